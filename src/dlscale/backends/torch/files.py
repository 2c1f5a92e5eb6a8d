"""The model files of the torch backend: read (module and signature) and written.

- `model.aoti.pt2`: an AOTInductor package, compiled ahead of time (see aoti.py).
- `model.pt2`: a torch.export program; its signature is stored inside it (or read off the graph).
- `model.pt`: a TorchScript module; its signature must be stored inside it.
- `model.zoo`: TOML naming one of the zoo's factories (`dlscale.models.zoo.nets.<module>:<name>`)
  that builds the module from its code, with the arguments to call it with and the signature.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import json
import re
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import tomli_w
import torch
from torch import nn

from dlscale.backends.torch.aoti import PackageInfo, load_package
from dlscale.backends.torch.tensors import datatype_of, from_numpy
from dlscale.errors import ConfigError
from dlscale.types import TensorSpec

#: Name of the signature inside a .pt2 or .pt archive (their "extra files").
SIGNATURE_ENTRY = "dlscale/signature.json"
Kind = Literal["aoti", "export", "torchscript", "module"]
KINDS: dict[str, Kind] = {".pt2": "export", ".pt": "torchscript", ".zoo": "module"}


@dataclass
class LoadedModel:
    """A module ready to call on device tensors, and the tensors it takes and gives."""

    module: Callable[..., Any]
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    kind: Kind
    #: What an AOTInductor package was compiled for (None for the other kinds).
    package: PackageInfo | None = None


def load_model(path: Path, device: torch.device, *, single_threaded: bool = False) -> LoadedModel:
    """Read a model file onto `device`; raises ConfigError naming the file when it cannot.

    `single_threaded`: an AOTInductor package's runner without its own locking (CUDA graphs).
    """
    kind = "aoti" if path.name.endswith(".aoti.pt2") else KINDS.get(path.suffix)
    if kind is None:
        raise ConfigError(f"{path}: the torch backend reads {sorted(KINDS)} and .aoti.pt2 files")
    if not path.is_file():
        raise ConfigError(f"{path}: no such file")
    try:
        if kind == "aoti":
            runner, info = load_package(path, device, single_threaded=single_threaded)
            return LoadedModel(runner, info.inputs, info.outputs, "aoti", info)
        if kind == "export":
            return _load_exported(path, device)
        if kind == "torchscript":
            return _load_torchscript(path, device)
        return _load_module(path, device)
    except ConfigError:
        raise
    except Exception as exc:  # torch raises many untyped errors for a bad archive
        raise ConfigError(f"{path}: torch cannot load it: {exc}") from exc


def _load_exported(path: Path, device: torch.device) -> LoadedModel:
    _register_quantized_ops()
    extra = {SIGNATURE_ENTRY: ""}
    program = torch.export.load(path, extra_files=extra)
    if device.type != "cpu":
        # An exported graph records the device of the tensors it creates; this pass rewrites it.
        from torch.export.passes import move_to_device_pass

        program = move_to_device_pass(program, device)
    if extra[SIGNATURE_ENTRY]:
        inputs, outputs = _parse_signature(extra[SIGNATURE_ENTRY], path)
    else:
        inputs, outputs = _graph_signature(program)
    return LoadedModel(program.module(), inputs, outputs, "export")


def _register_quantized_ops() -> None:
    """Register the quantized_decomposed ops that INT8 (PT2E) programs call.

    A program is deserialized op by op, and these ops exist only once the torch module that
    defines them has been imported (the quantizer's process had; a server's has not).
    """
    with contextlib.suppress(ImportError):
        import torch.ao.quantization.fx._decomposed  # noqa: F401


def _load_torchscript(path: Path, device: torch.device) -> LoadedModel:
    extra = {SIGNATURE_ENTRY: ""}
    module = torch.jit.load(  # type: ignore[no-untyped-call]
        str(path), map_location=device, _extra_files=extra
    )
    if not extra[SIGNATURE_ENTRY]:
        raise ConfigError(
            f"{path}: a TorchScript file says nothing of its tensors' names and types; save it "
            "with dlscale.backends.torch.files.save_torchscript, which stores them inside"
        )
    inputs, outputs = _parse_signature(extra[SIGNATURE_ENTRY], path)
    return LoadedModel(module.eval(), inputs, outputs, "torchscript")


def _load_module(path: Path, device: torch.device) -> LoadedModel:
    try:
        spec = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    factory = _import_factory(spec.get("factory"), path)
    built = _call_factory(factory, spec.get("kwargs", {}), path)
    # The zoo's factories return (module, metadata); a bare module is accepted too.
    module = built[0] if isinstance(built, tuple) else built
    if not isinstance(module, nn.Module):
        raise ConfigError(
            f"{path}: factory {spec['factory']!r} returned {type(module).__name__}, not a "
            "torch.nn.Module (or a tuple whose first item is one)"
        )
    inputs, outputs = _parse_signature(json.dumps(spec), path)
    return LoadedModel(module.eval().to(device), inputs, outputs, "module")


#: The package whose factories a model.zoo may name: the `make` and `make_*` functions of the
#: zoo's own network modules. A model.zoo may come from a client (a load request's upload), so
#: it may not name any other importable code.
ZOO_NETS = "dlscale.models.zoo.nets"
_FACTORY = re.compile(rf"^{re.escape(ZOO_NETS)}\.[a-z][a-z0-9_]*:make(_[a-z0-9_]+)?$")


def _import_factory(name: object, path: Path) -> Callable[..., Any]:
    """The zoo factory `name` names; ConfigError, before anything is imported, for any other."""
    if not isinstance(name, str) or not _FACTORY.match(name):
        raise ConfigError(
            f"{path}: field 'factory': {name!r} is not one of the zoo's factories "
            f"('{ZOO_NETS}.<module>:make...'); serve other code as a model.pt2 from the "
            "repository or as a Python model"
        )
    module_name, attribute = name.split(":", 1)
    try:
        factory = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"{path}: field 'factory': cannot import {name!r}: {exc}") from None
    # A function the zoo module defines, not a name it imported (`torch`, say).
    if not inspect.isfunction(factory) or factory.__module__ != module_name:
        raise ConfigError(f"{path}: field 'factory': {name!r} is not a function of the zoo")
    return factory


def _call_factory(factory: Callable[..., Any], kwargs: object, path: Path) -> Any:
    """The factory called with the file's arguments, which must be ones it takes."""
    if not isinstance(kwargs, dict):
        raise ConfigError(f"{path}: field 'kwargs': expected a table of arguments")
    try:
        inspect.signature(factory).bind(**kwargs)
    except TypeError as exc:
        raise ConfigError(f"{path}: field 'kwargs': {exc}") from None
    return factory(**kwargs)


