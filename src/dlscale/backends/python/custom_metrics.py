"""Custom metrics that Python models define (Triton's pb_utils.MetricFamily), held per process.

User code creates families and series through pb_utils; they land in this process's `STORE`.
A model in a worker process fills its worker's store, and the worker ships the series that
changed with each message it sends (`take_changes`); the server's store takes them in (`merge`).
The server's /metrics reads the server's store (serving/metrics/custom.py). Bounds per model
(families, series) keep a model from growing /metrics without limit: past them, creating one
more raises, in the user's code, with the bound named.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass, field, replace

COUNTER, GAUGE, HISTOGRAM = "counter", "gauge", "histogram"
KINDS = (COUNTER, GAUGE, HISTOGRAM)
#: The most families one model may create.
MAX_FAMILIES_PER_MODEL = 64
#: The most label sets (series) one model may create, over all its families.
MAX_SERIES_PER_MODEL = 1000
#: The most buckets a histogram series may have.
MAX_BUCKETS = 64
#: The most labels of one series, and the longest label value.
MAX_LABELS, MAX_LABEL_VALUE = 16, 256
#: Prometheus' metric and label names.
_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*\Z")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*\Z")
#: Prefixes of the server's own families: a model may not shadow them.
RESERVED = ("nv_", "dlscale_")

Labels = tuple[tuple[str, str], ...]


class MetricError(ValueError):
    """A family or series that cannot be made or updated; the message says why."""


@dataclass
class SeriesState:
    """One series' value: counter or gauge `value`; a histogram's bucket counts, sum, count."""

    family: str
    description: str
    kind: str
    labels: Labels
    model: str
    value: float = 0.0
    buckets: tuple[float, ...] = ()
    counts: list[int] = field(default_factory=list)  # per bucket, then +Inf; not cumulative
    total: float = 0.0  # a histogram's sum
    count: int = 0


@dataclass
class FamilyState:
    """A family: its kind and help text, the model that made it, its series by label set."""

    name: str
    description: str
    kind: str
    model: str
    series: dict[Labels, SeriesState] = field(default_factory=dict)


class MetricStore:
    """This process's custom families; every method takes the lock (user threads update)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._families: dict[str, FamilyState] = {}
        self._dirty: dict[tuple[str, Labels], SeriesState] = {}
        self._holders: dict[str, int] = {}  # loaded copies of each model (instances, versions)

    def hold(self, model: str) -> None:
        """A copy of `model` loaded: its series stay until every copy is released."""
        with self._lock:
            self._holders[model] = self._holders.get(model, 0) + 1

    def release(self, model: str) -> None:
        """A copy of `model` unloaded; the last one takes its series off (a reload's new copy
        holds before the old one releases, so they stay across it)."""
        with self._lock:
            left = self._holders.get(model, 0) - 1
            if left > 0:
                self._holders[model] = left
                return
            self._holders.pop(model, None)
            self._drop(model)

    def family(self, name: str, description: str, kind: str, model: str) -> None:
        """Make the family, or check that the one of that name has the same kind."""
        _check_name(name)
        if kind not in KINDS:
            raise MetricError(f"MetricFamily {name!r}: kind must be COUNTER, GAUGE or HISTOGRAM")
        with self._lock:
            found = self._families.get(name)
            if found is not None:
                if found.kind != kind:
                    raise MetricError(
                        f"MetricFamily {name!r} exists as a {found.kind}, not a {kind}"
                    )
                return
            owned = sum(1 for f in self._families.values() if f.model == model)
            if owned >= MAX_FAMILIES_PER_MODEL:
                raise MetricError(
                    f"model {model!r} has {owned} metric families, the most one model may "
                    f"have (MAX_FAMILIES_PER_MODEL); reuse a family with labels instead"
                )
            self._families[name] = FamilyState(name, description, kind, model)

    def series(
        self, name: str, labels: dict[str, str], model: str, buckets: tuple[float, ...] = ()
    ) -> Labels:
        """Make the series of `labels` in family `name` (or find it); its key."""
        key = _labels(name, labels)
        with self._lock:
            family = self._families[name]
            if key in family.series:
                return key
            count = sum(1 for f in self._families.values() for s in f.series.values()
                        if s.model == model)  # fmt: skip
            if count >= MAX_SERIES_PER_MODEL:
                raise MetricError(
                    f"model {model!r} has {count} metric series (label sets), the most one model "
                    "may have (MAX_SERIES_PER_MODEL); labels should not hold unbounded values"
                )
            state = SeriesState(name, family.description, family.kind, key, model)
            if family.kind == HISTOGRAM:
                state.buckets = _buckets(name, buckets)
                state.counts = [0] * (len(state.buckets) + 1)
            family.series[key] = state
            self._dirty[(name, key)] = state
        return key

    def update(self, name: str, key: Labels, how: str, amount: float) -> None:
        """Apply `how` (increment, set, observe) to the series."""
        with self._lock:
            state = self._series(name, key)
            _apply(state, how, float(amount))
            self._dirty[(name, key)] = state

    def value(self, name: str, key: Labels) -> float:
        """A counter's or gauge's value; a histogram's count of observations."""
        with self._lock:
            state = self._series(name, key)
            return float(state.count) if state.kind == HISTOGRAM else state.value

    def _series(self, name: str, key: Labels) -> SeriesState:
        family = self._families.get(name)
        state = family.series.get(key) if family is not None else None
        if state is None:  # kept by user code past its model's unload
            raise MetricError(f"metric {name!r}{dict(key)}: its model was unloaded")
        return state

    def take_changes(self) -> tuple[SeriesState, ...]:
        """Copies of the series changed since the last call (what a worker ships)."""
        with self._lock:
            changed, self._dirty = self._dirty, {}
            return tuple(_copy(s) for s in changed.values())

    def merge(self, changes: tuple[SeriesState, ...]) -> None:
        """Take a worker's changed series in; the worker already held them to the bounds."""
        with self._lock:
            for state in changes:
                family = self._families.setdefault(
                    state.family,
                    FamilyState(state.family, state.description, state.kind, state.model),
                )
                if family.kind == state.kind:
                    family.series[state.labels] = state

    def _drop(self, model: str) -> None:
        """Forget the series `model` made, and its families left empty (the lock is held)."""
        for name, family in list(self._families.items()):
            family.series = {k: s for k, s in family.series.items() if s.model != model}
            if not family.series and family.model == model:
                del self._families[name]
        self._dirty = {k: s for k, s in self._dirty.items() if s.model != model}

    def snapshot(self) -> list[FamilyState]:
        """Copies of every family and its series (what a scrape reads)."""
        with self._lock:
            return [
                FamilyState(f.name, f.description, f.kind, f.model,
                            {k: _copy(s) for k, s in f.series.items()})
                for f in self._families.values()
            ]  # fmt: skip


