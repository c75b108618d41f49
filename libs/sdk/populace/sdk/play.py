"""Playing one round on a set of agents — the generic worker the agent-host service wraps
with NATS, and the local runner runs in process. The simulation's code decides; this does.

- Every agent runs its own turn as its own asyncio task, bounded by an in-flight limit.
- A turn that raises is that agent's invalid outcome (with the error's text); a turn that
  found no model (`InferError`, after the port's retries) is never an answer: the round
  stops with `ModelUnavailable` and the run pauses, to replay it once a model answers.
- With groups, a group's outcomes wait until all its members played; the group env settles
  them (sorted by agent id), each member hears the news, then they go on.
- `OutcomeSink` batches outcomes (~1,000), validates each batch's columns in pydantic-core,
  reduces it with the root env, and hands it on: one message per batch, never per agent.
"""

from __future__ import annotations

import asyncio
import dataclasses
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import TypeAdapter, ValidationError

from populace.core.ranges import not_in, outside
from populace.sdk.agent import Agent
from populace.sdk.env import Env, GroupEnv, Partial
from populace.sdk.llm import LLM, InferError, ModelUnavailable
from populace.sdk.outcome import Outcome, columns_adapter
from populace.sdk.process import AgentRaised
from populace.sdk.simulation import Observation, Simulation

# Yield to the event loop every this many task launches so batches leave while agents start.
LAUNCH_SLICE = 2000
_VALID = TypeAdapter(list[bool])
_RAW = TypeAdapter(list[str])


class RoundFailed(RuntimeError):
    """The simulation's own environment code (a group env) raised: the run cannot go on."""


@dataclass(slots=True)
class OutcomeBatch:
    """One batch of a round's outcomes, columnar and validated."""

    seq: int
    agent_ids: list[int]
    columns: dict[str, list]
    valid: list[bool]
    raws: list[str]
    latency_ms: list[float]
    errors: list[str | None]
    group_ids: list[int] | None
    posts: dict[str, list] | None = None  # a run with a graph: each agent's post, what it heard


@dataclass(slots=True)
class RoundShare:
    """What one host (or the local runner's share) contributes to a round."""

    n: int
    n_valid: int
    partial: Partial | None  # None when the share had no agents
    batches: int = 0
    n_simulation_errors: int = 0  # invalid rows the simulation's own code caused ('agent: …')


# (agent ids, outcomes, errors, valid) of a batch -> its post columns (populace.sdk.mailroom):
# may mark a row invalid (a post that cannot travel), as a bad outcome value does
PostRecorder = Callable[[list[int], list[Outcome], list, list[bool]], dict[str, list]]


