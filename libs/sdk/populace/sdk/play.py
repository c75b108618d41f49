"""Playing one round on a set of agents — the generic worker the round engine
(`populace.sdk.engine`) drives on an agent-host and in the local runner. The simulation's code
decides; this does.

- Only the agents the round selects play (activation, `populace.sdk.select`); the others are
  not touched.
- Every agent runs its own turn as its own asyncio task, bounded by an in-flight limit; with
  scenes, every group runs its scene as one task (its members' acts in order).
- A turn that raises is that agent's invalid outcome (with the error's text); a turn that
  found no model (`InferError`, after the port's retries) is never an answer: the round
  stops with `ModelUnavailable` and the run pauses, to replay it once a model answers.
- With groups, a group's outcomes wait until all its members played; the group env settles
  them (sorted by agent id), each member hears the news, then — level by level, for nested
  groups — the group of the level above settles once all its groups did.
- `OutcomeSink` batches outcomes (~1,000), validates each batch's columns in pydantic-core,
  reduces it with the root env, and hands it on: one message per batch, never per agent. With
  groups, a group enters a batch whole (its members' outcomes with its scene's acts and lines):
  a batch leaves only between groups, so the recorder finds every act beside its member's outcome.
"""

from __future__ import annotations

import asyncio
import dataclasses
import operator
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from pydantic import TypeAdapter, ValidationError

from populace.core.ranges import not_in, outside
from populace.sdk.agent import Agent
from populace.sdk.answers import schema_options
from populace.sdk.claims import ClaimError
from populace.sdk.edges import EdgeError
from populace.sdk.env import Env, GroupEnv, Partial
from populace.sdk.groups import Group, GroupLayout
from populace.sdk.llm import LLM, TURNS, InferError, ModelUnavailable
from populace.sdk.outcome import Outcome, columns_adapter, literal_values, outcome_fields
from populace.sdk.process import AgentRaised
from populace.sdk.profile import RoundCost, Timed, sampled
from populace.sdk.scene import PLAYING, ActRecord, LineRecord, Member, Scene, SceneError
from populace.sdk.shown import ShownError
from populace.sdk.simulation import Observation, Simulation
from populace.sdk.slicing import SLICE_S, slicer_for

# Yield to the event loop every this many task launches (at most: fewer when the simulation's
# code is slow, populace.sdk.slicing) so batches leave while agents start.
LAUNCH_SLICE = 2000
# A batch also leaves once its groups' text (acts, lines, answers) passes this, between two
# groups, so that with its other columns a message stays well under NATS' 1 MB max_payload.
SCENE_BYTES = 256 * 1024
# One group travels in one batch (its acts beside its members' outcomes); a group whose text alone
# is larger than this cannot, and its round pauses naming it (as in a local run: local = fleet).
# The agent-host checks the encoded message itself too (populace.agent_host.batch_fit).
GROUP_BYTES = 768 * 1024
# What a row costs beyond its text, roughly (its ids, numbers and keys on the wire)
ROW_BYTES = 64
_VALID = TypeAdapter(list[bool])
_RAW = TypeAdapter(list[str])


class RoundFailed(RuntimeError):
    """The simulation's own environment code (a group env, a scene) raised: the run cannot go on."""


class RoundPaused(RoundFailed):
    """The simulation broke one of the platform's rules in a way a fix can resume from (a scene,
    an edge edit): the run pauses naming it; what was recorded stays."""


class SceneFailed(RoundPaused):
    """A scene raised, broke a rule or never finished."""


@dataclass(slots=True)
class OutcomeRows:
    """One batch of a round's outcomes, columnar and validated: what the sink emits. A host
    sends it as the wire's `populace.core.contracts.OutcomeBatch` (its lists as they are, its
    run, round, host and epoch added); the local runner keeps the rows."""

    seq: int
    agent_ids: list[int]
    columns: dict[str, list]
    valid: list[bool]
    raws: list[str]
    latency_ms: list[float]
    errors: list[str | None]
    group_ids: list[int] | None
    posts: dict[str, list] | None = None  # a run with a graph: each agent's post, what it heard
    levels: dict[str, list[int]] | None = None  # nested groups: each outer level's group ids
    edits: dict[str, list] | None = None  # graphs that change: the batch's edge edits, in order
    acts: dict[str, list] | None = None  # scenes: the acts of the groups whose members are here
    lines: dict[str, list] | None = None  # scenes: what those groups' members said
    audit: bool = False  # a prototype run's audits (table `audits`), never outcomes
    prototypes: list[str] | None = None  # audits: each agent's prototype
    shown: dict[str, list] | None = None  # who saw what: the batch's agents' records (populace.sdk.shown)


