"""The DataPlane's typed answers as the REST protocol's JSON documents (Triton's layouts)."""

from __future__ import annotations

from typing import Any

from dlscale.types import (
    ModelConfigView,
    ModelMetadata,
    ModelStatistics,
    RepositoryEntry,
    ServerMetadata,
)
from dlscale.wire.documents import as_document, config_message, statistics_message


def server_metadata(meta: ServerMetadata) -> dict[str, Any]:
    """`GET /v2`: `{name, version, extensions}`."""
    return {"name": meta.name, "version": meta.version, "extensions": list(meta.extensions)}


def model_metadata(meta: ModelMetadata) -> dict[str, Any]:
    """`GET /v2/models/{m}`: `{name, versions, platform, inputs, outputs}`."""
    return {
        "name": meta.name,
        "versions": list(meta.versions),
        "platform": meta.platform,
        "inputs": [s.to_dict() for s in meta.inputs],
        "outputs": [s.to_dict() for s in meta.outputs],
    }


def model_config(view: ModelConfigView) -> dict[str, Any]:
    """`GET /v2/models/{m}/config`: the JSON form of Triton's ModelConfig message."""
    return as_document(config_message(view))


def statistics(stats: list[ModelStatistics]) -> dict[str, Any]:
    """`GET /v2/models[/{m}]/stats`: Triton's statistics extension."""
    return as_document(statistics_message(stats))


def repository_index(rows: list[RepositoryEntry]) -> list[dict[str, Any]]:
    """`POST /v2/repository/index`: one row per version; no `version` for a model with none;
    a loaded version's `memory`, bytes by device (dlscale's addition, docs/memory.md)."""
    out = []
    for row in rows:
        doc: dict[str, Any] = {"name": row.name, "state": row.state, "reason": row.reason}
        if row.version:
            doc["version"] = row.version
        if row.memory:
            doc["memory"] = dict(row.memory)
        out.append(doc)
    return out
