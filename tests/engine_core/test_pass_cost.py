from __future__ import annotations

import pytest

from engine_core.pass_cost import REFIT_EVERY, PassCostFit


def feed(fit: PassCostFit, passes: int, fixed_s: float, per_token_s: float) -> list[float | None]:
    """Passes of 64 to 1,024 padded tokens, as the cuts of served windows vary, timed by the cost model."""
    answers = []
    for index in range(passes):
        tokens = 64 + (index * 97) % 961
        answers.append(fit.observe(tokens, fixed_s + per_token_s * tokens))
    return answers


def test_it_answers_every_refit_every_passes_the_fixed_cost_in_tokens_the_passes_show() -> None:
    fit = PassCostFit(cap=8192)
    answers = feed(fit, 2 * REFIT_EVERY, fixed_s=0.010, per_token_s=0.0001)
    assert answers[: REFIT_EVERY - 1] == [None] * (REFIT_EVERY - 1)
    assert answers[REFIT_EVERY - 1] == pytest.approx(100.0)
    assert answers[-1] == pytest.approx(100.0)


def test_it_follows_the_latest_passes() -> None:
    fit = PassCostFit(cap=8192)
    feed(fit, 4 * REFIT_EVERY, fixed_s=0.010, per_token_s=0.0001)
    answers = feed(fit, 8 * REFIT_EVERY, fixed_s=0.030, per_token_s=0.0001)
    assert answers[-1] == pytest.approx(300.0, rel=0.05)


def test_passes_alike_in_size_say_nothing_and_passes_that_cost_the_same_whatever_their_size_answer_the_cap() -> None:
    alike = PassCostFit(cap=8192)
    assert [alike.observe(200 + index % 3, 0.03) for index in range(REFIT_EVERY)][-1] is None
    launch_bound = PassCostFit(cap=8192)  # a GPU's passes: launches, not tokens
    assert feed(launch_bound, REFIT_EVERY, fixed_s=0.005, per_token_s=0.0)[-1] == 8192
