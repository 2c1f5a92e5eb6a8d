"""Worker processes: user code in a process of its own (no GIL shared with the server).

The server side (`WorkerRunner`) starts the worker with the spawn context, sends each batch as a
`Run` with its tensors in shared memory, answers the worker's BLS `Call`s through the server's
ModelCaller while it waits, and a watchdog thread restarts a worker that died (logged, with
"restarted"). The batch a worker died in fails with a server error; the next one is computed
by the new worker. A worker over its memory bound is replaced after its batch, and an unload
that finds a batch still running (its grace is over: a hung model) kills the worker at once;
the owner sweeps what a dead worker left in shared memory (its names' prefix).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import secrets
import threading
from collections.abc import Iterator, Mapping, Sequence
from multiprocessing import get_context
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

import numpy as np

from dlscale.backends.base import ModelCaller, RequestResult
from dlscale.backends.python import custom_metrics as metrics
from dlscale.backends.python import transport as t
from dlscale.backends.python.binding import bind_caller
from dlscale.backends.python.loader import Api, UserCodeError, UserModel, log_failure
from dlscale.backends.python.runner import Runner, make_runner
from dlscale.errors import BackendError, DlscaleError, Unavailable
from dlscale.types import InferenceRequest, InferenceResponse
from dlscale.wire import channel, segments

log = logging.getLogger("dlscale.python")
#: How often an unload waiting for a running batch kills the worker again (a restart may
#: have started a new one meanwhile).
KILL_POLL_S = 0.5
#: The most responses a streamed BLS call (`exec(decoupled=True)`) returns to a worker.
MAX_STREAMED = 4096
#: How long a worker asked to stop may take to run the model's finalize before it is killed.
STOP_TIMEOUT_S = 10.0


class WorkerRunner:
    """A user model loaded in a worker process; restarted by a watchdog when it dies.

    `max_memory_mb` bounds the worker's resident memory: checked after each batch, a worker
    over it is restarted (0: no bound). Resident memory, not an address-space limit
    (RLIMIT_AS): numpy, torch and CUDA reserve far more address space than they touch, so an
    RLIMIT_AS low enough to catch a leak fails healthy models at import or allocation, in
    their code, where nothing can recover; the resident size counts what the model keeps.
    """

    def __init__(
        self, model: UserModel, api: Api, caller: ModelCaller | None, max_memory_mb: int = 0
    ) -> None:
        self.model = model
        self.api = api
        self.caller = caller
        self.max_memory_mb = max_memory_mb
        self._context = get_context("spawn")
        self._lock = threading.Lock()  # one batch (or restart) at a time
        self._closing = False
        self._broken = ""  # why no worker runs (a restart failed)
        self._process: Any = None
        self._pipe: t.Pipe | None = None
        self._asks: Connection | None = None  # the worker's readiness pipe
        #: Whether the model has its own is_ready (the worker said so once loaded).
        self.checks_ready = False
        # The server's naming rule (wire/segments.py): the registry refuses these segments,
        # and what a dead worker left under its prefix is swept.
        scope = f"py{secrets.token_hex(4)}"
        self._worker_prefix = segments.scope_prefix(f"{scope}w")
        self._server_prefix = segments.scope_prefix(f"{scope}s")
        metrics.STORE.hold(model.name)  # the worker's custom metrics join the server's
        try:
            self._start()
        except BaseException:
            metrics.STORE.release(model.name)
            raise
        self._watchdog = threading.Thread(
            target=self._watch, name=f"{model.name}-watchdog", daemon=True
        )
        self._watchdog.start()

    @property
    def pid(self) -> int | None:
        """The worker's process id (tests kill it)."""
        return self._process.pid if self._process is not None else None

    def _start(self) -> None:
        """Start a worker and wait until it loaded the model (raises what its load raised)."""
        ours, theirs = self._context.Pipe()
        asks, answers = self._context.Pipe()
        process = self._context.Process(
            target=serve,
            args=(theirs, answers, self.model, self.api, self._worker_prefix),
            name=f"dlscale-{self.model.name}",
        )
        process.daemon = True
        process.start()
        theirs.close()
        answers.close()
        pipe = t.Pipe(ours, self._server_prefix)
        try:
            ready = _received(pipe)
            while isinstance(ready, t.BlsCall):  # BLS from initialize
                self._answer(pipe, ready)
                ready = _received(pipe)
        except EOFError:
            process.join()
            pipe.close()
            asks.close()
            raise BackendError(
                f"model {self.model.name!r}: its worker process exited while loading "
                f"(exit code {process.exitcode})"
            ) from None
        if isinstance(ready, t.Ready) and ready.error is not None:
            process.join()
            pipe.close()
            asks.close()
            raise _error(ready.error)
        self.checks_ready = isinstance(ready, t.Ready) and ready.checks_ready
        self._process, self._pipe, self._asks = process, pipe, asks

    @property
    def alive(self) -> bool:
        """Whether a worker process runs the model now (not while one is restarted)."""
        process = self._process
        return process is not None and process.is_alive()

    def ready(self) -> bool:
        """The model's is_ready answer, asked on the worker's readiness pipe: beside a batch
        that runs, as Triton's stub answers it beside execute. One ask at a time (the caller,
        backends/python/readiness.py, runs them in one thread)."""
        asks = self._asks
        if asks is None or not self.alive:
            raise Unavailable(f"model {self.model.name!r}: no worker process runs it now")
        try:
            channel.send(asks, t.AskReady())
            answer = channel.expect(t.Readiness, channel.receive(asks))
        except (EOFError, OSError):
            raise Unavailable(f"model {self.model.name!r}: its worker process exited") from None
        if answer.error is not None:
            raise answer.error
        return answer.ready

    def run(self, requests: Sequence[Mapping[str, np.ndarray]]) -> list[RequestResult]:
        """Send the batch to the worker and wait for its results, answering its BLS calls."""
        with self._lock:
            if self._process is not None and not self._process.is_alive():
                self._restart(self._process)  # died between batches, before the watchdog saw
            if self._pipe is None:
                raise Unavailable(f"model {self.model.name!r}: no worker process ({self._broken})")
            try:
                arrays = [dict(r) for r in requests]
                self._pipe.send(t.Run(arrays), *arrays)
                results = self._results(self._pipe)
            except (EOFError, OSError):
                raise self._died() from None
            self._bound_memory()
            return results

    def _died(self) -> DlscaleError:
        """The error of the batch the worker died (or was killed) in."""
        self._process.join(timeout=5)
        code = self._process.exitcode
        if self._closing:
            return Unavailable(
                f"model {self.model.name!r}: unloaded while computing this batch (its worker "
                "process was stopped after the unload's grace)"
            )
        log.error(
            "model %r: its worker process (pid %s) died with exit code %s during a "
            "batch; that batch fails and the worker is restarted",
            self.model.name, self._process.pid, code,
        )  # fmt: skip
        return BackendError(
            f"model {self.model.name!r}: its worker process died (exit code {code}) "
            "while computing this batch; the worker is being restarted"
        )

    def _bound_memory(self) -> None:
        """Restart the worker when its resident memory is over the bound (the lock is held)."""
        if not self.max_memory_mb:
            return
        used = _resident_mb(self._process.pid)
        if used <= self.max_memory_mb:
            return
        log.warning(
            "model %r: worker process (pid %s) holds %d MB, over its bound of %d MB "
            "(backend option max_worker_memory_mb); restarting it",
            self.model.name, self._process.pid, used, self.max_memory_mb,
        )  # fmt: skip
        process = self._process
        self._stop_worker()
        self._restart(process)

    def _results(self, pipe: t.Pipe) -> list[RequestResult]:
        while True:
            ready = wait([pipe.conn, self._process.sentinel])
            if pipe.conn not in ready:
                raise EOFError
            message = _received(pipe)
            if isinstance(message, t.BlsCall):
                self._answer(pipe, message)
            elif isinstance(message, t.Failed):
                raise _error(message.error)
            elif isinstance(message, t.Done):
                return [_error(r) if isinstance(r, DlscaleError) else r for r in message.results]

    def _answer(self, pipe: t.Pipe, call: t.BlsCall) -> None:
        """Run a BLS call of the worker's user code through the server (this thread waits)."""
        if self.caller is None:
            pipe.send(t.Answer(None, Unavailable("no server to call models")))
            return
        try:
            if call.stream:
                self._streamed(pipe, self.caller, call.request)
                return
            response = self.caller.infer(call.request)
        except DlscaleError as exc:
            pipe.send(t.Answer(None, exc))
            return
        pipe.send(t.Answer(response), response.outputs)

    def _streamed(self, pipe: t.Pipe, caller: ModelCaller, request: InferenceRequest) -> None:
        """A streamed call's responses, all of them in one answer (a worker takes one message
        per call), at most MAX_STREAMED of them."""
        responses = list(itertools.islice(caller.stream(request), MAX_STREAMED + 1))
        if len(responses) > MAX_STREAMED:
            raise Unavailable(
                f"model {request.model_name!r} streamed more than {MAX_STREAMED} responses to a "
                'model in a worker process; run the caller with isolation "thread"'
            )
        pipe.send(t.Answer(None, more=tuple(responses)), *(r.outputs for r in responses))

    def _watch(self) -> None:
        """Restart the worker each time it dies, until the model unloads."""
        while not self._closing:
            process = self._process
            if process is None:
                return
            wait([process.sentinel])
            with self._lock:
                if not self._closing and self._process is process:
                    self._restart(process)

    def _restart(self, process: Any) -> None:
        """Start a new worker in place of `process`, which died (the lock is held)."""
        process.join()
        log.warning(
            "model %r: worker process (pid %s) exited with code %s; restarting it",
            self.model.name, process.pid, process.exitcode,
        )  # fmt: skip
        self._close_pipe()
        segments.sweep(self._worker_prefix)  # what the dead worker could not unlink
        self._process = None
        try:
            self._start()
        except DlscaleError as exc:
            self._broken = f"its restart failed: {exc}"
            log.error("model %r: worker %s", self.model.name, self._broken)
            return
        log.warning(
            "model %r: worker process restarted (pid %s)", self.model.name, self._process.pid
        )

    def close(self) -> None:
        """Ask the worker to unload the model and exit; kill it if it does not.

        Called while a batch still runs (the instance's unload grace is over: a hung model), it
        kills the worker at once, whatever it holds: the batch fails and the lock comes free.
        """
        self._closing = True
        while not self._lock.acquire(timeout=KILL_POLL_S):
            process = self._process
            if process is not None and process.is_alive():
                log.warning(
                    "model %r: its worker process (pid %s) is still computing at unload: killed",
                    self.model.name, process.pid,
                )  # fmt: skip
                process.kill()
        try:
            self._stop_worker()
        finally:
            self._lock.release()
            metrics.STORE.release(self.model.name)

    def _stop_worker(self) -> None:
        """Stop the worker (Stop, then a kill when it lingers) and sweep its segments."""
        process, pipe = self._process, self._pipe
        self._process = None
        if process is None or pipe is None:
            return
        with contextlib.suppress(OSError):
            pipe.send(t.Stop())
        process.join(timeout=STOP_TIMEOUT_S)
        if process.is_alive():
            process.kill()
            process.join()
        self._close_pipe()
        segments.sweep(self._worker_prefix)  # the worker unlinks its own; a killed one cannot

    def _close_pipe(self) -> None:
        pipe, self._pipe = self._pipe, None
        if pipe is not None:
            pipe.conn.close()
            pipe.close()
        asks, self._asks = self._asks, None
        if asks is not None:
            asks.close()


