"""Interviews: questions agents answer from a copy of their state, which never change the run.

    from populace.sdk.interview import Question, Survey

    survey = Survey(id="trust", questions=[
        Question(id="council", text="How much do you trust the city council?", labels=["none", "some", "a lot"]),
        Question(id="car", text="Do you own a car?", options=["yes", "no"]),
    ])

A question's kind says what a valid answer is: one of its `options`, a point of a Likert scale,
a number in a range, or free text of at most `max_chars` (populace.core.contracts.Question
validates them, naming the field). Each answer is one structured call, `{"answer": …}`, under
a JSON schema built here (an enum, integer points, a range, a maxLength); an answer that is
still invalid after one corrective re-ask is recorded invalid with its raw text, never made up.

Snapshot semantics — what the platform guarantees:
- an agent answers from a copy of its state at a round's end (its persona, its declared state
  as a checkpoint holds it), made by `copy_of`; the run's own agent is never touched, so
  nothing an agent answers is remembered, and the run plays on exactly as without interviews;
- every call of an interview is seeded apart from every call of a round: its tag
  (`InferBatch.seqs`) has bit 62 set and carries the question's digest, so the answer depends
  on (run seed, round, agent, question) alone — the same whether the question is asked as
  planned in the scenario, from the checkpoint afterwards, on the fleet or in one process.

A survey's mode: `each` (the default) asks every question in a call of its own. Each answer
then depends on its question only, never on which other questions were asked with it or in
what order (a question added to a survey, or asked alone afterwards, keeps its answers); an
invalid answer costs one question; and each schema stays small (small models follow small
schemas better). `together` asks them all in one call: fewer calls and tokens (the persona and
context are sent once), at the price of answers that see each other.

An agent class may override how it answers (`Agent.answer(asked, llm)`) and what it knows as
text (`Agent.context()`); the default prompt is its persona, its context (its memory) and the
question.
"""

from __future__ import annotations

import asyncio
import copy
import hashlib
import inspect
import json
import math
from array import array
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic_core import from_json, to_json

from populace.core.checkpoint_rows import MARKS, resolve_chain
from populace.core.contracts import Question, Survey, choice_key
from populace.sdk.answers import answer_field
from populace.sdk.llm import ASKING, ASKING_CALLS, CALLER, LLM, InferError, ModelUnavailable
from populace.sdk.population import FRESH, GONE
from populace.sdk.statejson import decode, decode_state

if TYPE_CHECKING:
    from populace.sdk.agent import Agent
    from populace.sdk.simulation import Simulation

Asked = Question | Survey  # one question, or a survey asked together

SYSTEM = ("You are taking part in a survey. Answer as the person described, from what they know and "
          "remember, in their own voice. Reply with JSON only, exactly as asked.")
# An interview call's tag: bit 62 (no round's call has it: a round's tags stay below 2**59) plus
# 44 bits of the question's digest, and the call's count for that question in the low 16 bits.
INTERVIEW_BIT = 1 << 62
_DIGEST_BITS = 44
_COUNT_BITS = 16
# Re-asks an invalid answer gets (the gateway re-asks the schema violations it checks itself).
REASKS = 1


def _by_object(fn: Callable[[Asked], Any]) -> Callable[[Asked], Any]:
    """`fn` computed once per question object: a survey's questions are the same objects for
    every agent, and a port batches calls by their schema's identity (a new dict per call
    would be grouped by value, a json.dumps each)."""
    known: dict[int, tuple[Asked, Any]] = {}

    def cached(asked: Asked) -> Any:
        hit = known.get(id(asked))
        if hit is not None and hit[0] is asked:
            return hit[1]
        if len(known) >= 4096:
            known.clear()
        value = fn(asked)
        known[id(asked)] = (asked, value)
        return value

    return cached


def digest(asked: Asked) -> str:
    """sha256 of what the model is asked: the question's text, kind and answer space (a
    survey: its questions in order) — not its id, so a renamed question keeps its answers."""
    if isinstance(asked, Survey):
        body: Any = [_spec(q) | {"id": q.id} for q in asked.questions]
    else:
        body = _spec(asked)
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _spec(q: Question) -> dict:
    return q.model_dump(exclude={"id"}, exclude_none=True)


@_by_object
def tag_base(asked: Asked) -> int:
    """The tag of an interview's first call for `asked`; its n-th call adds n."""
    return INTERVIEW_BIT | ((int(digest(asked), 16) & ((1 << _DIGEST_BITS) - 1)) << _COUNT_BITS)


