"""Questions, surveys and their answers (populace.sdk.interview): what a valid answer is, the
schema sent, how a model's text is read (one re-ask), how calls are seeded apart from a round's,
and bad input refused naming the field before anything is asked."""

from __future__ import annotations

import asyncio

import pytest
from pydantic import ValidationError

from populace.core.contracts import PlannedInterview, Question, RunConfig, Survey
from populace.core.interviews import expected, owed_rounds, respondents
from populace.core.scenario import format_validation_error
from populace.sdk import interview
from populace.sdk.llm import ASKING, CALLER, InferError, ModelUnavailable, call_tag
from populace.sdk.mock import DummyLLM, ScriptedLLM
from populace.sdk.registry import resolve

CAR = Question(id="car", text="Do you own a car?", options=["yes", "no", "not any more"])
TRUST = Question(id="trust", text="Do you trust the council?", labels=["no", "somewhat", "yes"])
COUNT = Question(id="count", text="How many trips a week?", min=0, max=20, integer=True)
SHARE = Question(id="share", text="What share of your trips are by car?", min=0, max=1)
WHY = Question(id="why", text="Why?", max_chars=40)


def refusal(model, **data) -> str:
    with pytest.raises(ValidationError) as err:
        model(**data)
    return format_validation_error(err.value)


@pytest.mark.parametrize(("data", "says"), [
    ({"id": "q", "text": "   "}, "text: a question needs its text"),
    ({"id": "q"}, "text: Field required"),
    ({"id": "q", "text": "x", "options": ["Yes", " yes "]}, "options: option 1 ('yes') repeats option 0 ('Yes')"),
    ({"id": "q", "text": "x", "options": ["only"]}, "options: a question with options needs 2 to 26, not 1"),
    ({"id": "q", "text": "x", "points": 1}, "points: a Likert scale needs 2 to 11 points, not 1"),
    ({"id": "q", "text": "x", "labels": ["agree"]}, "points: a Likert scale needs 2 to 11 points, not 1"),
    ({"id": "q", "text": "x", "points": 5, "labels": ["a", "b"]}, "labels: 2 labels for 5 points"),
    ({"id": "q", "text": "x", "kind": "number", "min": 3}, "min, max: a number question needs its range"),
    ({"id": "q", "text": "x", "min": 3, "max": 3}, "min: 3 must be below max (3)"),
    ({"id": "q", "text": "x", "min": 0.2, "max": 0.8, "integer": True}, "min, max: no whole number lies in"),
    ({"id": "q", "text": "x", "options": ["a", "b"], "max_chars": 5}, "max_chars: not a key of a options question"),
    ({"id": "q", "text": "x", "max_chars": 0}, "max_chars: 1 to 10000, not 0"),
    ({"id": "q.1", "text": "x"}, "id: String should match pattern"),
    ({"id": "q", "text": "x", "min": float("nan"), "max": 1}, "min: Input should be a finite number"),
])
def test_bad_questions_are_refused_naming_the_field(data, says):
    assert says in refusal(Question, **data)


def test_the_kind_follows_from_the_keys():
    assert [q.kind for q in (CAR, TRUST, COUNT, WHY)] == ["options", "likert", "number", "text"]
    assert TRUST.points == 3 and Question(id="q", text="x", points=7).labels is None
    assert WHY.max_chars == 40 and Question(id="q", text="x").max_chars == 500


def test_bad_surveys_and_plans_are_refused_naming_the_field():
    assert "question 1's id 'car' is used twice" in refusal(Survey, id="s", questions=[CAR, CAR])
    assert "questions: List should have at least 1 item" in refusal(Survey, id="s", questions=[])
    plan = {"id": "p", "questions": [CAR.model_dump()]}
    assert "sample: Input should be greater than 0" in refusal(PlannedInterview, **plan, after=[1], sample=0)
    assert "sample: Input should be less than or equal to 1" in refusal(PlannedInterview, **plan, after=[1],
                                                                         sample=1.5)
    assert "sample, agents: give one of them" in refusal(PlannedInterview, **plan, after=[1], sample=0.5, agents=[1])
    assert "after: the rounds after which to ask" in refusal(PlannedInterview, **plan, after=[])
    assert "interviews.0.after: round 4 is after the run's last round (3)" in refusal(
        RunConfig, rounds=3, interviews=[{**plan, "after": [2, 4]}])
    assert "interviews.0.agents: agent 10 does not exist (ids are 0..9)" in refusal(
        RunConfig, agents=10, interviews=[{**plan, "after": "every", "agents": [3, 10]}])
    assert "interviews.1.id: survey 'p' is planned twice" in refusal(
        RunConfig, interviews=[{**plan, "after": [1]}, {**plan, "after": [2]}])


