"""`dlscale serve REPO --device-workers SPEC`: one server process per device behind one port.

The command starts HAProxy on the user's --host and ports (scale/haproxy.py) and, for each
device (scale/devices.py), a whole `dlscale serve` on 127.0.0.1 port 0 that sees that device
only (scale/child.py). It supervises them: a worker that dies is out of the router at once
(HAProxy's own check marks it down sooner, and resends the requests it held), started again,
and back in rotation once loaded. The metrics port serves every worker's metrics in one view,
each sample labelled with its worker's `device`. No Ray here: this is the single-host fleet.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import signal
import threading
import time
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from dlscale.errors import ConfigError, DlscaleError
from dlscale.frontends.api_key import metrics_guard
from dlscale.scale.child import Endpoint, ServerChild
from dlscale.scale.connections import ConnectionRules, behind_router
from dlscale.scale.devices import Device, Host, devices_for
from dlscale.scale.haproxy import HaproxyRouter, Member
from dlscale.scale.prefix import Routing, routes_of
from dlscale.scale.settings import BOTH_FLEETS
from dlscale.scale.weights import WEIGH_S, Weigher, read_each
from dlscale.server import ServerSettings, settings_from
from dlscale.serving.control.mode import ModelControl
from dlscale.serving.metrics.exposition import MetricsServer

log = logging.getLogger("dlscale.scale")
LOOPBACK = "127.0.0.1"
#: Seconds between two looks at the workers' processes.
WATCH_S = 0.1
#: Seconds a worker that fails to start again waits before the next try (doubling up to the max).
RETRY_S, RETRY_MAX_S = 1.0, 30.0
#: A worker that dies sooner than this after it was ready is in a crash loop: it waits as one that
#: failed to start does, instead of being spawned again at once.
STABLE_S = 5.0
#: Seconds a worker's metrics port gets to answer a scrape of the fleet's.
SCRAPE_TIMEOUT_S = 5.0


def refuse_unshared(settings: ServerSettings) -> None:
    """A ConfigError for what cannot work when each request may reach a different process."""
    why = None
    if settings.shared_memory.allow_client_shm:
        why = (
            "--allow-client-shm: a client's region is registered with the one worker its "
            "registration reached, and its next request may reach another"
        )
    elif settings.models.model_control in (ModelControl.EXPLICIT, ModelControl.ON_DEMAND):
        why = (
            f"--model-control {settings.models.model_control}: a load or unload over the API "
            "reaches one worker only; use none (every model) or poll (each worker follows the "
            "repository)"
        )
    elif settings.security.tls_cert is not None:
        why = "--tls-cert: the router speaks plain text to the workers; put TLS in front of it"
    elif settings.network.http_port is None:
        why = "--http-port -1: the router checks each worker's REST /v2/health/ready"
    if why is not None:
        raise ConfigError(f"{why} (not available with --device-workers)")


def worker_settings(settings: ServerSettings, device: Device) -> ServerSettings:
    """A worker's settings: the user's, on loopback port 0 (its own metrics port too), a trace
    file of its own, and no per-peer cap (the router holds each client to it,
    scale/connections.py); --http-workers carries over (each worker has its REST processes)."""
    network, seen = settings.network, settings.observation
    trace = seen.trace_file
    if trace is not None:  # two processes appending JSON to one file would interleave it
        trace = trace.with_name(f"{trace.stem}.{device.name}{trace.suffix}")
    return behind_router(settings).replace(
        host=LOOPBACK,
        http_port=0,
        grpc_port=None if network.grpc_port is None else 0,
        metrics_port=None if network.metrics_port is None else 0,
        device_workers=None,
        trace_file=trace,
    )


@dataclass
class Worker:
    """One device's server process, where it serves, and how often it was started again."""

    device: Device
    child: ServerChild
    endpoint: Endpoint | None = None
    restarts: int = 0
    #: Waiting for a spawned process to load its models: the watcher leaves it alone.
    starting: bool = False
    #: When (monotonic seconds) a worker that is down may be spawned again, and the wait after.
    next_try: float = 0.0
    wait_s: float = RETRY_S
    #: When (monotonic seconds) it was last ready.
    ready_at: float = 0.0


