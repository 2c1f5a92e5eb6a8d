"""`backend = "transformers"`: Hugging Face transformers' continuous batching as a backend.

The version folder is a Hugging Face folder (config.json, safetensors, tokenizer). The engine
(transformers_engine.py) batches at the iteration level over a paged KV cache in its own
thread; each request streams by the generative contract (contract.py): its new text per
generated token, and the finish reason at the end. Sampling is per request
(transformers_sampling.py); stop strings and whole characters are kept by
transformers_text.py. docs/generative.md describes the options.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import queue
from collections.abc import AsyncIterator, Iterator, Mapping
from pathlib import Path

import numpy as np
import torch

from dlscale.backends.base import BackendOptions, Capabilities, StreamPart, model_folder
from dlscale.backends.generative.contract import (
    INPUTS,
    OUTPUTS,
    EngineStats,
    StepGate,
    converted,
    join,
    prompt_text,
)
from dlscale.backends.generative.quiet import third_party_to_file
from dlscale.backends.generative.transformers_engine import Engine, Sink
from dlscale.backends.generative.transformers_request import Job, Parts, prepare, tokens
from dlscale.backends.generative.transformers_settings import EngineSettings
from dlscale.errors import ConfigError, Unavailable
from dlscale.sampling import Sampling
from dlscale.types import Parameter

#: Plain `infer` calls an instance may run at once: each is one sequence the engine batches.
INFER_CONCURRENCY = 64


class TransformersBackend:
    """A causal language model served by transformers' continuous-batching manager."""

    def __init__(self, path: Path, options: BackendOptions) -> None:
        self.path = path
        self.options = options
        self.settings = EngineSettings.from_options(options)
        self.inputs, self.outputs = list(INPUTS), list(OUTPUTS)
        self._engine: Engine | None = None
        self._ids = itertools.count()

    def load(self) -> None:
        """Load the weights and tokenizer onto the device and start the engine's thread."""
        if self.options.intra_op_threads > 0:
            # Process-wide in PyTorch: the engine's thread computes with this many.
            torch.set_num_threads(self.options.intra_op_threads)
        folder = self.path.parent if self.path.is_file() else self.path
        try:
            with third_party_to_file(model_folder(folder).name):
                self._engine = Engine(folder, self.settings, self.options.report_failure)
        except Exception as exc:  # transformers raises many kinds for a folder it cannot read
            raise ConfigError(f"transformers backend cannot load {folder.name}: {exc}") from exc

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(
            concurrency=INFER_CONCURRENCY,
            streams_answers=True,
            generates_text=True,
            paces_steps=True,
        )

    def pace(self, gate: StepGate) -> None:
        """Each engine step from now on takes its device's slot (contract.PacedBackend)."""
        self._loaded().manager.gate = gate

    def engine_stats(self) -> EngineStats:
        engine = self._engine
        return EngineStats(0, 0, 0.0) if engine is None else engine.stats()

    def _loaded(self) -> Engine:
        if self._engine is None:
            raise Unavailable("the transformers engine is not loaded")
        return self._engine

    def _prepare(self, inputs: Mapping[str, np.ndarray], sampling: Sampling) -> tuple[Engine, Job]:
        engine = self._loaded()
        return engine, prepare(engine, inputs, sampling)

    def _convert(self, inputs: Mapping[str, np.ndarray], sampling: Sampling) -> StreamPart:
        engine = self._loaded()
        tokenizer = engine.tokenizer
        return converted(
            sampling,
            prompt_text(inputs, engine.context),
            lambda text: tokens(engine, text, sampling),
            lambda ids: str(tokenizer.decode(list(ids))),
            len(tokenizer),
        )

    def stream(
        self, request_id: str, inputs: Mapping[str, np.ndarray], parameters: Mapping[str, Parameter]
    ) -> AsyncIterator[StreamPart]:
        """`generate` for a caller that holds the settings as request parameters."""
        return self.generate(request_id, inputs, Sampling.from_parameters(parameters))

    async def generate(
        self, request_id: str, inputs: Mapping[str, np.ndarray], sampling: Sampling
    ) -> AsyncIterator[StreamPart]:
        """The request's parts as the engine makes them; closing early cancels the sequence."""
        # Chat templates and the tokenizer take time in proportion to the prompt: in a thread,
        # so that the event loop keeps answering every other request meanwhile.
        if sampling.task != "generate":
            yield await asyncio.to_thread(self._convert, inputs, sampling)
            return
        engine, job = await asyncio.to_thread(self._prepare, inputs, sampling)
        loop = asyncio.get_running_loop()
        arrived: asyncio.Queue[object] = asyncio.Queue()

        def sink(output: object) -> None:  # on the router thread
            # A closed loop: nobody waits for this sequence any more.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(arrived.put_nowait, output)

        with self._submitted(engine, job, request_id, sink) as parts:
            while not parts.done:
                yield parts.next(await arrived.get())  # type: ignore[arg-type]

    def infer(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """One whole answer with the default settings, blocking (from an instance thread)."""
        engine, job = self._prepare(inputs, Sampling())
        arrived: queue.SimpleQueue[object] = queue.SimpleQueue()
        answer: list[StreamPart] = []
        with self._submitted(engine, job, "infer", arrived.put) as parts:
            while not parts.done:
                answer.append(parts.next(arrived.get()))  # type: ignore[arg-type]
        return join(answer).outputs

    @contextlib.contextmanager
    def _submitted(self, engine: Engine, job: Job, request_id: str, sink: Sink) -> Iterator[Parts]:
        """The job queued as one sequence, its outputs going to `sink`; cancelled on leaving
        unless the engine ended it (closed early, stopped by a stop string, or failed)."""
        # The caller's id may repeat (clients choose it); the engine's must not.
        engine_id = f"{request_id}#{next(self._ids)}"
        parts = Parts(engine.tokenizer, job)
        prompt, max_tokens, adapter = job.prompt, job.sampling.max_tokens, job.sampling.adapter
        engine.submit(engine_id, prompt, max_tokens, job.eos, job.settings, sink, adapter)
        try:
            yield parts
        finally:
            if not parts.engine_done:
                engine.cancel(engine_id)

    def load_adapter(self, name: str, folder: Path) -> None:
        """Load a LoRA adapter onto the running engine (lora_layers.py)."""
        self._loaded().adapters_for(name).add(name, folder)

    def unload_adapter(self, name: str) -> None:
        """Free a LoRA adapter's slot and weights (its sequences have ended)."""
        engine = self._engine
        if engine is not None and engine.adapters is not None:
            engine.adapters.remove(name)

    def unload(self) -> None:
        """Stop the engine and free the model and its KV cache at once."""
        engine, self._engine = self._engine, None
        if engine is not None:
            engine.close()
