"""A loaded user model, whichever API it speaks: `run` a batch's requests, `close` it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

import numpy as np

from dlscale.backends.base import RequestResult
from dlscale.backends.python.loader import Api, UserModel


class Runner(Protocol):
    """User code loaded in this process or behind a worker: one result per request; `ready`
    asks the model's own readiness where it has one (`checks_ready`: Triton's is_ready)."""

    @property
    def checks_ready(self) -> bool: ...

    def ready(self) -> bool: ...

    def run(self, requests: Sequence[Mapping[str, np.ndarray]]) -> list[RequestResult]: ...

    def close(self) -> None: ...


def make_runner(model: UserModel, api: Api) -> Runner:
    """Import the model.py and load its model in this process (UserCodeError if user code fails)."""
    if api == "triton":
        from dlscale.backends.python.triton import TritonRunner

        return TritonRunner(model)
    from dlscale.backends.python.native import NativeRunner

    return NativeRunner(model)