class LocalFleet:
    """The router and one worker per device: start, supervise (restart the dead), stop.

    Every worker is spawned by the thread that calls `start` and `watch` (a child stops with the
    thread that spawned it, scale/child.py); waiting for one to load runs in threads of its own.
    """

    def __init__(
        self,
        settings: ServerSettings,
        devices: Sequence[Device],
        env: Mapping[str, str] | None = None,
    ) -> None:
        refuse_unshared(settings)
        self.settings = settings
        base = dict(os.environ if env is None else env)
        self.workers = [
            Worker(d, ServerChild(worker_settings(settings, d), d.env(base))) for d in devices
        ]
        network = settings.network
        self.router = HaproxyRouter(
            network.host,
            network.http_port or 0,
            network.grpc_port,
            routing=Routing.of(settings),
            rules=ConnectionRules.of(settings),
        )
        self.metrics: MetricsServer | None = None
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self.weigher = Weigher()
        key = settings.security.key
        #: What the supervisor sends to its workers' guarded routes (the API key, if any).
        self.headers = {} if key is None else {"Authorization": f"Bearer {key.value}"}

    def start(self, timeout_s: float = 300.0) -> None:
        """Start the router and every worker (at once); raise, all stopped, if one cannot."""
        try:
            self.router.start()
            for worker in self.workers:
                worker.child.spawn()
            with ThreadPoolExecutor(len(self.workers)) as pool:
                ends = list(pool.map(lambda w: w.child.ready(timeout_s), self.workers))
            for worker, end in zip(self.workers, ends, strict=True):
                worker.endpoint, worker.ready_at = end, time.monotonic()
            # The metrics page first: once the router says ready, every port of the fleet is up.
            self._serve_metrics()
            self._sync()
        except BaseException:
            self.stop()
            raise
        log.info("devices: %s", "; ".join(map(_described, self.workers)))
        ports = " ".join(f"{k} {self.router.host}:{v}" for k, v in self.ports.items())
        log.info("serving on %s through the router", ports)

    @property
    def ports(self) -> dict[str, int]:
        """The fleet's ports: the router's (http, grpc) and the merged metrics one."""
        found = dict(self.router.ports)
        if self.metrics is not None:
            found["metrics"] = self.metrics.port
        return found

    def watch(self, stop: threading.Event) -> None:
        """Until `stop` is set: take a dead worker out of the router and start it again, and
        weigh the live ones by the work they measured (scale/weights.py); under poll control,
        follow the repository's [routing] as the workers follow its models."""
        weighed = routed = time.monotonic()
        polling = self.settings.models.model_control is ModelControl.POLL
        while not stop.wait(WATCH_S):
            for worker in self.workers:
                self._look_after(worker)
            if time.monotonic() - weighed >= WEIGH_S:
                weighed = time.monotonic()
                self._weigh()
            if polling and time.monotonic() - routed >= self.settings.models.poll_interval_s:
                routed = time.monotonic()
                self._route()

    def _route(self) -> None:
        try:
            routes = routes_of(self.settings.repository)
        except DlscaleError as exc:  # the folder went away: the workers say so too
            log.warning("routing: the repository cannot be read: %s", exc)
            return
        with self._lock:
            if not self._stopping.is_set():
                self.router.route(routes)

    def _weigh(self) -> None:
        live = {w.device.name: (e.host, e.http_port) for w, e in self.live()}
        readings = read_each(live, self.headers)
        with self._lock:
            if not self._stopping.is_set():
                self.router.weigh(self.weigher.weights(readings), self.weigher.clocks())

    def _look_after(self, worker: Worker) -> None:
        with self._lock:
            if worker.starting or (worker.endpoint is not None and worker.child.alive()):
                return
            died = worker.endpoint is not None
            worker.endpoint = None
        if died:
            self._sync()
            code = worker.child.process.poll() if worker.child.process else None
            log.warning(
                "worker %s (pid %s) exited with %s: starting it again",
                worker.device.name, worker.child.pid, code,
            )  # fmt: skip
            if time.monotonic() - worker.ready_at < STABLE_S:
                self._defer(worker)
            else:
                worker.next_try, worker.wait_s = 0.0, RETRY_S
        if time.monotonic() < worker.next_try:
            return
        worker.child = ServerChild(worker.child.settings, worker.child.env)
        worker.child.spawn()
        worker.restarts += 1
        worker.starting = True
        threading.Thread(target=self._await, args=(worker,), daemon=True).start()

    def _await(self, worker: Worker) -> None:
        """Wait for a spawned worker; in rotation once loaded, else tried again later."""
        try:
            endpoint = worker.child.ready()
        except DlscaleError as exc:
            log.error("worker %s did not start again: %s", worker.device.name, exc)
            with self._lock:
                self._defer(worker)
                worker.starting = False
            return
        with self._lock:
            worker.endpoint, worker.starting = endpoint, False
            worker.ready_at = time.monotonic()
        self._sync()
        log.info("worker %s is back (restart %d): %s", worker.device.name, worker.restarts,
                 _described(worker))  # fmt: skip

    @staticmethod
    def _defer(worker: Worker) -> None:
        """Spawn it again after its wait, and wait twice as long the next time (up to a max)."""
        worker.next_try = time.monotonic() + worker.wait_s
        worker.wait_s = min(2 * worker.wait_s, RETRY_MAX_S)

    def _sync(self) -> None:
        with self._lock:
            members = [Member.of(w.device.name, w.endpoint) for w in self.workers if w.endpoint]
            if not self._stopping.is_set():
                self.router.sync(members)

    def _serve_metrics(self) -> None:
        port = self.settings.network.metrics_port
        if port is None:
            return
        guard = metrics_guard(self.settings.security.key)
        self.metrics = MetricsServer(FleetMetrics(self), self.settings.network.host, port, guard)
        self.metrics.start()

    def live(self) -> list[tuple[Worker, Endpoint]]:
        """The workers serving now, with their endpoints."""
        with self._lock:
            return [(w, w.endpoint) for w in self.workers if w.endpoint is not None]

    def stop(self) -> None:
        """Stop the router (no new request), then every worker within its grace, at once."""
        self._stopping.set()
        self.router.stop()
        if self.metrics is not None:
            self.metrics.stop()
        grace = self.settings.lifecycle.grace_s
        with ThreadPoolExecutor(max(1, len(self.workers))) as pool:
            list(pool.map(lambda w: w.child.stop(grace), self.workers))


