"""A dollar budget (`budget: {dollars: N}`) pauses a run before the round that would go past it,
like the token budget: the rounds' dollars and the interviews' count, the reason says how much
was spent and what the next round needs, and a resume needs a larger one (`--budget-dollars`)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError
from test_orchestrator_logic import PLACEMENT, result

from populace.client.live import SteerError, raised_budget
from populace.core.contracts import Budget, ModelUse, RunConfig, Usage, money
from populace.core.scenario import ScenarioError, format_validation_error, parse_scenario
from populace.orchestrator.workflow import (
    FinishRun,
    OpenRound,
    new_run,
    on_result,
    on_resume,
    on_spawned,
    over_budget,
    planned_interviews,
    resume_refusal,
)

PRICED = {"name": "m", "kind": "sim", "prices": {"input": 2.0, "cached_input": 0.5, "output": 8.0}}
# 10 calls: 900 prompt tokens (300 of them cached) and 100 completion tokens at PRICED's prices
ROUND = Usage(llm_calls=10, prompt_tokens=900, cached_tokens=300, completion_tokens=100,
              dollars=(600 * 2.0 + 300 * 0.5 + 100 * 8.0) / 1e6)


def running(config: RunConfig):
    s = new_run("r1", config, PLACEMENT)
    s, _ = on_spawned(s, "h1")
    s, _ = on_spawned(s, "h2")
    return s


def config(dollars: float, **more) -> RunConfig:
    return RunConfig(agents=10, rounds=5, models=[PRICED], budget={"dollars": dollars}, **more)


def test_the_round_usage_is_what_the_prices_say():
    assert ROUND.dollars == pytest.approx(0.00215)


def test_a_run_pauses_before_the_round_that_would_spend_past_its_dollar_cap_and_a_larger_one_resumes_it():
    s = running(config(0.007))  # room for 3 rounds of 0.00215, not 4
    for n in (1, 2):
        s, acts = on_result(s, result(n).model_copy(update={"usage": ROUND}))
        assert acts == [OpenRound(n + 1, 10)]
    s, acts = on_result(s, result(3).model_copy(update={"usage": ROUND}))
    assert s.status == "paused" and s.round == 3 and acts == [FinishRun("paused", 3, s.reason)]
    assert s.used.dollars == pytest.approx(3 * ROUND.dollars)
    assert s.reason == ("budget: $0.0065 of $0.0070 spent, and the next round needs about $0.0022 more "
                        "(--budget-dollars); `populace resume r1 --budget-… N` raises it and continues")
    # the same cap would pause again at once: refused; a larger one plays on from round 4
    assert "give a larger budget" in resume_refusal(s)
    assert on_resume(s, PLACEMENT) == (s, [])
    assert resume_refusal(s, Budget(dollars=0.0087)) is None
    r, acts = on_resume(s, PLACEMENT, budget=Budget(dollars=0.01))
    assert r.status == "spawning" and r.config.budget == Budget(dollars=0.01) and acts
    assert r.used.dollars == s.used.dollars  # the budget counts from the run's start


def test_the_token_budget_is_checked_first_and_each_names_its_flag():
    both = Budget(tokens=10_000, dollars=0.001)
    assert "--budget-dollars" in over_budget(both, ROUND, ROUND)
    assert "--budget-tokens" in over_budget(Budget(tokens=1500, dollars=0.001), ROUND, ROUND)
    assert over_budget(Budget(dollars=1.0), ROUND, ROUND) is None


def test_interviews_dollars_count_against_the_dollar_budget():
    questions = [{"id": "a", "text": "A?", "options": ["x", "y"]}]
    c = config(0.006, interviews=[{"id": "s", "after": [2], "questions": questions}])
    s = running(c)
    # after round 2 every agent answers: 10 calls priced per call as the last round's, $0.00215
    asked = planned_interviews(c, 2, Usage(), ROUND)
    assert asked.llm_calls == 10 and asked.dollars == pytest.approx(ROUND.dollars)
    assert asked.cached_tokens == 300
    s, acts = on_result(s, result(1).model_copy(update={"usage": ROUND}))
    # 0.00215 spent; round 2 (0.00215) and its interviews (0.00215) would pass 0.006
    assert s.status == "paused" and acts == [FinishRun("paused", 1, s.reason)]
    assert "needs about $0.0043 more, $0.0022 of them for the interviews planned after it" in s.reason
    # the interviews' own dollars, carried by a later round's result, count too
    s = running(config(0.005))
    s, _ = on_result(s, result(1).model_copy(update={"usage": ROUND, "interviews": ROUND}))
    assert s.status == "paused" and "$0.0043 of $0.0050 spent" in s.reason


def test_a_dollar_budget_needs_priced_models():
    for data, needle in (({"budget": {"dollars": 5}}, "budget.dollars: needs `models:`"),
                         ({"models": [{"name": "m", "kind": "sim"}], "budget": {"dollars": 5}},
                          "budget.dollars: no model has prices"),
                         ({"models": [PRICED], "budget": {"dollars": 0}}, "budget.dollars"),
                         ({"models": [PRICED], "budget": {"dollars": float("inf")}}, "budget.dollars")):
        with pytest.raises((ValidationError, ScenarioError)) as err:
            parse_scenario(data)
        text = str(err.value) if isinstance(err.value, ScenarioError) else format_validation_error(err.value)
        assert needle in text, text
    assert parse_scenario({"models": [PRICED], "budget": {"dollars": 5}}).budget.dollars == 5


def test_resume_replaces_only_the_limits_given_and_refuses_dollars_for_a_run_without_prices():
    s = running(config(0.007).model_copy(update={"budget": Budget(tokens=9000, dollars=0.007)}))
    assert raised_budget(s, None, None, None) is None
    assert raised_budget(s, None, None, 0.02) == Budget(tokens=9000, dollars=0.02)
    assert raised_budget(s, 20_000, None, None) == Budget(tokens=20_000, dollars=0.007)  # its dollars kept
    free = running(RunConfig(agents=10, rounds=5, budget={"tokens": 100}))
    with pytest.raises(SteerError, match="--budget-dollars: run r1's models have no prices"):
        raised_budget(free, None, None, 1.0)


def test_usage_adds_dollars_and_cached_tokens_per_model():
    a = Usage(llm_calls=1, prompt_tokens=10, cached_tokens=4, dollars=0.5,
              by_model={"m": ModelUse(llm_calls=1, prompt_tokens=10, cached_tokens=4, dollars=0.5)})
    total = a + a
    assert (total.cached_tokens, total.dollars, total.by_model["m"].dollars) == (8, 1.0, 1.0)


@pytest.mark.parametrize("dollars,text", [(0, "$0"), (0.0042, "$0.0042"), (0.00001234, "$0.000012"),
                                          (0.009999, "$0.010"), (0.0065, "$0.0065"), (0.123, "$0.12"), (0.999, "$1.00"), (0.5, "$0.50"), (12.345, "$12.35"),
                                          (1234.5, "$1,234"), (1e-12, "<$0.000000001")])
def test_money_reads_as_people_write_it_and_never_rounds_a_cost_to_zero(dollars, text):
    assert money(dollars) == text
