"""AOTInductor packages: a model compiled ahead of time into `model.aoti.pt2`, loaded in seconds.

`torch._inductor.aoti_compile_and_package` compiles a torch.export program (kernels, weights and
a C++ runner) into a .pt2 archive; `aoti_load_package` maps it back without compiling anything.
The program packaged is the backend's `Boundary` (the model with its input and output
conversions), exported with a dynamic batch dimension, so one package serves every batch size
up to its maximum. What the backend needs to serve it rides in the package's AOTInductor
metadata: the signature, the precision and layout it was compiled with, the batch range, the
device kind and the FLOPs of one sample.
"""

from __future__ import annotations

import json
import zipfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import torch

from dlscale.errors import ConfigError
from dlscale.types import TensorSpec

#: The file name of a package in a version folder (AOTInductor insists on the .pt2 suffix).
PACKAGE_NAME = "model.aoti.pt2"
_PREFIX = "dlscale."


@dataclass(frozen=True)
class PackageInfo:
    """What a package was compiled for and how to call it."""

    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    #: "cpu" or "cuda": the kind of device its kernels run on.
    device: str
    precision: str
    channels_last: bool
    #: The largest batch it takes (its smallest is 1).
    max_batch: int
    #: torch.compile mode its kernels were generated under ("default", "max-autotune"...).
    mode: str = "default"
    freezing: bool = False
    flops_per_sample: float | None = None
    #: torch.__version__ that compiled it: the runner's ABI is that release's ("" when unknown).
    torch_version: str = ""
    #: "9.0" for an H100: the CUDA compute capability its kernels target (None on the CPU).
    capability: str | None = None

    def metadata(self) -> dict[str, str]:
        """The info as AOTInductor metadata (string values only)."""
        values: dict[str, Any] = {f.name: getattr(self, f.name) for f in fields(self)}
        values["inputs"] = [s.to_dict() for s in self.inputs]
        values["outputs"] = [s.to_dict() for s in self.outputs]
        return {_PREFIX + k: json.dumps(v) for k, v in values.items()}

    @classmethod
    def from_metadata(cls, metadata: Mapping[str, str], source: Path) -> PackageInfo:
        """The info read back from a package's metadata; ConfigError when it has none."""
        try:
            raw = {
                k[len(_PREFIX) :]: json.loads(v) for k, v in metadata.items() if k[:8] == _PREFIX
            }
            sides = [[TensorSpec.from_dict(e) for e in raw[s]] for s in ("inputs", "outputs")]
            return cls(
                inputs=sides[0],
                outputs=sides[1],
                device=str(raw["device"]),
                precision=str(raw["precision"]),
                channels_last=bool(raw["channels_last"]),
                max_batch=int(raw["max_batch"]),
                mode=str(raw.get("mode", "default")),
                freezing=bool(raw.get("freezing", False)),
                flops_per_sample=raw.get("flops_per_sample"),
                torch_version=str(raw.get("torch_version", "")),
                capability=raw.get("capability"),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(
                f"{source}: an AOTInductor package without dlscale's metadata ({exc}); write it "
                "with dlscale.backends.torch.aoti.build_package"
            ) from None


def build_package(
    program: torch.nn.Module,
    example: Sequence[torch.Tensor],
    info: PackageInfo,
    path: Path,
    inductor_configs: Mapping[str, Any] | None = None,
) -> Path:
    """Export `program` (batch dim dynamic, 1 to info.max_batch) and compile it into `path`.

    `program`'s forward takes its inputs as `*args`, as the Boundary's does.

    `example` holds one batch of at least two rows on the package's device, in the program's
    input order. Compiling takes as long as torch.compile of the same model (a minute or more
    for resnet50); loading the result takes seconds.
    """
    from torch._inductor import aoti_compile_and_package

    if not path.name.endswith(".pt2"):
        raise ConfigError(f"{path}: an AOTInductor package must end in .pt2")
    batch = torch.export.Dim("batch", min=1, max=info.max_batch)
    # The Boundary's forward takes *args: its dynamic shapes are one tuple, for `args`.
    dynamic = (tuple({0: batch} for _ in example),)
    configs = dict(inductor_configs or {})
    configs["aot_inductor.metadata"] = info.metadata()
    with torch.no_grad():
        # No .eval(): the model is in eval mode already, and an exported one refuses train().
        exported = torch.export.export(program, tuple(example), dynamic_shapes=dynamic)
        aoti_compile_and_package(exported, package_path=str(path), inductor_configs=configs)
    return path


def read_info(path: Path) -> PackageInfo:
    """A package's info read from its archive, without loading its compiled code."""
    try:
        with zipfile.ZipFile(path) as archive:
            names = [n for n in archive.namelist() if n.endswith("_metadata.json")]
            for name in names:
                metadata = json.loads(archive.read(name))
                if any(str(k).startswith(_PREFIX) for k in metadata):
                    return PackageInfo.from_metadata(metadata, path)
    except (OSError, zipfile.BadZipFile, json.JSONDecodeError) as exc:
        raise ConfigError(f"{path}: not an AOTInductor package: {exc}") from None
    raise ConfigError(
        f"{path}: no dlscale metadata in this AOTInductor package; write it with "
        "dlscale.backends.torch.aoti.build_package"
    )


def device_capability(device: torch.device) -> str | None:
    """The compute capability of a CUDA device as "major.minor"; None for any other device."""
    if device.type != "cuda":
        return None
    major, minor = torch.cuda.get_device_capability(device)
    return f"{major}.{minor}"


def check_compatible(info: PackageInfo, device: torch.device, path: Path) -> None:
    """Refuse a package built for another device kind, torch release or compute capability.

    AOTInductor itself only warns on a mismatch and then fails in the kernels (or computes
    wrong answers), so the check comes first, with the fix in the message.
    """
    rebuild = "rebuild the package on and for the machine that serves it (dlscale optimize)"
    if info.device != device.type:
        raise ConfigError(
            f"{path}: compiled for {info.device}, asked to run on {device}; {rebuild}"
        )
    if info.torch_version != torch.__version__:
        built = info.torch_version or "an unrecorded torch release"
        raise ConfigError(
            f"{path}: compiled by torch {built}, this process runs torch {torch.__version__}; "
            f"{rebuild}"
        )
    here = device_capability(device)
    if info.capability != here:
        raise ConfigError(
            f"{path}: compiled for compute capability {info.capability}, device {device} has "
            f"{here}; {rebuild}"
        )


def load_package(
    path: Path, device: torch.device, *, single_threaded: bool
) -> tuple[Callable[..., list[torch.Tensor]], PackageInfo]:
    """The package's runner on `device` and its info; ConfigError when the device differs.

    `single_threaded` drops the runner's own locking, which CUDA graph capture needs and which
    the backend does not (it calls one runner from one thread at a time).
    """
    from torch._inductor import aoti_load_package

    info = read_info(path)
    check_compatible(info, device, path)
    index = device.index if device.type == "cuda" and device.index is not None else -1
    try:
        runner = aoti_load_package(
            str(path), run_single_threaded=single_threaded, device_index=index
        )
    except Exception as exc:  # the loader raises plain RuntimeErrors (ABI, arch, driver)
        raise ConfigError(f"{path}: AOTInductor cannot load it here: {exc}") from exc
    return runner, info
