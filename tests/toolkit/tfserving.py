"""Models and a client for TensorFlow Serving's API over dlscale (tests/integration/tfserving/).

The client follows TensorFlow Serving's REST API document: `POST /v1/models/NAME:predict` with
`instances` or `inputs`, `:classify` / `:regress` with `examples`, `GET` for status and metadata.
"""

from __future__ import annotations

from pathlib import Path

from tests.toolkit.models import (
    add_graph,
    identity_graph,
    sum_and_copy_graph,
    sum_and_diff_graph,
    write_model,
    write_null_model,
)

BATCHED = "max_batch_size = 16\n[batching]\nmax_queue_delay_us = 200\n"
#: A null model echoing text: `text` comes back as `text_out` (as text) and `blob` as
#: `blob_bytes` (as {"b64": ...}, TensorFlow Serving's rule for names ending in _bytes).
WORDS = (
    "max_batch_size = 8\n"
    '[[inputs]]\nname = "text"\ndatatype = "BYTES"\nshape = [2]\n'
    '[[inputs]]\nname = "blob"\ndatatype = "BYTES"\nshape = [1]\n'
    '[[outputs]]\nname = "text_out"\ndatatype = "BYTES"\nshape = [2]\n'
    '[[outputs]]\nname = "blob_bytes"\ndatatype = "BYTES"\nshape = [1]\n'
)
#: A null model shaped as TensorFlow's classification signature: `scores` echo `x`, `classes`
#: echo `names`.
LABELED = (
    "max_batch_size = 8\n"
    '[[inputs]]\nname = "x"\ndatatype = "FP32"\nshape = [3]\n'
    '[[inputs]]\nname = "names"\ndatatype = "BYTES"\nshape = [3]\n'
    '[[outputs]]\nname = "scores"\ndatatype = "FP32"\nshape = [3]\n'
    '[[outputs]]\nname = "classes"\ndatatype = "BYTES"\nshape = [3]\n'
)
#: A null model echoing FP16, which JSON carries as numbers here (TensorFlow Serving's rule).
HALF = (
    "max_batch_size = 8\n"
    '[[inputs]]\nname = "x"\ndatatype = "FP16"\nshape = [2]\n'
    '[[outputs]]\nname = "y"\ndatatype = "FP16"\nshape = [2]\n'
)
#: The add model's addend: its output is its input plus this.
ADDEND = 1.0


def tfserving_repository(root: Path) -> Path:
    """add (one input, [batch, 3]), sumdiff (two in, two out), mixed (FP32 and INT32 inputs),
    one ([batch, 1]: regresses), words (BYTES), labeled (classes and scores), half (FP16) and
    identity (docs/tfserving.md's examples)."""
    write_model(root, "add", add_graph(ADDEND, width=3), BATCHED)
    write_model(root, "sumdiff", sum_and_diff_graph(), BATCHED)
    write_model(root, "mixed", sum_and_copy_graph(), BATCHED)
    write_model(root, "one", add_graph(0.5, width=1), BATCHED)
    write_null_model(root, "words", WORDS)
    write_null_model(root, "labeled", LABELED)
    write_null_model(root, "half", HALF)
    # docs/tfserving.md's examples use it: FP32 [batch, 16], `input` -> `output`.
    write_model(root, "identity", identity_graph(16), BATCHED)
    return root
