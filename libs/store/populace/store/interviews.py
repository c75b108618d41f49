"""Interview answers in DuckDB: table `interviews` (one row per run, round after which it was
asked, survey, question and agent), `interview_questions` (what each survey asked, in order)
and `interview_usage` (their LLM work, per host and batch, apart from the rounds').

Each (run, round, survey, question, agent) is kept once: a share restored from a checkpoint
asks that round's planned interviews again, and the first answer stays. A batch is refused
(a dead letter, stored nowhere) when it answers for agents its sender does not hold, for
agents the plan (or the post-hoc order) does not choose, with a survey the run did not plan
(or a request nobody placed on its sender), after another round or with other questions than
its plan or order says, or with a valid answer its question does not allow. What was asked
(its questions, the round) is taken from the run's config or the orchestrator's order, never
from a batch: a host's batch cannot redefine a survey the others then answer "wrongly"."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

import duckdb
import numpy as np
import pyarrow as pa

from populace.core.contracts import (
    InterviewBatch,
    InterviewOrder,
    InterviewPlaced,
    PlannedInterview,
    RunConfig,
    Survey,
)
from populace.core.interviews import chosen, expected, fits, owed_rounds

_SCHEMA = pa.schema([("run_id", pa.string()), ("after_round", pa.int32()), ("survey", pa.string()),
                     ("question", pa.string()), ("agent_id", pa.int64()), ("answer", pa.string()),
                     ("value", pa.float64()), ("raw", pa.string()), ("valid", pa.bool_()), ("error", pa.string()),
                     ("latency_ms", pa.float64()), ("request", pa.string()), ("host_id", pa.string())])
# Surveys whose answered (agent, question) pairs are kept in memory (agents × questions bits each)
MAX_KEPT = 64


@dataclass(frozen=True)
class Owed:
    """A finished run's planned answers: stored, owed (after the rounds it played), and of those
    not stored, how many may still come (worth waiting for)."""

    answers: int
    owed: int
    pending: int

    @property
    def missing(self) -> int:
        return max(0, self.owed - self.answers)


@dataclass(frozen=True)
class Order:
    """What the orchestrator ordered one host to ask for a post-hoc request: its survey, after
    which round, whom (a `sample` share or the listed `agents`, of its `ranges`). `survey` is
    None for orders stored before orders kept it (checked against the first batch, as then)."""

    ranges: list[tuple[int, int]]
    after_round: int | None
    survey: Survey | None
    sample: float | None
    agents: list[int] | None


@dataclass
class Asked:
    """One survey asked after one round (planned, or a post-hoc request): its questions, and
    per (agent, question) whether an answer is stored."""

    survey: Survey
    answered: np.ndarray  # bool, agents × questions
    index: dict[str, int]  # question id -> column


def survey_spec(survey: Survey) -> str:
    return json.dumps(survey.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))


class InterviewStore:
    def __init__(self, con_of) -> None:
        self._con_of = con_of  # the store's connection (opened lazily, maybe again after a failure)
        self._configs: dict[str, RunConfig] = {}
        self._asked: dict[tuple[str, int, str, str | None], Asked] = {}

    @property
    def con(self) -> duckdb.DuckDBPyConnection:
        return self._con_of()

    def forget(self, run_id: str | None = None) -> None:
        """Drop what memory holds (all of it, or one run's): it is read again from DuckDB."""
        if run_id is None:
            self._asked.clear()
            return
        for key in [k for k in self._asked if k[0] == run_id]:
            self._asked.pop(key)

    def config_of(self, run_id: str) -> RunConfig | None:
        if run_id not in self._configs:
            row = self.con.execute("SELECT config_json FROM runs WHERE run_id = ?", [run_id]).fetchone()
            if not row or row[0] is None:
                return None
            self._configs[run_id] = RunConfig.model_validate_json(row[0])
        return self._configs[run_id]

    def started(self, run_id: str, config: RunConfig) -> None:
        self._configs[run_id] = config

    def _asked_of(self, b: InterviewBatch, survey: Survey, agents: int) -> Asked | str:
        """The survey as asked (`survey`: the plan's or the order's; its questions stored once),
        or why the batch's differs from it."""
        key = (b.run_id, b.after_round, b.survey.id, b.request)
        known = self._asked.get(key)
        if known is not None:
            return known if known.survey == b.survey else self._differs(b)
        con = self.con
        where = "run_id = ? AND after_round = ? AND survey = ? AND request IS NOT DISTINCT FROM ?"
        params = [b.run_id, b.after_round, b.survey.id, b.request]
        row = con.execute(f"SELECT any_value(spec), count(*) FROM interview_questions WHERE {where} AND position = -1",
                          params).fetchone()
        if row and row[1]:
            if row[0] != survey_spec(b.survey):
                return self._differs(b)
        else:
            if survey != b.survey:
                return self._differs(b)
            rows = [(b.run_id, b.after_round, survey.id, b.request, survey.mode, -1, None, None, None,
                     survey_spec(survey))]
            rows += [(b.run_id, b.after_round, survey.id, b.request, survey.mode, i, q.id, q.kind, q.text,
                      json.dumps(q.model_dump(mode="json", exclude_none=True)))
                     for i, q in enumerate(survey.questions)]
            con.executemany("INSERT INTO interview_questions VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)
        index = {q.id: i for i, q in enumerate(survey.questions)}
        answered = np.zeros((agents, len(index)), dtype=bool)
        got = con.execute(f"SELECT agent_id, question FROM interviews WHERE {where}", params).fetchall()
        for aid, qid in got:
            if 0 <= aid < agents and qid in index:
                answered[aid, index[qid]] = True
        while len(self._asked) >= MAX_KEPT:
            self._asked.pop(next(iter(self._asked)))
        asked = self._asked[key] = Asked(survey, answered, index)
        return asked

    @staticmethod
    def _differs(b: InterviewBatch) -> str:
        return (f"survey {b.survey.id!r} after round {b.after_round} was asked with other questions "
                f"({'request ' + b.request if b.request else 'planned'})")

    def refusal(self, b: InterviewBatch, ranges: list[tuple[int, int]] | None, plans: list[PlannedInterview],
                config: RunConfig, order: Order | None = None) -> str | None:
        """Why a batch is refused (None: what it holds may be stored). `order`: for a post-hoc
        request, what the orchestrator ordered its sender (None: nothing)."""
        if b.after_round > config.rounds:
            return f"round {b.after_round}: run {b.run_id} has {config.rounds} rounds"
        ids = np.asarray(b.agent_ids, dtype=np.int64)
        if b.request is None:
            plan = next((p for p in plans if p.id == b.survey.id), None)
            if plan is None or plan.survey != b.survey:
                return f"survey {b.survey.id!r} is not one the run plans (as planned)"
            if b.after_round not in plan.rounds(config.rounds):
                return f"survey {b.survey.id!r} is not planned after round {b.after_round}"
            if ranges is None:
                return f"share {b.host_id}@{b.epoch} was never placed in run {b.run_id}"
            held = ranges
            if ids.size and not chosen(ids, seed=config.seed, survey_id=plan.id, sample=plan.sample,
                                       agents=plan.agents).all():
                return f"survey {plan.id!r} does not choose every agent of the batch"
        else:
            if order is None:
                return f"request {b.request!r} was never placed on {b.host_id}"
            if order.after_round is not None and b.after_round != order.after_round:
                return (f"request {b.request!r} asks after round {order.after_round}, not after round "
                        f"{b.after_round}")
            if order.survey is not None:
                if b.survey != order.survey:
                    return (f"request {b.request!r} asks survey {order.survey.id!r} with its own questions; this "
                            f"batch answers {b.survey.id!r} with other ones")
                if ids.size and not chosen(ids, seed=config.seed, survey_id=order.survey.id, sample=order.sample,
                                           agents=order.agents).all():
                    return f"request {b.request!r} does not choose every agent of the batch"
            held = order.ranges
        inside = np.zeros(ids.size, dtype=bool)
        for first, count in held:
            inside |= (ids >= first) & (ids < first + count)
        if ids.size and not inside.all():
            return f"agent {int(ids[~inside][0])} is not one of {b.host_id}'s agents"
        questions = {q.id: q for q in b.survey.questions}
        for i, ok in enumerate(b.valid):
            if ok and (why := fits(questions[b.questions[i]], b.answers[i], b.values[i])) is not None:
                return f"row {i} (agent {b.agent_ids[i]}, question {b.questions[i]!r}): valid, but {why}"
        return None

    def insert(self, b: InterviewBatch, survey: Survey, agents: int) -> int | str:
        """Store the batch's rows not stored yet (and its LLM work); returns how many, or why the
        batch differs from what was asked (`survey`: the plan's or the order's)."""
        asked = self._asked_of(b, survey, agents)
        if isinstance(asked, str):
            return asked
        if asked.answered.shape[0] < agents:  # newcomers since it was first asked (a population that changes)
            more = np.zeros((agents - asked.answered.shape[0], asked.answered.shape[1]), dtype=bool)
            asked.answered = np.vstack([asked.answered, more])
        con = self.con
        u = b.usage
        if u.llm_calls or u.prompt_tokens or u.completion_tokens or u.infra_retries:
            con.execute("INSERT INTO interview_usage (run_id, after_round, survey, request, host_id, llm_calls, "
                        "prompt_tokens, completion_tokens, infra_retries, cached_tokens, dollars) "
                        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                        [b.run_id, b.after_round, b.survey.id, b.request, b.host_id, u.llm_calls, u.prompt_tokens,
                         u.completion_tokens, u.infra_retries, u.cached_tokens, u.dollars])
        if not b.agent_ids:
            return 0
        ids = np.asarray(b.agent_ids, dtype=np.int64)
        cols = np.asarray([asked.index[q] for q in b.questions], dtype=np.int64)
        keep = ~asked.answered[ids, cols]
        # the same (agent, question) twice in one batch: the first stays
        pairs = ids * len(asked.index) + cols
        first = np.zeros(ids.size, dtype=bool)
        first[np.unique(pairs, return_index=True)[1]] = True
        keep &= first
        if not keep.any():
            return 0
        asked.answered[ids[keep], cols[keep]] = True
        rows = keep.nonzero()[0].tolist()
        n = len(rows)
        table = pa.Table.from_pydict({
            "run_id": [b.run_id] * n, "after_round": [b.after_round] * n, "survey": [b.survey.id] * n,
            "question": [b.questions[i] for i in rows], "agent_id": [b.agent_ids[i] for i in rows],
            "answer": [b.answers[i] for i in rows], "value": [b.values[i] for i in rows],
            "raw": [b.raws[i] for i in rows], "valid": [b.valid[i] for i in rows],
            "error": [b.errors[i] for i in rows], "latency_ms": [b.latency_ms[i] for i in rows],
            "request": [b.request] * n, "host_id": [b.host_id] * n}, schema=_SCHEMA)
        con.register("interview_rows", table)
        try:
            con.execute("INSERT INTO interviews BY NAME SELECT * FROM interview_rows")
        finally:
            con.unregister("interview_rows")
        return n

    def placed(self, m: InterviewPlaced) -> None:
        """A post-hoc request placed (or refused): what it will have, for its announcement. Said
        again, it was placed again (nothing changes here: the new hosts' orders come as orders)
        or it failed: its error is kept, and it is never announced."""
        con = self.con
        if con.execute("SELECT count(*) FROM interview_requests WHERE run_id = ? AND request = ?",
                       [m.run_id, m.request]).fetchone()[0]:
            if m.error is not None:
                con.execute("UPDATE interview_requests SET error = ? WHERE run_id = ? AND request = ? "
                            "AND error IS NULL AND recorded_at IS NULL", [m.error, m.run_id, m.request])
            return
        con.execute("INSERT INTO interview_requests VALUES (?, ?, ?, ?, ?, ?, to_timestamp(?), NULL)",
                    [m.run_id, m.request, m.after_round, m.survey.id if m.survey else None, m.expected, m.error,
                     m.placed_at])

    def ordered(self, m: InterviewOrder) -> None:
        self.con.execute("INSERT INTO _interview_orders (run_id, request, host_id, ranges, after_round, survey, "
                         "sample, agents) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                         [m.run_id, m.request, m.host_id, json.dumps(m.ranges), m.after_round, survey_spec(m.survey),
                          m.sample, None if m.agents is None else json.dumps(m.agents)])

    def order_of(self, run_id: str, request: str, host_id: str) -> Order | None:
        """What `request` ordered `host_id` to ask (its orders' ranges together: a lost host's part
        is ordered again to the living), None if nothing. Every order of a request asks the same
        survey after the same round (the orchestrator places one request); the first says it."""
        rows = self.con.execute("SELECT ranges, after_round, survey, sample, agents FROM _interview_orders "
                                "WHERE run_id = ? AND request = ? AND host_id = ?",
                                [run_id, request, host_id]).fetchall()
        if not rows:
            return None
        _, after_round, spec, sample, agents = rows[0]
        return Order(ranges=[tuple(r) for row in rows for r in json.loads(row[0])], after_round=after_round,
                     survey=None if spec is None else Survey.model_validate_json(spec), sample=sample,
                     agents=None if agents is None else json.loads(agents))

    def host_order_ranges(self, run_id: str, host_id: str) -> list[tuple[int, int]]:
        """Every range of the run that post-hoc interviews ordered `host_id` to ask (any request):
        the agents whose call records that host may send besides its shares'."""
        rows = self.con.execute("SELECT ranges FROM _interview_orders WHERE run_id = ? AND host_id = ?",
                                [run_id, host_id]).fetchall()
        return [tuple(r) for row in rows for r in json.loads(row[0])]

    def complete_requests(self) -> list[tuple[str, str, int]]:
        """(run, request, answers) of the placed requests whose answers are all in, marked
        recorded (each is announced once)."""
        con = self.con
        done = con.execute(  # only the answers of the round and survey it asked count
            "SELECT q.run_id, q.request, count(i.agent_id) AS got FROM interview_requests q "
            "LEFT JOIN interviews i ON i.run_id = q.run_id AND i.request = q.request "
            "AND i.after_round = q.after_round AND i.survey IS NOT DISTINCT FROM q.survey "
            "WHERE q.recorded_at IS NULL AND q.error IS NULL GROUP BY q.run_id, q.request, q.expected "
            "HAVING count(i.agent_id) >= q.expected").fetchall()
        for run_id, request, _ in done:
            con.execute("UPDATE interview_requests SET recorded_at = now() WHERE run_id = ? AND request = ?",
                        [run_id, request])
        return [(r, q, int(n)) for r, q, n in done]

    def resumed(self, run_id: str, after_round: int) -> None:
        """Rounds after `after_round` are played again: their planned answers go (asked again)."""
        self.forget(run_id)
        for table in ("interviews", "interview_questions", "interview_usage"):
            self.con.execute(f"DELETE FROM {table} WHERE run_id = ? AND after_round > ? AND request IS NULL",
                             [run_id, after_round])

    def played(self, run_id: str, agents: int) -> Callable[[int], np.ndarray] | None:
        """In a run whose population changed (table `population`), round -> the ids of the agents
        that played it: its first `agents` and those born after an earlier round, but for those
        departed after an earlier round. None: nobody came or went."""
        rows = self.con.execute("SELECT agent_id, round, event FROM population WHERE run_id = ?",
                                [run_id]).fetchnumpy()
        if not rows["agent_id"].size:
            return None
        size = max(agents, int(rows["agent_id"].max()) + 1)
        came = np.zeros(size, dtype=np.int64)  # the round after which it came (0: one of the first)
        went = np.full(size, np.iinfo(np.int64).max)  # the round after which it departed
        newcomer = np.isin(rows["event"], ["born", "arrived"])
        came[rows["agent_id"][newcomer]] = rows["round"][newcomer]
        went[rows["agent_id"][~newcomer]] = rows["round"][~newcomer]
        came[agents:][came[agents:] == 0] = np.iinfo(np.int64).max  # ids given to nobody yet
        return lambda r: np.flatnonzero((came < r) & (went >= r))

    def owed(self, run_id: str, last_round: int, first_played: int = 1, resumed_after: int | None = None) -> Owed:
        """What the run's planned interviews owe after its last round `last_round`, the rounds
        from `first_played` on (a fork's: after its fork point), and how much of it may still
        come (not what a resume after round `resumed_after` never asks again): owed_rounds."""
        config = self.config_of(run_id)
        if config is None or not config.interviews:
            return Owed(0, 0, 0)
        owes, awaits = owed_rounds(last_round, first_played, resumed_after)
        played = self.played(run_id, config.agents)
        want = expected(config.interviews, config.agents, config.seed, last_round, owes.start, played)
        awaited = expected(config.interviews, config.agents, config.seed, last_round, awaits.start, played)
        got, got_awaited = self.con.execute(
            "SELECT count(*), count(*) FILTER (WHERE after_round >= ?) FROM interviews WHERE run_id = ? "
            "AND request IS NULL AND after_round BETWEEN ? AND ?",
            [awaits.start, run_id, owes.start, last_round]).fetchone()
        return Owed(int(got), want, max(0, awaited - int(got_awaited)))
