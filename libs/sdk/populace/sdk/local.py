"""A whole run in this process, without NATS or services: the same agents, round player,
reduce, merge and decide as on the fleet, with the LLM port answering in process.

For unit tests of a simulation (with a `ScriptedLLM`) and for notebooks on the dummy model,
whose seeded answers equal the gateway's, so a local run reproduces a fleet run exactly.
`hosts` splits the agents as the orchestrator would place them on that many agent-hosts.

    result = await run_local(RunConfig(simulation="public-goods", agents=20, rounds=3))
    result.rounds["mean_contribution"]
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from populace.core.contracts import (
    GRAPH_ONE_PER_PROCESS,
    PROTOTYPE_COLUMNS,
    HostInfo,
    PrototypeEvidence,
    PrototypeRound,
    RunConfig,
    SimulationTables,
)
from populace.core.placement import birth_block, place, place_births
from populace.graph.csr import Graph
from populace.population import prototypes as pure
from populace.population.cast import Cast
from populace.sdk import interview, prototypes
from populace.sdk.engine import RoundDecider
from populace.sdk.hosting import HostedRun, host_run
from populace.sdk.llm import LLM
from populace.sdk.mock import DummyLLM
from populace.sdk.play import OutcomeRows, RoundPlayer, RoundShare
from populace.sdk.population import Delta, Population, combined_rows
from populace.sdk.profile import PROFILE_KEYS, RoundCost, budget_bytes
from populace.sdk.registry import Resolved, resolve
from populace.sdk.statejson import from_wire, to_wire

LLMFactory = Callable[[HostedRun, int], LLM]  # (the host's share, round) -> the port for that round


@dataclass
class LocalResult:
    """Columnar rows, named like the recorder's DuckDB tables (`tables.outcomes`, `tables.rounds`)."""

    run_id: str
    config: RunConfig
    tables: SimulationTables
    outcomes: dict[str, list] = field(default_factory=dict)
    rounds: dict[str, list] = field(default_factory=dict)
    posts: dict[str, list] = field(default_factory=dict)  # a run with a graph: table `posts`
    acts: dict[str, list] = field(default_factory=dict)  # scenes: table `tables.acts`
    transcripts: dict[str, list] = field(default_factory=dict)  # scenes: table `transcripts`
    edges: dict[str, list] = field(default_factory=dict)  # graphs that change: table `edges`
    shown: dict[str, list] = field(default_factory=dict)  # who saw what: table `shown`
    # where each round went (table `round_profile`): the process's row (role 'host') and the
    # environment's; the recorder adds its own when the run is recorded
    profile: dict[str, list] = field(default_factory=dict)
    status: str = "completed"
    reason: str | None = None
    interviews: dict[str, list] = field(default_factory=dict)  # the scenario's `interviews:`: table `interviews`
    # every departure and newcomer (table `population`: run_id, round, agent_id, event, reason)
    population: dict[str, list] = field(default_factory=dict)
    interview_calls: int = 0  # the interviews' LLM calls (the rounds' are in `rounds.llm_calls`)
    interview_usage: dict[tuple[int, str], int] = field(default_factory=dict)  # those calls by (after round, survey)
    # a prototype run: its audits (table `audits`'s rows) and each round's report (its result's)
    audits: dict[str, list] = field(default_factory=dict)
    prototype_reports: dict[int, PrototypeRound] = field(default_factory=dict)
    # round -> each share's agents' declared state after it, as a checkpoint holds it: what a
    # post-hoc interview (populace.sdk.local.interview_local) answers from
    states: dict[int, list[bytes]] = field(default_factory=dict, repr=False)
    resolved: Resolved | None = field(default=None, repr=False)
    cast: Cast | None = field(default=None, repr=False)


def dummy_llm(run: HostedRun, round_: int) -> LLM:
    model = run.resolved.config.model
    if model.backend != "dummy":
        raise ValueError(f"model.backend: a local run answers on the dummy model (or an LLM you pass); "
                         f"{model.backend!r} needs the fleet (populace run / simulate(nats=…))")
    return DummyLLM(seed=model.seed, round_=round_, system=run.sim.request_system_prompt(),
                    schema=run.sim.request_schema())


def _shares(resolved: Resolved, hosts: int) -> list[list[tuple[int, int]]]:
    c = resolved.config
    if hosts <= 1:
        return [[(0, c.agents)]]
    fake = [HostInfo(host_id=f"host-{i:04d}", capacity=c.agents, pid=0, started_at=0, heartbeat_at=0)
            for i in range(hosts)]
    return list(place(c.agents, fake, unit=resolved.instance().placement_unit()).values())


