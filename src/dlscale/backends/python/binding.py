"""What the code of a user's model runs on behalf of: the caller its BLS calls go through and
the model its custom metrics count against, bound per thread by the python backend."""

from __future__ import annotations

import threading

from dlscale.backends.base import ModelCaller

_bound = threading.local()
_fallback: list[ModelCaller] = []  # the last caller bound: for threads user code starts itself
_models: list[str] = []  # the last model bound: for threads user code starts itself


def bind_model(name: str) -> None:
    """Say which model the code this thread runs is (custom metrics count against it)."""
    _bound.model = name
    _models[:] = [name]


def current_model() -> str:
    """The model bound to this thread, else the last one bound."""
    return str(getattr(_bound, "model", None) or (_models[0] if _models else ""))


def bind_caller(caller: ModelCaller | None) -> None:
    """Let BLS calls made in this thread (and, failing that, in any thread) use `caller`."""
    _bound.caller = caller
    if caller is not None:
        _fallback[:] = [caller]


def current_caller() -> ModelCaller | None:
    """The caller bound to this thread, else the last one bound, else None."""
    caller: ModelCaller | None = getattr(_bound, "caller", None)
    return caller or (_fallback[0] if _fallback else None)
