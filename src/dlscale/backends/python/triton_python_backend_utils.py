"""Triton's `triton_python_backend_utils` (pb_utils) for user model.py files, written for dlscale.

A Triton Python model imports it by that name; the python backend makes the name importable
while it runs user code (backends/python/loader.py). Tensors are numpy arrays on the host; BLS
calls (`InferenceRequest.exec`) go to the server's DataPlane through the ModelCaller bound to
the running thread or process (`bind_caller`). What differs from Triton: docs/backends.md.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from dlscale.backends.python import custom_metrics as metrics
from dlscale.backends.python.binding import current_caller, current_model
from dlscale.backends.python.pb_config import ModelConfig as ModelConfig  # Triton's name
from dlscale.backends.python.pb_config import by_name as _by_name
from dlscale.backends.python.pb_errors import TritonError as TritonError  # Triton's name
from dlscale.backends.python.pb_errors import code_of
from dlscale.errors import DlscaleError
from dlscale.types import Datatype, RequestedOutput
from dlscale.types import InferenceRequest as CoreRequest

log = logging.getLogger("dlscale.python")

TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_START = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_END = 2
TRITONSERVER_MEMORY_CPU = 0
TRITONSERVER_MEMORY_CPU_PINNED = 1
TRITONSERVER_MEMORY_GPU = 2

#: Triton's TYPE_* config names -> numpy dtypes (BYTES as object arrays).
_CONFIG_TYPES = {Datatype(d).config_type: Datatype(d).numpy for d in Datatype}


class PreferredMemory:
    """Where a BLS call's outputs should be placed (Triton's `PreferredMemory(type, device)`):
    taken as Triton's examples pass it; answers are host arrays here whatever it says."""

    def __init__(self, preferred_memory_type: int, preferred_device_id: int = 0) -> None:
        self.preferred_memory_type = preferred_memory_type
        self.preferred_device_id = preferred_device_id


class TritonModelException(Exception):
    """Raised by user code in initialize, execute or finalize to fail with a message."""


class Tensor:
    """A named host tensor (Triton's pb_utils.Tensor) over a numpy array."""

    def __init__(self, name: str, array: np.ndarray) -> None:
        if not isinstance(array, np.ndarray):
            raise TritonModelException(f"Tensor {name!r}: expected a numpy array, got {array!r}")
        self._name = name
        self._array = array

    def name(self) -> str:
        """The tensor's name."""
        return self._name

    def as_numpy(self) -> np.ndarray:
        """The data as a numpy array (BYTES: an object array of bytes)."""
        return self._array

    def shape(self) -> list[int]:
        """The tensor's shape."""
        return list(self._array.shape)

    def triton_dtype(self) -> str:
        """The datatype's protocol name (FP32, BYTES, ...)."""
        return Datatype.from_numpy(self._array.dtype).value

    def is_cpu(self) -> bool:
        """Always True: dlscale hands Python models host arrays."""
        return True

    def to_dlpack(self) -> Any:
        """A DLPack capsule of the data (numeric tensors only)."""
        return self._array.__dlpack__()

    @staticmethod
    def from_dlpack(name: str, capsule: Any) -> Tensor:
        """A tensor over an object that speaks DLPack (C-contiguous host memory)."""
        return Tensor(name, np.from_dlpack(capsule))


class InferenceResponse:
    """One request's answer: output tensors, or an error (Triton's pb_utils.InferenceResponse)."""

    def __init__(
        self,
        output_tensors: Sequence[Tensor] | None = None,
        error: TritonError | None = None,
        parameters: Mapping[str, Any] | str | None = None,
    ) -> None:
        self._outputs = list(output_tensors or ())
        self._error = error
        self._parameters = parameters if isinstance(parameters, str) else dict(parameters or {})

    def output_tensors(self) -> list[Tensor]:
        """The output tensors."""
        return self._outputs

    def has_error(self) -> bool:
        """Whether the response carries an error."""
        return self._error is not None

    def error(self) -> TritonError | None:
        """The error, or None."""
        return self._error

    def parameters(self) -> str:
        """The response's parameters as a JSON string."""
        p = self._parameters
        return p if isinstance(p, str) else json.dumps(p)


class InferenceResponseSender:
    """Sends a decoupled request's responses: any number, then the FINAL flag (Triton's
    `request.get_response_sender()`); usable from any thread, also after `execute` returned."""

    def __init__(self, deliver: Callable[[InferenceResponse | None, int], None]) -> None:
        self._deliver = deliver

    def send(self, response: InferenceResponse | None = None, flags: int = 0) -> None:
        """Send `response` (None: the flag alone); `flags=TRITONSERVER_RESPONSE_COMPLETE_FINAL`
        ends the request's stream."""
        if response is not None and not isinstance(response, InferenceResponse):
            raise TritonModelException(
                f"send: expected an InferenceResponse or None, got {type(response).__name__}"
            )
        self._deliver(response, flags)


