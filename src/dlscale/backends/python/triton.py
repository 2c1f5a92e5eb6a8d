"""Triton's Python-backend API: a `TritonPythonModel` with initialize, execute(requests), finalize.

Each client request of a batch is one pb_utils.InferenceRequest, as in Triton: the batcher hands
this backend the requests apart (`Capabilities.takes_requests`), nothing is concatenated, and a
response with an error fails its own request only.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any

import numpy as np

from dlscale.backends.base import RequestResult, StreamPart
from dlscale.backends.python import custom_metrics as metrics
from dlscale.backends.python import triton_python_backend_utils as pb
from dlscale.backends.python.binding import bind_model
from dlscale.backends.python.loader import UserCodeError, UserModel, failure, user_class
from dlscale.backends.python.pb_errors import error_of
from dlscale.backends.python.streaming import Channel
from dlscale.errors import BackendError
from dlscale.types import Parameters, TensorSpec

log = logging.getLogger("dlscale.python")


def model_config(model: UserModel) -> dict[str, Any]:
    """The model's config as Triton's JSON form (args['model_config'] holds it as a string)."""
    batch = 1 if model.max_batch_size > 0 else 0

    def tensor(spec: TensorSpec) -> dict[str, Any]:
        dims = list(spec.shape[batch:])
        return {"name": spec.name, "data_type": spec.datatype.config_type, "dims": dims}

    return {
        "name": model.name,
        "backend": "python",
        "max_batch_size": model.max_batch_size,
        "input": [tensor(s) for s in model.inputs],
        "output": [tensor(s) for s in model.outputs],
        "parameters": {k: {"string_value": str(v)} for k, v in model.parameters.items()},
        "model_transaction_policy": {"decoupled": model.decoupled},
    }


def initialize_args(model: UserModel) -> dict[str, str]:
    """Triton's `initialize(args)`: every value a string."""
    gpu = model.device.startswith("cuda")
    device_id = model.device.partition(":")[2] or "0"
    return {
        "model_config": json.dumps(model_config(model)),
        "model_instance_kind": "GPU" if gpu else "CPU",
        "model_instance_name": f"{model.name}_0",
        "model_instance_device_id": device_id if gpu else "0",
        "model_repository": str(model.repository),
        "model_version": str(model.version),
        "model_name": model.name,
    }


