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


def _imported_parts(path: Path, package: Path = PACKAGE) -> set[tuple[str, int]]:
    tree = ast.parse(path.read_text(), str(path))
    found: set[tuple[str, int]] = set()
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join(("dlscale", *path.relative_to(package).parts[: -node.level]))
                # `from .. import types` imports dlscale.types: the names are the modules.
                modules = [node.module] if node.module else [a.name for a in node.names]
                names = [f"{base}.{m}" for m in modules]
            elif node.module:
                names = [node.module]
        for name in names:
            parts = name.split(".")
            if parts[0] == "dlscale":
                found.add((parts[1] if len(parts) > 1 else "__init__", node.lineno))
    return found


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
#: the models it reads; the slots hold `Demand`, which the QoS scheduler above them weighs.
SERVING_LAYERS: list[set[str]] = [
    {"__init__", "observe", "policy", "classification", "versions", "instance", "regions"},
    {"slots", "warmup"},
    {"qos"},
    {"queue", "batches"},
    {"batcher", "seats", "pipeline"},
    {"runners"},
    {"served", "caller", "adapters"},
    {"memory"},
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
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            parts = node.module.split(".")
            if parts[:2] == ["dlscale", "serving"] and len(parts) > 2:
                found.add((parts[2], node.lineno))
    return found


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
