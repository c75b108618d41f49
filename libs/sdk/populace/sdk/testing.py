"""Checks for a simulation's own tests.

    from populace.sdk.testing import check_resume

    def test_a_resumed_run_equals_the_uninterrupted_one():
        check_resume(MySimulation, {"agents": 30, "rounds": 3, "game": {...}})

`check_resume` plays the scenario in this process, then plays it again stopping after round k:
every agent is rebuilt from its class and what its checkpoint keeps (`state_fields`, through
JSON), the group environment is built again, the environment's state comes back through JSON
— what `populace resume`, `populace fork` and a re-placed host do — and the run goes on. Every
outcome and round row must equal the uninterrupted run's. Before that, every agent is checked
between rounds for attributes a checkpoint would lose (populace.sdk.statecheck). A failure
names the attribute, or the first rows that differ.

The model answers from the prompt (`PromptSeededLLM`: a seeded answer that satisfies the answer
schema, drawn from a digest of the whole prompt), so an agent that lost its memory asks
something else and answers differently; the dummy model's answers ignore the prompt and would
hide it.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np
from pydantic_core import from_json, to_json

from populace.core import synth
from populace.core.contracts import RunConfig
from populace.sdk.agent import Agent
from populace.sdk.hosting import UNMADE, HostedRun
from populace.sdk.llm import LLM
from populace.sdk.local import LocalResult, run_local
from populace.sdk.population import FRESH, Population
from populace.sdk.registry import Resolved, resolve
from populace.sdk.simulation import Simulation
from populace.sdk.statecheck import StateCheck, checkpointed, stored
from populace.sdk.statejson import from_wire, to_wire

LLMFactory = Callable[[HostedRun, int], LLM]
# Columns that measure wall time, not what was played.
CLOCK_COLUMNS = ("latency_ms", "closed_at")


class ResumeMismatch(AssertionError):
    """A run resumed after a round differs from the uninterrupted run."""


class PromptSeededLLM:
    """Answers that satisfy the answer schema, seeded by (model seed, round, agent, prompt):
    any change in what an agent asks changes its answer."""

    def __init__(self, *, seed: int, round_: int, schema: dict | None = None) -> None:
        self.seed, self.round, self.schema = seed, round_, schema
        self.calls = 0

    async def ask(self, prompt: str, *, key: int, prefix_chars: int = 0, system: str | None = None,
                  schema: dict | None = None) -> str:
        self.calls += 1
        digest = int.from_bytes(hashlib.blake2b(f"{system or ''}\x00{prompt}".encode(), digest_size=8).digest())
        return synth.answer(schema or self.schema, (self.seed ^ digest) & (2**63 - 1), self.round, key)

    def flush(self) -> None:
        pass


def prompt_seeded(run: HostedRun, round_: int) -> LLM:
    return PromptSeededLLM(seed=run.resolved.config.model.seed, round_=round_, schema=run.sim.request_schema())


def _resolved(simulation: type[Simulation] | str, scenario: dict | RunConfig | str | Path | None) -> Resolved:
    if isinstance(scenario, (str, Path)):
        from populace.core.scenario import load_scenario_data

        scenario, _ = load_scenario_data(Path(scenario))
    data = scenario.model_dump(mode="json", exclude_unset=True) if isinstance(scenario, RunConfig) else \
        dict(scenario or {})
    if isinstance(simulation, str):
        data["simulation"] = simulation
        return resolve(RunConfig.model_validate(data))
    data["simulation"] = simulation.name  # the class itself plays, installed or not
    return resolve(RunConfig.model_validate(data), simulation)


class _ResumeAfter:
    """The port factory of a run that is stopped after round `after` and resumed: before round
    `after + 1` each share's agents (and its group env) are built again from their checkpoint,
    with a simulation instance of their own, as a new agent-host process builds them."""

    def __init__(self, factory: LLMFactory, after: int) -> None:
        self.factory, self.after = factory, after
        self.patched = False

    def __call__(self, run: HostedRun, round_: int) -> LLM:
        if not self.patched:  # the first share's env decides the run's rounds (run_local)
            self.patched = True
            self._roundtrip_state(run)
        if round_ == self.after + 1:
            sim = run.resolved.instance(run.run_id, run.sim.cast)
            if run.population is not None:  # a population that changed: who is alive comes back from its bytes
                self._restore_population(run, sim)
            for i, agent in enumerate(run.agents):
                if not isinstance(agent, Agent):
                    continue  # departed, or a newcomer not made yet (made as its class makes it)
                fresh = type(agent)(agent.id, agent.persona, sim)
                fresh.restore(checkpointed(agent))
                run.agents[i] = fresh  # the round player holds this very list
            player = run.player
            player.sim = sim
            player.group_envs = [type(g)(sim) for g in player.group_envs]
            book = run.sim.edges
            if book is not None:  # the agents' edges, as their checkpoints keep them (JSON), restored
                # into the host's book in place, as a host restores them (its mailroom reads that book)
                saved = {agent.id: json.loads(json.dumps(book.state(agent.id))) for agent in run.agents}
                for aid, edits in saved.items():
                    book.restore(aid, edits)
                sim.edges = book
        return self.factory(run, round_)

    def _restore_population(self, run: HostedRun, sim: Simulation) -> None:
        """As a host spawned after round `after` makes its share: every agent of its ranges made
        anew, the departed let go and the newcomers of that round given their birth state by
        the population's bytes, the others restored from their checkpointed state."""
        states: dict[int, dict] = {int(aid): {FRESH: True} for aid, a in zip(run.ids.tolist(), run.agents)
                                   if a is UNMADE}  # as a checkpoint keeps a newcomer not made yet
        states.update({a.id: stored(a) for a in run.made_agents()})  # restore decodes them
        personas = run.cast.personas if run.cast is not None else None
        make = type(sim).Agent
        run.agents[:] = [make(aid, personas[aid] if personas is not None and aid < len(personas) else None, sim)
                         for aid in run.ids.tolist()]
        run.living, run.unmade, run._unmade = None, 0, np.zeros(0, dtype=bool)
        population = Population.from_bytes(run.population.to_bytes())  # type: ignore[union-attr]
        run.population = None
        run.restore(states, population, self.after)

    def _roundtrip_state(self, run: HostedRun) -> None:
        """The environment's state after round `after` as its checkpoint gives it back (JSON)."""
        env, after = run.env, self.after
        decide = env.decide

        def decide_then_checkpoint(state, round_, total, *world):
            state, *rest = decide(state, round_, total, *world)  # with a World: (state, summary, world)
            if round_ == after:
                state = from_wire(type(state), from_json(to_json(to_wire(state))))
            return (state, *rest)

        env.decide = decide_then_checkpoint  # type: ignore[method-assign]