class OutcomeSink:
    def __init__(self, sim: type[Simulation], env: Env, *, batch_size: int = 1000,
                 emit: Callable[[OutcomeBatch], None] | None = None, grouped: bool = False,
                 posts: PostRecorder | None = None) -> None:
        self._cls = sim.Outcome
        self._adapters = columns_adapter(sim.Outcome)
        self._getters = {name: operator.attrgetter(name) for name in ("valid", "raw", *self._adapters)}
        self._defaults = {f.name: (f.default_factory if f.default is dataclasses.MISSING
                                   else (lambda v=f.default: v)) for f in dataclasses.fields(sim.Outcome)}
        self._env = env
        # A valid numeric measure outside the simulation's declared range for the run is not
        # possible: the row is invalid (named), as the recorder would refuse the batch.
        instance = getattr(env, "sim", None)
        run_tables = sim.tables_for(instance.params) if instance is not None else None
        self._range = run_tables.measure_range if run_tables else None
        # likewise a valid categorical measure that is not one of its declared options
        options = run_tables.measure_options if run_tables else None
        self._options = frozenset(options) if options else None
        self._measure = run_tables.measure if self._range is not None or self._options else None
        self._batch_size = batch_size
        self._emit = emit
        self._grouped = grouped
        self._posts = posts
        self._partials: list[Partial] = []
        self.n = self.n_valid = self.n_simulation_errors = 0
        self.seq = 0
        self.failure: RoundFailed | None = None  # the simulation's reduce raised: the round cannot close
        self._new()

    def _new(self) -> None:
        self._ids: list[int] = []
        self._outs: list[Outcome] = []
        self._lat: list[float] = []
        self._errs: list[str | None] = []
        self._groups: list[int] = []

    def add(self, agent_id: int, outcome: Outcome, latency_ms: float, error: str | None = None,
            group: int = -1) -> None:
        ids = self._ids
        ids.append(agent_id)
        self._outs.append(outcome)
        self._lat.append(latency_ms)
        self._errs.append(error)
        if self._grouped:
            self._groups.append(group)
        if len(ids) >= self._batch_size:
            self.flush()

    def _columns(self, outs: list[Outcome], errs: list[str | None]) -> tuple[dict[str, list], list[bool], list[str]]:
        """Validated columns. A value that does not fit its column is reset to the column's
        default and its row marked invalid (error named); the row's other values stay — a
        group env may already have filled them — and one agent's bad value never poisons
        the batch."""
        for _ in range(2):
            bad: dict[int, list[str]] = {}
            columns: dict[str, list] = {}
            for name, adapter in (("valid", _VALID), ("raw", _RAW), *self._adapters.items()):
                values = list(map(self._getters[name], outs))
                try:
                    columns[name] = adapter.validate_python(values)
                except ValidationError as err:
                    for e in err.errors():
                        if e["loc"] and isinstance(e["loc"][0], int):
                            bad.setdefault(e["loc"][0], []).append(name)
                            reason = f"outcome.{name}: {e['msg']} (got {e.get('input')!r})"
                            errs[e["loc"][0]] = errs[e["loc"][0]] or f"agent: {reason}"
            if self._range is not None and not bad:
                for i in outside(columns[self._measure], columns["valid"], self._range):
                    bad.setdefault(i, []).append(self._measure)
                    v, (lo, hi) = columns[self._measure][i], self._range
                    errs[i] = errs[i] or f"agent: outcome.{self._measure}: {v!r} is outside the simulation's range " \
                                         f"[{lo:g}, {hi:g}]"
            if self._options is not None and not bad:
                for i in not_in(columns[self._measure], columns["valid"], self._options):
                    bad.setdefault(i, []).append(self._measure)
                    errs[i] = errs[i] or f"agent: outcome.{self._measure}: {columns[self._measure][i]!r} is not one " \
                                         "of the simulation's options"
            if not bad:
                return columns, columns.pop("valid"), columns.pop("raw")
            for i, names in bad.items():
                out = outs[i]
                raw = out.raw
                for name in names:
                    setattr(out, name, self._defaults[name]())
                out.valid = False
                if "raw" in names:  # the model's text must survive as text
                    out.raw = repr(raw)
        raise RuntimeError("outcome defaults do not fit their own columns")  # pragma: no cover

    def flush(self) -> None:
        if not self._ids:
            return
        ids, outs, lat, errs, groups = self._ids, self._outs, self._lat, self._errs, self._groups
        self._new()
        columns, valid, raws = self._columns(outs, errs)
        posts = self._posts(ids, outs, errs, valid) if self._posts is not None else None
        self.n += len(ids)
        self.n_valid += sum(valid)
        self.n_simulation_errors += sum(1 for ok, e in zip(valid, errs) if not ok and e and e.startswith("agent:"))
        if self.failure is None:
            try:
                self._partials.append(self._env.reduce(ids, outs))
            except Exception as err:
                self.failure = RoundFailed(f"{type(self._env).__name__}.reduce raised: {type(err).__name__}: {err}")
        batch = OutcomeBatch(self.seq, ids, columns, valid, raws, lat, errs, groups if self._grouped else None,
                             posts)
        self.seq += 1
        if self._emit is not None:
            self._emit(batch)

    def close(self) -> RoundShare:
        """Flush the last batch and merge the batches' partials. Raises RoundFailed when the
        simulation's reduce or merge raised (the outcomes were still emitted: they are true)."""
        self.flush()
        if self.failure is not None:
            raise self.failure
        try:
            partial = self._env.merge(self._partials) if self._partials else None
        except Exception as err:
            raise RoundFailed(f"{type(self._env).__name__}.merge raised: {type(err).__name__}: {err}") from err
        return RoundShare(self.n, self.n_valid, partial, self.seq, self.n_simulation_errors)


@dataclass
class _Group:
    size: int
    members: list[tuple[Agent, Outcome, float, str | None]] = field(default_factory=list)