@dataclass(slots=True)
class RoundShare:
    """What one host (or the local runner's share) contributes to a round."""

    n: int
    n_valid: int
    partial: Partial | None  # None when the share had no agents
    batches: int = 0
    n_simulation_errors: int = 0  # invalid rows the simulation's own code caused ('agent: …')
    cost: RoundCost | None = None  # where the share's round went (populace.sdk.profile)
    prototypes: dict | None = None  # a prototype run: the share's evidence (populace.sdk.prototypes)


# (agent ids, outcomes, errors, valid) of a batch -> its post columns (populace.sdk.mailroom):
# may mark a row invalid (a post that cannot travel), as a bad outcome value does
PostRecorder = Callable[[list[int], list[Outcome], list, list[bool]], dict[str, list]]
# (agent ids, outcomes) of a batch -> its edge edits' columns (None: none), applied to the host's
# edge book; raises EdgeError for an edit the run cannot have
EditRecorder = Callable[[list[int], list[Outcome]], dict[str, list] | None]
# agent ids of a batch -> their shown records' columns (None: none); raises ShownError for an item
# the round's world does not have (populace.sdk.shown.ShownBook.take)
ShownRecorder = Callable[[list[int]], dict[str, list] | None]


class _Columns:
    """Validates a batch of outcome objects (a simulation's Outcome or Act class) into columns."""

    def __init__(self, cls: type[Outcome], bounds: tuple[str, tuple[float, float]] | None = None,
                 options: dict[str, tuple] | None = None) -> None:
        self.adapters = columns_adapter(cls)
        self.getters = {name: operator.attrgetter(name) for name in ("valid", "raw", *self.adapters)}
        self.defaults = {f.name: (f.default_factory if f.default is dataclasses.MISSING
                                  else (lambda v=f.default: v)) for f in dataclasses.fields(cls)}
        self.bounds = bounds  # (measure, its declared range): a valid value outside is invalid
        # column -> its declared options, in order (the measure's, an answer schema's enum): a
        # valid value not one of them is invalid
        self.options = {name: (tuple(opts), frozenset(opts)) for name, opts in (options or {}).items()}

    def __call__(self, outs: list[Outcome], errs: list[str | None]) -> tuple[dict[str, list], list[bool], list[str]]:
        """Validated columns. A value that does not fit its column is reset to the column's
        default and its row marked invalid (error named); the row's other values stay — a
        group env may already have filled them — and one agent's bad value never poisons
        the batch. A value outside what the model was offered (a Literal's values, the declared
        options or range) is the model's invalid answer ('answer: …', however the simulation's
        parser let it through); any other misfit is the simulation's own error ('agent: …')."""
        for _ in range(2):
            bad: dict[int, list[str]] = {}
            columns: dict[str, list] = {}
            for name, adapter in (("valid", _VALID), ("raw", _RAW), *self.adapters.items()):
                values = list(map(self.getters[name], outs))
                try:
                    columns[name] = adapter.validate_python(values)
                except ValidationError as err:
                    for e in err.errors():
                        if e["loc"] and isinstance(e["loc"][0], int):
                            bad.setdefault(e["loc"][0], []).append(name)
                            reason = f"outcome.{name}: {e['msg']} (got {e.get('input')!r})"
                            whose = "answer" if e["type"] == "literal_error" else "agent"
                            errs[e["loc"][0]] = errs[e["loc"][0]] or f"{whose}: {reason}"
            if self.bounds is not None and not bad:
                measure, (lo, hi) = self.bounds
                for i in outside(columns[measure], columns["valid"], (lo, hi)):
                    bad.setdefault(i, []).append(measure)
                    v = columns[measure][i]
                    errs[i] = errs[i] or f"answer: outcome.{measure}: {v!r} is outside the simulation's range " \
                                         f"[{lo:g}, {hi:g}]"
            if self.options and not bad:
                for name, (listed, allowed) in self.options.items():
                    for i in not_in(columns[name], columns["valid"], allowed):
                        bad.setdefault(i, []).append(name)
                        errs[i] = errs[i] or f"answer: outcome.{name}: {columns[name][i]!r} is not one of the " \
                                             f"options ({_listed(listed)})"
            if not bad:
                return columns, columns.pop("valid"), columns.pop("raw")
            for i, names in bad.items():
                out = outs[i]
                raw = out.raw
                for name in names:
                    setattr(out, name, self.defaults[name]())
                out.valid = False
                if "raw" in names:  # the model's text must survive as text
                    out.raw = repr(raw)
        raise RuntimeError("outcome defaults do not fit their own columns")  # pragma: no cover


