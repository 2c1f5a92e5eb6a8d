"""A LoRA adapter's folder (Hugging Face PEFT's layout), read as data and checked before use.

An adapter folder holds `adapter_config.json` and `adapter_model.safetensors`, nothing that
runs: a pickled `adapter_model.bin`, a `.py` file or any other file is refused (403, as a load
request's uploads are: docs/limits.md). The config is bounded (its size, the rank, the modules
it targets) and only the plain LoRA that an engine can add per sequence is taken: no DoRA, no
replaced modules, no bias. The safetensors header is read and bounded before a tensor is.
`base_model_name_or_path` is never followed: the base is the adapter's config.toml `base`,
a model of the same repository (docs/generative.md, "LoRA adapters").
"""

from __future__ import annotations

import json
import math
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dlscale.errors import ConfigError, PermissionDenied

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
#: What an adapter folder may hold: its two files, and the model card PEFT writes beside them
#: (never read).
FILES = (CONFIG_FILE, WEIGHTS_FILE, "README.md")
#: The largest rank any engine here takes (vLLM's largest `max_lora_rank` is 512).
MAX_RANK = 512
MAX_CONFIG_BYTES = 64 * 2**10
#: An adapter's weights: far above a rank-64 adapter of a 70B model's attention (~0.5 GB).
MAX_WEIGHTS_BYTES = 2 * 2**30
#: A safetensors header longer than this is no adapter's (a few hundred tensors).
MAX_HEADER_BYTES = 4 * 2**20
MAX_TARGETS = 64
_MODULE = re.compile(r"[A-Za-z0-9_]{1,64}")
#: PEFT's keys whose non-default values change the arithmetic beyond plain LoRA.
_UNSUPPORTED: dict[str, object] = {
    "use_dora": False,
    "modules_to_save": None,
    "fan_in_fan_out": False,
    "layers_to_transform": None,
    "layers_pattern": None,
    "rank_pattern": {},
    "alpha_pattern": {},
    "bias": "none",
    "megatron_config": None,
}
_WEIGHT_KEY = re.compile(
    r"base_model\.model\.(?P<module>[A-Za-z0-9_.]{1,256})\.lora_(?P<which>[AB])\.weight"
)


@dataclass(frozen=True)
class AdapterSpec:
    """A checked adapter folder: its rank, its scale and the tensors by module path."""

    folder: Path
    rank: int
    #: lora_alpha / rank (or / sqrt(rank) with use_rslora): what B(A(x)) is multiplied by.
    scale: float
    targets: tuple[str, ...]
    #: module path -> (A's shape, B's shape), from the safetensors header.
    shapes: dict[str, tuple[tuple[int, ...], tuple[int, ...]]]


def lora_off(name: str) -> ConfigError:
    """The error for adapter `name` on a base model whose engine serves no adapters."""
    return ConfigError(
        f"adapter {name!r}: its base model's engine was not started with "
        "[backend_options] enable_lora = true"
    )


def check_folder(folder: Path) -> None:
    """PermissionDenied for a file that is not an adapter's data; ConfigError for a missing one."""
    if not folder.is_dir():
        raise ConfigError(f"adapter folder {folder.name!r} is not a folder")
    other = sorted(p.name for p in folder.iterdir() if p.name not in FILES or not p.is_file())
    if other:
        raise PermissionDenied(
            f"adapter folder {folder.parent.name}/{folder.name} holds {other[:8]}: an adapter "
            f"holds {CONFIG_FILE} and {WEIGHTS_FILE} only (data; no pickled .bin weights, no code)"
        )
    missing = [f for f in (CONFIG_FILE, WEIGHTS_FILE) if not (folder / f).is_file()]
    if missing:
        raise ConfigError(f"adapter folder {folder.parent.name}/{folder.name} lacks {missing}")


def read_adapter(folder: Path, max_rank: int = MAX_RANK) -> AdapterSpec:
    """The adapter in `folder`, checked (files, config, tensor header); ConfigError naming
    what is wrong, PermissionDenied for a file that is not data."""
    check_folder(folder)
    config = read_config((folder / CONFIG_FILE).read_bytes(), max_rank)
    rank, targets = int(config["r"]), tuple(config["target_modules"])
    alpha = float(config.get("lora_alpha", rank))
    scale = alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank
    shapes = _shapes(folder / WEIGHTS_FILE, rank, targets)
    return AdapterSpec(folder, rank, scale, targets, shapes)