# -- what a valid answer is -------------------------------------------------------------------
def value_schema(q: Question) -> dict:
    """The JSON schema of one question's answer value."""
    if q.kind == "options":
        return {"type": "string", "enum": list(q.options or ())}
    if q.kind == "likert":
        return {"type": "integer", "minimum": 1, "maximum": q.points}
    if q.kind == "number":
        return {"type": "integer" if q.integer else "number", "minimum": _num(q.min), "maximum": _num(q.max)}
    return {"type": "string", "maxLength": q.max_chars}


def _num(x: float | None) -> float | int | None:
    return int(x) if x is not None and float(x).is_integer() else x


@_by_object
def schema(asked: Asked) -> dict:
    """The structured call's schema: `{"answer": …}`, or for a survey asked together one key per question."""
    if isinstance(asked, Survey):
        return {"type": "object", "properties": {q.id: value_schema(q) for q in asked.questions},
                "required": [q.id for q in asked.questions]}
    return {"type": "object", "properties": {"answer": value_schema(asked)}, "required": ["answer"]}


def max_tokens(asked: Asked, base: int) -> int:
    """Tokens an answer may need: the run's `model.max_tokens`, or more for long options and free text."""
    questions = asked.questions if isinstance(asked, Survey) else [asked]
    need = 16
    for q in questions:
        if q.kind == "options":
            need += 8 + max(len(o.encode()) for o in q.options or ("",))
        elif q.kind == "text":
            need += 8 + (q.max_chars or 0) // 2
        else:
            need += 16
    return min(8192, max(base, need))


@dataclass(frozen=True, slots=True)
class Answer:
    """One question's answer: `answer` as text (the option as written, the point, the number,
    the text), `value` its number (Likert and number questions), or invalid with `error`."""

    valid: bool
    answer: str | None
    value: float | None
    error: str | None = None


def _number(x: object) -> float | None:
    if isinstance(x, bool):
        return None
    if isinstance(x, (int, float)):
        return float(x) if math.isfinite(x) else None
    if isinstance(x, str):
        try:
            v = float(x.strip())
        except ValueError:
            return None
        return v if math.isfinite(v) else None
    return None


@_by_object
def _lookup(q: Question) -> dict[str, str]:
    """An options question's answers as a model may write them -> the option as written."""
    return {**{choice_key(o): o for o in q.options or ()}, **{o: o for o in q.options or ()}}


def judge(q: Question, value: object) -> Answer:
    """Whether `value` (what the model put under the question's key) answers `q`."""
    if value is None:
        return Answer(False, None, None, "no answer")
    if q.kind == "options":
        if isinstance(value, str):
            lookup = _lookup(q)
            match = lookup.get(value)  # as written (the schema's enum): no normalising needed
            if match is None:
                match = lookup.get(choice_key(value))
            if match is not None:
                return Answer(True, match, None)
        return Answer(False, None, None, f"{_short(value)} is not one of the options")
    if q.kind == "likert":
        point = _number(value)
        if point is None and isinstance(value, str) and q.labels:  # a label named instead of its point
            found = [i + 1 for i, label in enumerate(q.labels) if choice_key(label) == choice_key(value)]
            point = float(found[0]) if found else None
        if point is None or not point.is_integer() or not 1 <= point <= (q.points or 0):
            return Answer(False, None, None, f"{_short(value)} is not a point from 1 to {q.points}")
        return Answer(True, str(int(point)), point)
    if q.kind == "number":
        x = _number(value)
        if x is None:
            return Answer(False, None, None, f"{_short(value)} is not a number")
        if x < (q.min or 0.0) or x > (q.max or 0.0):
            return Answer(False, None, None, f"{x:g} is outside [{q.min:g}, {q.max:g}]")
        if q.integer and not x.is_integer():
            return Answer(False, None, None, f"{x:g} is not a whole number")
        return Answer(True, str(int(x)) if x.is_integer() else repr(x), x)
    if not isinstance(value, str) or not value.strip():
        return Answer(False, None, None, f"{_short(value)} is not text")
    text = value.strip()
    if len(text) > (q.max_chars or 0):
        return Answer(False, None, None, f"the text has {len(text)} characters, over {q.max_chars}")
    return Answer(True, text, None)


def _short(value: object, limit: int = 60) -> str:
    text = json.dumps(value, ensure_ascii=False) if not isinstance(value, str) else repr(value)
    return text if len(text) <= limit else text[:limit - 1] + "…"


