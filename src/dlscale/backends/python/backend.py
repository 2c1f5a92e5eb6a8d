"""The python backend: a user's model.py, in the server process or in a worker process.

`isolation` in [backend_options] chooses where the code runs: "thread" (in the server process,
in the instance's thread) or "process" (a worker process per instance: no GIL shared with the
server, tensors through shared memory). The default is Triton's for Triton models ("process")
and "thread" for dlscale's own API. docs/backends.md describes both APIs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from dlscale.backends.base import BackendOptions, Capabilities, RequestResult
from dlscale.backends.python import triton_python_backend_utils as pb
from dlscale.backends.python.loader import Api, UserCodeError, UserModel, api_of, log_failure
from dlscale.backends.python.runner import Runner, make_runner
from dlscale.errors import ConfigError, DlscaleError
from dlscale.types import TensorSpec

#: The file a version folder holds for this backend.
MODEL_FILE = "model.py"
ISOLATIONS = ("thread", "process")
#: The [backend_options] keys this backend reads itself; the others reach the user's code.
OWN_KEYS = ("isolation", "parameters")


class PythonBackend:
    """A Backend whose model is user Python code (dlscale's `Model` or Triton's)."""

    def __init__(self, path: Path, options: BackendOptions) -> None:
        self.path = path
        self.options = options
        self.api: Api = api_of(path)
        self.isolation = _isolation(path, options.extra, self.api)
        self._runner: Runner | None = None

    def load(self) -> None:
        """Import model.py and load its model, here or in a worker process."""
        options = self.options
        if not options.inputs or not options.outputs:
            raise ConfigError(
                f"{self.path}: backend 'python' needs the model's inputs and outputs in its "
                "config (config.toml [[inputs]]/[[outputs]] or config.pbtxt input/output)"
            )
        model = UserModel.at(
            self.path,
            options.device,
            options.max_batch_size,
            (options.inputs, options.outputs),
            _parameters(options.extra),
        )
        pb.bind_caller(options.caller)  # BLS from initialize or load, in this thread
        try:
            if self.isolation == "process":
                from dlscale.backends.python.worker import WorkerRunner

                self._runner = WorkerRunner(model, self.api, options.caller)
            else:
                self._runner = make_runner(model, self.api)
        except UserCodeError as exc:
            if self.isolation == "thread":  # a worker's failures are logged as they arrive
                log_failure(exc)
            raise

    @property
    def capabilities(self) -> Capabilities:
        """Calls other models (BLS); Triton models take a batch request by request."""
        return Capabilities(calls_models=True, takes_requests=self.api == "triton")

    @property
    def inputs(self) -> list[TensorSpec]:
        return list(self.options.inputs)

    @property
    def outputs(self) -> list[TensorSpec]:
        return list(self.options.outputs)

    def infer(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """One merged batch (dlscale's API; warm-up for Triton models)."""
        result = self.infer_requests([inputs])[0]
        if isinstance(result, DlscaleError):
            raise result
        return result

    def infer_requests(self, requests: Sequence[Mapping[str, np.ndarray]]) -> list[RequestResult]:
        """The batch's requests, each answered apart; a user-code failure fails them all."""
        if self._runner is None:
            raise ConfigError(f"{self.path}: the model is not loaded")
        pb.bind_caller(self.options.caller)  # BLS from this instance thread
        try:
            return self._runner.run(requests)
        except UserCodeError as exc:
            if self.isolation == "thread":
                log_failure(exc)
            raise

    def unload(self) -> None:
        """Call the model's unload (finalize) and stop its worker."""
        runner, self._runner = self._runner, None
        if runner is not None:
            runner.close()


def _isolation(path: Path, extra: Mapping[str, Any], api: Api) -> str:
    value = extra.get("isolation", "process" if api == "triton" else "thread")
    if value not in ISOLATIONS:
        raise ConfigError(
            f"{path}: field 'backend_options.isolation': expected one of {list(ISOLATIONS)}, "
            f"got {value!r}"
        )
    return str(value)


def _parameters(extra: Mapping[str, Any]) -> dict[str, Any]:
    """What user code is given: Triton's `parameters`, and any other [backend_options] key."""
    given = extra.get("parameters", {})
    if not isinstance(given, Mapping):
        raise ConfigError(f"field 'backend_options.parameters': expected a table, got {given!r}")
    rest = {k: v for k, v in extra.items() if k not in OWN_KEYS}
    return {**rest, **given}