def _rows(columns: dict[str, list]) -> list[dict]:
    keys = [k for k in columns if k not in CLOCK_COLUMNS]
    return [dict(zip(keys, values)) for values in zip(*(columns[k] for k in keys))]


def _first_difference(a: list[dict], b: list[dict]) -> tuple[int, str]:
    """(how many rows differ, the first difference in words)."""
    differ = [(x, y) for x, y in zip(a, b) if x != y]
    if len(a) != len(b):
        return max(len(differ), abs(len(a) - len(b))), f"{len(a)} rows uninterrupted, {len(b)} resumed"
    if not differ:
        return 0, ""
    x, y = differ[0]
    where = ", ".join(f"{label} {x[k]}" for k, label in (("round", "round"), ("agent_id", "agent")) if k in x)
    changed = "; ".join(f"{k}: {x[k]!r} → {y.get(k)!r}" for k in x if x[k] != y.get(k))
    return len(differ), f"{where}: {changed}"


def compare(uninterrupted: LocalResult, resumed: LocalResult, after: int) -> None:
    """Raise ResumeMismatch naming how many outcome, round, post and shown rows differ, and the first of each."""
    problems = []
    for table, a, b in (("outcome", uninterrupted.outcomes, resumed.outcomes),
                        ("round", uninterrupted.rounds, resumed.rounds),
                        ("post", uninterrupted.posts, resumed.posts),
                        ("shown", uninterrupted.shown, resumed.shown),
                        ("population", uninterrupted.population, resumed.population)):
        rows_a, rows_b = _rows(a), _rows(b)
        n, first = _first_difference(rows_a, rows_b)
        if n:
            problems.append(f"{n} of {len(rows_a)} {table} rows differ (first: {first})")
    if problems:
        cls = uninterrupted.config.simulation
        raise ResumeMismatch(
            f"simulation {cls!r} resumed after round {after} is not the uninterrupted run: {'; '.join(problems)}. "
            "A resume keeps each agent's state_fields (memory always), the environment's State and the "
            "observation; anything else a turn, a group env or the environment keeps is lost.")


async def check_resume_async(simulation: type[Simulation] | str, scenario: dict | RunConfig | str | Path | None = None,
                             *, after: int | Iterable[int] | None = None, hosts: int = 1,
                             llm: LLMFactory | None = None) -> None:
    """`check_resume` for code already inside an event loop (a notebook, an async test)."""
    resolved = _resolved(simulation, scenario)
    rounds = resolved.config.rounds
    if rounds < 2:
        raise ValueError(f"check_resume: rounds: needs 2 or more rounds to resume between (got {rounds})")
    afters = list(range(1, rounds)) if after is None else [after] if isinstance(after, int) else list(after)
    for k in afters:
        if not 1 <= k < rounds:
            raise ValueError(f"check_resume: after: {k} is not a round a run of {rounds} rounds can resume after")
    factory = llm or prompt_seeded
    check = StateCheck(factory, size=None)  # every agent, between every two rounds
    whole = await run_local(resolved, llm=check, hosts=hosts)
    check.finish()
    for k in afters:
        resumed = await run_local(resolved, llm=_ResumeAfter(factory, k), hosts=hosts)
        compare(whole, resumed, k)


def check_resume(simulation: type[Simulation] | str, scenario: dict | RunConfig | str | Path | None = None,
                 *, after: int | Iterable[int] | None = None, hosts: int = 1, llm: LLMFactory | None = None) -> None:
    """Play `scenario` (scenario keys as a dict, a RunConfig or a YAML file) of `simulation` (its
    class, or a name or import path) uninterrupted, then resumed after each round in `after`
    (default: every round but the last); raise UnsavedState or ResumeMismatch unless every row
    is the same. `llm`: the port per (share, round) (default: PromptSeededLLM)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(check_resume_async(simulation, scenario, after=after, hosts=hosts, llm=llm))
    raise RuntimeError("check_resume: an event loop is running here; use `await check_resume_async(...)`")


__all__ = ["PromptSeededLLM", "ResumeMismatch", "check_resume", "check_resume_async", "compare", "prompt_seeded"]