def local_graph(config: RunConfig, cast: Cast | None) -> Graph:
    """A run's graph built here from its `graph:` section, over the agents as `cast` numbers
    them (no renumbering: the fleet's client renumbers and hands its graph over as `graph=`)."""
    from populace.graph.prepare import prepare_graph

    assert config.graph is not None
    records = [{"profile": p.profile} for p in cast.personas] if cast is not None else None
    return prepare_graph(config.graph.spec, config.agents, seed=config.seed, placement="ids", records=records).graph


async def run_local(config: RunConfig | Resolved, *, run_id: str = "local", cast: Cast | None = None,
                    hosts: int = 1, llm: LLMFactory = dummy_llm, one_per_process: bool = False,
                    on_round: Callable[[int, dict], None] | None = None, graph: Graph | None = None,
                    keep_states: bool = True, view_budget_bytes: int | None = None) -> LocalResult:
    """`graph`: the run's graph (a run with a `graph:`; default: built from the section).
    `keep_states`: keep each round's agents' state (as checkpoints do on the fleet) for
    post-hoc interviews (`interview_local`). `view_budget_bytes`: a view or observation larger
    is said once (default: POPULACE_VIEW_BUDGET_BYTES, else 64 KiB)."""
    budget = budget_bytes() if view_budget_bytes is None else view_budget_bytes
    resolved = config if isinstance(config, Resolved) else resolve(config)
    c = resolved.config
    if one_per_process and c.graph is not None:  # refused as the CLI and the fleet refuse it
        raise ValueError(GRAPH_ONE_PER_PROCESS)
    tables = resolved.tables()
    if c.graph is not None and graph is None:
        graph = local_graph(c, cast)
    whole = _shares(resolved, hosts)
    runs = [host_run(resolved, run_id, ranges, cast, one_per_process=one_per_process, freeze=False, graph=graph,
                     view_budget_bytes=budget) for ranges in whole]
    for run in runs[1:]:  # one process: a view over its budget is said once, whichever share made it
        run.engine.budget = runs[0].engine.budget
    decider = RoundDecider(resolved, runs[0].env, budget_bytes=budget)
    state: dict | None = None  # the environment's, as the fleet carries it between rounds
    observation: dict | None = None
    selection: dict | None = None
    world = None  # a simulation's World after the last round (round 1: each share starts it)
    population: Population | None = None  # who is alive (None: the first agents, as ever)
    deltas: list[Delta] = []
    out = LocalResult(run_id, c, tables, resolved=resolved, cast=cast)
    rows = _Rows(run_id, tables)
    placement = {f"local-{i}@0": ranges for i, ranges in enumerate(whole)}  # share keys, as on the fleet
    raised: dict[str, float] | None = None  # a prototype run: the shares its guard raised
    try:
        for n in range(1, c.rounds + 1):
            if population is not None:  # as each host applies it when the round opens
                for run, key in zip(runs, placement):
                    run.apply(population, placement[key])
            shares: list[RoundShare] = []
            calls = 0
            start = rows.mark()
            for run in runs:
                port = llm(run, n)
                shares.append(await run.engine.play(n, observation, selection, port,
                                                    emit=functools.partial(rows.add, n), world=world,
                                                    prototypes=raised))
                calls += getattr(port, "calls", 0)  # the in-process ports count their calls
            _exchange(runs, placement, n)
            if n == 1 and decider.env.World is not None:
                world = decider.opening().world
            # each share's partial as the environment service reads it off the wire (local = fleet)
            partials = [from_wire(type(s.partial), to_wire(s.partial, strict=False)) for s in shares
                        if s.partial is not None]
            folded = None
            if c.prototypes is not None:  # the drawn agents' part, as the environment folds it
                folded = prototypes.fold(decider.env, c, tables, n, raised,
                                         [PrototypeEvidence.model_validate(s.prototypes) for s in shares
                                          if s.prototypes is not None])
                if folded.partial is not None:
                    partials.append(folded.partial)
            decision = decider.decide(n, state, partials, world, population)
            if folded is not None:
                plan = runs[0].prototypes
                assert plan is not None
                rows.draw(n, start, plan)
                out.prototype_reports[n] = folded.report
                raised = folded.report.shares or None
            _profile_rows(out.profile, run_id, n, [s.cost for s in shares if s.cost is not None], decision)
            state, observation, selection, world = (decision.state, decision.observation, decision.selection,
                                                    decision.world)
            if decision.population is not None and decision.population.round == n:
                d = decision.population.delta
                deltas.append(d)  # type: ignore[arg-type]
                if d.births:  # type: ignore[union-attr]
                    placement = place_births(placement, d.born_first, d.births,  # type: ignore[union-attr]
                                             base=c.agents, block=birth_block(c.agents))
            population = decision.population
            # the platform's round columns, as the recorder writes them (no tokens: no model runs here)
            row = {"run_id": run_id, "round": n, "n": sum(s.n for s in shares),
                   "n_valid": sum(s.n_valid for s in shares) + (folded.n_valid if folded is not None else 0),
                   "llm_calls": calls, "prompt_tokens": 0, "completion_tokens": 0, "infra_retries": 0,
                   "cached_tokens": 0, "dollars": 0.0,
                   **decision.summary, "closed_at": time.time()}
            for key, value in row.items():
                out.rounds.setdefault(key, []).append(value)
            planned = [plan for plan in c.interviews if n in plan.rounds(c.rounds)]
            if keep_states or planned:
                # the agents' state at the round's end, as the fleet checkpoints it
                frozen = [interview.frozen_states(await run.snapshot()) for run in runs]
                if keep_states:
                    out.states[n] = frozen
                for plan in planned:
                    out.interview_calls += await _interview(out, [(run, [data]) for run, data in zip(runs, frozen)],
                                                            n, plan.survey, llm, plan.sample, plan.agents)
            if on_round is not None:
                on_round(n, row)
            if folded is not None and folded.report.pause is not None and n < c.rounds:
                out.status = "paused"  # the guard was told to pause rather than raise a share
                out.reason = folded.report.pause
                break
    finally:
        for run in runs:
            run.stop()
    out.outcomes = rows.outcomes()
    out.audits = _sorted(rows.audits, ("round", "agent_id")) if rows.audits["agent_id"] else {}
    out.population = combined_rows(deltas, run_id) if deltas else {}
    if runs and runs[0].mailroom is not None:
        out.posts = _sorted(rows.posts, ("round", "agent_id"))
    if resolved.simulation.edge_kinds:  # in the order they apply: by round, agent, then as listed
        out.edges = _sorted(rows.edges, ("round", "follower"))
    if tables.shown_items is not None:
        out.shown = _sorted(rows.shown, ("round", "agent_id"))
    if tables.acts is not None:
        out.acts = _sorted(rows.acts, ("round", "group_id", "seq"))
        out.transcripts = _sorted(rows.lines, ("round", "group_id", "seq"))
    return out


