"""A whole run in this process, without NATS or services: the same agents, round player,
reduce, merge and decide as on the fleet, with the LLM port answering in process.

For unit tests of a simulation (with a `ScriptedLLM`) and for notebooks on the dummy model,
whose seeded answers equal the gateway's, so a local run reproduces a fleet run exactly.
`hosts` splits the agents as the orchestrator would place them on that many agent-hosts.

    result = await run_local(RunConfig(simulation="public-goods", agents=20, rounds=3))
    result.rounds["mean_contribution"]
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from populace.core.contracts import HostInfo, RunConfig, SimulationTables
from populace.core.placement import place
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


async def run_local(config: RunConfig | Resolved, *, run_id: str = "local", cast: Cast | None = None,
                    hosts: int = 1, llm: LLMFactory = dummy_llm, one_per_process: bool = False,
                    on_round: Callable[[int, dict], None] | None = None) -> LocalResult:
    resolved = config if isinstance(config, Resolved) else resolve(config)
    c = resolved.config
    tables = resolved.tables()
    runs = [host_run(resolved, run_id, ranges, cast, one_per_process=one_per_process, freeze=False)
            for ranges in _shares(resolved, hosts)]
    env = runs[0].env
    state = env.start()
    observation = None
    out = LocalResult(run_id, c, tables)
    group_id = ("group_id",) if tables.grouped else ()
    cols_out: dict[str, list] = {k: [] for k in ("run_id", "round", "agent_id", *group_id,
                                                 *(col.name for col in tables.outcome_columns),
                                                 "valid", "raw", "latency_ms", "error")}
    try:
        for n in range(1, c.rounds + 1):
            shares: list[RoundShare] = []
            calls = 0
            for run in runs:
                obs = run.observation(n, observation)

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

                sink = OutcomeSink(resolved.simulation, run.env, emit=emit, grouped=tables.grouped)
                port = llm(run, n)
                await run.player.play(obs, port, sink)
                calls += getattr(port, "calls", 0)  # the in-process ports count their calls
                shares.append(sink.close())
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
    return out
