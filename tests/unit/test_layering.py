"""The package's imports follow the layering of DESIGN.md; a new edge fails here first."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "dlscale"
# `sampling` is vocabulary too: the typed generation settings every layer passes on; `native`
# the one rule on native libraries' load order (Triton before TensorFlow).
BASE = {"types", "errors", "sampling", "native", "__init__"}

#: Which top-level parts each part may import, besides itself and the base vocabulary.
ALLOWED: dict[str, set[str]] = {
    "types": set(),
    "errors": set(),
    "sampling": set(),
    "native": set(),
    "__init__": set(),
    "config": set(),
    "hardware": set(),
    # The one tensor wire codec: below everything that reads or writes tensors on the wire.
    "wire": set(),
    "backends": {"hardware", "wire"},
    # models reads Triton's config.pbtxt with the gRPC schema's ModelConfig (wire/proto).
    "models": {"backends", "wire"},
    "serving": {"models", "backends", "hardware", "wire"},
    "frontends": {"serving", "wire"},
    "server": {"serving", "frontends", "server_settings"},
    # What `dlscale serve` is asked for: groups of fields that generate its flags.
    "server_settings": {"serving", "frontends"},
    # Ray Serve deployments of the same serving core, behind the same frontends' routes.
    "scale": {"serving", "frontends", "server", "server_settings", "models", "wire"},
    "bench": {"hardware", "models", "serving", "wire"},
    "optimize": {"bench", "backends", "models"},
    "plan": {"hardware", "models", "serving"},
    "cli": {"*"},
    # The verbs' arguments by verb group, assembled by cli: parsing only, as cli.
    "cli_verbs": {"*"},
    "demo": {"*"},
    "__main__": {"*"},
}


def _part(module_path: Path, package: Path = PACKAGE) -> str:
    rel = module_path.relative_to(package)
    return rel.parts[0].removesuffix(".py")


def _module_of(base: str, name: str, package: Path) -> str:
    """`from base import name`: the module base.name when there is one, else base."""
    dotted = f"{base}.{name}"
    where = package.parent.joinpath(*dotted.split("."))
    return dotted if where.is_dir() or where.with_suffix(".py").is_file() else base


def _imported_modules(path: Path, package: Path = PACKAGE) -> set[tuple[str, int]]:
    """The dlscale modules the module at `path` imports, by dotted name, each with its line
    (absolute or relative; `from dlscale.serving import manager` imports serving.manager)."""
    found: set[tuple[str, int]] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                above = ".".join(("dlscale", *path.relative_to(package).parts[: -node.level]))
                base = f"{above}.{base}" if base else above
            names = [_module_of(base, a.name, package) for a in node.names]
        else:
            continue
        found.update((n, node.lineno) for n in names if n.split(".")[0] == "dlscale")
    return found


def _imported_parts(path: Path, package: Path = PACKAGE) -> set[tuple[str, int]]:
    return {
        (name.split(".")[1] if "." in name else "__init__", line)
        for name, line in _imported_modules(path, package)
    }


def _breaks(path: Path, package: Path = PACKAGE) -> list[str]:
    """The imports of the module at `path` that its part may not make."""
    part = _part(path, package)
    assert part in ALLOWED, f"{part} is a new top-level part: add its layer to DESIGN and here"
    allowed = ALLOWED[part]
    return [
        f"line {line}: imports dlscale.{target}"
        for target, line in sorted(_imported_parts(path, package))
        if target != part and target not in BASE and "*" not in allowed and target not in allowed
    ]


def _modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_module_imports_follow_the_layering(path: Path) -> None:
    if "grpc_gen" in path.parts:
        return  # generated stubs import only protobuf and grpc
    bad = _breaks(path)
    assert not bad, f"{path.relative_to(PACKAGE)} ({_part(path)}) breaks the layering: {bad}"


def test_the_walk_sees_a_forbidden_edge(tmp_path: Path) -> None:
    # The checker itself must catch an edge, or every test above passes vacuously. The probe
    # lives in a copy of the package's shape under tmp_path: the checkout may be read-only.
    package = tmp_path / "dlscale"
    (package / "hardware" / "nested").mkdir(parents=True)
    absolute = package / "hardware" / "probe.py"
    absolute.write_text("import numpy\nfrom dlscale.serving import manager\n")
    relative = package / "hardware" / "nested" / "probe.py"
    relative.write_text("from ... import types\nfrom ...frontends import rest\n")
    assert _breaks(absolute, package) == ["line 2: imports dlscale.serving"]
    assert _breaks(relative, package) == ["line 2: imports dlscale.frontends"]
    allowed = package / "backends" / "probe.py"
    allowed.parent.mkdir()
    allowed.write_text("from dlscale.hardware import cpu\nfrom ..wire import tensors\n")
    assert _breaks(allowed, package) == []


# -- the rooms of serving/ ---------------------------------------------------------------------

#: serving/'s rooms, lowest first: a room imports only rooms of lower layers (issue 39: nine of
#: them imported each other). Recording (observe) is at the bottom, exposition (metrics) above
#: the models it reads; the slots hold `Demand`, which the QoS scheduler above them weighs;
#: loading a version sits below the manager, which keeps the models' states. The one rule:
#: docs/architecture.md shows this table, and a test below holds it to this one.
SERVING_LAYERS: list[set[str]] = [
    {
        "__init__",
        "observe",
        "policy",
        "classification",
        "versions",
        "instance",
        "regions",
        "request_plan",
        "wake_timer",
    },
    {"slots", "warmup"},
    {"qos"},
    {"queue", "batches"},
    {"batcher", "seats", "pipeline"},
    {"runners"},
    {"served", "caller", "adapters"},
    {"memory", "loading", "dependencies"},
    {"manager"},
    {"cache", "validation", "control"},
    {"streams"},
    {"dataplane", "metrics"},
    {"host"},
]
SERVING = PACKAGE / "serving"


def _room(module_path: Path) -> str:
    return module_path.relative_to(SERVING).parts[0].removesuffix(".py")


def _rooms_imported(path: Path) -> set[tuple[str, int]]:
    return {
        (name.split(".")[2], line)
        for name, line in _imported_modules(path)
        if name.startswith("dlscale.serving.")
    }


def _layer(room: str) -> int:
    layer = next((i for i, rooms in enumerate(SERVING_LAYERS) if room in rooms), None)
    assert layer is not None, f"serving/{room} is a new room: give it a layer in SERVING_LAYERS"
    return layer


@pytest.mark.parametrize(
    "path", sorted(SERVING.rglob("*.py")), ids=lambda p: str(p.relative_to(SERVING))
)
def test_serving_rooms_import_only_lower_layers(path: Path) -> None:
    room = _room(path)
    bad = [
        f"line {line}: imports serving.{target}"
        for target, line in sorted(_rooms_imported(path))
        if target != room and _layer(target) >= _layer(room)
    ]
    assert not bad, f"serving/{path.relative_to(SERVING)} ({room}) reaches up or sideways: {bad}"


def test_every_serving_room_has_a_layer() -> None:
    rooms = {_room(p) for p in SERVING.rglob("*.py")}
    assert rooms == set().union(*SERVING_LAYERS)


ARCHITECTURE = PACKAGE.parents[1] / "docs" / "architecture.md"


def test_the_docs_show_the_serving_layers_as_the_rule_holds_them() -> None:
    # The table's rows are `| layer | rooms | what they hold |`, rooms in backquotes.
    section = ARCHITECTURE.read_text().split("### The rooms of serving/, lowest first", 1)[1]
    text = section.split("\n#", 1)[0]
    rows = [line.split("|") for line in text.splitlines() if line[:3].strip("| ").isdigit()]
    shown = [{r.strip("`/ ") for r in row[2].split(",")} for row in rows]
    assert shown == SERVING_LAYERS


def _dotted(path: Path, package: Path) -> str:
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _import_graph(folder: Path, package: Path = PACKAGE) -> dict[str, set[str]]:
    """Each module under `folder` (a package counts as its __init__), with the modules under
    `folder` that it imports."""
    top = _dotted(folder / "__init__.py", package)
    graph = {}
    for path in sorted(folder.rglob("*.py")):
        me = _dotted(path, package)
        imported = {n for n, _ in _imported_modules(path, package)}
        graph[me] = {n for n in imported if n.startswith(f"{top}.") and n != me}
    return graph


def _reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    """The modules `start` imports, directly or through others (itself only around a circle)."""
    seen: set[str] = set()
    todo = list(graph.get(start, ()))
    while todo:
        module = todo.pop()
        if module not in seen:
            seen.add(module)
            todo.extend(graph.get(module, ()))
    return seen


def _knots(graph: dict[str, set[str]]) -> list[list[str]]:
    """The groups of modules that import one another, directly or around a circle."""
    reach = {m: _reachable(graph, m) for m in graph}
    knots = {frozenset(n for n in reach[m] if m in reach[n]) for m in graph if m in reach[m]}
    return sorted(sorted(k) for k in knots)


def _by_room(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The same imports between rooms (serving's modules and subpackages): a.b.c -> c's room."""

    def room(module: str) -> str:
        return module.split(".")[2] if module.count(".") > 1 else "__init__"

    rooms: dict[str, set[str]] = {}
    for module, imported in graph.items():
        rooms.setdefault(room(module), set()).update(room(n) for n in imported)
    return {r: imported - {r} for r, imported in rooms.items()}


