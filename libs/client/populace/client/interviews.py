"""Interviews after the fact, from Python or `populace interview`: ask a survey of a recorded
run's agents as they were after a round, on the fleet (the agent-hosts answer from the round's
checkpoint) or of a local run (from the state it kept). Nothing of the run changes: no round
is played, no checkpoint written, and each agent answers on a copy of its state.

    from populace.client import interview, simulate
    from populace.sdk.interview import Question

    result = simulate("examples/opinion.yaml", local=True)
    answers = interview(result, after_round=2, survey=Question(id="trust", text="Do you trust the others?",
                                                               labels=["no", "somewhat", "yes"]))
    answers.to_pandas()           # one row per agent and question (table `interviews`'s columns)

    interview("20261130-193923-f0e26d", after_round=3, survey=…, nats="nats://127.0.0.1:4222", sample=0.1)

Bad input is refused before anything is asked, naming the field: a round the run has not
completed (or beyond its last), a sample outside (0, 1], an agent id not in the run."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
from nats.aio.client import Client

from populace.core import bus, subjects
from populace.core.contracts import (
    InterviewPlaced,
    InterviewRequest,
    InterviewsRecorded,
    Question,
    RunState,
    Survey,
)

ASKED_TIMEOUT_S = 30.0  # the orchestrator places a request at once: longer means it is not up


class InterviewRefused(ValueError):
    """The interview cannot be asked; the message names the field or flag."""


class InterviewFailed(RuntimeError):
    """The interview was placed but cannot be answered whole (a host lost with no other up to
    answer its part, a host that could not answer); the message says why. What was answered
    stays recorded."""


def as_survey(survey: Survey | Question | Sequence[Question] | dict, survey_id: str = "interview") -> Survey:
    """A survey from a survey, a question, questions, or their dict (validated, naming fields)."""
    if isinstance(survey, Survey):
        return survey
    if isinstance(survey, Question):
        return Survey(id=survey_id, questions=[survey])
    if isinstance(survey, dict):
        return Survey.model_validate({"id": survey_id, **survey}) if "questions" in survey else Survey(
            id=survey_id, questions=[Question.model_validate(survey)])
    return Survey(id=survey_id, questions=[q if isinstance(q, Question) else Question.model_validate(q)
                                           for q in survey])


def check_who(sample: float | None, agents: Sequence[int] | None, count: int | None = None) -> None:
    """Refuse a sample outside (0, 1], both a sample and agents, an agent not among `count`."""
    if sample is not None and agents is not None:
        raise InterviewRefused("--sample, --agents: give one of them (or neither: every agent)")
    if sample is not None and not 0 < sample <= 1:
        raise InterviewRefused(f"--sample: {sample:g} is outside (0, 1]")
    if agents is not None and not agents:
        raise InterviewRefused("--agents: no agent id given")
    if agents is not None and count is not None:
        bad = [a for a in agents if not 0 <= a < count]
        if bad:
            raise InterviewRefused(f"--agents: agent {bad[0]} is not in the run (ids are 0..{count - 1})")


def state_refusal(state: RunState | None, run_id: str, after_round: int) -> str | None:
    """What the run's state already says against asking after `after_round` (the orchestrator
    checks again, and checks the checkpoint itself): a round the run does not have, has not
    completed, or (a fork) never played."""
    if state is None:
        return f"RUN: run {run_id} is not known on this stack"
    if after_round < 1:
        return f"--after-round: round {after_round} is not one of the run's rounds (1..{state.config.rounds})"
    if after_round > state.config.rounds:
        return f"--after-round: round {after_round} is beyond the run's last ({state.config.rounds})"
    done = max(0, state.round - 1) if state.status == "running" else state.round
    if after_round > done:
        return f"--after-round: run {run_id} has completed {done} round(s), so round {after_round} has no checkpoint"
    fork = state.restore
    if fork is not None and fork.run_id != run_id and after_round <= fork.round:
        return (f"--after-round: this fork never played round {after_round}; its parent {fork.run_id} did (the fork "
                f"starts from its state after round {fork.round}: `populace interview {fork.run_id} --after-round "
                f"{after_round}`)")
    return None


@dataclass
class Asked:
    placed: InterviewPlaced
    recorded: InterviewsRecorded


async def ask(nc: Client, run_id: str, after_round: int, survey: Survey, *, sample: float | None = None,
              agents: Sequence[int] | None = None, timeout_s: float = 600.0, request: str | None = None,
              on_placed: Callable[[InterviewPlaced], None] | None = None) -> Asked:
    """Ask on the fleet and wait until every answer is recorded. InterviewRefused (with the
    field) before anything is asked, or when the orchestrator refuses; InterviewFailed when it
    cannot be answered whole (a lost host's part that no host up can take: within the host
    heartbeat timeout, not at `timeout_s`); TimeoutError naming the hosts when the answers do
    not all come within `timeout_s`. A lost host's part ordered from another host is said to
    `on_placed` (the new placement), and the wait goes on."""
    from populace.client.run import run_state

    state = await run_state(nc, run_id)
    if why := state_refusal(state, run_id, after_round):
        raise InterviewRefused(why)
    check_who(sample, agents, state.config.agents)  # type: ignore[union-attr]
    request = request or f"iv-{uuid.uuid4().hex[:12]}"
    req = InterviewRequest(run_id=run_id, request=request, after_round=after_round, survey=survey, sample=sample,
                           agents=list(agents) if agents is not None else None)
    said: asyncio.Queue = asyncio.Queue()  # its placements and its announcement, in the order they come

    async def hear(msg) -> None:
        said.put_nowait(msg)

    placed_sub = await nc.subscribe(subjects.run_asked(run_id, request), cb=hear)
    done_sub = await nc.subscribe(subjects.run_interviewed(run_id, request), cb=hear)
    try:
        await bus.publish_js(nc.jetstream(), subjects.RUN_INTERVIEW, req, msg_id=f"interview.{run_id}.{request}")
        placed: InterviewPlaced | None = None
        t0 = time.monotonic()
        while True:
            wait = ASKED_TIMEOUT_S if placed is None else timeout_s - (time.monotonic() - t0)
            try:
                msg = await asyncio.wait_for(said.get(), max(0.0, wait))
            except TimeoutError:
                if placed is None:
                    raise TimeoutError(f"the interview was not placed within {ASKED_TIMEOUT_S:g} s: is the "
                                       "orchestrator up?") from None
                raise TimeoutError(f"request {request}: not every answer was recorded within "
                                   f"{time.monotonic() - t0:.0f} s; see the logs of agent-hosts "
                                   f"{', '.join(sorted(placed.hosts))}") from None
            if msg.subject == done_sub.subject:  # recorded after it was placed: placed is known
                placed = placed or InterviewPlaced(run_id=run_id, request=request, after_round=after_round,
                                                   survey=survey, placed_at=time.time())
                return Asked(placed, InterviewsRecorded.model_validate_json(msg.data))
            news = InterviewPlaced.model_validate_json(msg.data)
            if news.error and placed is None and news.placement == 0:
                raise InterviewRefused(news.error.replace("after_round:", "--after-round:", 1)
                                       .replace("agents:", "--agents:", 1))
            if news.error:
                raise InterviewFailed(f"request {request}: {news.error}")
            if placed is None or news.placement > placed.placement:
                if placed is not None and on_placed is not None:
                    on_placed(news)
                placed = news
                t0 = t0 if news.placement else time.monotonic()
    finally:
        await placed_sub.unsubscribe()
        await done_sub.unsubscribe()


def read_answers(con: duckdb.DuckDBPyConnection, run_id: str, request: str | None = None,
                 survey: str | None = None, after_round: int | None = None) -> pa.Table:
    """Table `interviews`'s rows of a run: one request's, or a survey's (after a round)."""
    where, params = ["run_id = $rid"], {"rid": run_id}
    for column, value in (("request", request), ("survey", survey), ("after_round", after_round)):
        if value is not None:
            where.append(f"{column} = ${column}")
            params[column] = value
    return con.sql(f"SELECT * FROM interviews WHERE {' AND '.join(where)} ORDER BY after_round, survey, agent_id, "
                   "question", params=params).to_arrow_table()