#: This process's store: the server's, or a worker's.
STORE = MetricStore()


def _check_name(name: str) -> None:
    if not isinstance(name, str) or not _METRIC_NAME.match(name):
        raise MetricError(f"MetricFamily name {name!r}: expected a Prometheus name [a-zA-Z_:]...")
    if name.startswith(RESERVED):
        raise MetricError(
            f"MetricFamily name {name!r}: names starting with {' or '.join(RESERVED)} are the "
            "server's own"
        )


def _labels(name: str, labels: dict[str, str]) -> Labels:
    if not isinstance(labels, dict) or len(labels) > MAX_LABELS:
        raise MetricError(f"metric {name!r}: labels must be a dict of at most {MAX_LABELS}")
    for key, value in labels.items():
        if not isinstance(key, str) or not _LABEL_NAME.match(key) or key.startswith("__"):
            raise MetricError(f"metric {name!r}: label name {key!r} is not a Prometheus name")
        if not isinstance(value, str) or len(value) > MAX_LABEL_VALUE:
            raise MetricError(
                f"metric {name!r}: label {key!r} must be a string of at most "
                f"{MAX_LABEL_VALUE} characters"
            )
    return tuple(sorted(labels.items()))


def _buckets(name: str, buckets: tuple[float, ...]) -> tuple[float, ...]:
    bounds = tuple(float(b) for b in buckets)
    if not bounds or len(bounds) > MAX_BUCKETS or list(bounds) != sorted(set(bounds)):
        raise MetricError(
            f"histogram {name!r}: buckets must be 1 to {MAX_BUCKETS} increasing bounds, "
            f"got {list(buckets)}"
        )
    return bounds


def _apply(state: SeriesState, how: str, amount: float) -> None:
    allowed = {COUNTER: ("increment",), GAUGE: ("increment", "set"), HISTOGRAM: ("observe",)}
    if how not in allowed[state.kind]:
        raise MetricError(f"metric {state.family!r}: a {state.kind} has no {how}()")
    if amount != amount:  # NaN
        raise MetricError(f"metric {state.family!r}: {how}(NaN)")
    if how == "increment":
        if state.kind == COUNTER and amount < 0:
            raise MetricError(f"counter {state.family!r}: increment by a negative value")
        state.value += amount
    elif how == "set":
        state.value = amount
    else:
        slot = next((i for i, b in enumerate(state.buckets) if amount <= b), len(state.buckets))
        state.counts[slot] += 1
        state.total += amount
        state.count += 1


def _copy(state: SeriesState) -> SeriesState:
    return replace(state, counts=list(state.counts))