def test_schemas():
    assert interview.schema(CAR) == {"type": "object", "properties": {"answer": {
        "type": "string", "enum": ["yes", "no", "not any more"]}}, "required": ["answer"]}
    assert interview.value_schema(TRUST) == {"type": "integer", "minimum": 1, "maximum": 3}
    assert interview.value_schema(COUNT) == {"type": "integer", "minimum": 0, "maximum": 20}
    assert interview.value_schema(SHARE) == {"type": "number", "minimum": 0, "maximum": 1}
    assert interview.value_schema(WHY) == {"type": "string", "maxLength": 40}
    together = Survey(id="s", mode="together", questions=[CAR, COUNT])
    assert interview.schema(together)["required"] == ["car", "count"]
    assert interview.schema(CAR) is interview.schema(CAR)  # one object per question: a port batches by it


@pytest.mark.parametrize(("q", "text", "valid", "answer", "value"), [
    (CAR, '{"answer": "Not  any more"}', True, "not any more", None),  # case and spacing ignored
    (CAR, '{"answer": "maybe"}', False, None, None),
    (CAR, "yes", True, "yes", None),  # a backend that ignored the schema answered bare
    (TRUST, '{"answer": 2}', True, "2", 2.0),
    (TRUST, '{"answer": "Somewhat"}', True, "2", 2.0),  # the label instead of its point
    (TRUST, '{"answer": 4}', False, None, None),
    (TRUST, '{"answer": 1.5}', False, None, None),
    (TRUST, '{"answer": true}', False, None, None),
    (COUNT, '{"answer": 7}', True, "7", 7.0),
    (COUNT, '{"answer": 7.5}', False, None, None),
    (COUNT, '{"answer": 21}', False, None, None),
    (SHARE, '{"answer": 0.25}', True, "0.25", 0.25),
    (SHARE, '{"answer": -0.1}', False, None, None),
    (WHY, '{"answer": " Too far "}', True, "Too far", None),
    (WHY, '{"answer": "' + "x" * 41 + '"}', False, None, None),
    (WHY, '{"answer": ""}', False, None, None),
    (WHY, "", False, None, None),
])
def test_parse(q, text, valid, answer, value):
    (a,) = interview.parse(q, text)
    assert (a.valid, a.answer, a.value) == (valid, answer, value)
    assert (a.error is None) == valid


def test_parse_a_survey_asked_together():
    s = Survey(id="s", mode="together", questions=[CAR, COUNT])
    got = interview.parse(s, '{"car": "no", "count": 99}')
    assert [a.valid for a in got] == [True, False] and got[1].error == "99 is outside [0, 20]"
    assert [a.valid for a in interview.parse(s, "no")] == [False, False]


def test_interview_tags_never_meet_a_rounds():
    base = interview.tag_base(CAR)
    assert base >> 62 == 1 and base < 2**63 and base & 0xFFFF == 0
    # a round's tags: an agent's own calls count from 0, a call for another key has the caller in bits 32..58
    assert ((100_000_000 + 1) << 32 | 0xFFFF) < 2**59 < base
    counts: dict = {}
    token = ASKING.set(base)
    try:
        assert [call_tag(counts, 5) for _ in range(3)] == [base, base + 1, base + 2]
    finally:
        ASKING.reset(token)
    assert call_tag(counts, 5) == 0  # the round's own first call is untouched
    assert interview.digest(CAR) == interview.digest(CAR.model_copy(update={"id": "other"}))
    assert interview.digest(CAR) != interview.digest(CAR.model_copy(update={"text": "A car?"}))


def sim():
    return resolve(RunConfig(simulation="vote", agents=20, rounds=3, seed=7)).instance("r")


def ask(survey, llm, ids=range(20), reasks=1):
    rows = interview.Rows()
    asyncio.run(interview.ask(sim(), [(i, {"memory": [[1, "yes"], [2, "no"]]}) for i in ids], survey, llm, rows,
                              reasks=reasks))
    return rows