async def _interview(out: LocalResult, shares: list[tuple[HostedRun, list[bytes]]], after_round: int,
                     survey: interview.Survey, llm: LLMFactory, sample: float | None,
                     agents: list[int] | None) -> int:
    """Each share's chosen agents answer `survey` from their state after `after_round` (frozen
    as checkpoints hold it; each answers on a copy, the run's agents are not touched); their
    rows go to `out.interviews`. Returns the calls made."""
    c = out.config
    calls = 0
    for run, frozen in shares:
        port = llm(run, after_round)
        rows = interview.Rows()
        people = interview.Respondents.frozen(*frozen)
        await interview.ask(run.sim, people.chosen(seed=c.seed, survey_id=survey.id, sample=sample, agents=agents,
                                                   last_use=True),
                            survey, port, rows)
        made = getattr(port, "calls", 0)
        calls += made
        out.interview_usage[after_round, survey.id] = out.interview_usage.get((after_round, survey.id), 0) + made
        m = rows.n
        table = out.interviews or {k: [] for k in interview.TABLE_KEYS}
        table["run_id"].extend([out.run_id] * m)
        table["after_round"].extend([after_round] * m)
        table["survey"].extend([survey.id] * m)
        for key, values in rows.columns.items():
            table[key].extend(values)
        out.interviews = table
    out.interviews = _sorted(out.interviews, ("after_round", "survey", "agent_id")) if out.interviews else {}
    return calls


