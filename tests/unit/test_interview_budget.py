"""Budgets count interviews: the interviews' LLM work the hosts report rides apart from the
rounds' (`RunState.interviews`, not `used`), and a run pauses before the round whose planned
interviews, with the round itself, would go past its budget; a resume checks the same."""

from __future__ import annotations

from test_orchestrator_logic import PLACEMENT, result

from populace.core.contracts import Budget, RunConfig, Usage
from populace.orchestrator.workflow import (
    FinishRun,
    OpenRound,
    new_run,
    on_result,
    on_spawned,
    planned_interviews,
    resume_refusal,
)

ROUND = Usage(llm_calls=10, prompt_tokens=900, completion_tokens=100)  # 100 tokens a call
ASKED = Usage(llm_calls=20, prompt_tokens=1000, completion_tokens=200)  # 60 tokens a call
QUESTIONS = [{"id": "a", "text": "A?", "options": ["x", "y"]}, {"id": "b", "text": "B?", "points": 5}]


def running(config: RunConfig):
    s = new_run("r1", config, PLACEMENT)
    s, _ = on_spawned(s, "h1")
    s, _ = on_spawned(s, "h2")
    return s


def test_interviews_after_the_next_round_count_against_the_budget():
    # after round 3 every agent answers two questions: 20 calls of ~60 tokens = 1200 tokens
    config = RunConfig(agents=10, rounds=4, budget={"tokens": 3500},
                       interviews=[{"id": "s", "after": [1, 3], "questions": QUESTIONS}])
    s = running(config)
    s, acts = on_result(s, result(1).model_copy(update={"usage": ROUND}))
    assert acts == [OpenRound(2, 10)] and s.interviews == Usage()
    # round 2's partials carry round 1's interviews, done meanwhile: counted apart from the rounds'
    s, acts = on_result(s, result(2).model_copy(update={"usage": ROUND, "interviews": ASKED}))
    assert s.used.tokens == 2000 and s.interviews.tokens == 1200
    # 3200 spent; round 3 (1000) and its interviews (1200) would pass 3500: the run pauses before it
    assert s.status == "paused" and acts == [FinishRun("paused", 2, s.reason)]
    assert "3,200 of 3,500 tokens used" in s.reason and "needs about 2,200 more, 1,200 of them for the interviews" \
        in s.reason
    assert "give a larger budget" in resume_refusal(s)
    assert resume_refusal(s, Budget(tokens=5400)) is None


def test_without_the_interviews_the_same_run_plays_on():
    s = running(RunConfig(agents=10, rounds=4, budget={"tokens": 3500}))
    s, _ = on_result(s, result(1).model_copy(update={"usage": ROUND}))
    s, acts = on_result(s, result(2).model_copy(update={"usage": ROUND}))
    assert acts == [OpenRound(3, 10)]


def test_what_planned_interviews_likely_need():
    config = RunConfig(agents=1000, rounds=3, interviews=[
        {"id": "each", "after": "every", "sample": 0.1, "questions": QUESTIONS},
        {"id": "together", "after": [2], "mode": "together", "agents": [1, 2, 3], "questions": QUESTIONS}])
    assert planned_interviews(config, 1, Usage(), ROUND) == Usage(llm_calls=200, prompt_tokens=18000,
                                                                  completion_tokens=2000)
    assert planned_interviews(config, 2, ASKED, ROUND).llm_calls == 203
    assert planned_interviews(config, 2, ASKED, ROUND).tokens == 203 * 60
    assert planned_interviews(RunConfig(), 1, ASKED, ROUND) == Usage()