def parse(asked: Asked, text: str) -> list[Answer]:
    """The answers in a model's raw text, one per question asked (never made up: whatever
    does not fit its question is invalid, with why)."""
    if isinstance(asked, Survey):
        try:
            obj = json.loads(text)
        except ValueError:
            obj = None
        if not isinstance(obj, dict):
            return [Answer(False, None, None, "the answer is not a JSON object")] * len(asked.questions)
        return [judge(q, obj.get(q.id)) for q in asked.questions]
    return [judge(asked, answer_field(text, "answer"))]


_PARSED: dict[tuple[int, str], tuple[Asked, list[Answer]]] = {}


def parsed(asked: Asked, text: str) -> list[Answer]:
    """`parse`, once per distinct (question object, raw text): many agents give the same raw
    answer (an option, a point), and an Answer is immutable. Do not change the list returned."""
    key = (id(asked), text)
    hit = _PARSED.get(key)
    if hit is not None and hit[0] is asked:
        return hit[1]
    answers = parse(asked, text)
    if len(text) <= 256:  # free text is seldom repeated: not kept
        if len(_PARSED) >= 16384:
            _PARSED.clear()
        _PARSED[key] = (asked, answers)
    return answers


def reasked(asked: Asked, raw: str, errors: Sequence[str]) -> Asked:
    """`asked` with a correction appended to its text: what a re-ask shows the agent."""
    why = "; ".join(dict.fromkeys(e for e in errors if e))
    note = f"\n\n(Your answer {_short(raw.strip(), 200)} was not valid: {why}. Answer again, exactly as asked.)"
    if isinstance(asked, Survey):
        first = asked.questions[0]
        questions = [first.model_copy(update={"text": first.text + note}), *asked.questions[1:]]
        return asked.model_copy(update={"questions": questions})
    return asked.model_copy(update={"text": asked.text + note})


# -- the default prompt -----------------------------------------------------------------------
def instruction(q: Question) -> str:
    if q.kind == "options":
        return "Choose one of: " + ", ".join(json.dumps(o, ensure_ascii=False) for o in q.options or ()) + "."
    if q.kind == "likert":
        if q.labels:
            return (f"Answer on a scale from 1 to {q.points}: "
                    + ", ".join(f"{i} = {label}" for i, label in enumerate(q.labels, 1)) + ".")
        return f"Answer on a scale from 1 to {q.points}."
    if q.kind == "number":
        whole = "a whole number" if q.integer else "a number"
        return f"Answer with {whole} from {_num(q.min)} to {_num(q.max)}."
    return f"Answer in your own words, in at most {q.max_chars} characters."


def _example(q: Question) -> str:
    return {"options": '"<option>"', "likert": "<point>", "number": "<number>", "text": '"<text>"'}[q.kind]


@_by_object
def question_text(asked: Asked) -> str:
    if isinstance(asked, Survey):
        lines = [f"{i}. {q.text} {instruction(q)}" for i, q in enumerate(asked.questions, 1)]
        keys = ", ".join(f'"{q.id}": {_example(q)}' for q in asked.questions)
        ids = ", ".join(f"{i}. as \"{q.id}\"" for i, q in enumerate(asked.questions, 1))
        return "Questions:\n" + "\n".join(lines) + f"\nAnswer every question ({ids}) with JSON: {{{keys}}}"
    return f"Question: {asked.text}\n{instruction(asked)}\nAnswer with JSON: {{\"answer\": {_example(asked)}}}"


def memory_text(memory: Iterable[Any]) -> str:
    """An agent's memory as lines of text (a simulation's items are tuples, e.g. (round, guess))."""
    return "\n".join("- " + " · ".join(map(str, item)) if isinstance(item, (tuple, list)) else f"- {item}"
                     for item in memory)


def default_call(agent: Agent, asked: Asked, llm: LLM) -> Awaitable[str]:
    """The call of the default `Agent.answer`: the agent's prompt (`prompt`) under the question's
    schema, keyed by the agent."""
    text, prefix = prompt(agent, asked)
    return llm.ask(text, key=agent.id, prefix_chars=prefix, system=SYSTEM, schema=schema(asked))


def prompt(agent: Agent, asked: Asked) -> tuple[str, int]:
    """The default interview prompt of `agent` (its persona, its context, the question) and how
    many leading characters stay the same between questions (the persona: cached by replicas)."""
    persona = agent.persona.text if agent.persona is not None else ""
    head = f"{persona}\n\n" if persona else ""
    context = agent.context()
    body = f"What you remember so far:\n{context}\n\n" if context else ""
    return head + body + question_text(asked), len(head)