async def interview_local(result: LocalResult, after_round: int, survey: interview.Survey, *,
                          sample: float | None = None, agents: list[int] | None = None,
                          llm: LLMFactory = dummy_llm) -> dict[str, list]:
    """Ask `survey` after the fact, of a local run's agents (all, a seeded `sample` share, or
    `agents`) as they were after `after_round`: from the state the run kept, playing no round.
    Returns the rows (table `interviews`'s columns); bad input raises ValueError naming it."""
    c = result.config
    if not 1 <= after_round <= c.rounds:
        raise ValueError(f"after_round: {after_round} is not one of the run's rounds (1..{c.rounds})")
    if after_round not in result.states:
        raise ValueError(f"after_round: the run kept no state after round {after_round} "
                         "(it was played with keep_states=False, or stopped before it)")
    if sample is not None and not 0 < sample <= 1:
        raise ValueError(f"sample: {sample:g} is outside (0, 1]")
    ids = max([c.agents, *(a + 1 for a in result.population.get("agent_id", ()))])  # newcomers' ids too
    bad = [a for a in agents or () if not 0 <= a < ids]
    if bad:
        raise ValueError(f"agents: agent {bad[0]} is not in the run (ids are 0..{ids - 1})")
    resolved = result.resolved if result.resolved is not None else resolve(c)
    sim = resolved.instance(result.run_id, result.cast)
    # no agents are built for the run: each respondent answers from a copy made from its state
    share = HostedRun(result.run_id, resolved, sim, type(sim).Env(sim), [], RoundPlayer(sim, []))
    out = LocalResult(result.run_id, c, result.tables)
    result.interview_calls += await _interview(out, [(share, result.states[after_round])], after_round, survey, llm,
                                               sample, agents)
    return out.interviews or {k: [] for k in interview.TABLE_KEYS}


def _profile_rows(table: dict[str, list], run_id: str, round_: int, costs: list[RoundCost], decision) -> None:
    """The round's rows of `round_profile`: this process's (its shares summed: one process is one
    host) and the environment's."""
    host = {"role": "host", "host_id": "local", "agents": sum(c.agents for c in costs),
            "wall_s": sum(c.wall_s for c in costs), "view_s": sum(c.view_s for c in costs),
            "turn_s": sum(c.turn_s for c in costs), "merge_s": sum(c.merge_s for c in costs),
            "model_wait_s": sum(c.model_wait_s for c in costs), "view_bytes": sum(c.view_bytes for c in costs),
            "view_max_bytes": max((c.view_max_bytes for c in costs), default=0),
            "observation_bytes": max((c.observation_bytes for c in costs), default=0),
            "held": sum(c.held for c in costs), "note": next((c.note for c in costs if c.note), None)}
    d = decision.profile
    env = {"role": "environment", "host_id": "environment", "merge_s": d.merge_s, "decide_s": d.decide_s,
           "observation_bytes": d.observation_bytes, "note": d.note} if d is not None else None
    for row in (host, env):
        if row is None:
            continue
        full = {"run_id": run_id, "round": round_, "epoch": 0, **row}
        for key in PROFILE_KEYS:
            table.setdefault(key, []).append(full.get(key))


def _sorted(columns: dict[str, list], by: tuple[str, ...]) -> dict[str, list]:
    order = sorted(range(len(columns[by[0]])), key=lambda i: tuple(columns[k][i] for k in by))
    return {k: [v[i] for i in order] for k, v in columns.items()}


