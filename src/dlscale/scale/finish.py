"""Finish-first routing: each request goes to the replica where it would finish first.

HAProxy places each request of its `rest` and `grpc` backends by a rule it runs in Lua
(scale/finish.lua): per replica it keeps a batch clock (the batch it computes, when that batch
ends, the requests waiting behind it) from the requests it sends and the answers it sees, and
sends a request where the time left on the running batch plus one batch per batch's worth of
requests waiting, plus its own, is least. The batch time and batch size of each replica come
from here: the replicas' measured times (scale/weights.py), written into a map over HAProxy's
runtime API as they change. Until every replica in service is measured, weighted leastconn
routes (the map holds "-" for one not measured yet).

Why not leastconn's counts alone: HAProxy's leastconn sends to an idle replica first, whatever
its weight, so a replica three times slower takes the next request whenever it is idle, even
when the fastest would finish it in a third of the time; and a count cannot tell a replica
whose batch is about to end from one whose batch just began. BENCHMARKS.md ("Finish first")
has the simulation and the measured run.
"""

from __future__ import annotations

from collections.abc import Mapping
from importlib import resources
from pathlib import Path

#: The variable finish.lua sets to the chosen server's name (`use-server` reads it).
SERVER_VAR = "txn.dlscale_server"
#: The map's value for a member not measured yet.
UNMEASURED = "-"


def lua_path(workdir: Path) -> Path:
    """Where the router's copy of the rule lives."""
    return workdir / "finish.lua"


def map_path(workdir: Path) -> Path:
    """The map of each member's batch clock (server name to "seconds:rows")."""
    return workdir / "clocks.map"


def write(workdir: Path) -> None:
    """The Lua rule, told where its map is, and the map, empty, where HAProxy loads them."""
    rule = resources.files("dlscale.scale").joinpath("finish.lua").read_text()
    lua_path(workdir).write_text(f'local FINISH_MAP = "{map_path(workdir)}"\n{rule}')
    map_path(workdir).write_text("")


def global_lines(workdir: Path) -> list[str]:
    """HAProxy's `global` lines loading the rule."""
    return [f"  lua-load {lua_path(workdir)}"]


def backend_lines() -> list[str]:
    """A backend's rules: the rule picks a server, `use-server` sends the request there (a
    server that is down is passed over); with no pick (a replica unmeasured, or a failure in
    the rule) the backend's leastconn decides."""
    return [
        "  http-request lua.dlscale_pick",
        f"  use-server %[var({SERVER_VAR})] if {{ var({SERVER_VAR}) -m found }}",
        "  http-response lua.dlscale_done",
    ]


def clock(seconds: float, rows: int) -> str:
    """A member's value in the map: its batch time and the most rows of a batch."""
    return f"{seconds:.6f}:{max(1, rows)}"


def map_commands(path: Path, held: Mapping[str, object], wanted: Mapping[str, object]) -> list[str]:
    """Runtime-API commands taking a map from `held` to `wanted` (by key; None removes a key's
    entry, a key not named keeps it). `add map` would add a second entry for a key already
    there: `set map`."""
    commands = []
    for name, value in wanted.items():
        if value is None:
            if name in held:
                commands.append(f"del map {path} {name}")
        elif name not in held:
            commands.append(f"add map {path} {name} {value}")
        elif held[name] != value:
            commands.append(f"set map {path} {name} {value}")
    return commands