# -- the copy an agent answers from ---------------------------------------------------------
def copy_of(sim: Simulation, agent_id: int, state: dict[str, Any]) -> Agent:
    """A throwaway agent of the run's class: agent `agent_id`'s persona and `state` (its declared
    state as a checkpoint holds it). Answering changes nothing of the run's own agent."""
    cast = sim.cast
    persona = cast.personas[agent_id] if cast is not None else None
    cls = type(sim).Agent
    agent = cls(agent_id, persona, sim)
    agent.restore(decode_state(state, cls))
    return agent


def answers_by_default(cls: type[Agent]) -> bool:
    """Whether `cls` answers as `Agent` does (no `answer`, `context`, `restore` or `__init__` of
    its own): then its copy's answer depends on its id, persona and memory alone."""
    from populace.sdk.agent import Agent

    return all(getattr(cls, name) is getattr(Agent, name) for name in ("__init__", "answer", "context", "restore"))


class _Copy:
    """What the default `Agent.answer` reads of a copy — its id, persona and memory — without
    building the agent: `Agent.answer` and `Agent.context` themselves run on it, so the prompt
    and the call are those of `copy_of`'s agent (`Agent.restore` turns the memory's lists into
    tuples; `memory_text` writes both alike)."""

    __slots__ = ("id", "memory", "persona")

    def __init__(self, agent_id: int, persona: Any, memory: Any) -> None:
        self.id, self.persona, self.memory = agent_id, persona, memory

    def context(self) -> str:
        from populace.sdk.agent import Agent

        return Agent.context(self)  # type: ignore[arg-type]

    async def answer(self, asked: Asked, llm: LLM) -> str:
        return await default_call(self, asked, llm)  # type: ignore[arg-type]


def copy_maker(sim: Simulation) -> Callable[[int, dict[str, Any]], Any]:
    """`copy_of` for `sim`'s agent class, or the cheaper `_Copy` when the class answers by default."""
    cls = type(sim).Agent
    if not answers_by_default(cls):
        return lambda agent_id, state: copy_of(sim, agent_id, state)
    personas = sim.cast.personas if sim.cast is not None else None
    has_memory = "memory" in cls.state_fields

    def light(agent_id: int, state: dict[str, Any]) -> _Copy:
        memory = (state.get("memory") or ()) if has_memory else ()
        if type(memory) is dict:  # a memory saved typed (populace.sdk.statejson); JSON lists read alike
            memory = decode(memory)
        return _Copy(agent_id, personas[agent_id] if personas is not None else None, memory)

    return light


def frozen_states(snapshot: Sequence[Any]) -> bytes:
    """A share's agents' declared state (HostedRun.snapshot's ranges) as a checkpoint stores
    it: JSON. Taken at a round's end, so answering later never sees the next round."""
    return to_json([part.value() for part in snapshot])


def _expanded(chunk: dict) -> dict[str, list]:
    """A stored range's fields, a value per agent (its departed and unmade newcomers marked)."""
    if any(key in chunk for key in ("held", *MARKS)):
        return resolve_chain([chunk], chunk["first"], chunk["count"])
    return chunk["fields"]


def _respondent(people: Respondents, i: int, make: Callable[[int, dict[str, Any]], Any], survey: Survey,
                rows: Rows) -> Any:
    """The `i`-th agent made from its state (which is then let go), or None when the agent class
    cannot take that state: its answers are then recorded invalid, an agent error."""
    aid = people.ids[i]
    try:
        return make(aid, people.state(i))
    except Exception as err:
        text = f"{type(err).__name__}: {err}"
        for q in survey.questions:
            rows.add(aid, q.id, Answer(False, None, None, f"agent: restore raised {text}"),
                     f"<agent error: {text}>", 0.0)
        return None
    finally:
        people.release(i)


