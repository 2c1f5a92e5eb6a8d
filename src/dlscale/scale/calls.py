"""One call to a model deployment through a Ray Serve handle, with Ray's failures made clear.

A replica's own error (a DlscaleError it returns or raises) reaches the client unchanged. A
replica that dies, or cannot be reached, while it holds the request fails that request; the
call is then sent once more, to another replica or a restarted one, since inference is
idempotent. The whole call is bounded: past the timeout the client gets 503 / UNAVAILABLE.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Sequence
from typing import Any, cast

from ray.exceptions import RayActorError, RayTaskError
from ray.serve.exceptions import BackPressureError, DeploymentUnavailableError
from ray.serve.handle import DeploymentHandle, DeploymentResponse, DeploymentResponseGenerator

from dlscale.errors import BackendError, DlscaleError, QueueFull, Unavailable

log = logging.getLogger("dlscale.scale")

#: Sends of one call: the first, and one retry after a replica died holding it.
ATTEMPTS = 2


async def remote_call(
    handle: DeploymentHandle[Any], model: str, method: str, args: Sequence[Any], timeout_s: float
) -> Any:
    """`method(*args)` on a replica of `model`'s deployment; failures as DlscaleErrors."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    for attempt in range(1, ATTEMPTS + 1):
        response = cast(DeploymentResponse[Any], handle.options(method_name=method).remote(*args))
        try:
            result = await _within(response, deadline - loop.time())
        except RayTaskError as exc:
            raise replica_error(model, exc) from None
        except RayActorError as exc:
            if attempt < ATTEMPTS:
                log.warning("model %s: a replica failed during %s; sending it again", model, method)
                continue
            raise Unavailable(
                f"model {model!r}: the replica holding the request died or became unreachable "
                f"(sent {ATTEMPTS} times): {_first_line(exc)}"
            ) from None
        except BackPressureError as exc:
            raise QueueFull(f"model {model!r}: every replica's queue is full: {exc}") from None
        except DeploymentUnavailableError as exc:
            raise Unavailable(f"model {model!r} is unavailable on Ray Serve: {exc}") from None
        except TimeoutError:
            raise Unavailable(
                f"model {model!r}: no replica answered within {timeout_s:g} s"
            ) from None
        if isinstance(result, DlscaleError):
            raise result  # the replica's answer to a request it refused (replica.py)
        return result
    raise AssertionError("unreachable")  # the loop returns or raises


async def remote_stream(
    handle: DeploymentHandle[Any], model: str, method: str, args: Sequence[Any]
) -> AsyncIterator[Any]:
    """The items of generator `method(*args)` on a replica of `model`'s deployment, as they come.

    Sent once (a retry could repeat responses a client already has); a DlscaleError item is the
    replica's answer to a request it refused or a stream that failed, raised here. Closing this
    iterator early (the client left) cancels the replica's generator, which frees the sequence.
    """
    options = handle.options(method_name=method, stream=True)
    responses = cast(DeploymentResponseGenerator[Any], options.remote(*args))
    ended = False
    try:
        async for item in responses:
            if isinstance(item, DlscaleError):
                raise item
            yield item
        ended = True
    except RayTaskError as exc:
        raise replica_error(model, exc) from None
    except RayActorError as exc:
        raise Unavailable(
            f"model {model!r}: the replica holding the stream died: {_first_line(exc)}"
        ) from None
    except BackPressureError as exc:
        raise QueueFull(f"model {model!r}: every replica's queue is full: {exc}") from None
    except DeploymentUnavailableError as exc:
        raise Unavailable(f"model {model!r} is unavailable on Ray Serve: {exc}") from None
    finally:
        if not ended:
            responses.cancel()  # type: ignore[no-untyped-call]


async def _within(response: DeploymentResponse[Any], timeout_s: float) -> Any:
    """The response's result; the request is cancelled in Ray too if it times out here."""

    async def result() -> Any:
        return await response

    try:
        return await asyncio.wait_for(result(), max(timeout_s, 0.0))
    except (TimeoutError, asyncio.CancelledError):
        response.cancel()  # type: ignore[no-untyped-call]
        raise


def replica_error(model: str, exc: RayTaskError) -> DlscaleError:
    """The replica's own DlscaleError, or a BackendError naming what else it raised."""
    cause = exc.cause
    if isinstance(cause, DlscaleError):
        return cause
    return BackendError(f"model {model!r}: the replica failed: {cause!r}")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
