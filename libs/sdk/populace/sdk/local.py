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

from populace.core.contracts import HostInfo, RunConfig, SimulationTables
from populace.core.placement import place
from populace.graph.csr import Graph
from populace.population.cast import Cast
from populace.sdk.hosting import HostedRun, host_run
from populace.sdk.llm import LLM
from populace.sdk.mock import DummyLLM
from populace.sdk.play import OutcomeBatch, OutcomeSink, RoundShare
from populace.sdk.registry import Resolved, resolve

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
    status: str = "completed"


def dummy_llm(run: HostedRun, round_: int) -> LLM:
    model = run.resolved.config.model
    if model.backend != "dummy":
        raise ValueError(f"model.backend: a local run answers on the dummy model (or an LLM you pass); "
                         f"{model.backend!r} needs the fleet (populace run / simulate(nats=…))")
    return DummyLLM(seed=model.seed, round_=round_, system=run.sim.system_prompt(),
                    schema=run.sim.answer_schema())


def _shares(resolved: Resolved, hosts: int) -> list[list[tuple[int, int]]]:
    c = resolved.config
    if hosts <= 1:
        return [[(0, c.agents)]]
    fake = [HostInfo(host_id=f"host-{i:04d}", capacity=c.agents, pid=0, started_at=0, heartbeat_at=0)
            for i in range(hosts)]
    unit = resolved.instance().group_size() or 1 if resolved.simulation.GroupEnv is not None else 1
    return list(place(c.agents, fake, unit=unit).values())


def local_graph(config: RunConfig, cast: Cast | None) -> Graph:
    """A run's graph built here from its `graph:` section, over the agents as `cast` numbers
    them (no renumbering: the fleet's client renumbers and hands its graph over as `graph=`)."""
    from populace.graph.prepare import prepare_graph

    assert config.graph is not None
    records = [{"profile": p.profile} for p in cast.personas] if cast is not None else None
    return prepare_graph(config.graph.spec, config.agents, seed=config.seed, placement="ids", records=records).graph


async def run_local(config: RunConfig | Resolved, *, run_id: str = "local", cast: Cast | None = None,
                    hosts: int = 1, llm: LLMFactory = dummy_llm, one_per_process: bool = False,
                    on_round: Callable[[int, dict], None] | None = None, graph: Graph | None = None) -> LocalResult:
    """`graph`: the run's graph (a run with a `graph:`; default: built from the section)."""
    resolved = config if isinstance(config, Resolved) else resolve(config)
    c = resolved.config
    tables = resolved.tables()
    if c.graph is not None and graph is None:
        graph = local_graph(c, cast)
    whole = _shares(resolved, hosts)
    runs = [host_run(resolved, run_id, ranges, cast, one_per_process=one_per_process, freeze=False, graph=graph)
            for ranges in whole]
    env = runs[0].env
    state = env.start()
    observation = None
    out = LocalResult(run_id, c, tables)
    group_id = ("group_id",) if tables.grouped else ()
    cols_out: dict[str, list] = {k: [] for k in ("run_id", "round", "agent_id", *group_id,
                                                 *(col.name for col in tables.outcome_columns),
                                                 "valid", "raw", "latency_ms", "error")}
    placement = {f"local-{i}@0": ranges for i, ranges in enumerate(whole)}  # share keys, as on the fleet
    posts: dict[str, list] = {k: [] for k in ("run_id", "round", "agent_id", "text", "fields", "heard",
                                              "heard_digest")}
    try:
        for n in range(1, c.rounds + 1):
            shares: list[RoundShare] = []
            calls = 0
            for run in runs:
                obs = run.observation(n, observation)
                record_posts = None
                room = run.mailroom
                if room is not None:
                    reading = room.reading(n)
                    obs._mailbox = reading
                    record_posts = functools.partial(room.record, n, reading)

                def emit(batch: OutcomeBatch, n: int = n) -> None:
                    k = len(batch.agent_ids)
                    cols_out["run_id"].extend([run_id] * k)
                    cols_out["round"].extend([n] * k)
                    cols_out["agent_id"].extend(batch.agent_ids)
                    if batch.group_ids is not None:
                        cols_out["group_id"].extend(batch.group_ids)
                    for name, values in batch.columns.items():
                        cols_out[name].extend(values)
                    cols_out["valid"].extend(batch.valid)
                    cols_out["raw"].extend(batch.raws)
                    cols_out["latency_ms"].extend(batch.latency_ms)
                    cols_out["error"].extend(batch.errors)
                    if batch.posts is not None:
                        posts["run_id"].extend([run_id] * k)
                        posts["round"].extend([n] * k)
                        posts["agent_id"].extend(batch.agent_ids)
                        for key in ("text", "fields", "heard", "heard_digest"):
                            posts[key].extend(batch.posts["texts" if key == "text" else key])

                sink = OutcomeSink(resolved.simulation, run.env, emit=emit, grouped=tables.grouped,
                                   posts=record_posts)
                port = llm(run, n)
                await run.player.play(obs, port, sink)
                calls += getattr(port, "calls", 0)  # the in-process ports count their calls
                shares.append(sink.close())
            _exchange(runs, placement, n)
            total = env.merge([s.partial for s in shares if s.partial is not None])
            state, summary = env.decide(state, n, total)
            observation = env.observe(state, n + 1).model_dump(mode="json")
            # the platform's round columns, as the recorder writes them (no tokens: no model runs here)
            row = {"run_id": run_id, "round": n, "n": sum(s.n for s in shares),
                   "n_valid": sum(s.n_valid for s in shares),
                   "llm_calls": calls, "prompt_tokens": 0, "completion_tokens": 0, "infra_retries": 0,
                   **summary.model_dump(mode="json"), "closed_at": time.time()}
            for key, value in row.items():
                out.rounds.setdefault(key, []).append(value)
            if on_round is not None:
                on_round(n, row)
    finally:
        for run in runs:
            run.stop()
    order = sorted(range(len(cols_out["agent_id"])), key=lambda i: (cols_out["round"][i], cols_out["agent_id"][i]))
    out.outcomes = {k: [v[i] for i in order] for k, v in cols_out.items()}
    if runs and runs[0].mailroom is not None:
        order = sorted(range(len(posts["agent_id"])), key=lambda i: (posts["round"][i], posts["agent_id"][i]))
        out.posts = {k: [v[i] for i in order] for k, v in posts.items()}
    return out


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