class Respondents:
    """The agents who answer and their state as a checkpoint holds it, by columns: `ids` and
    {field: values} (a share's frozen snapshot, a checkpoint's chunks), never a dict per
    agent; an agent's dict is built as it starts answering, and its values are let go once
    its answers are in (`release`). Made from (agent id, state) pairs too (`of`)."""

    __slots__ = ("_dicts", "fields", "ids")

    def __init__(self, ids: Sequence[int], fields: dict[str, list] | None = None,
                 dicts: list[dict[str, Any] | None] | None = None) -> None:
        self.ids, self.fields, self._dicts = ids, fields if dicts is None else None, dicts

    @classmethod
    def of(cls, states: Sequence[tuple[int, dict[str, Any]]]) -> Respondents:
        return cls([aid for aid, _ in states], dicts=[st for _, st in states])

    @classmethod
    def from_chunks(cls, chunks: Iterable[tuple[int, int, dict[str, list]]],
                    wanted: Sequence[tuple[int, int]] | None = None) -> Respondents:
        """From checkpoint chunks (first agent, count, {field: values}), the agents in `wanted`
        ranges (first, count) only. The ids are kept as one array of int64, not an int object
        each (a host's share of a million agents)."""
        import numpy as np

        ids = array("q")
        fields: dict[str, list] = {}
        for first, count, columns in chunks:
            gone = columns.get(GONE)
            if gone is not None:  # departed before the round: not one who answers after it
                columns = {k: v for k, v in columns.items() if k != GONE}
            fresh = columns.get(FRESH)
            if fresh is not None:  # a newcomer that never acted answers as its class makes one
                columns = {k: [_ABSENT if f is True else v for v, f in zip(values, fresh)]
                           for k, values in columns.items() if k != FRESH}
            if wanted is None and gone is None:
                keep = None
            else:
                agents = np.arange(first, first + count, dtype=np.int64)
                inside = np.zeros(count, dtype=bool)
                if wanted is None:
                    inside[:] = True
                for lo, n in wanted or ():
                    inside |= (agents >= lo) & (agents < lo + n)
                if gone is not None:
                    inside &= np.fromiter((g is not True for g in gone), dtype=bool, count=count)
                keep = None if inside.all() else np.flatnonzero(inside).tolist()
                del agents, inside
            before = len(ids)
            if keep is None:
                ids.extend(range(first, first + count))
            else:
                ids.extend(first + o for o in keep)
            taken = len(ids) - before
            for name, values in columns.items():
                # a field absent from an earlier chunk: those agents' states lack it, as thawed ones would
                column = fields.setdefault(name, [_ABSENT] * before)
                column.extend(values if keep is None else [values[o] for o in keep])
            for name, column in fields.items():
                if name not in columns:
                    column.extend([_ABSENT] * taken)
        return cls(ids, fields)

    @classmethod
    def frozen(cls, *data: bytes | Sequence[dict]) -> Respondents:
        """From `frozen_states`' bytes (or the chunk objects they hold), one share's after another."""
        chunks = (c for one in data for c in (from_json(one) if isinstance(one, (bytes, bytearray)) else one))
        return cls.from_chunks((c["first"], c["count"], _expanded(c)) for c in chunks)

    def __len__(self) -> int:
        return len(self.ids)

    def state(self, i: int) -> dict[str, Any]:
        """The `i`-th agent's state, as `thawed` gives it."""
        if self._dicts is not None:
            return self._dicts[i]  # type: ignore[return-value]
        return {name: v for name, values in self.fields.items() if (v := values[i]) is not _ABSENT}

    def release(self, i: int) -> None:
        if self._dicts is not None:
            self._dicts[i] = None
        else:
            for values in self.fields.values():
                values[i] = None

    def chosen(self, *, seed: int, survey_id: str, sample: float | None = None,
               agents: Sequence[int] | None = None, last_use: bool = False) -> Respondents:
        """Those who answer a survey (see `choose`): a new Respondents (this one untouched),
        or, when everyone answers and the caller uses this one no more (`last_use`), this one:
        a post-hoc interview of a whole share need not copy its columns (a million agents)."""
        import numpy as np

        from populace.core.interviews import chosen

        if sample is None and agents is None:
            if last_use:
                return self
            # lists copied whole (no index list: at a million agents that is a million ints)
            if self._dicts is not None:
                return Respondents(copy.copy(self.ids), dicts=list(self._dicts))
            return Respondents(copy.copy(self.ids), {name: list(values) for name, values in self.fields.items()})
        ids = np.asarray(self.ids, dtype=np.int64)
        keep = np.flatnonzero(chosen(ids, seed=seed, survey_id=survey_id, sample=sample, agents=agents)).tolist()
        ids = [self.ids[i] for i in keep]
        if self._dicts is not None:
            return Respondents(ids, dicts=[self._dicts[i] for i in keep])
        return Respondents(ids, {name: [values[i] for i in keep] for name, values in self.fields.items()})


_ABSENT: Any = object()  # a field an agent's checkpointed state does not have