def _local_table(rows: dict[str, list], request: str | None = None) -> pa.Table:
    n = len(rows.get("agent_id", []))
    return pa.Table.from_pydict({**rows, "request": [request] * n, "host_id": ["local"] * n})


def interview(run: Any, *, after_round: int, survey: Survey | Question | Sequence[Question] | dict,
              sample: float | None = None, agents: Sequence[int] | None = None, nats: str | None = None,
              db: str | None = None, timeout_s: float = 600.0) -> pa.Table:
    """Ask `survey` of `run`'s agents as they were after `after_round`; the answers as a table
    (one row per agent and question). `run`: a local result (`simulate(…, local=True)`, or
    `populace.sdk.local.run_local`'s), or a fleet run (its result, or its id) on the stack at
    `nats`, whose recorder's DuckDB (`db`, or the result's) is read for the answers."""
    from populace.sdk.local import LocalResult, interview_local

    asked = as_survey(survey)
    local = run if isinstance(run, LocalResult) else getattr(run, "local", None)
    if local is not None:
        check_who(sample, agents, local.config.agents)
        try:
            rows = _sync(lambda: interview_local(local, after_round, asked, sample=sample,
                                                 agents=list(agents) if agents is not None else None))
        except ValueError as err:
            raise InterviewRefused(str(err).replace("after_round:", "--after-round:", 1)) from None
        return _local_table(rows)
    run_id = run if isinstance(run, str) else run.run_id
    if nats is None:
        raise InterviewRefused("nats: a fleet run is asked on its stack (its checkpoints are there): give its NATS "
                               "URL (a private stack stops with its run: keep one with `populace up`)")

    async def go() -> Asked:
        nc = await bus.connect_or_fail(nats, "populace-interview")
        try:
            return await ask(nc, run_id, after_round, asked, sample=sample, agents=agents, timeout_s=timeout_s)
        finally:
            await nc.close()

    done = _sync(go)
    path = db or getattr(run, "db_path", None) or done.recorded.db_path
    return answers_at(path, run_id, done.placed.request, nats)


def _sync(make):
    """Await `make()` here, or (inside a running event loop: a notebook) in a worker thread."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(make())
    import threading

    box: dict[str, Any] = {}

    def worker() -> None:
        try:
            box["out"] = asyncio.run(make())
        except BaseException as err:
            box["err"] = err

    thread = threading.Thread(target=worker, name="populace-interview")
    thread.start()
    thread.join()
    if "err" in box:
        raise box["err"]
    return box["out"]


def answers_at(path: str, run_id: str, request: str, nats: str) -> pa.Table:
    """A request's answers from the recorder's DuckDB file, or (held by the recorder) from the
    copy it gives."""
    try:
        with duckdb.connect(path, read_only=True) as con:
            return read_answers(con, run_id, request)
    except duckdb.IOException:
        import tempfile

        from populace.client.reads import live_copy

        with tempfile.TemporaryDirectory(prefix="populace-interview-") as tmp:
            copy = live_copy(nats, Path(tmp), lambda _index: [run_id])
            with duckdb.connect(str(copy), read_only=True) as con:
                return read_answers(con, run_id, request)


__all__ = ["Asked", "InterviewFailed", "InterviewRefused", "as_survey", "ask", "interview", "read_answers"]
