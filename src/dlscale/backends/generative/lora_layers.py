"""Many LoRA adapters on one loaded model, chosen per sequence inside one engine step.

transformers' continuous batching packs every sequence of a step into one row of tokens, so
PEFT's per-row `adapter_names` cannot choose an adapter per sequence. Instead each linear layer
of the decoder is wrapped once, when the engine starts (`install`): it computes the base
layer, then adds `x A^T B^T * scale` for the tokens of each adapter in the step, found by index
(`Routing`, filled before each forward pass from the step's sequences: `route`). A step whose
sequences all use one adapter adds it to every token without indexing; a step of base
sequences only costs a test per layer. Adapters take slots 1..max_loras; slot 0 is the base.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from typing import Any

import torch
from safetensors.torch import load_file
from torch import nn

from dlscale.backends.generative.lora_files import AdapterSpec, read_adapter
from dlscale.errors import ConfigError, QueueFull

BASE = 0


class Routing:
    """Which tokens of the current step each adapter computes: (slot, token indices or None
    for every token). Written by the engine's thread before each forward pass, read by the
    layers during it."""

    def __init__(self) -> None:
        self.groups: list[tuple[int, torch.Tensor | None]] = []


class LoraLinear(nn.Module):
    """A linear layer and the low-rank updates of the adapters that target it, by slot."""

    def __init__(self, base: nn.Linear, routing: Routing) -> None:
        super().__init__()
        self.base = base
        self.routing = routing
        #: slot -> (A^T [in, r], B^T * scale [r, out]).
        self.updates: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.base(x)
        groups = self.routing.groups
        if not groups or not self.updates:
            return out
        rows = x.reshape(-1, x.shape[-1])
        flat = out.view(-1, out.shape[-1])
        for slot, index in groups:
            update = self.updates.get(slot)
            if update is None:
                continue
            down, up = update
            if index is None:
                flat += (rows @ down) @ up
            else:
                flat.index_add_(0, index, (rows.index_select(0, index) @ down) @ up)
        return out


def install(model: nn.Module) -> tuple[Routing, dict[str, LoraLinear]]:
    """Wrap every linear layer of the decoder's layers (not the embeddings or the head)."""
    routing = Routing()
    wrapped: dict[str, LoraLinear] = {}
    targets = [
        (name, module)
        for name, module in model.named_modules()
        if isinstance(module, nn.Linear) and ".layers." in f".{name}"
    ]
    for name, module in targets:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name)
        layer = LoraLinear(module, routing)
        setattr(parent, child, layer)
        wrapped[name] = layer
    return routing, wrapped


class Adapters:
    """The adapters an engine holds, by name and slot; at most `max_loras`, each of rank at
    most `max_rank`."""

    def __init__(
        self, model: nn.Module, max_loras: int, max_rank: int, device: str, dtype: torch.dtype
    ) -> None:
        self.routing, self.layers = install(model)
        self.max_loras = max_loras
        self.max_rank = max_rank
        self.device = device
        self.dtype = dtype
        self.slots: dict[str, int] = {}
        self._lock = threading.Lock()

    def add(self, name: str, folder: Any) -> AdapterSpec:
        """Read, check and place an adapter's weights; its slot is taken once all are placed."""
        spec = read_adapter(folder, self.max_rank)
        updates = self._updates(spec)
        with self._lock:
            if name in self.slots:
                raise ConfigError(f"adapter {name!r} is loaded already")
            free = sorted(set(range(1, self.max_loras + 1)) - set(self.slots.values()))
            if not free:
                raise QueueFull(
                    f"the engine holds {self.max_loras} adapters already (max_loras): unload "
                    "one, or raise [backend_options] max_loras of the base model"
                )
            slot = free[0]
            for module, update in updates.items():
                self.layers[module].updates[slot] = update
            self.slots[name] = slot
        return spec

    def _updates(self, spec: AdapterSpec) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        tensors = load_file(str(spec.folder / "adapter_model.safetensors"))
        out = {}
        for module, (a_shape, b_shape) in spec.shapes.items():
            layer = self.layers.get(module)
            if layer is None:
                raise ConfigError(
                    f"adapter targets {module!r}, which is no linear layer of the base model's "
                    "decoder layers"
                )
            if (a_shape[1], b_shape[0]) != (layer.base.in_features, layer.base.out_features):
                raise ConfigError(
                    f"adapter's {module!r} maps {a_shape[1]} -> {b_shape[0]} features; the base "
                    f"model's maps {layer.base.in_features} -> {layer.base.out_features}"
                )
            prefix = f"base_model.model.{module}"
            a = tensors[f"{prefix}.lora_A.weight"].to(self.device, torch.float32)
            b = tensors[f"{prefix}.lora_B.weight"].to(self.device, torch.float32)
            down = a.t().contiguous().to(self.dtype)
            up = (b.t() * spec.scale).contiguous().to(self.dtype)
            out[module] = (down, up)
        return out

    def remove(self, name: str) -> None:
        """Free an adapter's slot and weights (no sequence of it may still run)."""
        with self._lock:
            slot = self.slots.pop(name, None)
            if slot is None:
                return
            for layer in self.layers.values():
                layer.updates.pop(slot, None)

    def slot(self, name: str) -> int:
        """The slot of a loaded adapter ("" is the base model)."""
        if not name:
            return BASE
        slot = self.slots.get(name)
        if slot is None:
            raise ConfigError(f"adapter {name!r} is not loaded on this engine")
        return slot

    def route(self, slots: Sequence[int], lengths: Iterable[int]) -> None:
        """Set the step's token groups: sequence i has `lengths[i]` tokens and uses `slots[i]`."""
        groups: dict[int, list[torch.Tensor]] = {}
        start = 0
        for slot, length in zip(slots, lengths, strict=True):
            if slot != BASE:
                groups.setdefault(slot, []).append(torch.arange(start, start + length))
            start += length
        if len(groups) == 1 and all(s == next(iter(groups)) for s in slots):
            self.routing.groups = [(next(iter(groups)), None)]
            return
        self.routing.groups = [
            (slot, torch.cat(parts).to(self.device, non_blocking=True))
            for slot, parts in groups.items()
        ]
