"""The config Triton's `auto_complete_config` completes: pb_utils.ModelConfig (the module
triton_python_backend_utils re-exports it; backends/python/autocomplete.py runs the method)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any


class ModelConfig:
    """The config `auto_complete_config` completes (Triton's pb_utils.ModelConfig), in
    Triton's JSON form; each setter refuses a value that contradicts the config.pbtxt."""

    def __init__(self, config: Mapping[str, Any]) -> None:
        self._config: dict[str, Any] = json.loads(json.dumps(dict(config)))

    def as_dict(self) -> dict[str, Any]:
        """The config as it stands."""
        return self._config

    def set_max_batch_size(self, max_batch_size: int) -> None:
        """Set max_batch_size (a config.pbtxt's non-zero value must agree)."""
        if isinstance(max_batch_size, bool) or not isinstance(max_batch_size, int):
            raise ValueError(f"set_max_batch_size: expected an int, got {max_batch_size!r}")
        if max_batch_size < 0:
            raise ValueError(f"set_max_batch_size: must not be negative, got {max_batch_size}")
        given = int(self._config.get("max_batch_size", 0) or 0)
        if given and given != max_batch_size:
            raise ValueError(
                f"set_max_batch_size({max_batch_size}): the config sets max_batch_size {given}"
            )
        self._config["max_batch_size"] = max_batch_size

    def set_dynamic_batching(self) -> None:
        """Turn dynamic batching on (kept as the config gives it, if it does)."""
        self._config.setdefault("dynamic_batching", {})

    def set_model_transaction_policy(self, policy: Mapping[str, Any]) -> None:
        """Set the transaction policy ({"decoupled": bool})."""
        unknown = set(policy) - {"decoupled"}
        if unknown:
            raise ValueError(f"set_model_transaction_policy: unknown keys {sorted(unknown)}")
        self._config["model_transaction_policy"] = {"decoupled": bool(policy.get("decoupled"))}

    def add_input(self, input: Mapping[str, Any]) -> None:
        """Add an input ({name, data_type, dims[, optional]}), or fill in the one of its name."""
        self._add("input", input)

    def add_output(self, output: Mapping[str, Any]) -> None:
        """Add an output ({name, data_type, dims}), or fill in the one of its name."""
        self._add("output", output)

    def _add(self, role: str, tensor: Mapping[str, Any]) -> None:
        if not isinstance(tensor, Mapping) or not isinstance(tensor.get("name"), str):
            raise ValueError(f"add_{role}: expected a dict with a 'name', got {tensor!r}")
        entries = self._config.setdefault(role, [])
        found = by_name(entries, tensor["name"])
        if found is None:
            entries.append(dict(tensor))
            return
        for key, value in tensor.items():
            mine = found.get(key)
            if key == "dims" and mine is not None:
                mine = [int(d) for d in mine]
            if mine not in (None, [], "", "TYPE_INVALID") and mine != value:
                raise ValueError(
                    f"add_{role}({tensor['name']!r}): {key} {value!r} contradicts the config's "
                    f"{mine!r}"
                )
            found[key] = value


def by_name(entries: list[dict[str, Any]], name: str) -> dict[str, Any] | None:
    """The entry of that name among a config's inputs or outputs, or None."""
    return next((e for e in entries if e.get("name") == name), None)