class RoundPlayer:
    """Plays rounds for one run's agents on one process."""

    def __init__(self, sim: Simulation, agents: Sequence[Agent], *, max_in_flight: int = 1_000_000) -> None:
        self.sim = sim
        self.agents = agents
        self.max_in_flight = max_in_flight
        self.outcome_cls = type(sim).Outcome
        group_cls = type(sim).GroupEnv
        self.group_size = sim.group_size() if group_cls is not None else None
        self.group_env: GroupEnv | None = group_cls(sim) if group_cls is not None and self.group_size else None

    def failed_outcome(self, error: BaseException) -> tuple[Outcome, str]:
        text = str(error) if isinstance(error, AgentRaised) else f"{type(error).__name__}: {error}"
        return self.outcome_cls(valid=False, raw=f"<agent error: {text}>"), f"agent: {text}"

    async def play(self, obs: Observation, llm: LLM, sink: OutcomeSink) -> None:
        agents = self.agents
        total = len(agents)
        if total == 0:
            return
        loop = asyncio.get_running_loop()
        now = loop.time
        cls = self.outcome_cls
        finished = loop.create_future()
        state = {"next": 0, "left": total}
        self._failure = None
        # one callable either way: the sink itself, or the groups' waiting room in front of it
        deliver = self._grouped_delivery(obs.round, sink) if self.group_env is not None else None
        add = sink.add
        failed = self.failed_outcome

        async def play(agent: Agent) -> None:
            started = now()
            error = None
            try:
                out = await agent.turn(obs, llm)
                if out.__class__ is not cls and not isinstance(out, cls):
                    raise TypeError(f"turn returned {type(out).__name__}, not {cls.__name__}")
            except InferError as err:
                # No model answered (after the port's own retries): not this agent's answer.
                # The round stops here; the run pauses and replays it once a model answers.
                if self._failure is None:
                    self._failure = err if isinstance(err, ModelUnavailable) else ModelUnavailable(str(err))
                if not finished.done():
                    finished.set_result(None)
                return
            except Exception as err:
                out, error = failed(err)
            if deliver is None:
                add(agent.id, out, (now() - started) * 1000.0, error)
            else:
                deliver(agent, out, (now() - started) * 1000.0, error)

        running: set[asyncio.Task] = set()

        def launch() -> None:
            i = state["next"]
            if i < total:
                state["next"] = i + 1
                task = loop.create_task(play(agents[i]))
                running.add(task)
                task.add_done_callback(on_done)

        def on_done(task: asyncio.Task) -> None:
            running.discard(task)
            if finished.done():
                return  # cancelled, or stopped (no model): launch nothing more
            state["left"] -= 1
            if state["left"] == 0:
                finished.set_result(None)
            else:
                launch()

        for k in range(min(self.max_in_flight, total)):
            launch()
            if k % LAUNCH_SLICE == LAUNCH_SLICE - 1:
                await asyncio.sleep(0)
        flush = getattr(llm, "flush", None)
        if flush is not None:
            flush()  # send what is queued now rather than after the flush timer
        try:
            await finished
        except asyncio.CancelledError:
            # the run was cancelled (or replaced): its agents' turns stop with it
            finished.cancel()
            for task in list(running):
                task.cancel()
            raise
        if self._failure is not None:
            for task in list(running):
                task.cancel()
            raise self._failure

    _failure: BaseException | None = None

    def _grouped_delivery(self, round_: int, sink: OutcomeSink) -> Callable[[Agent, Outcome, float, str | None], None]:
        """Outcomes wait in their group until every member played; then the group env settles
        them and each member hears the news (groups are whole on a process: placement keeps
        them so)."""
        k = self.group_size
        n_agents = self.sim.agents
        env = self.group_env
        assert k and env is not None
        groups: dict[int, _Group] = {}

        def deliver(agent: Agent, out: Outcome, latency: float, error: str | None) -> None:
            g = agent.id // k
            group = groups.get(g)
            if group is None:
                group = groups[g] = _Group(min(k, n_agents - g * k))
            group.members.append((agent, out, latency, error))
            if len(group.members) < group.size:
                return
            del groups[g]
            members = sorted(group.members, key=lambda m: m[0].id)
            news: Any = None
            if self._failure is None:
                try:
                    news = env.settle(round_, g, [m[0].id for m in members], [m[1] for m in members])
                except Exception as err:
                    self._failure = RoundFailed(f"{type(env).__name__}.settle raised in round {round_} "
                                                f"(group {g}): {type(err).__name__}: {err}")
            for member, outcome, lat, err in members:
                try:
                    member.settled(outcome, news)
                except Exception as exc:
                    err = err or f"agent: settled raised {type(exc).__name__}: {exc}"
                sink.add(member.id, outcome, lat, err, g)

        return deliver
