"""What the property-based fuzz tests share: their bounded settings and any JSON value."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st


def bounded(examples: int) -> Any:
    """Hypothesis settings for a fuzz that must take seconds, not minutes: `examples` cases,
    no per-example deadline (a loaded machine), no example database between runs."""
    return settings(
        max_examples=examples,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )


#: Any JSON value, integers beyond 64 bits included (a client may send them).
JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=20,
)
