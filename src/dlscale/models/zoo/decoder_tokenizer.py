"""The zoo decoder's tokenizer: byte-level BPE trained by `tokenizers` on a corpus made by code.

Byte-level, so that every string encodes (no unknown token) and every id sequence decodes;
trained on seeded pseudo-text plus a list of common English words, so that ordinary prompts
take a few tokens per word as they would with a real model's vocabulary. The files are the
ones a Hugging Face folder holds (tokenizer.json, tokenizer_config.json with the chat
template), so transformers' AutoTokenizer and vLLM read them as they read a downloaded model.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

BOS, EOS, PAD = "<|begin_of_text|>", "<|end_of_text|>", "<|pad|>"
#: Chat roles are spelt with special tokens, so that a message cannot forge a turn by text.
ROLE_START, ROLE_END, TURN_END = "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"
SPECIAL_TOKENS = (BOS, EOS, PAD, ROLE_START, ROLE_END, TURN_END)
#: Llama 3's chat layout, in Jinja as transformers and vLLM render it (bos first, one header per
#: message, the assistant's header last when a generation prompt is asked for).
#: With `tools`, a system turn lists them (as JSON) and says how to call one: Hermes's
#: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, which the OpenAI frontend reads
#: back; an assistant turn that called tools is spelt the same way.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% if tools %}"
    "{{ '<|start_header_id|>system<|end_header_id|>\\n\\n' }}"
    "{{ 'You may call these tools. To call one, answer <tool_call>"
    '{"name": NAME, "arguments": ARGUMENTS}'
    "</tool_call>.\\n' }}"
    "{% for tool in tools %}{{ tool | tojson }}{{ '\\n' }}{% endfor %}"
    "{{ '<|eot_id|>' }}"
    "{% endif %}"
    "{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}"
    "{% if message.tool_calls %}"
    "{% for call in message.tool_calls %}"
    '{{ \'<tool_call>{"name": "\' + call.function.name + \'", "arguments": \' }}'
    "{{ call.function.arguments }}{{ '}</tool_call>' }}"
    "{% endfor %}"
    "{% else %}{{ message['content'] }}{% endif %}"
    "{{ '<|eot_id|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{% endif %}"
)

#: Common English words, so that ordinary prompts tokenize as they would with a real model.
_COMMON_TEXT = (
    "the of and to in is that it for was on are as with be at by this have from or one had not "
    "but what all were when we there can an your which their said if do will each about how up "
    "out them then she many some so these would other into has more her two like him see time "
    "could no make than first been its who now people my made over did down only way find use "
    "may water long little very after words called just where most know get through back much "
    "before go good new write our used me man too any day same right look think also around "
    "another came come work three word must because does part even place well such here take "
    "why things help put years different away again off went old number great tell men say "
    "small every found still between name should home big give air line set own under read last "
    "never us left end along while might next sound below saw something thought both few those "
    "always looked show large often together asked house world going want school important "
    "until form food keep children feet land side without boy once animals life enough took "
    "sometimes hello model server request answer token stream batch latency throughput "
    "inference GPU CPU memory cache question story tell write poem explain why how what "
)
_COMMON = tuple(_COMMON_TEXT.split())
_ONSETS = (
    "b",
    "c",
    "d",
    "f",
    "g",
    "h",
    "k",
    "l",
    "m",
    "n",
    "p",
    "r",
    "s",
    "t",
    "v",
    "w",
    "st",
    "tr",
    "pl",
    "gr",
    "ch",
    "sh",
    "th",
    "br",
    "cl",
    "",
)
_VOWELS = ("a", "e", "i", "o", "u", "ai", "ea", "ou", "io", "y")
_CODAS = ("", "", "n", "r", "s", "t", "l", "m", "nd", "ng", "st", "rk", "x")


def corpus(words: int, seed: int) -> list[str]:
    """Seeded lines of text: common words, pseudo-words, numbers and punctuation mixed."""
    rng = random.Random(seed)
    lines: list[str] = []
    line: list[str] = []
    for _ in range(words):
        kind = rng.random()
        if kind < 0.55:
            word = rng.choice(_COMMON)
        elif kind < 0.95:
            syllables = rng.randint(1, 4)
            word = "".join(
                rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS)
                for _ in range(syllables)
            )
        else:
            word = str(rng.randint(0, 10_000))
        if not line or rng.random() < 0.05:
            word = word.capitalize()
        line.append(word)
        if rng.random() < 0.08:
            line[-1] += rng.choice((".", ",", "?", "!", ":", ";"))
        if len(line) >= 12 and rng.random() < 0.2:
            lines.append(" ".join(line))
            line = []
    lines.append(" ".join(line))
    return lines


def train(vocab_size: int, seed: int) -> object:
    """A byte-level BPE `tokenizers.Tokenizer` of at most `vocab_size` ids, specials first."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    # About 20 words of text per id to learn: enough pairs for the trainer to reach the size.
    tokenizer.train_from_iterator(corpus(max(20_000, 20 * vocab_size), seed), trainer=trainer)
    # Every encoded text starts with the begin token, as Llama 3's does.
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, 0)]
    )
    return tokenizer


def write(folder: Path, vocab_size: int, seed: int, max_length: int) -> int:
    """tokenizer.json and tokenizer_config.json into `folder`; returns the vocabulary's size."""
    tokenizer = train(vocab_size, seed)
    tokenizer.save(str(folder / "tokenizer.json"))  # type: ignore[attr-defined]
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "pad_token": PAD,
        "model_max_length": max_length,
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    return int(tokenizer.get_vocab_size())  # type: ignore[attr-defined]


def token_ids() -> dict[str, int]:
    """The special tokens' ids: the trainer gives them the first ids, in this order."""
    return {token: index for index, token in enumerate(SPECIAL_TOKENS)}
