"""Many LoRA adapters on one loaded model, chosen per sequence inside one engine step.

transformers' continuous batching packs every sequence of a step into one row of tokens, so
PEFT's per-row `adapter_names` cannot choose an adapter per sequence. Instead each linear layer
of the decoder is wrapped once, when the engine starts (`install`): it computes the base
layer, then adds `x A^T B^T * scale` to the tokens of each adapter (`Routing`, set before each
forward pass from the step's sequences: `route`). A step whose sequences all use one adapter
adds it to every token; a step that mixes adapters multiplies every token by all loaded
adapters' A side by side (`Stacked`), keeps each token's own columns (a mask made once per
step) and multiplies by the B's side by side: three operations per layer whatever the number
of adapters (a loop over adapters cost 8 operations per layer for 8, and on a CPU the step's
time went with its operations). A step of base sequences only costs a test per layer.
Adapters take slots 1..max_loras; slot 0 is the base.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from safetensors.torch import load_file
from torch import nn

from dlscale.backends.generative.lora_files import AdapterSpec, read_adapter
from dlscale.errors import ConfigError, QueueFull

BASE = 0


@dataclass(frozen=True)
class Stacked:
    """Every loaded adapter's weights side by side, for steps that mix them: each slot owns a
    block of columns; a layer's `down` [in, C] and `up` [C, out] hold zeros in the blocks of
    adapters that do not target it. Rebuilt whole on each load or unload, and swapped in one
    assignment, so a forward pass reads one consistent set."""

    #: Row s is 1 on slot s's columns (row 0, the base: none); a step's mask is its rows.
    template: torch.Tensor
    layers: dict[str, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)


class Routing:
    """How the current step adds the adapters, set before each forward pass by the engine's
    thread and read by the layers during it: `single`, the one adapter of every token (no
    index); or `mask`, each token's columns of `stacked` (a step that mixes adapters, or
    adapters and the base); neither for a step of base sequences."""

    def __init__(self) -> None:
        self.single: int | None = None
        self.mask: torch.Tensor | None = None
        self.stacked: Stacked | None = None


class LoraLinear(nn.Module):
    """A linear layer and the low-rank updates of the adapters that target it, by slot."""

    def __init__(self, name: str, base: nn.Linear, routing: Routing) -> None:
        super().__init__()
        self.name = name
        self.base = base
        self.routing = routing
        #: slot -> (A^T [in, r], B^T * scale [r, out]).
        self.updates: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.base(x)
        routing = self.routing
        if routing.single is None and routing.mask is None:
            return out
        rows = x.reshape(-1, x.shape[-1])
        flat = out.view(-1, out.shape[-1])
        if routing.single is not None:
            update = self.updates.get(routing.single)
            if update is not None:
                flat.addmm_(rows @ update[0], update[1])
            return out
        stacked = routing.stacked.layers.get(self.name) if routing.stacked else None
        if stacked is not None and routing.mask is not None:
            # Three operations whatever the number of adapters: on a CPU the step's cost is
            # in operations, not in these few extra columns of arithmetic.
            flat.addmm_((rows @ stacked[0]) * routing.mask, stacked[1])
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
        layer = LoraLinear(name, module, routing)
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
            self.routing.stacked = self._stack()
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
            self.routing.stacked = self._stack()

    def _stack(self) -> Stacked:
        """The loaded adapters' weights side by side (under the lock)."""
        slots = sorted(self.slots.values())
        ranks = {
            s: next(u[0].shape[1] for layer in self.layers.values() if (u := layer.updates.get(s)))
            for s in slots
        }
        template = torch.zeros(self.max_loras + 1, sum(ranks.values()), dtype=self.dtype)
        start = 0
        for s in slots:
            template[s, start : start + ranks[s]] = 1
            start += ranks[s]
        layers = {}
        for name, layer in self.layers.items():
            if not layer.updates:
                continue
            base = layer.base
            downs = [_or_zeros(layer.updates, s, 0, (base.in_features, ranks[s])) for s in slots]
            ups = [_or_zeros(layer.updates, s, 1, (ranks[s], base.out_features)) for s in slots]
            layers[name] = (torch.cat(downs, 1).contiguous(), torch.cat(ups, 0).contiguous())
        return Stacked(template.to(self.device), layers)

    def slot(self, name: str) -> int:
        """The slot of a loaded adapter ("" is the base model)."""
        if not name:
            return BASE
        slot = self.slots.get(name)
        if slot is None:
            raise ConfigError(f"adapter {name!r} is not loaded on this engine")
        return slot

    def route(self, slots: Sequence[int], lengths: Iterable[int], tokens: int) -> None:
        """Set the step's routing: sequence i has `lengths[i]` tokens and uses `slots[i]`;
        the step has `tokens` rows (any beyond the sequences' are padding, the base's)."""
        routing = self.routing
        distinct = set(slots)
        if distinct <= {BASE}:
            routing.single, routing.mask = None, None
        elif len(distinct) == 1:
            routing.single, routing.mask = slots[0], None
        else:
            stacked = routing.stacked
            assert stacked is not None  # an adapter is loaded
            per_token = torch.repeat_interleave(torch.tensor(slots), torch.tensor(list(lengths)))
            if len(per_token) < tokens:
                per_token = torch.cat([per_token, per_token.new_zeros(tokens - len(per_token))])
            mask = stacked.template[per_token.to(self.device, non_blocking=True)]
            routing.single, routing.mask = None, mask


def _or_zeros(
    updates: dict[int, tuple[torch.Tensor, torch.Tensor]],
    slot: int,
    which: int,
    shape: tuple[int, int],
) -> torch.Tensor:
    update = updates.get(slot)
    if update is not None:
        return update[which]
    like = next(iter(updates.values()))[0]
    return torch.zeros(shape, dtype=like.dtype, device=like.device)