class _Rows:
    """A local run's rows as the recorder would store them, from the engine's batches."""

    def __init__(self, run_id: str, tables: SimulationTables) -> None:
        self.run_id = run_id
        group_id = ("group_id", *(f"{level}_id" for level in tables.levels)) if tables.grouped else ()
        self.prototypes = tables.prototypes
        self.columns: dict[str, list] = {k: [] for k in ("run_id", "round", "agent_id", *group_id,
                                                         *(col.name for col in tables.outcome_columns),
                                                         "valid", "raw", "latency_ms", "error",
                                                         *(name for name, _ in PROTOTYPE_COLUMNS if self.prototypes))}
        self.names = [col.name for col in tables.outcome_columns]
        self.audits: dict[str, list] = {k: [] for k in ("run_id", "round", "agent_id", "prototype",
                                                        *self.names, "valid", "raw", "latency_ms", "error")}
        self.posts: dict[str, list] = {k: [] for k in ("run_id", "round", "agent_id", "text", "fields", "heard",
                                                       "heard_digest")}
        self.acts: dict[str, list] = {k: [] for k in ("run_id", "round", "group_id", "seq", "agent_id", "phase",
                                                      *(col.name for col in tables.act_columns),
                                                      "valid", "raw", "latency_ms", "error")}
        self.lines: dict[str, list] = {k: [] for k in ("run_id", "round", "group_id", "seq", "speaker", "text",
                                                       "fields")}
        self.edges: dict[str, list] = {k: [] for k in ("run_id", "round", "follower", "author", "kind", "op")}
        self.shown: dict[str, list] = {k: [] for k in ("run_id", "round", "agent_id", "items", "ranks")}

    def mark(self) -> int:
        return len(self.columns["agent_id"])

    def add(self, n: int, batch: OutcomeRows) -> None:
        if batch.audit:
            self._audit(n, batch)
            return
        cols = self.columns
        k = len(batch.agent_ids)
        if self.prototypes:  # a representative's own answer
            cols["source"].extend(["llm"] * k)
            cols["prototype"].extend(batch.prototypes or [None] * k)
            cols["drawn_from"].extend([None] * k)
        cols["run_id"].extend([self.run_id] * k)
        cols["round"].extend([n] * k)
        cols["agent_id"].extend(batch.agent_ids)
        if batch.group_ids is not None:
            cols["group_id"].extend(batch.group_ids)
        for level, ids in (batch.levels or {}).items():
            cols[f"{level}_id"].extend(ids)
        for name, values in batch.columns.items():
            cols[name].extend(values)
        cols["valid"].extend(batch.valid)
        cols["raw"].extend(batch.raws)
        cols["latency_ms"].extend(batch.latency_ms)
        cols["error"].extend(batch.errors)
        if batch.posts is not None:
            posts = self.posts
            posts["run_id"].extend([self.run_id] * k)
            posts["round"].extend([n] * k)
            posts["agent_id"].extend(batch.agent_ids)
            for key in ("text", "fields", "heard", "heard_digest"):
                posts[key].extend(batch.posts["texts" if key == "text" else key])
        for table, part in ((self.acts, batch.acts), (self.lines, batch.lines), (self.edges, batch.edits),
                            (self.shown, batch.shown)):
            if part:
                m = len(next(iter(part.values())))
                table["run_id"].extend([self.run_id] * m)
                table["round"].extend([n] * m)
                for key, values in part.items():
                    table[key].extend(values)

    def _audit(self, n: int, batch: OutcomeRows) -> None:
        a = self.audits
        k = len(batch.agent_ids)
        a["run_id"].extend([self.run_id] * k)
        a["round"].extend([n] * k)
        a["agent_id"].extend(batch.agent_ids)
        a["prototype"].extend(batch.prototypes or [None] * k)
        for name in self.names:
            a[name].extend(batch.columns[name])
        a["valid"].extend(batch.valid)
        a["raw"].extend(batch.raws)
        a["latency_ms"].extend(batch.latency_ms)
        a["error"].extend(batch.errors)

    def draw(self, n: int, start: int, plan: prototypes.Plan) -> None:
        """Round `n`'s drawn rows (every agent that did not play copies the row of the representative
        it drew: populace.population.prototypes.sources), after its representatives' rows from `start`."""
        cols = self.columns
        m = plan.members
        reps = {aid: start + i for i, aid in enumerate(cols["agent_id"][start:])}
        is_rep = np.zeros(m.agents, dtype=bool)
        valid = np.zeros(m.agents, dtype=bool)
        for aid, i in reps.items():
            is_rep[aid] = True
            valid[aid] = cols["valid"][i]
        src = pure.sources(m, is_rep, valid, plan.seed, n)
        copied = [k for k in cols if k not in ("run_id", "round", "agent_id", "latency_ms", "error", "source",
                                               "prototype", "drawn_from")]
        for aid in np.flatnonzero(~is_rep).tolist():
            s = int(src[aid])
            label = m.labels[int(m.of[aid])]
            cols["run_id"].append(self.run_id)
            cols["round"].append(n)
            cols["agent_id"].append(aid)
            if s >= 0:
                i = reps[s]
                for k in copied:
                    cols[k].append(cols[k][i])
                cols["error"].append(None)
            else:
                for k in copied:
                    cols[k].append(None)
                cols["valid"][-1], cols["raw"][-1] = False, ""
                cols["error"].append(f"prototype: no representative of {label} gave a valid answer in round {n}")
            cols["latency_ms"].append(0.0)
            cols["source"].append("prototype")
            cols["prototype"].append(label)
            cols["drawn_from"].append(s if s >= 0 else None)

    def outcomes(self) -> dict[str, list]:
        return _sorted(self.columns, ("round", "agent_id"))


def _exchange(runs: list[HostedRun], placement: dict[str, list[tuple[int, int]]], round_: int) -> None:
    """After a round, the shares' mail to each other, as the agent-hosts send it over NATS."""
    rooms = [(key, run.mailroom) for key, run in zip(placement, runs, strict=True) if run.mailroom is not None]
    for key, room in rooms:
        room.played.add(round_)
        for m in room.outgoing(round_, placement, me=[key]):
            dest = dict(rooms)[m.to]
            dest.receive(round_, key, m.shard, m.shards, (m.authors, m.texts, m.fields))
    for key, room in rooms:
        sources = {k: placement[k] for k, _ in rooms if k != key}
        if room.missing(round_, sources):
            raise RuntimeError(f"round {round_}: mail to {key} is missing")  # pragma: no cover - a bug
        room.deliver(round_, sources)
        room.forget_before(round_)