def thawed(data: bytes | Sequence[dict], wanted: Callable[[int], bool] | None = None
           ) -> list[tuple[int, dict[str, Any]]]:
    """(agent id, its state) for every agent in checkpoint chunks (`frozen_states`, or the
    `{"first", "count", "fields"}` objects of populace.core.checkpoints), those `wanted` only."""
    chunks = from_json(data) if isinstance(data, (bytes, bytearray)) else data
    out = []
    for chunk in chunks:
        first, fields = chunk["first"], _expanded(chunk)
        gone, fresh = fields.get(GONE) or (), fields.get(FRESH) or ()
        names = [name for name in fields if name not in (GONE, FRESH)]
        for offset in range(chunk["count"]):
            aid = first + offset
            if gone and gone[offset] is True:
                continue  # departed before the round
            if wanted is None or wanted(aid):
                # a newcomer that never acted: as its class makes one
                out.append((aid, {} if fresh and fresh[offset] is True else
                            {name: fields[name][offset] for name in names}))
    return out


# -- asking many agents -----------------------------------------------------------------------
ROW_KEYS = ("agent_id", "question", "answer", "value", "raw", "valid", "error", "latency_ms")
# table `interviews`: one row per (run, round after which it was asked, survey, question, agent)
TABLE_KEYS = ("run_id", "after_round", "survey", *ROW_KEYS)


class Rows:
    """Answers, columnar (one row per agent and question), handed on in batches of `size`."""

    def __init__(self, emit: Callable[[dict[str, list]], None] | None = None, size: int = 1000) -> None:
        self._emit, self._size = emit, size
        self.columns: dict[str, list] = {k: [] for k in ROW_KEYS}
        self.n = self.n_valid = 0

    def add(self, agent_id: int, question: str, a: Answer, raw: str, latency_ms: float) -> None:
        c = self.columns
        c["agent_id"].append(agent_id)
        c["question"].append(question)
        c["answer"].append(a.answer)
        c["value"].append(a.value)
        c["raw"].append(raw)
        c["valid"].append(a.valid)
        c["error"].append(a.error)
        c["latency_ms"].append(latency_ms)
        self.n += 1
        self.n_valid += a.valid
        if self._emit is not None and len(c["agent_id"]) >= self._size:
            self.flush()

    def flush(self) -> None:
        if self._emit is not None and self.columns["agent_id"]:
            batch, self.columns = self.columns, {k: [] for k in ROW_KEYS}
            self._emit(batch)


async def answer_one(agent: Agent, survey: Survey, llm: LLM, rows: Rows, *, reasks: int = REASKS) -> None:
    """Agent `agent` (a copy) answers `survey`; its rows go to `rows`. Raises ModelUnavailable
    when no model answers (never an agent's answer)."""
    loop = asyncio.get_running_loop()
    CALLER.set(agent.id)  # this task's own context: its calls are its own
    units: list[Asked] = list(survey.questions) if survey.mode == "each" else [survey]
    for unit in units:
        questions = unit.questions if isinstance(unit, Survey) else [unit]
        ASKING.set(tag_base(unit))
        started = loop.time()
        try:
            raw = await agent.answer(unit, llm)
            if not isinstance(raw, str):
                raise TypeError(f"answer returned {type(raw).__name__}, not the model's text (str)")
            answers = parsed(unit, raw)
            for _ in range(reasks):
                if all(a.valid for a in answers):
                    break
                again = await agent.answer(reasked(unit, raw, [a.error or "" for a in answers if not a.valid]), llm)
                if not isinstance(again, str):
                    raise TypeError(f"answer returned {type(again).__name__}, not the model's text (str)")
                raw, second = again, parsed(unit, again)
                answers = [b if not a.valid else a for a, b in zip(answers, second, strict=True)]
        except InferError as err:
            raise err if isinstance(err, ModelUnavailable) else ModelUnavailable(str(err)) from err
        except Exception as err:  # the agent's own code: its answers are invalid, with why
            text = f"{type(err).__name__}: {err}"
            raw, answers = f"<agent error: {text}>", [Answer(False, None, None, f"agent: {text}")] * len(questions)
        latency = (loop.time() - started) * 1000.0
        for q, a in zip(questions, answers, strict=True):
            rows.add(agent.id, q.id, a, raw, latency)


# answers started between two looks at the gate (and at the event loop: the first calls leave)
LAUNCH_SLICE = 2000


