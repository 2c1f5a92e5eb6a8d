"""The engine's per-request sampling processors: greedy rows untouched, temperature, top-k and
top-p per row, a draw from each request's own seeded generator, and the row processors
(repetition penalty, min_tokens, recorded logprobs) on each row's own history."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from dlscale.backends.generative.transformers_rows import RowState  # noqa: E402
from dlscale.backends.generative.transformers_sampling import (  # noqa: E402
    RequestSampling,
)
from dlscale.backends.generative.transformers_sampling import (  # noqa: E402
    request_settings as settings_of,
)
from dlscale.sampling import Sampling  # noqa: E402

#: The states made by `request_settings`, kept alive while a test runs (the engine would).
_KEPT: list[RowState] = []


def request_settings(
    temperature: float, top_p: float, seed: int | None, **more: Any
) -> dict[str, Any]:
    prompt, eos = more.pop("prompt", [0]), more.pop("eos", [3])
    sampling = Sampling(temperature=temperature, top_p=top_p, seed=seed, **more)
    state = RowState(
        prompt,
        eos,
        min_tokens=sampling.min_tokens,
        repetition_penalty=sampling.repetition_penalty,
        logprobs=sampling.logprobs,
    )
    _KEPT.append(state)
    return settings_of(sampling, state)


def rows(*settings: dict[str, Any], generated: tuple[int, ...] = ()) -> list[Any]:
    return [
        SimpleNamespace(
            has_new_token=True,
            state=SimpleNamespace(logit_processor_kwargs=s, generated_tokens=list(generated)),
        )
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


def test_top_k_one_leaves_the_arg_max_alone() -> None:
    drawn = set()
    for seed in range(50):
        settings = request_settings(2.0, 1.0, seed, top_k=1)
        drawn.add(int(processed(SCORES[1:], rows(settings))[0].argmax()))
    assert drawn == {1}  # row 1's best (3.0), never its close second (2.9)


def test_min_tokens_forbids_the_end_token_until_reached() -> None:
    settings = request_settings(0.0, 1.0, None, min_tokens=2, max_tokens=4)
    early = processed(SCORES, rows(settings, settings))
    assert early[0, 3] == float("-inf") and early[1, 3] == float("-inf")
    assert int(early[1].argmax()) == 1  # the end token (3) was row 1's close second
    later = request_settings(0.0, 1.0, None, min_tokens=2, max_tokens=4)
    assert torch.equal(processed(SCORES, rows(later, later, generated=(1, 1))), SCORES)


def test_repetition_penalty_lowers_the_tokens_already_seen() -> None:
    settings = request_settings(0.0, 1.0, None, repetition_penalty=2.0, prompt=[1])
    out = processed(SCORES, rows(settings, settings, generated=(0,)))
    # Positive scores halve, negative ones double; tokens never seen stay.
    assert out[0].tolist() == pytest.approx([1.0, 0.5, 0.5, -1.0])
    assert out[1].tolist() == pytest.approx([0.0, 1.5, 1.0, 2.9])
    assert int(out[1].argmax()) == 3  # token 1 lost its lead to one not yet said


def test_logprobs_are_the_raw_scores_of_the_chosen_token_and_the_best() -> None:
    settings = request_settings(0.0, 1.0, None, logprobs=2)
    state = settings["rows"]
    processed(SCORES[:1], rows(settings))
    [record] = state.records
    raw = torch.log_softmax(SCORES[0], dim=-1)
    assert record.token == 0 and record.logprob == pytest.approx(float(raw[0]))
    assert [t for t, _ in record.top] == [0, 1]
    assert record.top[1][1] == pytest.approx(float(raw[1]))
