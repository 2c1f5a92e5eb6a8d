"""The zoo's LoRA adapters: seeded low-rank updates of a zoo decoder, as PEFT folders.

Each adapter is written as Hugging Face PEFT saves one (`adapter_config.json`,
`adapter_model.safetensors` with `base_model.model.<module>.lora_A/B.weight`), from code and
the adapter's own seed: nothing is downloaded. Unlike PEFT's fresh adapters (B is zero, so
they change nothing), both A and B are drawn, so that an adapter changes its base's answers
and two adapters answer differently (the tests check both). `build` writes a repository model
whose config.toml names its base (docs/zoo.md, docs/generative.md "LoRA adapters").
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dlscale.models.zoo.decoder import DECODERS, DecoderModel
from dlscale.models.zoo.model import build_in_place

#: The modules the zoo's adapters adapt (PEFT's usual choice for Llama).
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")


@dataclass(frozen=True)
class ZooAdapter:
    """One seeded LoRA adapter of a zoo decoder."""

    name: str
    base: DecoderModel
    seed: int
    rank: int = 8
    alpha: int = 16
    targets: tuple[str, ...] = TARGETS
    #: The spread of A's and B's entries: large enough to change a random model's arg-max.
    std: float = 0.2

    def build(self, root: Path, seq_len: int = 0) -> Path:
        """Write `root/<name>/` (config.toml naming the base, 1/ the PEFT files); returns it.

        Its base is not built here: build it (or have it) in the same repository."""
        del seq_len

        def write(version: Path) -> dict[str, Any]:
            self.write_peft(version)
            return self.config()

        return build_in_place(root, self.name, write)

    def config(self) -> dict[str, Any]:
        """config.toml: an adapter of its base model."""
        return {
            "name": self.name,
            "backend": "lora",
            "base": self.base.name,
            "metadata": {"zoo": "true", "seed": self.seed, "rank": self.rank},
        }

    def write_peft(self, folder: Path) -> Path:
        """The two PEFT files alone into `folder` (created); returns it."""
        import torch
        from safetensors.torch import save_file

        folder.mkdir(parents=True, exist_ok=True)
        generator = torch.Generator().manual_seed(self.seed)
        tensors = {}
        for module, (fan_in, fan_out) in self.shapes().items():
            prefix = f"base_model.model.{module}"
            a = torch.randn(self.rank, fan_in, generator=generator) * self.std
            b = torch.randn(fan_out, self.rank, generator=generator) * self.std
            tensors[f"{prefix}.lora_A.weight"] = a.contiguous()
            tensors[f"{prefix}.lora_B.weight"] = b.contiguous()
        save_file(tensors, str(folder / "adapter_model.safetensors"))
        (folder / "adapter_config.json").write_text(json.dumps(self.peft_config(), indent=2))
        return folder

    def peft_config(self) -> dict[str, Any]:
        """adapter_config.json, with the keys PEFT's LoraConfig writes that matter here."""
        return {
            "peft_type": "LORA",
            "task_type": "CAUSAL_LM",
            "base_model_name_or_path": self.base.name,
            "r": self.rank,
            "lora_alpha": self.alpha,
            "lora_dropout": 0.0,
            "target_modules": list(self.targets),
            "bias": "none",
            "fan_in_fan_out": False,
            "use_rslora": False,
            "use_dora": False,
            "modules_to_save": None,
            "inference_mode": True,
        }

    def shapes(self) -> dict[str, tuple[int, int]]:
        """Each adapted module's path in the base model and its (in, out) features."""
        base = self.base
        kv = base.kv_heads * base.head_dim
        features = {
            "q_proj": (base.hidden_size, base.hidden_size),
            "k_proj": (base.hidden_size, kv),
            "v_proj": (base.hidden_size, kv),
            "o_proj": (base.hidden_size, base.hidden_size),
        }
        return {
            f"model.layers.{layer}.self_attn.{target}": features[target]
            for layer in range(base.layers)
            for target in self.targets
        }


def adapters_of(base: str, count: int) -> list[ZooAdapter]:
    """`count` adapters of the zoo decoder `base`, named `<base>-lora-<i>`, seeds 1..count."""
    return [ZooAdapter(f"{base}-lora-{i}", DECODERS[base], seed=i) for i in range(1, count + 1)]


#: The zoo's named adapters: two of llama-tiny (tests), eight of llama-small (the benchmark).
ADAPTERS: dict[str, ZooAdapter] = {
    a.name: a for a in (*adapters_of("llama-tiny", 2), *adapters_of("llama-small", 8))
}