class InferenceRequest:
    """A request: handed to `execute`, or built by user code to call another model (BLS)."""

    def __init__(
        self,
        model_name: str | bytes = "",
        requested_output_names: Iterable[str | bytes] = (),
        inputs: Iterable[Tensor] = (),
        request_id: str = "",
        correlation_id: int | str = 0,
        model_version: int = -1,
        flags: int = 0,
        timeout: int = 0,
        preferred_memory: Any = None,
        parameters: Mapping[str, Any] | str | None = None,
        trace: Any = None,
    ) -> None:
        # Triton's examples pass names read from BYTES tensors (`as_numpy()[0]`: bytes, or a
        # numpy bytes/str scalar): its stub takes them as strings, and so does this.
        self._model_name = _text(model_name)
        self._outputs = [_text(n) for n in requested_output_names]
        self._inputs = list(inputs)
        bad = [t for t in self._inputs if not isinstance(t, Tensor)]
        if bad:
            raise TritonModelException(
                f"InferenceRequest: inputs must be pb_utils.Tensor, got {type(bad[0]).__name__}"
            )
        self._id = _text(request_id)
        self._correlation_id = correlation_id
        self._version = int(model_version)
        self._flags = flags
        self._timeout = timeout
        self._parameters = json.loads(parameters) if isinstance(parameters, str) else parameters
        del preferred_memory, trace  # answers are host arrays here; traces are the server's
        self._sender: InferenceResponseSender | None = None
        self._cancelled: Callable[[], bool] = lambda: False

    def inputs(self) -> list[Tensor]:
        """The input tensors."""
        return self._inputs

    def requested_output_names(self) -> list[str]:
        """The outputs asked for."""
        return self._outputs

    def request_id(self) -> str:
        """The request's id."""
        return self._id

    def correlation_id(self) -> int | str:
        """The sequence correlation id (0: none)."""
        return self._correlation_id

    def model_name(self) -> str:
        """The model a BLS request calls."""
        return self._model_name

    def flags(self) -> int:
        """Sequence flags."""
        return self._flags

    def timeout(self) -> int:
        """The request's timeout in microseconds (0: the model's default)."""
        return self._timeout

    def parameters(self) -> str:
        """The request's parameters as a JSON string."""
        return json.dumps(dict(self._parameters or {}))

    def is_cancelled(self) -> bool:
        """Whether the client left or cancelled (decoupled requests; others: never)."""
        return self._cancelled()

    def get_response_sender(self) -> InferenceResponseSender:
        """The sender of this request's responses (decoupled models: execute returns None)."""
        if self._sender is None:
            raise TritonModelException(
                "get_response_sender: this model is not decoupled (set model_transaction_policy "
                "{ decoupled: true } in its config.pbtxt)"
            )
        return self._sender

    def attach(self, sender: InferenceResponseSender, cancelled: Callable[[], bool]) -> None:
        """dlscale's: bind the sender and the cancellation flag of a decoupled request."""
        self._sender = sender
        self._cancelled = cancelled

    def exec(self, decoupled: bool = False) -> Any:
        """Call the model named in this request on the same server and wait for its answer;
        `decoupled=True`: an iterator of its responses as they come (one, from a model that
        does not stream)."""
        responses = self._responses(decoupled)
        return responses if decoupled else next(responses)

    def _responses(self, decoupled: bool) -> Iterator[InferenceResponse]:
        """The called model's responses (its one answer unless `decoupled`), an error as one."""
        caller = current_caller()
        if caller is None:
            yield InferenceResponse(
                error=TritonError("BLS is available only inside execute", TritonError.UNAVAILABLE)
            )
            return
        try:
            request = self._core_request()
            for answer in caller.stream(request) if decoupled else [caller.infer(request)]:
                yield InferenceResponse([Tensor(n, a) for n, a in answer.outputs.items()])
        except DlscaleError as exc:
            yield InferenceResponse(error=TritonError(exc.message, code_of(exc)))

    async def async_exec(self, decoupled: bool = False) -> Any:
        """`exec` on the loop's default thread pool, as Triton's is."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, self.exec, decoupled)

    def _core_request(self) -> CoreRequest:
        params: dict[str, bool | int | float | str] = {
            k: v for k, v in (self._parameters or {}).items() if isinstance(v, bool | int | str)
        }
        if self._timeout:
            params["timeout"] = int(self._timeout)
        return CoreRequest(
            model_name=self._model_name,
            inputs={t.name(): t.as_numpy() for t in self._inputs},
            model_version=str(self._version) if self._version >= 0 else "",
            id=self._id,
            outputs=[RequestedOutput(n) for n in self._outputs] or None,
            parameters=params,
        )


def _text(value: Any) -> str:
    """A name given as str, bytes or a numpy scalar of either, as a str."""
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, bytes):
        try:
            return value.decode()
        except UnicodeDecodeError:
            raise TritonModelException(f"name {value!r} is not UTF-8 text") from None
    if not isinstance(value, str):
        raise TritonModelException(f"expected a name (str or bytes), got {value!r}")
    return value


def get_input_tensor_by_name(request: InferenceRequest, name: str) -> Tensor | None:
    """The request's input of that name, or None."""
    return next((t for t in request.inputs() if t.name() == name), None)