class TritonRunner:
    """Runs a `TritonPythonModel`: initialize once, `execute` per batch, finalize at unload."""

    def __init__(self, model: UserModel) -> None:
        self.model = model
        bind_model(model.name)  # custom metrics made in initialize count against it
        metrics.STORE.hold(model.name)
        try:
            self._user = user_class(model, "triton")()
            self._initialize()
        except BaseException:
            metrics.STORE.release(model.name)
            raise
        self._outputs = [s.name for s in model.outputs]

    def _initialize(self) -> None:
        initialize = getattr(self._user, "initialize", None)
        if initialize is not None:
            try:
                _await(initialize(initialize_args(self.model)))
            except Exception as exc:
                raise failure(self.model, "initialize", exc) from None

    @property
    def checks_ready(self) -> bool:
        """Whether the model has its own `is_ready` (Triton's: optional)."""
        return callable(getattr(self._user, "is_ready", None))

    def ready(self) -> bool:
        """The model's `is_ready` answer (True without one); UserCodeError when it raises or
        answers other than a bool, as Triton's python backend requires."""
        if not self.checks_ready:
            return True
        try:
            answer = _await(self._user.is_ready())
        except Exception as exc:
            raise failure(self.model, "is_ready", exc) from None
        if not isinstance(answer, bool):
            raise UserCodeError(
                f"model {self.model.name!r}: is_ready returned {answer!r}; expected True or False"
            )
        return answer

    def run(self, requests: Sequence[Mapping[str, np.ndarray]]) -> list[RequestResult]:
        """`execute` on the batch's requests; one result per request, raises for user bugs."""
        asked = [self._request(inputs) for inputs in requests]
        responses = self._execute(asked)
        if not isinstance(responses, list | tuple) or len(responses) != len(asked):
            got = f"{len(responses)} items" if isinstance(responses, list | tuple) else responses
            raise UserCodeError(
                f"model {self.model.name!r}: execute returned {got!r}; expected a list of "
                f"{len(asked)} InferenceResponse, one per request"
            )
        return [self._result(i, r) for i, r in enumerate(responses)]

    def _result(self, index: int, response: Any) -> RequestResult:
        name = self.model.name
        if not isinstance(response, pb.InferenceResponse):
            return BackendError(
                f"model {name!r}: execute's answer {index} is {type(response).__name__}, "
                "not an InferenceResponse"
            )
        error = response.error()
        if error is not None:
            return error_of(error)
        outputs = {t.name(): t.as_numpy() for t in response.output_tensors()}
        missing = [n for n in self._outputs if n not in outputs]
        if missing:
            return BackendError(f"model {name!r}: execute's answer {index} lacks outputs {missing}")
        return outputs

    def stream(
        self,
        inputs: Mapping[str, np.ndarray],
        parameters: Mapping[str, Any],
        ident: str,
        channel: Channel,
    ) -> None:
        """`execute` on one decoupled request, whose sender passes each response to `channel`."""
        request = self._request(inputs, request_id=ident, parameters=dict(parameters))
        request.attach(
            pb.InferenceResponseSender(partial(_deliver, channel)), channel.cancelled.is_set
        )
        if self._execute([request]) is not None:
            raise UserCodeError(
                f"model {self.model.name!r} is decoupled: execute must return None and answer "
                "through request.get_response_sender()"
            )

    def _request(self, inputs: Mapping[str, np.ndarray], **extra: Any) -> pb.InferenceRequest:
        return pb.InferenceRequest(
            model_name=self.model.name,
            requested_output_names=self._outputs,
            inputs=[pb.Tensor(n, a) for n, a in inputs.items()],
            **extra,
        )

    def _execute(self, requests: list[pb.InferenceRequest]) -> Any:
        """The model's `execute` on `requests`, its custom metrics counted against it."""
        bind_model(self.model.name)
        try:
            return _await(self._user.execute(requests))
        except Exception as exc:
            raise failure(self.model, "execute", exc) from None

    def close(self) -> None:
        """Call `finalize`, if the model has one (a failure is logged, not raised); its custom
        metrics leave /metrics."""
        finalize = getattr(self._user, "finalize", None)
        if finalize is not None:
            try:
                _await(finalize())
            except Exception:
                log.exception("model %r: finalize raised", self.model.name)
        metrics.STORE.release(self.model.name)


def _deliver(channel: Channel, response: pb.InferenceResponse | None, flags: int) -> None:
    """A decoupled request's response as a stream part; a response's error ends its stream."""
    final = bool(flags & pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
    if response is None:
        if final and not channel.ended:  # FINAL after an error: the stream ended
            channel.send(StreamPart({}, final=True))
        return
    error = response.error()
    if error is not None:
        channel.send(error_of(error))
        return
    outputs = {t.name(): t.as_numpy() for t in response.output_tensors()}
    channel.send(StreamPart(outputs, _parameters(response.parameters()), final))


def _parameters(text: str) -> Parameters:
    """A response's parameters (pb_utils keeps them as JSON): the protocol's kinds only."""
    try:
        values = json.loads(text or "{}")
    except json.JSONDecodeError:
        return {}
    if not isinstance(values, dict):
        return {}
    return {str(k): v for k, v in values.items() if isinstance(v, bool | int | float | str)}


def _await(value: Any) -> Any:
    """The value, or the coroutine's result for `async def` methods (a loop per call)."""
    return asyncio.run(value) if inspect.iscoroutine(value) else value