def answers(rows):
    return {(a, q): x for a, q, x in zip(rows.columns["agent_id"], rows.columns["question"], rows.columns["answer"])}


def test_an_answer_depends_on_the_agent_round_and_question_only():
    llm = lambda: DummyLLM(seed=7, round_=2)  # noqa: E731
    whole = answers(ask(Survey(id="s", questions=[CAR, TRUST, COUNT, SHARE, WHY]), llm()))
    alone = answers(ask(Survey(id="other", questions=[COUNT]), llm()))
    reordered = answers(ask(Survey(id="s", questions=[WHY, COUNT, CAR]), llm()))
    assert {k: v for k, v in whole.items() if k[1] == "count"} == alone
    assert {k: v for k, v in whole.items() if k[1] in ("why", "count", "car")} == reordered
    later = answers(ask(Survey(id="s", questions=[COUNT]), DummyLLM(seed=7, round_=3)))
    assert later != alone  # another round: other draws
    assert len({v for k, v in whole.items() if k[1] == "car"}) > 1  # agents answer apart


def test_the_default_prompt():
    s = sim()
    s.cast = None
    agent = interview.copy_of(s, 3, {"memory": [[1, "yes"], [2, "no"]]})
    text, prefix = interview.prompt(agent, TRUST)
    assert text == ("What you remember so far:\n- 1 · yes\n- 2 · no\n\nQuestion: Do you trust the council?\n"
                    "Answer on a scale from 1 to 3: 1 = no, 2 = somewhat, 3 = yes.\nAnswer with JSON: "
                    '{"answer": <point>}')
    assert prefix == 0
    llm = ScriptedLLM('{"answer": 2}')
    asyncio.run(agent.answer(TRUST, llm))
    (call,) = llm.asked
    assert call.system == interview.SYSTEM and call.schema == interview.schema(TRUST) and call.key == 3


def test_an_invalid_answer_is_asked_again_once_then_kept_invalid_with_its_text():
    script = {0: ['{"answer": "maybe"}', '{"answer": "yes"}'], 1: ['{"answer": "maybe"}', "I walk"],
              2: ['{"answer": "no"}']}
    llm = ScriptedLLM(script)
    rows = ask(Survey(id="s", questions=[CAR]), llm, ids=[0, 1, 2])
    c = rows.columns
    assert c["valid"] == [True, False, True] and c["answer"] == ["yes", None, "no"]
    assert c["raw"][1] == "I walk" and c["error"][1] == "'I walk' is not one of the options"
    assert [a.key for a in llm.asked].count(0) == 2 and [a.key for a in llm.asked].count(2) == 1
    reask = [a.prompt for a in llm.asked if a.key == 0][1]
    assert "(Your answer '{\"answer\": \"maybe\"}' was not valid: 'maybe' is not one of the options." in reask
    none = ask(Survey(id="s", questions=[CAR]), ScriptedLLM({0: ['{"answer": "maybe"}', '{"answer": "yes"}']}),
               ids=[0], reasks=0)
    assert none.columns["valid"] == [False]


def test_no_model_is_never_an_answer():
    with pytest.raises(ModelUnavailable):
        ask(Survey(id="s", questions=[CAR]), ScriptedLLM(lambda key, prompt: InferError("down")))


def test_the_dummy_models_calls_are_seeded_by_their_tags():
    seen = []

    class Recording(DummyLLM):
        async def ask(self, prompt, *, key, **kw):
            seen.append((key, CALLER.get(), ASKING.get()))
            return await super().ask(prompt, key=key, **kw)

    ask(Survey(id="s", questions=[CAR, COUNT]), Recording(seed=1, round_=1), ids=[4])
    assert seen == [(4, 4, interview.tag_base(CAR)), (4, 4, interview.tag_base(COUNT))]


def test_a_sample_is_the_same_every_round_and_about_its_size():
    ids = respondents(10_000, seed=3, survey_id="panel", sample=0.1)
    assert 900 < ids.size < 1100
    assert (ids == respondents(10_000, seed=3, survey_id="panel", sample=0.1)).all()
    assert not (ids[:50] == respondents(10_000, seed=3, survey_id="other", sample=0.1)[:50]).all()
    assert respondents(10, seed=3, survey_id="p", agents=[7, 2]).tolist() == [2, 7]
    assert respondents(4, seed=3, survey_id="p").tolist() == [0, 1, 2, 3]