def get_output_tensor_by_name(response: InferenceResponse, name: str) -> Tensor | None:
    """The response's output of that name, or None."""
    return next((t for t in response.output_tensors() if t.name() == name), None)


def get_input_config_by_name(model_config: Mapping[str, Any], name: str) -> Any:
    """The input's entry of a model config dict (json.loads(args["model_config"])), or None."""
    return _by_name(model_config.get("input", ()), name)


def get_output_config_by_name(model_config: Mapping[str, Any], name: str) -> Any:
    """The output's entry of a model config dict, or None."""
    return _by_name(model_config.get("output", ()), name)


def triton_string_to_numpy(triton_type: str) -> Any:
    """The numpy type for a config datatype name ("TYPE_FP32"); BYTES is object."""
    return _CONFIG_TYPES[triton_type].type


def using_decoupled_model_transaction_policy(model_config: Mapping[str, Any]) -> bool:
    """Whether the config asks for decoupled answers."""
    return bool(model_config.get("model_transaction_policy", {}).get("decoupled", False))


class Logger:
    """Triton's pb_utils.Logger, writing to dlscale's log (logger `dlscale.python`)."""

    @staticmethod
    def log_info(message: str) -> None:
        """Log at INFO."""
        log.info("%s", message)

    @staticmethod
    def log_warn(message: str) -> None:
        """Log at WARNING."""
        log.warning("%s", message)

    @staticmethod
    def log_error(message: str) -> None:
        """Log at ERROR."""
        log.error("%s", message)

    @staticmethod
    def log_verbose(message: str) -> None:
        """Log at DEBUG."""
        log.debug("%s", message)


class MetricFamily:
    """A family of custom metrics, exported on the server's /metrics (Triton's
    pb_utils.MetricFamily); the family of that name is shared when kinds agree."""

    COUNTER = 0
    GAUGE = 1
    HISTOGRAM = 2

    def __init__(self, name: str, description: str, kind: int) -> None:
        kinds = dict(zip((self.COUNTER, self.GAUGE, self.HISTOGRAM), metrics.KINDS, strict=True))
        self._name = name
        self._model = current_model()
        _metric_call(metrics.STORE.family, name, description, kinds.get(kind, ""), self._model)

    def Metric(
        self, labels: Mapping[str, str] | None = None, buckets: Sequence[float] | None = None
    ) -> Metric:
        """The series of these labels (a histogram's needs its bucket bounds)."""
        key = _metric_call(
            metrics.STORE.series, self._name, dict(labels or {}), self._model, tuple(buckets or ())
        )
        return Metric(self._name, key)


class Metric:
    """One series of a MetricFamily: increment, set (gauges), observe (histograms), value."""

    def __init__(self, family: str, key: metrics.Labels) -> None:
        self._family = family
        self._key = key

    def increment(self, value: float) -> None:
        """Add `value` (a counter's must not be negative)."""
        _metric_call(metrics.STORE.update, self._family, self._key, "increment", value)

    def set(self, value: float) -> None:
        """Set a gauge."""
        _metric_call(metrics.STORE.update, self._family, self._key, "set", value)

    def observe(self, value: float) -> None:
        """Count an observation in a histogram."""
        _metric_call(metrics.STORE.update, self._family, self._key, "observe", value)

    def value(self) -> float:
        """A counter's or gauge's value (a histogram's: its count of observations)."""
        return float(metrics.STORE.value(self._family, self._key))


def _metric_call(method: Callable[..., Any], *args: Any) -> Any:
    try:
        return method(*args)
    except (metrics.MetricError, TypeError, ValueError) as exc:
        raise TritonModelException(str(exc)) from None
