"""The engine's per-request sampling processors: greedy rows untouched, temperature and top-p
per row, and a draw from each request's own seeded generator."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from dlscale.backends.generative.transformers_sampling import (  # noqa: E402
    RequestSampling,
    request_settings,
)


def rows(*settings: dict[str, Any]) -> list[Any]:
    return [
        SimpleNamespace(has_new_token=True, state=SimpleNamespace(logit_processor_kwargs=s))
        for s in settings
    ]


def processed(scores: Any, requests: list[Any]) -> Any:
    sampling = RequestSampling()
    storage = torch.zeros((sampling.tensors_required, len(requests)), dtype=torch.int32)
    arguments = sampling.prepare_tensor_args(requests, storage)
    return sampling(torch.zeros(len(requests), dtype=torch.long), scores.clone(), arguments)


SCORES = torch.tensor([[2.0, 1.0, 0.5, -1.0], [0.0, 3.0, 1.0, 2.9]])


def test_a_greedy_row_keeps_its_scores_and_its_arg_max() -> None:
    out = processed(SCORES, rows(request_settings(0.0, 1.0, None), request_settings(0.0, 1.0, 3)))
    assert torch.equal(out, SCORES)


def test_a_sampled_row_keeps_only_the_drawn_token() -> None:
    out = processed(SCORES, rows(request_settings(1.0, 1.0, 5), request_settings(0.0, 1.0, None)))
    assert int(torch.isfinite(out[0]).sum()) == 1
    assert torch.equal(out[1], SCORES[1])  # the greedy row beside it is untouched


def test_top_p_keeps_the_smallest_set_that_reaches_it() -> None:
    # Probabilities about 0.61, 0.22, 0.14, 0.03: top_p 0.7 keeps the first two only.
    drawn = {
        int(processed(SCORES[:1], rows(request_settings(1.0, 0.7, seed)))[0].argmax())
        for seed in range(200)
    }
    assert drawn == {0, 1}


def test_the_same_seed_draws_the_same_tokens() -> None:
    def draws(seed: int) -> list[int]:
        settings = request_settings(1.5, 1.0, seed)
        return [int(processed(SCORES[:1], rows(settings))[0].argmax()) for _ in range(30)]

    assert draws(11) == draws(11)
    assert draws(11) != draws(12)
