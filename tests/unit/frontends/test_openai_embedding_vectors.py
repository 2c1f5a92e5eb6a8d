"""Embeddings from an encoder's outputs: pooled when it has them, else the mean over the real
tokens (padding left out), always at unit length."""

from __future__ import annotations

import numpy as np

from dlscale.frontends.rest.openai.embeddings import Embedding, embeddings_document
from dlscale.types import InferenceResponse


def test_without_a_pooled_output_the_real_tokens_are_averaged() -> None:
    hidden = np.array(
        [[[3.0, 0.0], [1.0, 0.0], [100.0, 100.0]], [[0.0, 2.0], [9.0, 9.0], [9.0, 9.0]]]
    )
    call = Embedding("enc", [[1, 2], [1]], base64=False)
    doc = embeddings_document(call, InferenceResponse("enc", {"last_hidden_state": hidden}))
    # Row 0: mean of its two tokens (2, 0); row 1: its one token (0, 2); the padding is ignored.
    assert [d["embedding"] for d in doc["data"]] == [[1.0, 0.0], [0.0, 1.0]]
    assert doc["usage"] == {"prompt_tokens": 3, "total_tokens": 3}