def test_no_serving_modules_or_rooms_import_one_another() -> None:
    # Issue 39 found one knot of eleven rooms (observe read the manager, which records into
    # observe; qos <-> slots; control <-> manager through warmup). The layers order the rooms;
    # this names any knot whole, and holds inside a room (control/, memory/, qos/, ...) too.
    graph = _import_graph(SERVING)
    assert _knots(graph) == []
    assert _knots(_by_room(graph)) == []


def test_the_knot_finder_sees_a_circle(tmp_path: Path) -> None:
    serving = tmp_path / "dlscale" / "serving"
    (serving / "room").mkdir(parents=True)
    (serving / "__init__.py").write_text("")
    (serving / "room" / "__init__.py").write_text("")
    (serving / "a.py").write_text("from dlscale.serving.room import b\n")
    (serving / "room" / "b.py").write_text("from ...serving import a\nfrom .. import c\n")
    (serving / "c.py").write_text("import dlscale.serving.d\n")
    (serving / "d.py").write_text("")
    graph = _import_graph(serving, tmp_path / "dlscale")
    assert graph["dlscale.serving.c"] == {"dlscale.serving.d"}
    assert _knots(graph) == [["dlscale.serving.a", "dlscale.serving.room.b"]]
    assert _knots(_by_room(graph)) == [["a", "room"]]
