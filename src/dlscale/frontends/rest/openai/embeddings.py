"""`POST /v1/embeddings` for an encoder served as a tensor model (the zoo's bert-base).

An embedding model here is one whose inputs are BERT's, `input_ids` and `attention_mask`
(INT64, one row of token ids per input), and whose outputs hold `pooler_output` (one vector per
row) or `last_hidden_state` (one per token, averaged over the real tokens). Its inputs are
padded to the model's sequence length and sent as one batch through the model's own queue and
batcher; each vector is scaled to length 1, as OpenAI's and vLLM's embeddings are. The zoo's
encoder ships no tokenizer, so `input` must be token ids (a list of ints, or a list of such
lists, as OpenAI's API allows); text is a 400 that says so.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from dlscale.errors import InvalidField
from dlscale.frontends.rest.openai.decode import is_token_id
from dlscale.types import InferenceRequest, InferenceResponse, ModelMetadata, TensorSpec

IDS, MASK = "input_ids", "attention_mask"
POOLED, HIDDEN = "pooler_output", "last_hidden_state"
#: Inputs one request may embed (OpenAI's bound is 2048).
MAX_INPUTS = 2048
ENCODINGS = ("float", "base64")


@dataclass(frozen=True)
class Embedding:
    """A decoded embeddings request: its token rows and how to send the vectors."""

    model: str
    rows: list[list[int]]
    base64: bool


def embedding_call(doc: Mapping[str, Any]) -> Embedding:
    """An embeddings body as token rows; InvalidField naming the field otherwise."""
    model = doc.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidField("model", "model is required: the name of a served embedding model")
    encoding = doc.get("encoding_format") or "float"
    if encoding not in ENCODINGS:
        raise InvalidField(
            "encoding_format", f"encoding_format must be float or base64, not {encoding!r}"
        )
    if doc.get("dimensions") is not None:
        raise InvalidField("dimensions", "dimensions is not supported: the model's own are sent")
    return Embedding(model, _rows(doc.get("input")), encoding == "base64")


def _rows(value: object) -> list[list[int]]:
    if isinstance(value, str) or (
        isinstance(value, list) and any(isinstance(v, str) for v in value)
    ):
        raise InvalidField("input", "this server's embedding models take token ids, not text")
    if isinstance(value, list) and value and all(is_token_id(v) for v in value):
        value = [value]
    if not isinstance(value, list) or not value or len(value) > MAX_INPUTS:
        raise InvalidField("input", f"input must be 1 to {MAX_INPUTS} lists of token ids")
    for index, row in enumerate(value):
        if not isinstance(row, list) or not row or not all(is_token_id(v) for v in row):
            raise InvalidField(
                f"input[{index}]", f"input[{index}] must be a non-empty list of token ids"
            )
    return [list(row) for row in value]


def encoder_inputs(metadata: ModelMetadata) -> TensorSpec | None:
    """The `input_ids` spec of an embedding model (BERT's signature), None for any other."""
    inputs = {spec.name: spec for spec in metadata.inputs}
    outputs = {spec.name for spec in metadata.outputs}
    if set(inputs) != {IDS, MASK} or not outputs & {POOLED, HIDDEN}:
        return None
    return inputs[IDS]


def encoder_request(call: Embedding, ids: TensorSpec, request_id: str) -> InferenceRequest:
    """The model's request: the rows padded to its sequence length (its fixed one, else the
    longest row's), with the mask that marks the real tokens."""
    fixed = ids.shape[-1] if ids.shape and ids.shape[-1] > 0 else 0
    length = fixed or max(len(row) for row in call.rows)
    tokens = np.zeros((len(call.rows), length), dtype=np.int64)
    mask = np.zeros_like(tokens)
    for index, row in enumerate(call.rows):
        if len(row) > length:
            raise InvalidField(
                f"input[{index}]",
                f"input[{index}] has {len(row)} tokens; this model takes {length}",
            )
        tokens[index, : len(row)] = row
        mask[index, : len(row)] = 1
    return InferenceRequest(call.model, {IDS: tokens, MASK: mask}, id=request_id)


def embeddings_document(call: Embedding, response: InferenceResponse) -> dict[str, Any]:
    """OpenAI's list of embeddings (unit length), with the tokens counted as the prompt's."""
    vectors = _vectors(response, np.array([len(r) for r in call.rows]))
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    vectors = (vectors / np.where(norms > 0, norms, 1.0)).astype(np.float32)
    data = [
        {"object": "embedding", "index": i, "embedding": _encoded(v, call.base64)}
        for i, v in enumerate(vectors)
    ]
    tokens = sum(len(r) for r in call.rows)
    return {
        "object": "list",
        "data": data,
        "model": call.model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }


def _vectors(response: InferenceResponse, lengths: np.ndarray) -> np.ndarray:
    pooled = response.outputs.get(POOLED)
    if pooled is not None:
        return np.asarray(pooled, dtype=np.float64).reshape(len(lengths), -1)
    hidden = np.asarray(response.outputs[HIDDEN], dtype=np.float64)
    mask = np.arange(hidden.shape[1])[None, :] < lengths[:, None]
    summed: np.ndarray = (hidden * mask[..., None]).sum(axis=1)
    mean: np.ndarray = summed / lengths[:, None]
    return mean


def _encoded(vector: np.ndarray, as_base64: bool) -> list[float] | str:
    # base64: the float32 bytes, little-endian, as OpenAI's client decodes them.
    if as_base64:
        return base64.b64encode(vector.astype("<f4").tobytes()).decode()
    return [float(x) for x in vector]