def read_config(data: bytes, max_rank: int = MAX_RANK) -> dict[str, Any]:
    """adapter_config.json's fields, bounded: a plain LoRA of rank 1..max_rank on named modules."""
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{CONFIG_FILE} is {len(data)} bytes, above {MAX_CONFIG_BYTES}")
    try:
        config = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{CONFIG_FILE} is not JSON: {exc}") from None
    if not isinstance(config, dict):
        raise ConfigError(f"{CONFIG_FILE} must hold a JSON object")
    if config.get("peft_type", "LORA") != "LORA":
        raise ConfigError(f"{CONFIG_FILE}: peft_type {config.get('peft_type')!r} is not LORA")
    rank = config.get("r")
    if isinstance(rank, bool) or not isinstance(rank, int) or not 1 <= rank <= max_rank:
        raise ConfigError(
            f"{CONFIG_FILE}: r (the rank) must be an integer 1..{max_rank}, not {rank!r}"
        )
    alpha = config.get("lora_alpha", rank)
    if isinstance(alpha, bool) or not isinstance(alpha, int | float) or not 0 < alpha <= 2**16:
        raise ConfigError(f"{CONFIG_FILE}: lora_alpha must be a positive number, not {alpha!r}")
    targets = config.get("target_modules")
    if (
        not isinstance(targets, list)
        or not 1 <= len(targets) <= MAX_TARGETS
        or not all(isinstance(t, str) and _MODULE.fullmatch(t) for t in targets)
    ):
        raise ConfigError(
            f"{CONFIG_FILE}: target_modules must be a list of 1..{MAX_TARGETS} module names "
            "(such as q_proj; a regular expression is not taken)"
        )
    for key, default in _UNSUPPORTED.items():
        if config.get(key, default) not in (default, None, [], {}, False):
            raise ConfigError(f"{CONFIG_FILE}: {key} = {config[key]!r} is not served (plain LoRA)")
    return config


def _shapes(
    path: Path, rank: int, targets: tuple[str, ...]
) -> dict[str, tuple[tuple[int, ...], tuple[int, ...]]]:
    """Each adapted module's A and B shapes, from the header alone (no tensor read yet)."""
    header = read_header(path)
    found: dict[str, dict[str, tuple[int, ...]]] = {}
    for key, entry in header.items():
        if key == "__metadata__":
            continue
        match = _WEIGHT_KEY.fullmatch(key)
        if match is None or match["module"].rsplit(".", 1)[-1] not in targets:
            raise ConfigError(f"{WEIGHTS_FILE}: tensor {key[:200]!r} is no LoRA A/B of a target")
        shape = tuple(entry.get("shape", ()))
        if len(shape) != 2 or not all(isinstance(n, int) and n > 0 for n in shape):
            raise ConfigError(f"{WEIGHTS_FILE}: tensor {key[:200]!r} is not a matrix")
        found.setdefault(match["module"], {})[match["which"]] = shape
    out = {}
    for module, pair in found.items():
        a, b = pair.get("A"), pair.get("B")
        if a is None or b is None or a[0] != rank or b[1] != rank:
            raise ConfigError(
                f"{WEIGHTS_FILE}: module {module!r} needs lora_A [{rank}, in] and lora_B "
                f"[out, {rank}] (the rank is {rank}), has {a} and {b}"
            )
        out[module] = (a, b)
    if not out:
        raise ConfigError(f"{WEIGHTS_FILE} holds no LoRA tensors")
    return out


def read_header(path: Path) -> dict[str, Any]:
    """A safetensors file's header (names, dtypes, shapes), bounded before it is read."""
    size = path.stat().st_size
    if size > MAX_WEIGHTS_BYTES:
        raise ConfigError(f"{WEIGHTS_FILE} is {size} bytes, above {MAX_WEIGHTS_BYTES}")
    with path.open("rb") as file:
        head = file.read(8)
        length = struct.unpack("<Q", head)[0] if len(head) == 8 else -1
        if not 0 < length <= min(MAX_HEADER_BYTES, size - 8):
            raise ConfigError(f"{WEIGHTS_FILE} is not a safetensors file")
        try:
            header = json.loads(file.read(length))
        except (ValueError, UnicodeDecodeError):
            raise ConfigError(f"{WEIGHTS_FILE} has no readable safetensors header") from None
    if not isinstance(header, dict):
        raise ConfigError(f"{WEIGHTS_FILE} has no readable safetensors header")
    return header


def check_upload(file_name: str, data: bytes) -> None:
    """An uploaded adapter_config.json must be a plain, bounded LoRA config."""
    if file_name == CONFIG_FILE:
        read_config(data)
