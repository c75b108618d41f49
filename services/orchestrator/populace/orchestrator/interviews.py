"""Post-hoc interviews (`ctl.run.interview`): the orchestrator checks a request against the run's
state and places it — each range of the round's checkpoint on one of the agent-hosts up, which
answers from it (populace.agent_host). Pure; the app reads the state and publishes.

Why the hosts: they already may read checkpoints and call the gateway, and they hold the
simulations' code; a client given those grants could spend LLM work outside every run's budget
and read every agent's state. Nothing is asked before the request is checked: a round with no
checkpoint (not played yet, beyond the run's last, pruned, unverifiable), an agent not in the
run, a survey id the scenario plans are each refused, naming the field."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from populace.core import subjects
from populace.core.contracts import AskedShare, Asking, HostInfo, InterviewRequest, RunFault, RunState
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
    ids = state.population.size if state.population is not None else c.agents  # newcomers' ids too
    bad = [a for a in req.agents or () if a >= ids]
    if bad:
        return f"agents: agent {bad[0]} is not in the run (ids are 0..{ids - 1})"
    if any(plan.id == req.survey.id for plan in c.interviews):
        return f"survey.id: {req.survey.id!r} is a survey the scenario plans; give the interview another id"
    return None


def split(ranges: list[tuple[int, int]], hosts: list[HostInfo],
          held: dict[str, int] | None = None) -> dict[str, list[tuple[int, int]]]:
    """The checkpoint's ranges over the hosts, each whole (a host reads an object once), the
    largest first to the host with the fewest agents so far (`held`: agents of the interview a
    host answers already)."""
    if not hosts:
        return {}
    load = {h.host_id: (held or {}).get(h.host_id, 0) for h in sorted(hosts, key=lambda h: h.host_id)}
    out: dict[str, list[tuple[int, int]]] = {}
    for first, count in sorted(ranges, key=lambda r: (-r[1], r[0])):
        host = min(load, key=lambda h: (load[h], h))
        load[host] += count
        out.setdefault(host, []).append((first, count))
    return {h: sorted(rs) for h, rs in out.items()}


def absent(req: InterviewRequest, played: np.ndarray | None) -> str | None:
    """Why an agent the request names cannot answer (None: each can): in a run whose population
    changed (`played`: who played the round), one that had departed before it or came after it."""
    if played is None or req.agents is None:
        return None
    missing = [a for a in req.agents if a >= played.size or not played[a]]
    if missing:
        return (f"agents: agent {missing[0]} did not play round {req.after_round} (it departed before it, or "
                "came after it): it cannot be asked after it")
    return None


def expected(req: InterviewRequest, agents: int, seed: int, played: np.ndarray | None = None) -> int:
    """How many answers the request will have: its respondents × its questions (`played`: in a
    run whose population changed, who played the round, the only ones who answer after it)."""
    questions = len(req.survey.questions)
    if req.agents is not None:
        return len(set(req.agents)) * questions
    if played is not None:
        living = np.flatnonzero(played)
        if req.sample is None:
            return int(living.size) * questions
        return int(chosen(living, seed=seed, survey_id=req.survey.id, sample=req.sample).sum()) * questions
    if req.sample is None:
        return agents * questions
    step, who = 1 << 20, 0
    for lo in range(0, agents, step):
        ids = np.arange(lo, min(agents, lo + step), dtype=np.int64)
        who += int(chosen(ids, seed=seed, survey_id=req.survey.id, sample=req.sample).sum())
    return who * questions


@dataclass(frozen=True)
class OrderAgain:
    """Order `hosts` (host id -> ranges) to answer a lost host's part of `request`, as its
    `placement`-th placement; `lost` says what was lost, `reason` also where it went."""

    request: str
    hosts: dict[str, list[tuple[int, int]]]
    placement: int
    lost: str
    reason: str


@dataclass(frozen=True)
class InterviewLost:
    """`request` cannot be answered whole: say so (InterviewPlaced.error); it is watched no more."""

    request: str
    after_round: int
    expected: int  # what it would have had (a refusal says 0: nothing was asked)
    reason: str


def lost_parts(asking: Asking, hosts: list[HostInfo], live: set[str]) -> list[AskedShare]:
    """Its hosts that stopped heartbeating or restarted since they were ordered (a new process
    has no order: it never reads one sent before it started)."""
    started = {h.host_id: h.started_at for h in hosts}
    return [sh for sh in asking.shares if sh.host_id not in live
            or (sh.incarnation is not None and started.get(sh.host_id, sh.incarnation) != sh.incarnation)]


def on_beat(state: RunState, hosts: list[HostInfo], live: set[str], recorded: set[str],
            silent_s: float) -> tuple[RunState, list[OrderAgain | InterviewLost]]:
    """One watch beat over the run's post-hoc interviews in flight: those the recorder
    announced (`recorded`) are watched no more; a lost host's part is ordered from the hosts up
    (a restarted one counts as up: it has room and no order), each answer the lost host already
    sent stays (the recorder keeps the first answer of each agent and question); with no host
    up, the interview fails, saying why."""
    actions: list[OrderAgain | InterviewLost] = []
    kept: list[Asking] = []
    up = [h for h in hosts if h.host_id in live]
    started = {h.host_id: h.started_at for h in up}
    for asking in state.asking:
        if asking.request in recorded:
            continue
        lost = lost_parts(asking, hosts, live)
        if not lost:
            kept.append(asking)
            continue
        gone = sorted({sh.host_id for sh in lost if sh.host_id not in live})
        restarted = sorted({sh.host_id for sh in lost} - set(gone))
        what = "; ".join([*([f"agent-host {', '.join(gone)} stopped (no heartbeat for {silent_s:g}s)"] if gone else []),
                          *([f"agent-host {', '.join(restarted)} restarted"] if restarted else [])])
        what += f" while answering interview {asking.request} after round {asking.after_round}"
        ranges = sorted(r for sh in lost for r in sh.ranges)
        agents = sum(c for _, c in ranges)
        shares = [sh for sh in asking.shares if sh not in lost]
        held: dict[str, int] = {}
        for sh in shares:
            held[sh.host_id] = held.get(sh.host_id, 0) + sum(c for _, c in sh.ranges)
        placed = split(ranges, up, held)
        if not placed:
            actions.append(InterviewLost(asking.request, asking.after_round, asking.expected,
                                         f"{what}, and no agent-host is up to answer its {agents} agents; the "
                                         "answers recorded so far stay"))
            continue
        n = asking.placements + 1
        shares += [AskedShare(host_id=h, ranges=r, incarnation=started.get(h), placement=n) for h, r in placed.items()]
        kept.append(asking.model_copy(update={"shares": shares, "placements": n}))
        actions.append(OrderAgain(asking.request, placed, n, what,
                                  f"{what}: its {agents} agents ordered again from {', '.join(sorted(placed))}"))
    if not actions and len(kept) == len(state.asking):
        return state, []
    return state.model_copy(update={"asking": kept}), actions


def asked(state: RunState, asking: Asking) -> tuple[RunState, list]:
    """The run state with `asking` watched (once: a request delivered again changes nothing)."""
    if any(a.request == asking.request for a in state.asking):
        return state, []
    return state.model_copy(update={"asking": [*state.asking, asking]}), []


def failed(state: RunState, request: str, host_id: str | None = None) -> tuple[RunState, list]:
    """`request` fails (`host_id` cannot answer its part, or its order could not go out): it is
    watched no more. Nothing is decided when it is not watched (recorded, failed already), nor
    when `host_id` has no part of it."""
    if not any(a.request == request and (host_id is None or host_id in a.hosts) for a in state.asking):
        return state, []
    return state.model_copy(update={"asking": [a for a in state.asking if a.request != request]}), []


def fault_refusal(state: RunState | None, fault: RunFault, subject: str) -> str | None:
    """Why a host's fault about a post-hoc interview must not fail it (None: it may, if it is
    still watched). NATS permissions check the subject, so its last token is the sender: the
    body may not claim another, and the sender must be a host ordered to answer it."""
    sender = subject.rsplit(".", 1)[-1]
    if subject != subjects.run_fault(fault.run_id, fault.source):
        return f"a fault from {sender} on {subject} claims to come from {fault.source!r} about run {fault.run_id}"
    if state is None:
        return f"run {fault.run_id} is not known"
    asking = next((a for a in state.asking if a.request == fault.request), None)
    if asking is not None and sender not in asking.hosts:
        return (f"agent-host {sender} was not ordered to answer interview {fault.request}: its fault is not the "
                "interview's")
    return None