async def ask(sim: Simulation, respondents: Respondents | Sequence[tuple[int, dict[str, Any]]], survey: Survey,
              llm: LLM, rows: Rows, *, max_in_flight: int = 100_000, reasks: int = REASKS,
              gate: Callable[[], Awaitable[int]] | None = None) -> None:
    """Every respondent (agent id, its state) answers `survey`, each from its own copy
    (`copy_of`; a lighter one with the same answers when its class answers by default), as its
    own task, at most `max_in_flight` at once; each agent's state is let go once it has
    answered. `gate`, when given, is awaited before each slice of answers starts and says how
    many may be answering now (at least 1: the host holds answers back while a round is in
    play, and keeps few out between rounds). Raises ModelUnavailable when no model answers;
    what was answered before is in `rows`."""
    people = respondents if isinstance(respondents, Respondents) else Respondents.of(respondents)
    total = len(people)
    if total == 0:
        return
    make = copy_maker(sim)
    if answers_by_default(type(sim).Agent) and not inspect.iscoroutinefunction(llm.ask):
        await _ask_by_default(people, survey, llm, rows, make, max_in_flight=max_in_flight, reasks=reasks,
                              gate=gate)
        return
    loop = asyncio.get_running_loop()
    running: set[asyncio.Task] = set()
    failure: list[BaseException] = []
    room = asyncio.Event()  # set when an answer is done (room for one more, or the end)

    async def one(i: int) -> None:
        agent = _respondent(people, i, make, survey, rows)
        if agent is not None:
            await answer_one(agent, survey, llm, rows, reasks=reasks)

    def finished(task: asyncio.Task) -> None:
        running.discard(task)
        if not task.cancelled() and task.exception() is not None and not failure:
            failure.append(task.exception())  # type: ignore[arg-type]
        room.set()

    flush = getattr(llm, "flush", None)
    try:
        i = 0
        while i < total and not failure:
            limit = max_in_flight if gate is None else min(max_in_flight, await gate())
            n = min(LAUNCH_SLICE, total - i, limit - len(running))
            if n <= 0:
                room.clear()
                await room.wait()
                continue
            for k in range(i, i + n):
                task = loop.create_task(one(k))
                running.add(task)
                task.add_done_callback(finished)
            i += n
            if flush is not None:
                flush()  # the slice's calls leave now rather than after the flush timer
            await asyncio.sleep(0)
        while running and not failure:
            room.clear()
            await room.wait()
        if failure:
            raise failure[0]
    finally:
        for task in list(running):
            task.cancel()


class _Call:
    """A call out in `_ask_by_default`, as its answer's callback: `after(agent, k, started,
    before, n, fut)`. An object of its own rather than a closure: tens of thousands are out at
    once, and a closure costs a function and a cell per name it captures (a partial, its
    arguments' tuple and a dict)."""

    __slots__ = ("after", "agent", "before", "k", "n", "started")

    def __init__(self, after: Callable[..., None], agent: _Copy, k: int, started: float,
                 before: list[Answer] | None, n: int) -> None:
        self.after, self.agent, self.k, self.started, self.before, self.n = after, agent, k, started, before, n

    def __call__(self, fut: asyncio.Future) -> None:
        self.after(self.agent, self.k, self.started, self.before, self.n, fut)