def _text_bytes(values: list) -> int:
    """The UTF-8 bytes of the strings among `values` (anything else counts 0)."""
    try:
        return len("".join(values).encode())  # one join, one encode: a group's few texts at once
    except TypeError:  # a None (no error), or an author's raw that is not text
        return sum(len(v.encode()) for v in values if isinstance(v, str))


def _listed(options: Sequence[object], most: int = 12) -> str:
    shown = ", ".join(map(repr, options[:most]))
    return shown + (f", … ({len(options)} in all)" if len(options) > most else "")


def declared_options(sim: type[Simulation], measure: str | None, measure_options: Sequence[str] | None,
                     answer_schema: dict | None) -> dict[str, tuple]:
    """Each outcome column's declared options: the measure's (`measure_options`, as the run's
    tables carry them), and for any other column named as a property of the answer schema with
    an `enum`, that enum in the column's type (an enum the column's type cannot hold is the
    simulation's translation of the answer: left alone). A Literal column's values are checked
    by its type already."""
    out: dict[str, tuple] = {}
    if measure is not None and measure_options:
        out[measure] = tuple(measure_options)
    fields = dict(outcome_fields(sim.Outcome))
    enums = {name: enum for name, enum in schema_options(answer_schema).items()
             if name in fields and name not in out and not literal_values(fields[name])}
    adapters = columns_adapter(sim.Outcome) if enums else {}
    for name, enum in enums.items():
        try:
            out[name] = tuple(dict.fromkeys(adapters[name].validate_python(list(enum))))
        except ValidationError:
            continue
    return out


def _group_bytes(members: Sequence[tuple[Agent, Outcome, float, str | None, Any]], acts: Sequence[ActRecord],
                 lines: Sequence[LineRecord]) -> int:
    """About how many bytes a scene's group takes in a batch: its text (UTF-8) and a row's cost
    beyond it, for its acts, lines and members' outcomes."""
    texts = [a[4].raw for a in acts]
    texts += [a[6] for a in acts if a[6] is not None]
    texts += [m[1].raw for m in members]
    texts += [m[3] for m in members if m[3] is not None]
    for x in lines:
        texts.append(x[3])
        if x[4] is not None:
            texts.append(x[4])
    return _text_bytes(texts) + ROW_BYTES * (len(acts) + len(lines) + len(members))


