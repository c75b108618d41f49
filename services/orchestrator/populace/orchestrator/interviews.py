"""Post-hoc interviews (`ctl.run.interview`): the orchestrator checks a request against the run's
state and places it — each range of the round's checkpoint on one of the agent-hosts up, which
answers from it (populace.agent_host). Pure; the app reads the state and publishes.

Why the hosts: they already may read checkpoints and call the gateway, and they hold the
simulations' code; a client given those grants could spend LLM work outside every run's budget
and read every agent's state. Nothing is asked before the request is checked: a round with no
checkpoint (not played yet, beyond the run's last, pruned, unverifiable), an agent not in the
run, a survey id the scenario plans are each refused, naming the field."""

from __future__ import annotations

import numpy as np

from populace.core.contracts import HostInfo, InterviewRequest, RunState
from populace.core.interviews import chosen
from populace.orchestrator.workflow import completed


def never_played(state: RunState, round_: int) -> str | None:
    """Why a fork has no round `round_` of its own to be asked after (None: it played it): it
    starts from its parent's state after its fork point, so that round and those before are
    its parent's."""
    fork = state.restore
    if fork is None or fork.run_id == state.run_id or round_ > fork.round:
        return None
    return (f"this fork never played round {round_}; its parent {fork.run_id} did (the fork starts from its "
            f"state after round {fork.round}: `populace interview {fork.run_id} --after-round {round_}`)")


def refusal(state: RunState | None, req: InterviewRequest) -> str | None:
    """Why `req` cannot be asked of the run in `state` (None: it can, given its checkpoint)."""
    if state is None:
        return f"run_id: run {req.run_id} is not known here"
    c = state.config
    if req.after_round > c.rounds:
        return f"after_round: round {req.after_round} is beyond the run's last ({c.rounds})"
    if why := never_played(state, req.after_round):
        return f"after_round: {why}"
    done = completed(state)
    if req.after_round > done:
        return (f"after_round: run {req.run_id} has completed {done} round(s), so round {req.after_round} has no "
                "checkpoint")
    bad = [a for a in req.agents or () if a >= c.agents]
    if bad:
        return f"agents: agent {bad[0]} is not in the run (ids are 0..{c.agents - 1})"
    if any(plan.id == req.survey.id for plan in c.interviews):
        return f"survey.id: {req.survey.id!r} is a survey the scenario plans; give the interview another id"
    return None


def split(ranges: list[tuple[int, int]], hosts: list[HostInfo]) -> dict[str, list[tuple[int, int]]]:
    """The checkpoint's ranges over the hosts, each whole (a host reads an object once), the
    largest first to the host with the fewest agents so far."""
    if not hosts:
        return {}
    load = {h.host_id: 0 for h in sorted(hosts, key=lambda h: h.host_id)}
    out: dict[str, list[tuple[int, int]]] = {}
    for first, count in sorted(ranges, key=lambda r: (-r[1], r[0])):
        host = min(load, key=lambda h: (load[h], h))
        load[host] += count
        out.setdefault(host, []).append((first, count))
    return {h: sorted(rs) for h, rs in out.items()}


def expected(req: InterviewRequest, agents: int, seed: int) -> int:
    """How many answers the request will have: its respondents × its questions."""
    questions = len(req.survey.questions)
    if req.agents is not None:
        return len(set(req.agents)) * questions
    if req.sample is None:
        return agents * questions
    step, who = 1 << 20, 0
    for lo in range(0, agents, step):
        ids = np.arange(lo, min(agents, lo + step), dtype=np.int64)
        who += int(chosen(ids, seed=seed, survey_id=req.survey.id, sample=req.sample).sum())
    return who * questions