async def _ask_by_default(people: Respondents, survey: Survey, llm: LLM, rows: Rows,
                          make: Callable[[int, dict[str, Any]], Any], *, max_in_flight: int, reasks: int,
                          gate: Callable[[], Awaitable[int]] | None) -> None:
    """`ask` for an agent class that answers by default, on a port whose `ask` returns a future
    (the fleet's InferSession): what `answer_one` does for each agent (its questions in turn,
    the same calls, re-asks and rows), driven by the calls' callbacks rather than a task per
    agent, which cost more than the rest of an answer. (A port whose `ask` is a coroutine
    answers within its caller's task: there, a task per agent keeps the order of its calls.)"""
    loop = asyncio.get_running_loop()
    now = loop.time
    units: list[Asked] = list(survey.questions) if survey.mode == "each" else [survey]
    total = len(people)
    failure: list[BaseException] = []
    pending: set[asyncio.Future] = set()  # calls out
    room = asyncio.Event()  # set when an agent is done (room for one more, or the end)
    answering = 0  # agents with a call out

    def fail(err: BaseException) -> None:
        if not failure:
            failure.append(err)
        room.set()

    def done_one() -> None:
        nonlocal answering
        answering -= 1
        room.set()

    # An agent's calls of a unit are its first and its re-asks: the `n`-th call's count is `n`,
    # told to the port (ASKING_CALLS) rather than counted by it per agent and unit for the whole
    # interview. Not when two units share a tag (the same question twice): the port counts on.
    own_count = len({tag_base(u) for u in units}) == len(units)

    def call(agent: _Copy, k: int, asked: Asked, started: float, before: list[Answer] | None, n: int) -> None:
        """Agent `agent` is asked unit `k` (or its re-ask `asked`, the `n`-th)."""
        asking, caller = ASKING.set(tag_base(units[k])), CALLER.set(agent.id)
        counted = ASKING_CALLS.set(n if own_count else None)
        try:
            fut = asyncio.ensure_future(default_call(agent, asked, llm))  # type: ignore[arg-type]
        except Exception as err:  # a call that failed before it left: as if it had failed on its way
            fut = loop.create_future()
            fut.set_exception(err)
        finally:
            ASKING_CALLS.reset(counted)
            ASKING.reset(asking)
            CALLER.reset(caller)
        pending.add(fut)
        fut.add_done_callback(_Call(answered, agent, k, started, before, n))

    def answered(agent: _Copy, k: int, started: float, before: list[Answer] | None, n: int,
                 fut: asyncio.Future) -> None:
        pending.discard(fut)
        if failure or fut.cancelled():
            return
        try:
            unit = units[k]
            questions = unit.questions if isinstance(unit, Survey) else [unit]
            try:
                err = fut.exception()
                if err is not None:
                    raise err
                raw = fut.result()
                if not isinstance(raw, str):
                    raise TypeError(f"answer returned {type(raw).__name__}, not the model's text (str)")
                answers = parsed(unit, raw)
                if before is not None:  # a re-ask: its answers fill in what was invalid
                    answers = [b if not a.valid else a for a, b in zip(before, answers, strict=True)]
                if n < reasks and not all(a.valid for a in answers):
                    again = reasked(unit, raw, [a.error or "" for a in answers if not a.valid])
                    call(agent, k, again, started, answers, n + 1)
                    return
            except InferError as err:
                fail(err if isinstance(err, ModelUnavailable) else ModelUnavailable(str(err)))
                return
            except Exception as err:  # the agent's own answer failed: its answers are invalid, with why
                text = f"{type(err).__name__}: {err}"
                raw, answers = f"<agent error: {text}>", [Answer(False, None, None, f"agent: {text}")] * len(questions)
            latency = (now() - started) * 1000.0
            for q, a in zip(questions, answers, strict=True):
                rows.add(agent.id, q.id, a, raw, latency)
            if k + 1 < len(units):
                call(agent, k + 1, units[k + 1], now(), None, 0)
            else:
                done_one()
        except BaseException as err:  # never lost in a callback: the interview stops, saying why
            fail(err)

    def begin(i: int) -> None:
        nonlocal answering
        agent = _respondent(people, i, make, survey, rows)
        if agent is None:
            return
        answering += 1
        call(agent, 0, units[0], now(), None, 0)

    flush = getattr(llm, "flush", None)
    try:
        i = 0
        while i < total and not failure:
            limit = max_in_flight if gate is None else min(max_in_flight, await gate())
            n = min(LAUNCH_SLICE, total - i, limit - answering)
            if n <= 0:
                room.clear()
                await room.wait()
                continue
            for k in range(i, i + n):
                begin(k)
            i += n
            if flush is not None:
                flush()  # the slice's calls leave now rather than after the flush timer
            await asyncio.sleep(0)
        while answering and not failure:
            room.clear()
            await room.wait()
        if failure:
            raise failure[0]
    finally:
        for fut in list(pending):
            fut.cancel()


def choose(states: Sequence[tuple[int, dict[str, Any]]], *, seed: int, survey_id: str,
           sample: float | None = None, agents: Sequence[int] | None = None) -> list[tuple[int, dict[str, Any]]]:
    """Those of `states` (agent id, state) whose agents answer a survey: every agent, a seeded
    `sample` share of them (the same share after every round: a panel), or `agents`."""
    import numpy as np

    from populace.core.interviews import chosen

    if sample is None and agents is None:
        return list(states)
    ids = np.fromiter((aid for aid, _ in states), dtype=np.int64, count=len(states))
    mask = chosen(ids, seed=seed, survey_id=survey_id, sample=sample, agents=agents)
    return [st for st, keep in zip(states, mask.tolist(), strict=True) if keep]


def chosen_states(data: bytes | Sequence[dict], *, seed: int, survey_id: str, sample: float | None = None,
                  agents: Sequence[int] | None = None) -> list[tuple[int, dict[str, Any]]]:
    """`choose` among the states held in checkpoint chunks (see `thawed`)."""
    return choose(thawed(data), seed=seed, survey_id=survey_id, sample=sample, agents=agents)


__all__ = ["SYSTEM", "Answer", "Question", "Respondents", "Rows", "Survey", "answer_one", "ask", "copy_of", "digest",
           "judge", "parse", "prompt", "schema", "tag_base"]