def _parse_signature(text: str, source: Path) -> tuple[list[TensorSpec], list[TensorSpec]]:
    data = json.loads(text)
    sides = []
    for which in ("inputs", "outputs"):
        entries = data.get(which)
        if not isinstance(entries, list) or not entries:
            raise ConfigError(f"{source}: signature field '{which}': expected a list of tensors")
        try:
            sides.append([TensorSpec.from_dict(e) for e in entries])
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(
                f"{source}: signature field '{which}': each tensor needs name, datatype and "
                f"shape ({exc})"
            ) from None
    return sides[0], sides[1]


def _graph_signature(
    program: torch.export.ExportedProgram,
) -> tuple[list[TensorSpec], list[TensorSpec]]:
    """Inputs named as forward's arguments; outputs "output" or "output_<i>"."""
    user_inputs = set(program.graph_signature.user_inputs)
    inputs = [
        _spec_of(node.name, node.meta["val"])
        for node in program.graph.nodes
        if node.op == "placeholder" and node.name in user_inputs
    ]
    output_node = next(n for n in program.graph.nodes if n.op == "output")
    values = [arg.meta["val"] for arg in output_node.args[0]]
    names = ["output"] if len(values) == 1 else [f"output_{i}" for i in range(len(values))]
    return inputs, [_spec_of(n, v) for n, v in zip(names, values, strict=True)]


def _spec_of(name: str, value: torch.Tensor) -> TensorSpec:
    # Symbolic sizes (the batch dim exported as dynamic) are variable: -1.
    shape = tuple(d if isinstance(d, int) else -1 for d in value.shape)
    return TensorSpec(name, datatype_of(value.dtype), shape)


# -- writing ---------------------------------------------------------------------------------------


def signature_json(inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec]) -> str:
    """The signature as stored in a model file (shapes with the batch dim, -1 variable)."""
    return json.dumps(
        {"inputs": [s.to_dict() for s in inputs], "outputs": [s.to_dict() for s in outputs]}
    )


def save_exported(
    module: nn.Module,
    example: Mapping[str, np.ndarray],
    inputs: Sequence[TensorSpec],
    outputs: Sequence[TensorSpec],
    path: Path,
) -> None:
    """torch.export `module` with dim 0 of every input dynamic, and save it with its signature.

    `example` holds a batch of at least two rows keyed by input name, in forward's order.
    """
    args = tuple(from_numpy(example[s.name]) for s in inputs)
    batch = torch.export.Dim("batch")
    dynamic = tuple({0: batch} for _ in args)
    with torch.no_grad():
        program = torch.export.export(module.eval(), args, dynamic_shapes=dynamic)
    torch.export.save(program, path, extra_files={SIGNATURE_ENTRY: signature_json(inputs, outputs)})


def save_torchscript(
    module: nn.Module,
    example: Mapping[str, np.ndarray],
    inputs: Sequence[TensorSpec],
    outputs: Sequence[TensorSpec],
    path: Path,
) -> None:
    """Trace `module` into TorchScript on `example` and save it with its signature."""
    args = tuple(from_numpy(example[s.name]) for s in inputs)
    with torch.no_grad():
        traced = torch.jit.trace(module.eval(), args)  # type: ignore[no-untyped-call]
    extra = {SIGNATURE_ENTRY: signature_json(inputs, outputs)}
    torch.jit.save(traced, str(path), _extra_files=extra)


def write_module_spec(
    path: Path,
    factory: str,
    kwargs: Mapping[str, Any],
    inputs: Sequence[TensorSpec],
    outputs: Sequence[TensorSpec],
) -> None:
    """Write a `model.zoo` file: the factory that builds the module, its arguments, its tensors."""
    spec = {
        "factory": factory,
        "kwargs": dict(kwargs),
        "inputs": [s.to_dict() for s in inputs],
        "outputs": [s.to_dict() for s in outputs],
    }
    path.write_text(tomli_w.dumps(spec))