def _resident_mb(pid: int) -> int:
    """The resident memory of process `pid`, in MB (0 when it is gone)."""
    try:
        pages = int(Path(f"/proc/{pid}/statm").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return 0
    return pages * os.sysconf("SC_PAGE_SIZE") // (1 << 20)


def _received(pipe: t.Pipe) -> Any:
    """The worker's next message; the custom metrics it carries join the server's."""
    message = pipe.receive()
    changed = getattr(message, "metrics", ())
    if changed:
        metrics.STORE.merge(changed)
    return message


def _error(error: DlscaleError) -> DlscaleError:
    """A worker's error, its user traceback (if any) written to this process's log."""
    if isinstance(error, UserCodeError) and error.trace:
        log_failure(error)
    return error


# -- the worker's side -----------------------------------------------------------------------------


class _PipeCaller:
    """BLS from a worker: the call goes to the server over the pipe, which answers it."""

    def __init__(self, pipe: t.Pipe) -> None:
        self._pipe = pipe
        self._lock = threading.Lock()

    def infer(self, request: InferenceRequest) -> InferenceResponse:
        answer = self._call(request, stream=False)
        if answer.response is None:
            raise BackendError("the server sent no answer to a model's call")
        return answer.response

    def stream(self, request: InferenceRequest) -> Iterator[InferenceResponse]:
        return iter(self._call(request, stream=True).more)

    def _call(self, request: InferenceRequest, stream: bool) -> t.Answer:
        with self._lock:  # one call at a time: the arena and the pipe are shared
            call = t.BlsCall(request, metrics.STORE.take_changes(), stream)
            self._pipe.send(call, request.inputs)
            answer = channel.expect(t.Answer, self._pipe.receive())
        if answer.error is not None:
            raise answer.error
        return answer


def serve(conn: Connection, asks: Connection, model: UserModel, api: Api, prefix: str) -> None:
    """The worker's main: load the model, then compute each batch the server sends; its
    segments are named under `prefix` (the server's rule, wire/segments.py). A model with its
    own is_ready answers the server's asks on `asks`, in a thread of its own."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s [worker] %(message)s")
    pipe = t.Pipe(conn, prefix)
    bind_caller(_PipeCaller(pipe))
    try:
        runner = make_runner(model, api)
    except DlscaleError as exc:
        pipe.send(t.Ready(_portable(exc)))
        return
    if runner.checks_ready:
        threading.Thread(target=_answer_asks, args=(asks, runner), daemon=True).start()
    pipe.send(t.Ready(metrics=metrics.STORE.take_changes(), checks_ready=runner.checks_ready))
    while True:
        message = pipe.receive()
        if isinstance(message, t.Stop):
            runner.close()
            pipe.close()
            return
        try:
            results = runner.run(channel.expect(t.Run, message).requests)
        except DlscaleError as exc:
            pipe.send(t.Failed(_portable(exc), metrics.STORE.take_changes()))
            continue
        done = [_portable(r) if isinstance(r, DlscaleError) else r for r in results]
        outputs = (r for r in done if not isinstance(r, DlscaleError))
        pipe.send(t.Done(done, metrics.STORE.take_changes()), *outputs)


def _answer_asks(asks: Connection, runner: Runner) -> None:
    """Answer each AskReady with the model's is_ready, until the server closes the pipe."""
    while True:
        try:
            channel.expect(t.AskReady, channel.receive(asks))
        except (EOFError, OSError):
            return
        try:
            answer = t.Readiness(runner.ready())
        except DlscaleError as exc:
            answer = t.Readiness(False, _portable(exc))
        try:
            channel.send(asks, answer)
        except OSError:
            return


def _portable(exc: DlscaleError) -> DlscaleError:
    """The error as it can cross the pipe (a DlscaleError of its text when it cannot)."""
    crossing = channel.portable(exc)
    return crossing if isinstance(crossing, DlscaleError) else DlscaleError(str(exc))