class OutcomeSink:
    def __init__(self, sim: type[Simulation], env: Env, *, batch_size: int = 1000,
                 emit: Callable[[OutcomeRows], None] | None = None, grouped: bool = False,
                 posts: PostRecorder | None = None, levels: Sequence[str] = (),
                 edits: EditRecorder | None = None, round_: int | None = None,
                 shown: ShownRecorder | None = None) -> None:
        # A valid numeric measure outside the simulation's declared range for the run is not
        # possible: the row is invalid (named), as the recorder would refuse the batch.
        instance = getattr(env, "sim", None)
        schema = instance.request_schema() if instance is not None else None
        run_tables = sim.tables_for(instance.params, schema) if instance is not None else None
        bounds = (run_tables.measure, run_tables.measure_range) if run_tables and run_tables.measure_range else None
        # likewise a valid value that is not one of its declared options: the categorical measure's,
        # and any column's that the answer schema gives an `enum`
        options = declared_options(sim, run_tables.measure if run_tables else None,
                                   run_tables.measure_options if run_tables else None, schema)
        self._columns = _Columns(sim.Outcome, bounds, options)
        self._act_columns = _Columns(sim.Act) if sim.Act is not None else None
        self._env = env
        self._where = f"simulation {sim.name!r}" + (f", round {round_}" if round_ is not None else "")
        self._batch_size = batch_size
        self._emit = emit
        self._grouped = grouped
        self._levels = tuple(levels)  # outer levels' names (nested groups), inner to outer
        self._posts = posts
        self._edits = edits
        self._shown = shown
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
        self._outer: list[tuple[int, ...]] = []
        self._acts: list[ActRecord] = []
        self._lines: list[LineRecord] = []
        self._scene_bytes = 0

    def validated(self, outs: list[Outcome], errs: list[str | None]) -> tuple[dict[str, list], list[bool], list[str]]:
        """Outcomes' columns as a batch of them is checked (a prototype run's audits: not reduced, not emitted)."""
        return self._columns(outs, errs)

    def add(self, agent_id: int, outcome: Outcome, latency_ms: float, error: str | None = None) -> None:
        """An agent's outcome (a simulation without groups: a batch may leave after any agent)."""
        ids = self._ids
        ids.append(agent_id)
        self._outs.append(outcome)
        self._lat.append(latency_ms)
        self._errs.append(error)
        if len(ids) >= self._batch_size:
            self.flush()

    def add_group(self, group: int, members: Sequence[tuple[Agent, Outcome, float, str | None, Any]],
                  outer: tuple[int, ...] = (), acts: Sequence[ActRecord] = (), lines: Sequence[LineRecord] = ()
                  ) -> bool:
        """A settled group's members (agent, outcome, latency, error, and what else the caller keeps)
        and its scene's acts and lines, all in one batch: the batch before it leaves first when the
        group would take it past SCENE_BYTES, and a batch leaves only after a whole group. False
        (and `failure` set): the group's text alone is more than a message holds (GROUP_BYTES);
        nothing of it is kept."""
        size = _group_bytes(members, acts, lines) if acts or lines else 0
        if size > GROUP_BYTES:
            if self.failure is None:
                self.failure = SceneFailed(
                    f"group {group}: its acts, lines and answers are {size:,} bytes, more than one message "
                    f"carries ({GROUP_BYTES:,}): a group's acts travel with its members' outcomes in one batch, "
                    "so a scene must say less (shorter lines, fewer acts) or answer shorter")
            return False
        if self._scene_bytes and self._scene_bytes + size > SCENE_BYTES:
            self.flush()  # the group would take the batch past its size: the batch leaves before it
        ids, outs, lat, errs, groups = self._ids, self._outs, self._lat, self._errs, self._groups
        for agent, outcome, latency_ms, error, _ in members:
            ids.append(agent.id)
            outs.append(outcome)
            lat.append(latency_ms)
            errs.append(error)
            groups.append(group)
        if self._levels:
            self._outer.extend([outer] * len(members))
        if acts:
            self._acts.extend(acts)
        if lines:
            self._lines.extend(lines)
        self._scene_bytes += size
        if len(ids) >= self._batch_size or self._scene_bytes >= SCENE_BYTES:
            self.flush()
        return True

    def flush(self) -> None:
        if not self._ids:
            return
        ids, outs, lat, errs, groups = self._ids, self._outs, self._lat, self._errs, self._groups
        outer, acts, lines = self._outer, self._acts, self._lines
        self._new()
        columns, valid, raws = self._columns(outs, errs)
        posts = self._posts(ids, outs, errs, valid) if self._posts is not None else None
        edits = None
        if self._edits is not None:
            try:
                edits = self._edits(ids, outs)
            except EdgeError as err:  # the simulation's bug: the round stops, the run pauses naming it
                if self.failure is None:
                    self.failure = RoundPaused(str(err))
        shown = None
        if self._shown is not None:
            try:
                shown = self._shown(ids)
            except ShownError as err:  # likewise: an item the round's world does not have
                if self.failure is None:
                    self.failure = RoundPaused(str(err))
        self.n += len(ids)
        self.n_valid += sum(valid)
        self.n_simulation_errors += sum(1 for ok, e in zip(valid, errs) if not ok and e and e.startswith("agent:"))
        if self.failure is None:
            try:
                self._partials.append(self._env.reduce(ids, outs))
            except ClaimError as err:  # a claim that is not a target (e.g. 2.5): the simulation's bug, named
                self.failure = RoundPaused(f"{self._where}: {type(self._env).__name__}.reduce: claims: {err}")
            except Exception as err:
                self.failure = RoundFailed(f"{type(self._env).__name__}.reduce raised: {type(err).__name__}: {err}")
        levels = ({name: [o[i] for o in outer] for i, name in enumerate(self._levels)}
                  if self._grouped and self._levels else None)
        batch = OutcomeRows(self.seq, ids, columns, valid, raws, lat, errs, groups if self._grouped else None,
                             posts=posts, levels=levels, acts=self._act_rows(acts), lines=self._line_rows(lines),
                             edits=edits, shown=shown)
        self.seq += 1
        if self._emit is not None:
            self._emit(batch)

    def _act_rows(self, acts: list[ActRecord]) -> dict[str, list] | None:
        if self._act_columns is None or not acts:
            return None
        groups, seqs, agents, phases, outs, latency, errs = map(list, zip(*acts, strict=True))
        columns, valid, raws = self._act_columns(outs, errs)
        return {"group_id": groups, "seq": seqs, "agent_id": agents, "phase": phases,
                **columns, "valid": valid, "raw": raws, "latency_ms": latency, "error": errs}

    @staticmethod
    def _line_rows(lines: list[LineRecord]) -> dict[str, list] | None:
        if not lines:
            return None
        groups, seqs, speakers, texts, fields = map(list, zip(*lines, strict=True))
        return {"group_id": groups, "seq": seqs, "speaker": speakers, "text": texts, "fields": fields}

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
class _Waiting:
    """Members of one group at one level, until all of them played (or settled below)."""

    size: int
    members: list[tuple[Agent, Outcome, float, str | None, Group]] = field(default_factory=list)