def _described(worker: Worker) -> str:
    end, device = worker.endpoint, worker.device
    shown = f" ({device.visible})" if device.visible else ""
    where = f"pid {end.pid} http {end.host}:{end.http_port}" if end else "starting"
    return f"{device.name}{shown}: {where}"


class FleetMetrics:
    """A Collector: every live worker's metrics with its `device` label, and the fleet's own."""

    def __init__(self, fleet: LocalFleet) -> None:
        self.fleet = fleet

    def collect(self) -> Iterable[Metric]:
        """Scrape each worker now (one that does not answer is left out), then merge."""
        texts = {}
        for worker, end in self.fleet.live():
            if end.metrics_port is None:
                continue
            url = f"http://{end.host}:{end.metrics_port}/metrics"
            request = urllib.request.Request(url, headers=self.fleet.headers)
            try:
                with urllib.request.urlopen(request, timeout=SCRAPE_TIMEOUT_S) as answer:
                    texts[worker.device.name] = answer.read().decode()
            except OSError as exc:  # it died between the look and the scrape
                log.debug("metrics of worker %s: %s", worker.device.name, exc)
        yield from merged(texts)
        yield from self._own()

    def _own(self) -> Iterable[Metric]:
        up = GaugeMetricFamily(
            "dlscale_device_worker_up",
            "1 while the device's worker serves (its pid labelled), 0 while it starts",
            labels=["device", "pid"],
        )
        restarts = CounterMetricFamily(
            "dlscale_device_worker_restarts",
            "times the device's worker was started again after it died",
            labels=["device"],
        )
        for worker in self.fleet.workers:
            end = worker.endpoint
            up.add_metric([worker.device.name, str(end.pid) if end else ""], 1.0 if end else 0.0)
            restarts.add_metric([worker.device.name], float(worker.restarts))
        return [up, restarts]


def merged(texts: Mapping[str, str]) -> list[Metric]:
    """One family per name over the workers' texts, each sample labelled with its `device`;
    every sample keeps its name (Triton's counters have no `_total`)."""
    families: dict[str, Metric] = {}
    for device, text in texts.items():
        counters = set(_COUNTER.findall(text))
        for family in text_string_to_metric_families(text):
            name, samples = _as_written(family, counters)
            into = families.get(name)
            if into is None:
                into = families[name] = Metric(name, family.documentation, family.type)
            into.samples += [s._replace(labels={**s.labels, "device": device}) for s in samples]
    return list(families.values())


_COUNTER = re.compile(r"^# TYPE (\S+) counter$", re.M)


def _as_written(family: Metric, counters: set[str]) -> tuple[str, list[Sample]]:
    """The family's name and samples as the text wrote them: the parser names a counter's
    samples NAME_total, whether the text had the suffix or not."""
    if family.type != "counter":
        return family.name, list(family.samples)
    if family.name not in counters:  # written NAME_total: samples as parsed
        return family.name + "_total", list(family.samples)
    suffix = len("_total")
    bare = [s._replace(name=s.name[:-suffix]) if s.name == family.name + "_total" else s
            for s in family.samples]  # fmt: skip
    return family.name, bare


def serve_on_devices(args: argparse.Namespace, detect: Callable[[], Host]) -> int:
    """`dlscale serve REPO --device-workers SPEC`: serve until SIGINT or SIGTERM."""
    if getattr(args, "ray", False):
        raise ConfigError(BOTH_FLEETS)
    settings = settings_from(args)
    spec = settings.network.device_workers
    assert spec is not None
    fleet = LocalFleet(settings, devices_for(spec, detect()))  # refusals before anything starts
    seen = settings.observation
    logging.basicConfig(
        level=seen.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        filename=seen.log_file,  # the workers append there too; None: stderr
    )
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    fleet.start()
    try:
        fleet.watch(stop)
        log.info("stopping: the router, then the workers (requests in flight finish)")
    finally:
        fleet.stop()
    return 0
