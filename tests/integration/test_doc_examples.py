"""The client examples in docs/serving-*.md run as written, against the zoo's models."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.toolkit.doc_blocks import ROOT, code_blocks
from tests.toolkit.server import LocalServer, serving

#: The addresses the examples use, and which of the server's ports each stands for.
ADDRESSES = {"localhost:8000": "http", "127.0.0.1:8000": "http", "127.0.0.1:8001": "grpc"}


def _client_examples() -> list[tuple[str, str]]:
    found = []
    for doc in ("serving-rest.md", "serving-grpc.md"):
        blocks = code_blocks(ROOT / "docs" / doc)
        found += [
            (doc, b) for lang, b in blocks if lang == "python" and "InferenceServerClient(" in b
        ]
    return found


EXAMPLES = _client_examples()


@pytest.fixture(scope="module")
def server(small_repo: Path) -> Iterator[LocalServer]:
    with serving(small_repo) as running:
        yield running


def test_the_docs_have_client_examples() -> None:
    assert {doc for doc, _ in EXAMPLES} == {"serving-rest.md", "serving-grpc.md"}


@pytest.mark.parametrize("example", [b for _, b in EXAMPLES], ids=[d for d, _ in EXAMPLES])
def test_a_client_example_runs_as_written(
    server: LocalServer, example: str, capsys: pytest.CaptureFixture[str]
) -> None:
    for address, frontend in ADDRESSES.items():
        example = example.replace(address, f"127.0.0.1:{server.server.ports[frontend]}")
    exec(compile(example, "<doc example>", "exec"), {})
    assert capsys.readouterr().out.strip()  # each example prints its answer
