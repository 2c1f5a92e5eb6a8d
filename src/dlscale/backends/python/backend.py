"""The python backend: a user's model.py, in the server process or in a worker process.

`isolation` in [backend_options] chooses where the code runs: "thread" (in the server process,
in the instance's thread) or "process" (a worker process per instance: no GIL shared with the
server, tensors through shared memory). The default is Triton's for Triton models ("process")
and "thread" for dlscale's own API. docs/backends.md describes both APIs.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, cast

import numpy as np

from dlscale.backends.base import BackendOptions, Capabilities, RequestResult, StreamPart
from dlscale.backends.generative.contract import (
    NUM_INPUT_TOKENS,
    NUM_OUTPUT_TOKENS,
    TEXT_INPUT,
    TEXT_OUTPUT,
)
from dlscale.backends.python.binding import bind_caller
from dlscale.backends.python.loader import Api, UserCodeError, UserModel, api_of, log_failure
from dlscale.backends.python.native import NativeRunner
from dlscale.backends.python.outputs import check_outputs
from dlscale.backends.python.readiness import ReadinessCheck
from dlscale.backends.python.runner import Runner, make_runner
from dlscale.backends.python.streaming import Channel, relay, streams
from dlscale.backends.python.triton import TritonRunner
from dlscale.backends.python.worker import WorkerRunner
from dlscale.errors import ConfigError, DlscaleError
from dlscale.types import Parameter

ISOLATIONS = ("thread", "process")
#: The [backend_options] keys this backend reads itself; the others reach the user's code.
OWN_KEYS = ("isolation", "parameters", "decoupled", "max_num_seqs", "max_worker_memory_mb")
#: The default bound on a worker process's resident memory, in MB (worker.py says why RSS).
MAX_WORKER_MEMORY_MB = 8192
#: The config.pbtxt parameter that sets `isolation` (models/triton_config.py reads it).
ISOLATION_PARAMETER = "DLSCALE_ISOLATION"
#: The tensors that make a decoupled model generative (backends/generative/contract.py).
GENERATIVE = frozenset({TEXT_INPUT, TEXT_OUTPUT, NUM_INPUT_TOKENS, NUM_OUTPUT_TOKENS})


class PythonBackend:
    """A Backend whose model is user Python code (dlscale's `Model` or Triton's)."""

    def __init__(self, path: Path, options: BackendOptions) -> None:
        self.path = path
        self.options = options
        self.api: Api = api_of(path)
        #: Whether it answers with streams (decoupled): then it runs in the server process.
        self.decoupled = streams(path, self.api, options.extra)
        self.isolation = _isolation(path, options.extra, self.api, self.decoupled)
        #: The model's name (known once loaded), for errors about what its code returned.
        self.name = path.name
        self.inputs, self.outputs = list(options.inputs), list(options.outputs)
        self._runner: Runner | None = None
        self._streams: ThreadPoolExecutor | None = None  # user code of streams runs here
        self._readiness: ReadinessCheck | None = None  # when the model has its own is_ready

    def load(self) -> None:
        """Import model.py and load its model, here or in a worker process."""
        options = self.options
        if not options.inputs or not options.outputs:
            raise ConfigError(
                f"{self.path}: backend 'python' needs the model's inputs and outputs in its "
                "config (config.toml [[inputs]]/[[outputs]] or config.pbtxt input/output)"
            )
        model = UserModel.at(self.path, options, _parameters(options.extra), self.decoupled)
        self.name = model.name
        bound = _memory_bound(self.path, options.extra)  # checked whatever the isolation
        bind_caller(options.caller)  # BLS from initialize or load, in this thread
        with self._logged():
            if self.isolation == "process":
                self._runner = WorkerRunner(model, self.api, options.caller, bound)
            else:
                self._runner = make_runner(model, self.api)
                if self.decoupled:  # one execute at a time, as a Triton stub process runs it
                    self._streams = ThreadPoolExecutor(1, thread_name_prefix=f"{model.name}-stream")
        if self._runner.checks_ready:
            self._readiness = ReadinessCheck(model.name, self._runner.ready)

    @contextlib.contextmanager
    def _logged(self) -> Iterator[None]:
        """User code's failure in the block written to the server's log, then raised."""
        try:
            yield
        except UserCodeError as exc:
            if self.isolation == "thread":  # a worker's failures are logged as they arrive
                log_failure(exc)
            raise

    @property
    def capabilities(self) -> Capabilities:
        """Calls other models (BLS); Triton models take a batch request by request; a decoupled
        model streams, and one with the generative signature (text_input to text_output and
        the token counts, backends/generative/contract.py) is served as a generative model."""
        names = {s.name for s in (*self.options.inputs, *self.options.outputs)}
        generative = self.decoupled and names >= GENERATIVE
        return Capabilities(
            calls_models=True,
            takes_requests=self.api == "triton",
            streams_answers=self.decoupled,
            generates_text=generative,
            stops_batches=self.isolation == "process",
            reports_readiness=self.isolation == "process" or self._readiness is not None,
        )

    async def ready(self) -> bool:
        """As Triton's python backend says: ready while the model's worker process runs, and
        as the model's own `is_ready` answers when it has one (backends/python/readiness.py)."""
        runner = self._runner
        if runner is None or (isinstance(runner, WorkerRunner) and not runner.alive):
            return False
        return await self._readiness.ready() if self._readiness is not None else True

    def infer(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """One merged batch (dlscale's API; warm-up for Triton models)."""
        result = self.infer_requests([inputs])[0]
        if isinstance(result, DlscaleError):
            raise result
        return result

    def infer_requests(self, requests: Sequence[Mapping[str, np.ndarray]]) -> list[RequestResult]:
        """The batch's requests, each answered apart, each output checked against the config.

        When user code raises for the whole batch, each request is run again alone, so that
        only the request that makes it raise fails (Triton's models answer an error per
        request; one that raises instead would otherwise fail its good neighbours).
        """
        runner = self._runner
        if runner is None:
            raise ConfigError(f"{self.path}: the model is not loaded")
        bind_caller(self.options.caller)  # BLS from this instance thread
        try:
            with self._logged():
                results = runner.run(requests)
        except UserCodeError:
            if len(requests) == 1:
                raise
            results = [self._alone(runner, request) for request in requests]
        return [self._checked(i, r) for i, r in zip(requests, results, strict=True)]

    def _alone(self, runner: Runner, request: Mapping[str, np.ndarray]) -> RequestResult:
        try:
            with self._logged():
                return runner.run([request])[0]
        except UserCodeError as exc:
            return exc

    def _checked(self, inputs: Mapping[str, np.ndarray], result: RequestResult) -> RequestResult:
        if isinstance(result, DlscaleError):
            return result
        batched = self.options.max_batch_size > 0
        error = check_outputs(self.name, self.options.outputs, batched, inputs, result)
        return result if error is None else error

    def stream(
        self, request_id: str, inputs: Mapping[str, np.ndarray], parameters: Mapping[str, Parameter]
    ) -> AsyncIterator[StreamPart]:
        """One request's responses, as the user's code sends them from its thread."""
        runner, executor = self._runner, self._streams
        if runner is None or executor is None:
            raise ConfigError(f"{self.path}: the model is not loaded, or does not stream")
        caller = self.options.caller

        def run(channel: Channel) -> None:
            bind_caller(caller)  # BLS from this thread
            with self._logged():
                if isinstance(runner, TritonRunner):
                    runner.stream(inputs, parameters, request_id, channel)
                else:
                    cast(NativeRunner, runner).stream(inputs, parameters, channel)

        return relay(executor, run)

    def unload(self) -> None:
        """Call the model's unload (finalize) and stop its worker."""
        runner, self._runner = self._runner, None
        if self._readiness is not None:
            self._readiness.close()
        if runner is not None:
            runner.close()
        if self._streams is not None:
            self._streams.shutdown(wait=False, cancel_futures=True)


def _isolation(path: Path, extra: Mapping[str, Any], api: Api, decoupled: bool) -> str:
    value = extra.get("isolation", "process" if api == "triton" and not decoupled else "thread")
    if value not in ISOLATIONS:
        raise ConfigError(
            f"{path}: field 'backend_options.isolation': expected one of {list(ISOLATIONS)}, "
            f"got {value!r}"
        )
    if decoupled and value == "process":
        raise ConfigError(
            f"{path}: a model that streams its answers (decoupled) runs in the server process: "
            "isolation 'process' is not offered for it; set isolation = \"thread\" (config.toml "
            f"[backend_options]) or the config.pbtxt parameter {ISOLATION_PARAMETER}"
        )
    return str(value)


def _memory_bound(path: Path, extra: Mapping[str, Any]) -> int:
    value = extra.get("max_worker_memory_mb", MAX_WORKER_MEMORY_MB)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(
            f"{path}: field 'backend_options.max_worker_memory_mb': expected a whole number of "
            f"MB, 0 for no bound; got {value!r}"
        )
    return value


def _parameters(extra: Mapping[str, Any]) -> dict[str, Any]:
    """What user code is given: Triton's `parameters`, and any other [backend_options] key."""
    given = extra.get("parameters", {})
    if not isinstance(given, Mapping):
        raise ConfigError(f"field 'backend_options.parameters': expected a table, got {given!r}")
    rest = {k: v for k, v in extra.items() if k not in OWN_KEYS}
    return {**rest, **given}