@pytest.mark.parametrize(("last", "first", "resumed", "owes", "awaits"), [
    (4, 1, None, (1, 4), (1, 4)),  # a run: every round it played, all still to come
    (4, 3, None, (3, 4), (3, 4)),  # a fork after round 2: its parent answered rounds 1 and 2
    (5, 1, 3, (1, 5), (3, 5)),  # resumed after round 3: round 3 is asked again, rounds 1-2 never
    (5, 3, 2, (3, 5), (3, 5)),  # a fork after round 2, resumed before it completed a round of its own
    (5, 3, 4, (3, 5), (4, 5)),  # ... or after round 4
    (2, 1, 0, (1, 2), (1, 2)),  # resumed before round 1 closed
])
def test_what_a_run_owes_and_awaits_after_its_last_round(last, first, resumed, owes, awaits):
    got = owed_rounds(last, first, resumed)
    assert (got[0].start, got[0].stop - 1) == owes and (got[1].start, got[1].stop - 1) == awaits


def test_the_answers_a_fork_owes_start_at_its_first_round():
    """A panel (every round, a seeded half) and an exit poll after round 3, on a 4-round run of
    1,000 agents: the run owes 4 waves of the panel and the poll; its fork after round 2 two
    waves and the poll; after round 3, one wave."""
    panel = PlannedInterview(id="panel", after="every", sample=0.5, questions=[CAR, TRUST])
    exit_poll = PlannedInterview(id="exit", after=[3], questions=[WHY])
    half = respondents(1000, seed=9, survey_id="panel", sample=0.5).size
    assert 450 < half < 550
    plans = [panel, exit_poll]
    assert expected(plans, 1000, 9, 4) == 4 * half * 2 + 1000
    assert expected(plans, 1000, 9, 4, first_round=3) == 2 * half * 2 + 1000
    assert expected(plans, 1000, 9, 4, first_round=4) == half * 2
    assert expected(plans, 1000, 9, 2, first_round=3) == 0


class FuturePort:
    """A port whose `ask` returns a future at once, as the fleet's InferSession does: agents
    that answer by default are then asked without a task each (interview._ask_by_default)."""

    def __init__(self, inner):
        self.inner = inner

    def ask(self, prompt, **kw):
        return asyncio.ensure_future(self.inner.ask(prompt, **kw))


def by_agent(rows):
    c = rows.columns
    keep = ("valid", "answer", "value", "raw", "error")
    return sorted(zip(c["agent_id"], c["question"], *(c[k] for k in keep), strict=True))


@pytest.mark.parametrize("mode", ["each", "together"])
def test_answers_without_a_task_per_agent_are_the_same(mode, monkeypatch):
    taken = []
    by_default = interview._ask_by_default
    monkeypatch.setattr(interview, "_ask_by_default", lambda *a, **kw: taken.append(1) or by_default(*a, **kw))
    survey = Survey(id="s", questions=[CAR, TRUST, COUNT, SHARE, WHY], mode=mode)
    tasks = ask(survey, DummyLLM(seed=7, round_=2))
    futures = ask(survey, FuturePort(DummyLLM(seed=7, round_=2)))
    assert by_agent(futures) == by_agent(tasks) and len(tasks.columns["agent_id"]) == 100
    assert taken == [1]  # the port's futures took the path without tasks; the coroutines did not
    script = {0: ['{"answer": "maybe"}', '{"answer": "yes"}'], 1: ['{"answer": "maybe"}', "I walk"],
              2: ['{"answer": "no"}'], 3: [TypeError("a bug")]}
    one = Survey(id="s", questions=[CAR])
    scripted, asked = ScriptedLLM(script), ScriptedLLM(script)
    assert by_agent(ask(one, FuturePort(scripted), ids=[0, 1, 2, 3, 4])) == by_agent(ask(one, asked, ids=[0, 1, 2, 3, 4]))
    assert sorted((a.key, a.prompt) for a in scripted.asked) == sorted((a.key, a.prompt) for a in asked.asked)
    with pytest.raises(ModelUnavailable):
        ask(one, FuturePort(ScriptedLLM(lambda key, prompt: InferError("down"))))
