"""Text for the zoo, made by code: a corpus of short sentences on a few topics, and the WordPiece
vocabulary trained on it with Hugging Face `tokenizers` (the bert-e2e pipeline's tokenizer).

Each topic has its own nouns, verbs and adjectives; a sentence is one of a few templates filled
from one topic's words and a shared stock of function words, so a classifier can tell topics
apart by their words, as a trained text classifier would.
"""

from __future__ import annotations

import numpy as np

#: The classes: topic name -> (nouns, verbs, adjectives).
TOPICS: dict[str, tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]] = {
    "sport": (
        ("goalkeeper", "striker", "referee", "stadium", "match", "league", "coach", "penalty"),
        ("scored", "defended", "trained", "tackled", "won", "lost", "kicked", "celebrated"),
        ("athletic", "decisive", "fast", "tired", "victorious", "offside", "fit", "loyal"),
    ),
    "weather": (
        ("storm", "rainfall", "forecast", "cloud", "breeze", "thunder", "frost", "sunshine"),
        ("poured", "cleared", "drifted", "froze", "warmed", "flooded", "blew", "thawed"),
        ("humid", "cloudy", "windy", "chilly", "sunny", "foggy", "mild", "stormy"),
    ),
    "cooking": (
        ("recipe", "oven", "sauce", "garlic", "pastry", "kitchen", "flavour", "dough"),
        ("baked", "simmered", "chopped", "roasted", "seasoned", "whisked", "fried", "tasted"),
        ("crispy", "spicy", "tender", "savoury", "sweet", "fresh", "golden", "creamy"),
    ),
    "computing": (
        ("compiler", "server", "kernel", "database", "network", "processor", "cache", "thread"),
        ("crashed", "compiled", "rebooted", "deployed", "cached", "parsed", "scaled", "patched"),
        ("parallel", "fast", "distributed", "stable", "buggy", "virtual", "remote", "secure"),
    ),
}
CLASSES = tuple(TOPICS)
FUNCTION_WORDS = ("the", "a", "this", "that", "every", "our", "their", "one")
TEMPLATES = (
    "{d} {a} {n} {v} {d} {n2} .",
    "{d} {n} {v} and {d} {n2} {v2} .",
    "why was {d} {n} so {a} after it {v} ?",
    "{d} {a} {n} and {d} {a2} {n2} {v} today .",
)
#: Vocabulary size of the trained WordPiece model, special tokens included.
VOCAB_SIZE = 1000
SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
CORPUS_SEED = 7
CORPUS_SIZE = 2000


def sentences(count: int, seed: int = CORPUS_SEED) -> tuple[list[str], np.ndarray]:
    """`count` sentences and their topics (INT64 indices into CLASSES), the same for a seed."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, len(CLASSES), size=count)
    texts = []
    for label in labels:
        nouns, verbs, adjectives = TOPICS[CLASSES[label]]
        words = {
            "d": _pick(rng, FUNCTION_WORDS),
            "n": _pick(rng, nouns),
            "n2": _pick(rng, nouns),
            "v": _pick(rng, verbs),
            "v2": _pick(rng, verbs),
            "a": _pick(rng, adjectives),
            "a2": _pick(rng, adjectives),
        }
        template = TEMPLATES[int(rng.integers(len(TEMPLATES)))]
        texts.append(template.format(**words).capitalize())
    return texts, labels.astype(np.int64)


def _pick(rng: np.random.Generator, words: tuple[str, ...]) -> str:
    return words[int(rng.integers(len(words)))]


def train_tokenizer(max_length: int) -> str:
    """A BERT-style WordPiece tokenizer (lower-casing, [CLS] text [SEP]) trained on the corpus,
    as tokenizer.json text, the same on every build; padding to `max_length` is the tokenizer
    step's."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    from tokenizers.trainers import WordPieceTrainer

    def bert_style(model: models.Model) -> Tokenizer:
        tokenizer = Tokenizer(model)
        tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
        tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tokenizer.decoder = decoders.WordPiece()
        return tokenizer

    texts = sentences(CORPUS_SIZE)[0]
    # The trainer numbers the "##x" pieces in a hash map's order, which changes from run to run,
    # and breaks ties between merges by those numbers: each build learnt another vocabulary
    # (tokenizers issue #1794). Named first, as specials, they are numbered in this order; the
    # tokenizer is then made again from the learnt vocabulary, with only the real specials.
    pieces = [f"##{c}" for c in sorted(set("".join(texts).lower()) - {" "})]
    trainer = WordPieceTrainer(
        vocab_size=VOCAB_SIZE, special_tokens=[*SPECIAL_TOKENS, *pieces], show_progress=False
    )
    learnt = bert_style(models.WordPiece(unk_token="[UNK]"))
    learnt.train_from_iterator(texts, trainer=trainer)
    tokenizer = bert_style(models.WordPiece(learnt.get_vocab(), unk_token="[UNK]"))
    tokenizer.add_special_tokens(list(SPECIAL_TOKENS))
    cls, sep = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)],
    )
    tokenizer.enable_truncation(max_length)
    tokenizer.enable_padding(length=max_length, pad_token="[PAD]")
    return tokenizer.to_str()