class RoundPlayer:
    """Plays rounds for one run's agents on one process."""

    def __init__(self, sim: Simulation, agents: Sequence[Agent], *, max_in_flight: int = 1_000_000,
                 scene_idle_s: float = 60.0, slice_s: float = SLICE_S) -> None:
        self.sim = sim
        self.agents = agents
        self.max_in_flight = max_in_flight
        # the most the simulation's code holds the loop before heartbeats and messages go first
        self.slice_s = slice_s
        self.cost = RoundCost()  # the round in play's (a share's engine hands each round its own)
        # a scene that for this long waits on neither an act nor a model call is stuck: it fails
        self.scene_idle_s = scene_idle_s
        self._scenes: dict[int, Scene] = {}  # the scenes playing now, by group
        cls = type(sim)
        self.outcome_cls = cls.Outcome
        self.layout: GroupLayout | None = sim.group_layout()
        self.group_envs: list[GroupEnv] = [level(sim) for level in cls.group_levels()] if self.layout else []
        self.scenes = bool(self.group_envs) and cls.GroupEnv.plays_scenes()
        self.index = {a.id: i for i, a in enumerate(agents)} if self.layout is not None else {}
        self._failure: BaseException | None = None
        self._pending_groups: set[int] = set()

    @property
    def group_env(self) -> GroupEnv | None:
        return self.group_envs[0] if self.group_envs else None

    @property
    def level_names(self) -> tuple[str, ...]:
        """The outer levels' names (their recorded columns are `<name>_id`)."""
        return tuple(type(g).level for g in self.group_envs[1:])

    def failed_outcome(self, error: BaseException) -> tuple[Outcome, str]:
        text = str(error) if isinstance(error, AgentRaised) else f"{type(error).__name__}: {error}"
        return self.outcome_cls(valid=False, raw=f"<agent error: {text}>"), f"agent: {text}"

    def failed_act(self, error: BaseException) -> tuple[Outcome, str]:
        text = str(error) if isinstance(error, AgentRaised) else f"{type(error).__name__}: {error}"
        return type(self.sim).Act(valid=False, raw=f"<agent error: {text}>"), f"agent: {text}"

    def groups(self, round_: int, selected: Sequence[int] | None) -> list[Group]:
        """This round's groups of the selected agents (indices into `agents`; None: all)."""
        assert self.layout is not None
        ids = np.fromiter((a.id for a in self.agents), dtype=np.int64, count=len(self.agents)) if selected is None \
            else np.fromiter((self.agents[i].id for i in selected), dtype=np.int64, count=len(selected))
        ids.sort()
        return self.layout.groups(round_, ids)

    async def play(self, obs: Observation, llm: LLM, sink: OutcomeSink, selected: Sequence[int] | None = None,
                   view: Callable[[int], Any] | None = None, cost: RoundCost | None = None) -> None:
        """Play round `obs.round` for the agents at `selected` (indices into `agents`; None: all);
        `view`: agent id -> its own observation (the environment's view), else everyone sees `obs`;
        `cost`: where the round's time goes is added to it."""
        self._failure = None
        self.cost = cost if cost is not None else RoundCost()
        if self.layout is None:
            units: Sequence = self.agents if selected is None else [self.agents[i] for i in selected]
            await self._run(units, self._turn_task(obs, llm, sink.add, view), llm, turns=True)
            return
        groups = self.groups(obs.round, selected)
        deliver = self._settlement(obs.round, groups, sink)
        if self.scenes:
            watch = asyncio.get_running_loop().create_task(self._watch_scenes(obs.round))
            try:
                await self._run(groups, self._scene_task(obs.round, llm, deliver, sink), llm)
            finally:
                watch.cancel()
                self._scenes.clear()
        else:
            group_of = {m: g for g in groups for m in g.members}
            members = [self.agents[self.index[m]] for g in groups for m in g.members]
            await self._run(members, self._turn_task(
                obs, llm, lambda aid, out, lat, err: deliver(group_of[aid], [(aid, out, lat, err)]), view), llm,
                turns=True)
        if self._failure is None and self._pending_groups:
            raise RoundFailed(f"round {obs.round}: groups {sorted(self._pending_groups)[:5]} never settled")  # a bug

    # -- one task per unit (an agent's turn, or a group's scene), bounded in flight ---------------
    async def _run(self, units: Sequence, task_of: Callable[[Any], Any], llm: LLM, turns: bool = False) -> None:
        """`turns`: units are agents, each task its turn (registered in TURNS: its calls are its own)."""
        total = len(units)
        if total == 0:
            return
        loop = asyncio.get_running_loop()
        finished = loop.create_future()
        state = {"next": 0, "left": total}
        self._finished = finished
        running: set[asyncio.Task] = set()

        def launch() -> None:
            i = state["next"]
            if i < total:
                state["next"] = i + 1
                unit = units[i]
                task = loop.create_task(task_of(unit))
                if turns:
                    TURNS[task] = unit.id
                running.add(task)
                task.add_done_callback(on_done)

        def on_done(task: asyncio.Task) -> None:
            running.discard(task)
            if turns:
                TURNS.pop(task, None)
            if finished.done():
                return  # cancelled, or stopped (no model): launch nothing more
            state["left"] -= 1
            if state["left"] == 0:
                finished.set_result(None)
            elif not launching:
                launch()  # the launcher is done: one starts as one finishes (at most max_in_flight)

        slicer = slicer_for(loop, self.slice_s)
        held = slicer.held
        launching = True
        try:
            # done early: cancelled, or stopped (no model, the simulation failed)
            while not finished.done() and state["next"] < total:
                free = self.max_in_flight - len(running)
                if free <= 0:
                    break  # the rest start as turns finish (on_done)
                # as many as a slice of the loop holds at what the simulation's code costs: thousands
                # of cheap turns per turn of the loop, a few slow ones
                for _ in range(slicer.room(min(LAUNCH_SLICE, free, total - state["next"]))):
                    launch()
                if state["next"] < total:
                    await asyncio.sleep(0)
            launching = False
            flush = getattr(llm, "flush", None)
            if flush is not None:
                flush()  # send what is queued now rather than after the flush timer
            await finished
        except asyncio.CancelledError:
            # the run was cancelled (or replaced): its agents' turns stop with it
            finished.cancel()
            for task in list(running):
                task.cancel()
                TURNS.pop(task, None)
            raise
        finally:
            self.cost.held += slicer.held - held
        if self._failure is not None:
            for task in list(running):
                task.cancel()
            raise self._failure

    def _stop(self, failure: BaseException) -> None:
        """The round cannot go on (no model, the simulation's own code failed): stop launching."""
        if self._failure is None:
            self._failure = failure
        if not self._finished.done():
            self._finished.set_result(None)

    def _turn_task(self, obs: Observation, llm: LLM, deliver: Callable[[int, Outcome, float, str | None], None],
                   view: Callable[[int], Any] | None = None):
        loop = asyncio.get_running_loop()
        now = loop.time
        cls = self.outcome_cls
        failed = self.failed_outcome
        gate = slicer_for(loop, self.slice_s).enter
        cost = self.cost
        count = 0

        async def play(agent: Agent) -> None:
            nonlocal count
            wait = gate()  # the simulation's code starts here: after the loop turned, if it held it a slice
            if wait is not None:
                await wait
            started = now()
            error = None
            i = count
            count = cost.turns = i + 1
            try:
                seen = obs
                if view is not None:
                    try:
                        seen = view(agent.id)
                    except RoundFailed as err:  # the simulation's view, not this agent: stop the round
                        self._stop(err)
                        return
                out = await (Timed(agent.turn(seen, llm), cost) if sampled(i) else agent.turn(seen, llm))
                if out.__class__ is not cls and not isinstance(out, cls):
                    raise TypeError(f"turn returned {type(out).__name__}, not {cls.__name__}")
            except InferError as err:
                # No model answered (after the port's own retries): not this agent's answer.
                # The round stops here; the run pauses and replays it once a model answers.
                self._stop(err if isinstance(err, ModelUnavailable) else ModelUnavailable(str(err)))
                return
            except Exception as err:
                out, error = failed(err)
            deliver(agent.id, out, (now() - started) * 1000.0, error)

        return play

    async def _watch_scenes(self, round_: int) -> None:
        """Fail the round when a scene waits on something that is neither one of its acts nor a
        model call (an author's bug: an event never set, a future never resolved) for too long."""
        clock = time.perf_counter
        while True:
            # a look every quarter of the wait (at most 10 s): a look walks every scene playing, a
            # quarter of a million on a host of a million agents' scenes
            await asyncio.sleep(min(10.0, self.scene_idle_s / 4))
            now = clock()
            for scene in self._scenes.values():  # (nothing else runs while it walks: no copy)
                if scene.in_flight == 0 and now - scene.last_active > self.scene_idle_s:
                    self._stop(SceneFailed(f"{scene._where}: {type(self.group_envs[0]).__name__}.scene did not "
                                           f"finish: for {self.scene_idle_s:g}s it waited on neither an act nor a "
                                           "model call"))
                    return

    def _scene_task(self, round_: int, llm: LLM, deliver, sink: OutcomeSink):
        sim = self.sim
        env = self.group_envs[0]
        act_cls = type(sim).Act
        outcome_cls = self.outcome_cls
        agents, index, scenes, failed_act = self.agents, self.index, self._scenes, self.failed_act
        gate = slicer_for(asyncio.get_running_loop(), self.slice_s).enter
        cost = self.cost
        count = 0

        # (loops here, not comprehensions: a comprehension's closure costs objects per group)
        async def play(group: Group) -> None:
            nonlocal count
            wait = gate()
            if wait is not None:
                await wait
            i = count
            count = cost.turns = i + 1
            scene = Scene(round_, group.id, sim, llm, act_cls, failed_act, gate=gate)
            members_: list[Member] = []
            for aid in group.members:
                members_.append(Member(agents[index[aid]], scene))
            scene.members = members = tuple(members_)
            scene.last_active = scene._clock()
            scenes[group.id] = scene
            PLAYING.set(scene)  # this task's own context: what its acts are checked against
            try:
                news = await (Timed(env.scene(scene), cost) if sampled(i) else env.scene(scene))
                if scene.broken is not None:  # a rule broken, even if the scene caught the error
                    raise SceneError(scene.broken)
                outcomes = scene.outcomes
                missing = []
                for m in members:
                    if m.agent.id not in outcomes:
                        missing.append(m.agent.id)
                if missing:
                    raise SceneError(f"the scene gave no outcome to agent(s) {missing[:5]} (scene.outcome(member, …) "
                                     "for every member)")
                for aid, o in outcomes.items():
                    if o.__class__ is not outcome_cls and not isinstance(o, outcome_cls):
                        raise SceneError(f"the outcome of agent {aid} is a {type(o).__name__}, not a "
                                         f"{outcome_cls.__name__}")
            except InferError as err:
                self._stop(err if isinstance(err, ModelUnavailable) else ModelUnavailable(str(err)))
                return
            except Exception as err:
                where = scene._where
                why = str(err).removeprefix(f"{where}: ") if isinstance(err, SceneError) \
                    else f"{type(err).__name__}: {err}"
                self._stop(SceneFailed(f"{where}: {type(env).__name__}.scene failed: {why}"))
                return
            finally:
                scenes.pop(group.id, None)
                scene.end()
            # a member's time in the round: its acts' summed; its error: its first act's
            latency: dict[int, float] = {}
            errors: dict[int, str] = {}
            for a in scene.acts:
                aid = a[2]
                latency[aid] = latency.get(aid, 0.0) + a[5]
                if a[6] and aid not in errors:
                    errors[aid] = a[6]
            played = []
            for m in members:
                agent = m.agent
                aid = agent.id
                played.append((agent, outcomes[aid], latency.get(aid, 0.0), errors.get(aid), group))
            deliver(group, played, news=news, settled_here=True, scene=scene)

        return play

    # -- groups settle, level by level ---------------------------------------------------------
    def _settlement(self, round_: int, groups: list[Group], sink: OutcomeSink):
        """The callable that takes a group's played members: it settles the group when all of
        them are in (for scenes the scene settled it already), then each outer level once all
        its groups did, then hands the outcomes to the sink."""
        envs = self.group_envs
        agents, index = self.agents, self.index
        # innermost: each group's members; outer levels: how many members each of their groups has
        # (a scene's group comes whole: nothing to wait for)
        inner: dict[int, _Waiting | None] = dict.fromkeys([g.id for g in groups]) if self.scenes \
            else {g.id: _Waiting(len(g.members)) for g in groups}
        outer: list[dict[int, _Waiting]] = [{} for _ in envs[1:]]
        for g in groups:
            for level, gid in enumerate(g.outer):
                outer[level].setdefault(gid, _Waiting(0)).size += len(g.members)
        self._pending_groups = set(inner)
        # group -> its scene's acts and lines, until the group goes to the sink (nested: with its outer level)
        scenes: dict[int, tuple[list[ActRecord], list[LineRecord]]] = {}

        cost = self.cost

        def settle(level: int, gid: int, members: list) -> None:
            members.sort(key=lambda m: m[0].id)
            news: Any = None
            if self._failure is None:
                env = envs[level]
                t = time.perf_counter()
                try:
                    news = env.settle(round_, gid, [m[0].id for m in members], [m[1] for m in members])
                except Exception as err:
                    self._stop(RoundFailed(f"{type(env).__name__}.settle raised in round {round_} "
                                           f"({'group' if level == 0 else type(env).level} {gid}): "
                                           f"{type(err).__name__}: {err}"))
                finally:
                    cost.merge_s += time.perf_counter() - t
            hear(members, news)

        def hear(members: list, news: Any) -> list:
            for i, (member, outcome, lat, err, g) in enumerate(members):
                try:
                    member.settled(outcome, news)
                except Exception as exc:
                    members[i] = (member, outcome, lat, err or f"agent: settled raised {type(exc).__name__}: {exc}", g)
            return members

        def deliver(group: Group, played: list, news: Any = None, settled_here: bool = False,
                    scene: Scene | None = None) -> None:
            """`played`: (agent id, outcome, latency, error) of some of the group's members; a
            scene's: (agent, outcome, latency, error, group) of all of them."""
            if scene is not None:  # a scene's group, whole: its acts and lines leave with its members' outcomes
                del inner[group.id]
                scenes[group.id] = (scene.acts, scene.transcript)
                members = played
            else:
                waiting = inner[group.id]
                assert waiting is not None
                waiting.members.extend((agents[index[aid]], out, lat, err, group) for aid, out, lat, err in played)
                if len(waiting.members) < waiting.size:
                    return
                del inner[group.id]
                members = waiting.members
            self._pending_groups.discard(group.id)
            if settled_here:
                members.sort(key=lambda m: m[0].id)
                hear(members, news)
            else:
                settle(0, group.id, members)
            for level, gid in enumerate(group.outer):
                box = outer[level][gid]
                box.members.extend(members)
                if len(box.members) < box.size:
                    return
                del outer[level][gid]
                members = box.members
                settle(level + 1, gid, members)
            # Each group whole into the sink (a batch leaves between groups, never inside one):
            # for nested groups, every inner group of the outer one that settled now.
            if group.outer:
                by_group: dict[int, tuple[Group, list]] = {}
                for m in members:
                    by_group.setdefault(m[4].id, (m[4], []))[1].append(m)
                whole = list(by_group.values())
            else:
                whole = [(group, members)]
            for g, rows in whole:
                acts, lines = scenes.pop(g.id, ((), ()))
                if not sink.add_group(g.id, rows, g.outer, acts, lines):  # too large for a message
                    self._stop(SceneFailed(f"simulation {type(self.sim).name!r}, round {round_}, {sink.failure}"))
                    return

        return deliver
