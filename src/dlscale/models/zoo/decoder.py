"""The zoo's Llama-architecture decoders: seeded weights written as a Hugging Face folder.

Each size is a `LlamaForCausalLM` built from code (seeded weights, nothing downloaded) and a
byte-level BPE tokenizer trained by code (decoder_tokenizer.py), saved as config.json,
generation_config.json, model.safetensors, tokenizer.json and tokenizer_config.json: the
folder transformers' `from_pretrained` and vLLM load. `build` writes a repository model whose
version folder is that Hugging Face folder and whose config.toml names the transformers
backend (docs/zoo.md, docs/generative.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dlscale.models.zoo import decoder_tokenizer
from dlscale.models.zoo.model import WEIGHT_SEED, build_in_place

#: The tokenizer's corpus seed (its own, so that the weights' seed can change alone).
TOKENIZER_SEED = 7


@dataclass(frozen=True)
class DecoderModel:
    """One size of the zoo's Llama decoder: its shape and how to write it."""

    name: str
    description: str
    hidden_size: int
    layers: int
    heads: int
    kv_heads: int
    intermediate_size: int
    #: The tokenizer is trained to this many ids, and the embedding has exactly as many rows.
    vocab_size: int
    max_positions: int
    #: The dtype the weights are stored in ("float32" or "bfloat16"); engines cast on load.
    dtype: str = "float32"
    #: Written only when named: too large for a build of the whole zoo or for a CPU.
    on_request: bool = False
    #: Where config.toml places it, and the KV cache it gives the engine (None: the engine's
    #: share of the GPU's free memory).
    device: str = "cpu"
    kv_cache_gib: float | None = None

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.heads

    def parameters(self) -> int:
        """The parameter count (embedding and head untied), from the shape alone."""
        attention = self.hidden_size * self.head_dim * (2 * self.heads + 2 * self.kv_heads)
        mlp = 3 * self.hidden_size * self.intermediate_size
        norms = 2 * self.hidden_size
        return self.layers * (attention + mlp + norms) + self.hidden_size * (
            2 * self.vocab_size + 1
        )

    def build(self, root: Path, seq_len: int = 0) -> Path:
        """Write `root/<name>/` (config.toml, 1/ the Hugging Face folder); returns it.

        Assembled beside its final place and moved in at the end, as the other zoo models
        are, so a server polling the repository never sees half a model. `seq_len` is the
        zoo's common argument; a decoder takes any length up to its context.
        """
        del seq_len

        def write(version: Path) -> dict[str, Any]:
            self.write_hf(version)
            return self.config()

        return build_in_place(root, self.name, write)

    def write_hf(self, folder: Path) -> Path:
        """The Hugging Face files alone into `folder` (created); returns it."""
        folder.mkdir(parents=True, exist_ok=True)
        vocab = decoder_tokenizer.write(
            folder, self.vocab_size, TOKENIZER_SEED, max_length=self.max_positions
        )
        model = self.hf_model(vocab)
        model.save_pretrained(folder)
        # save_pretrained stamps no build time, but keep only the files a loader reads.
        return folder

    def hf_fields(self) -> dict[str, Any]:
        """The shape as config.json names its fields (what a planner reads of the written file)."""
        return {
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.layers,
            "num_attention_heads": self.heads,
            "num_key_value_heads": self.kv_heads,
            "max_position_embeddings": self.max_positions,
            "dtype": self.dtype,
        }

    def hf_config(self, vocab: int) -> Any:
        """The transformers `LlamaConfig` for this size and a vocabulary of `vocab` ids."""
        from transformers import LlamaConfig

        ids = decoder_tokenizer.token_ids()
        return LlamaConfig(
            **(self.hf_fields() | {"vocab_size": vocab}),
            bos_token_id=ids[decoder_tokenizer.BOS],
            # The end of a chat turn ends a generation too, as Llama 3's <|eot_id|> does.
            eos_token_id=[ids[decoder_tokenizer.EOS], ids[decoder_tokenizer.TURN_END]],
            pad_token_id=ids[decoder_tokenizer.PAD],
            tie_word_embeddings=False,
            architectures=["LlamaForCausalLM"],
        )

    def hf_model(self, vocab: int) -> Any:
        """`LlamaForCausalLM` with weights from the zoo's weight seed, in `self.dtype`."""
        import torch
        from transformers import GenerationConfig, LlamaForCausalLM

        from dlscale.models.zoo.nets.common import deterministic

        config = self.hf_config(vocab)
        with deterministic(WEIGHT_SEED):
            model = LlamaForCausalLM(config)
        model = model.to(getattr(torch, self.dtype)).eval()
        # Engines' defaults when a request names none: greedy, as the zoo's tests expect.
        model.generation_config = GenerationConfig(  # type: ignore[no-untyped-call]
            bos_token_id=config.bos_token_id,
            eos_token_id=config.eos_token_id,
            pad_token_id=config.pad_token_id,
            do_sample=False,
        )
        return model

    def config(self) -> dict[str, Any]:
        """config.toml: the transformers backend on the version folder's Hugging Face files."""
        options = {} if self.kv_cache_gib is None else {"kv_cache_gib": self.kv_cache_gib}
        return {
            "name": self.name,
            "backend": "transformers",
            "max_batch_size": 0,
            "instances": [{"count": 1, "device": self.device}],
            "backend_options": options,
            "metadata": {
                "zoo": "true",
                "task": "text-generation",
                "description": self.description,
                "seed": WEIGHT_SEED,
                "parameters": self.parameters(),
                "context": self.max_positions,
            },
        }


LLAMA_TINY = DecoderModel(
    name="llama-tiny",
    description="Llama decoder, 4 layers of 128, ~1M parameters, seeded (tests)",
    hidden_size=128,
    layers=4,
    heads=4,
    kv_heads=2,
    intermediate_size=384,
    vocab_size=1024,
    max_positions=512,
    # 2 KiB per token in FP32: 32k tokens, 64 sequences of the whole context.
    kv_cache_gib=0.0625,
)
LLAMA_SMALL = DecoderModel(
    name="llama-small",
    description="Llama decoder, 8 layers of 512, ~30M parameters, seeded (CPU benchmarks)",
    hidden_size=512,
    layers=8,
    heads=8,
    kv_heads=4,
    intermediate_size=1408,
    vocab_size=4096,
    max_positions=2048,
    # 16 KiB per token in FP32: 32k tokens.
    kv_cache_gib=0.5,
)
LLAMA_1B = DecoderModel(
    name="llama-1b",
    description="Llama decoder, 16 layers of 2048, ~1.1B parameters, seeded, BF16 (GPUs)",
    hidden_size=2048,
    layers=16,
    heads=32,
    kv_heads=8,
    intermediate_size=8192,
    vocab_size=32_000,
    max_positions=4096,
    dtype="bfloat16",
    on_request=True,
    device="cuda",
)
DECODERS: dict[str, DecoderModel] = {m.name: m for m in (LLAMA_TINY, LLAMA_SMALL, LLAMA_1B)}
