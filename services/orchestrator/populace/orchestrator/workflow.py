"""Run workflow, pure (deciding, not doing): given the run state and an event, return the
next state and the actions to take. The service performs the actions after the new state
is stored by compare-and-swap, so a replayed event never opens a round twice.

The placement is a list of shares (a host's agent id ranges, placed in an epoch). A lost
host's shares are placed again on the hosts up (a new epoch): their agents restart from the
last completed round's checkpoint and replay only their part of the round in play. A resume
places every share again. A round result counts only if it folded exactly the live shares."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

from populace.core import checkpoints, subjects
from populace.core.contracts import (
    ACTIVE_STATUSES,
    RESUMABLE_STATUSES,
    Budget,
    ConfigRef,
    HostInfo,
    Layout,
    LivingRef,
    Progress,
    Restore,
    RoundOpen,
    RoundResult,
    RunConfig,
    RunFault,
    RunState,
    Share,
    StateRef,
    Usage,
    WorldRef,
    money,
    share_key,
)
from populace.core.placement import PlacementError, Policy, birth_block, place_births, place_ranges

Placement = dict[str, list[tuple[int, int]]]
ACTIVE = ACTIVE_STATUSES
RESUMABLE = RESUMABLE_STATUSES


@dataclass(frozen=True)
class Request:
    """A control request (cancel, resume) as the CTL stream stored it: its sequence there and the
    server's time of storing it (seconds since the epoch)."""

    seq: int
    at: float


def stale(state: RunState, request: Request | None) -> bool:
    """Whether `request` is no newer than the last one that changed the run: delivered again, or
    overtaken. Both marks must be no newer, so a CTL stream made again (its sequence from 1) still
    takes new requests."""
    return request is not None and request.seq <= state.request_seq and request.at <= state.request_at


def _requested(state: RunState, request: Request | None) -> RunState:
    return state if request is None else state.model_copy(update={"request_seq": request.seq,
                                                                  "request_at": request.at})


@dataclass(frozen=True)
class OpenRound:
    """Announce `round` with the new state's observation, environment state and shares;
    `again`: the same round once more (for replacement shares, or after its deadline)."""

    round: int
    expected: int
    again: bool = False


@dataclass(frozen=True)
class FinishRun:
    status: str  # "completed" | "failed" | "cancelled" | "paused"
    rounds: int
    reason: str | None = None


@dataclass(frozen=True)
class SpawnShares:
    """Publish the spawn of these shares (by key); `resumed`: announce the resume first."""

    keys: tuple[str, ...]
    resumed: bool = False


Action = OpenRound | FinishRun | SpawnShares


def layout_of(shares: list[Share]) -> list[tuple[int, int]]:
    return sorted(r for sh in shares for r in sh.ranges)


def layout(from_round: int, shares: list[Share]) -> Layout:
    """The ranges `shares` play from `from_round` on, with the share that plays each."""
    pairs = sorted((r, sh.key) for sh in shares for r in sh.ranges)
    return Layout(from_round=from_round, ranges=[r for r, _ in pairs], shares=[k for _, k in pairs])


def owners(state: RunState, round_: int) -> dict[str, list[tuple[int, int]]]:
    """Which share played (and checkpointed) which ranges in `round_`: share key -> ranges."""
    chosen = [lay for lay in state.layouts if lay.from_round <= round_]
    if not chosen:
        return {sh.key: list(sh.ranges) for sh in state.shares}
    out: dict[str, list[tuple[int, int]]] = {}
    for r, key in zip(chosen[-1].ranges, chosen[-1].shares, strict=False):
        out.setdefault(key, []).append(r)
    return out


def writers_for(state: RunState, round_: int) -> dict[str, str]:
    """Who wrote each agents' checkpoint object of `round_`: the host of the share that played
    its range then (a reader takes an object only from its writer)."""
    return {subjects.checkpoint_agents(state.run_id, round_, first): key.rpartition("@")[0]
            for key, ranges in owners(state, round_).items() for first, _ in ranges}


def layout_for(state: RunState, round_: int, size: int | None = None) -> list[tuple[int, int]]:
    """The ranges the run's hosts played (and checkpointed) `round_` in; `size`: the agent ids
    given before that round's newcomers (a run whose population changed; LivingRef.size_in),
    for a placement has grown since by the newcomers of later rounds."""
    chosen = [lay for lay in state.layouts if lay.from_round <= round_]
    ranges = chosen[-1].ranges if chosen else layout_of(state.shares)
    return ranges if size is None else clipped(ranges, size)


def clipped(ranges: list[tuple[int, int]], size: int) -> list[tuple[int, int]]:
    """`ranges` cut to the ids below `size`."""
    return [(f, min(c, size - f)) for f, c in ranges if f < size]


def grown(state: RunState, living: LivingRef) -> RunState:
    """The run's placement with the newcomers of `living`'s round placed (populace.core.placement
    .place_births): the shares' ranges, and the ranges of the placement in force, grow."""
    if living.size <= living.first:
        return state
    c = state.config
    placement = place_births({sh.key: sh.ranges for sh in state.shares}, living.first, living.size - living.first,
                             base=c.agents, block=birth_block(c.agents))
    shares = [sh.model_copy(update={"ranges": placement[sh.key]}) for sh in state.shares]
    layouts = list(state.layouts)
    if layouts:  # the placement in force holds the newcomers from now on; rounds before it see less (clipped)
        layouts[-1] = layout(layouts[-1].from_round, shares)
    return state.model_copy(update={"shares": shares, "layouts": layouts})


def shares_for(placement: Placement, epoch: int, from_round: int,
               incarnations: dict[str, float] | None = None) -> list[Share]:
    inc = incarnations or {}
    return [Share(host_id=h, epoch=epoch, ranges=r, from_round=from_round, incarnation=inc.get(h))
            for h, r in sorted(placement.items())]


def round_open(state: RunState, action: OpenRound, opened_at: float) -> RoundOpen:
    """The announcement of the round `action` opens: the config by digest (hosts and the
    environment fetch it once), never the config itself."""
    return RoundOpen(run_id=state.run_id, round=action.round, expected=action.expected, config_ref=state.config_ref,
                     observation=state.observation, env_state=state.env_state, selection=state.selection,
                     world=state.world, prototypes=state.prototypes, opened_at=opened_at, epoch=state.epoch,
                     shares={sh.key: sh.count for sh in state.shares}, nudge=state.nudged,
                     # where posts go (a run with a graph), where newcomers are (a population that changed)
                     ranges={sh.key: sh.ranges for sh in state.shares}
                     if state.config.graph or state.population is not None else {},
                     population=state.population)


def new_run(run_id: str, config: RunConfig, placement: Placement,
            incarnations: dict[str, float] | None = None) -> RunState:
    shares = shares_for(placement, 0, 1, incarnations)
    return RunState(run_id=run_id, status="spawning", config=config, shares=shares, layouts=[layout(1, shares)])


def state_ref(run_id: str, round_: int, digest: str) -> StateRef:
    """Where the environment's state after `round_` is: its checkpoint of the round, by digest."""
    return StateRef(name=subjects.checkpoint_env(run_id, round_), digest=digest)


def fork_run(run_id: str, config: RunConfig, placement: Placement, parent: RunState, after_round: int,
             env_state: StateRef, observation: dict, incarnations: dict[str, float] | None = None,
             digests: dict[str, str] | None = None, selection: dict | None = None,
             world: WorldRef | None = None, population: LivingRef | None = None,
             prototypes: dict[str, float] | None = None) -> RunState:
    """A new run that starts where `parent` was after `after_round` (its agents' and
    environment's state, and who was alive), with its own config (the intervention); `digests`:
    the parent's checkpoint objects of that round, as recorded when it closed (`fork_digests`);
    `placement`: every agent id given by then (`population.size`, newcomers included)."""
    shares = shares_for(placement, 0, after_round + 1, incarnations)
    size = population.size_in(after_round) if population is not None else None
    return RunState(run_id=run_id, status="spawning", config=config, shares=shares, round=after_round,
                    config_ref=ConfigRef.of(config, after_round + 1),
                    restore=Restore(run_id=parent.run_id, round=after_round,
                                    ranges=layout_for(parent, after_round, size), digests=digests or {},
                                    writers=writers_for(parent, after_round), population=population),
                    layouts=[layout(after_round + 1, shares)],
                    env_state=env_state, observation=observation, selection=selection, world=world,
                    population=population, prototypes=prototypes)


def fork_digests(parent: RunState, round_: int, result: RoundResult | None) -> dict[str, str]:
    """The digests of `parent`'s checkpoint objects of `round_`: the run state's, for its last
    completed round; else those its round result (the environment's, read back from the
    stream) reports, each share's own ranges' only. Raises CheckpointUnverified when neither
    is there: a fork never starts from objects nobody can vouch for."""
    if round_ == completed(parent) and parent.checkpoints:
        return dict(parent.checkpoints)
    played = owners(parent, round_)
    if result is None or result.round != round_ or sorted(result.shares) != sorted(played):
        raise checkpoints.CheckpointUnverified(
            f"run {parent.run_id}'s round {round_} result is no longer in the stream (or is not the one the run "
            "counted): its checkpoint cannot be verified")
    digests, _ = checkpoints.recorded(parent.run_id, round_, result.checkpoints, result.env_checkpoint, played)
    return digests


def completed(state: RunState) -> int:
    """The last round whose result is in (so whose checkpoint is complete)."""
    return max(0, state.round - 1) if state.status == "running" else state.round


def restore_point(state: RunState) -> Restore | None:
    """Where agents spawned now start from: the last completed round's checkpoint; a fork's
    parent's until the fork completes a round of its own; nothing before round 1."""
    after = completed(state)
    if state.restore is not None and after <= state.restore.round:
        return state.restore
    if after:
        living = state.population
        return Restore(run_id=state.run_id, round=after,
                       ranges=layout_for(state, after, living.size_in(after) if living is not None else None),
                       digests=dict(state.checkpoints), writers=writers_for(state, after), population=living)
    return None


def _now(state: RunState, **update) -> RunState:
    return state.model_copy(update={**update, "updated_at": time.time()})


def on_spawned(state: RunState, host_id: str, epoch: int = 0) -> tuple[RunState, list[Action]]:
    key = f"{host_id}@{epoch}"
    if state.status not in ACTIVE or key in state.spawned or state.share(key) is None:
        return state, []
    spawned = [*state.spawned, key]
    if any(sh.key not in spawned for sh in state.shares):
        return _now(state, spawned=spawned), []
    if state.status == "spawning":
        n = state.round + 1  # while spawning, `round` is the last completed one
        return (_now(state, spawned=spawned, status="running", round=n, phase_at=time.time(), nudged=0),
                [OpenRound(n, state.config.agents)])
    # running: the replacement shares are ready, so the round in play is announced again for them
    return _now(state, spawned=spawned), [OpenRound(state.round, state.config.agents, again=True)]


def on_result(state: RunState, result: RoundResult) -> tuple[RunState, list[Action]]:
    if state.status != "running" or result.round != state.round:
        return state, []  # stale or replayed result
    if sorted(result.shares) != sorted(sh.key for sh in state.shares):
        return state, []  # it folded a share since replaced (or misses a replacement's)
    if result.env_checkpoint is None:  # the next round could not find the state it decided
        return on_pause(state, f"round {result.round}'s result names no checkpoint of the environment's state")
    digests, _ = checkpoints.recorded(state.run_id, result.round, result.checkpoints, result.env_checkpoint,
                                      {sh.key: sh.ranges for sh in state.shares})
    carried = {"env_state": state_ref(state.run_id, result.round, result.env_checkpoint),
               "observation": result.observation, "selection": result.selection,
               "world": result.world, "phase_at": time.time(), "nudged": 0,
               "prototypes": (result.prototypes.shares or None) if result.prototypes else state.prototypes,
               "used": state.used + result.usage, "last_round": result.usage, "checkpoints": digests,
               "interviews": state.interviews + result.interviews, "population": result.population}
    living = result.population
    if living is not None and living.round == result.round:
        try:
            state = grown(state, living)  # the round's newcomers, placed before the next round opens
        except PlacementError as err:
            return on_pause(state, f"round {result.round}'s newcomers cannot be placed: {err}")
    if state.round >= state.config.rounds:
        return _now(state, status="done", stop_announced=False, **carried), [FinishRun("completed", state.round)]
    # the next round, and the interviews planned after it (they start as its shares finish)
    asked = planned_interviews(state.config, state.round + 1, carried["interviews"], result.usage)
    over = over_budget(state.config.budget, carried["used"] + carried["interviews"], result.usage + asked,
                       interviews=asked)
    guard = result.prototypes.pause if result.prototypes is not None else None
    if guard is not None:  # the prototypes' guard was told to pause rather than raise a share
        reason = (f"{guard}; the next round plays at the same shares: `populace resume {state.run_id}` continues, "
                  "or fork it with a larger prototypes.share")
        return (_now(state, status="paused", reason=reason, stop_announced=False, **carried),
                [FinishRun("paused", state.round, reason)])
    if over is not None:
        reason = f"{over}; `populace resume {state.run_id} --budget-… N` raises it and continues"
        return (_now(state, status="paused", reason=reason, stop_announced=False, **carried),
                [FinishRun("paused", state.round, reason)])
    n = state.round + 1
    return _now(state, round=n, **carried), [OpenRound(n, state.config.agents)]


def over_budget(budget: Budget | None, used: Usage, next_round: Usage, interviews: Usage | None = None) -> str | None:
    """Why the next round would go past the budget (it likely needs what the last one did, plus
    `interviews`: those planned after it, counted in `next_round` too), or None."""
    if budget is None:
        return None
    asked = interviews or Usage()
    for used_text, flag, limit, spent, step, of_them, show in (
            ("tokens used", "tokens", budget.tokens, used.tokens, next_round.tokens, asked.tokens, _count),
            ("LLM calls used", "calls", budget.llm_calls, used.llm_calls, next_round.llm_calls, asked.llm_calls,
             _count),
            ("spent", "dollars", budget.dollars, used.dollars, next_round.dollars, asked.dollars, money)):
        if limit is not None and spent + step > limit:
            of_which = f", {show(of_them)} of them for the interviews planned after it" if of_them else ""
            return (f"budget: {show(spent)} of {show(limit)} {used_text}, and the next round needs about "
                    f"{show(step)} more{of_which} (--budget-{flag})")
    return None


def _count(n: float) -> str:
    return f"{n:,}"


def planned_interviews(config: RunConfig, round_: int, asked: Usage, last_round: Usage) -> Usage:
    """What the interviews the scenario plans after `round_` likely need: their calls (each
    respondent once per question, or once per survey asked together) and, per call, the tokens
    interviews took so far (before any: a round's per call), and so their dollars."""
    calls = 0.0
    for plan in config.interviews:
        if round_ in plan.rounds(config.rounds):
            who = len(plan.agents) if plan.agents is not None else config.agents * (plan.sample or 1.0)
            calls += who * (len(plan.questions) if plan.mode == "each" else 1)
    if not calls:
        return Usage()
    per = asked if asked.llm_calls else last_round
    scale = math.ceil(calls) / per.llm_calls if per.llm_calls else 0.0
    n = math.ceil(calls)
    return Usage(llm_calls=n, prompt_tokens=round(per.prompt_tokens * scale),
                 completion_tokens=round(per.completion_tokens * scale),
                 cached_tokens=round(per.cached_tokens * scale), dollars=per.dollars * scale)


def _stop(state: RunState, status: str, reason: str) -> tuple[RunState, list[Action]]:
    if state.status not in ACTIVE:
        return state, []
    stopped = _now(state, status=status, round=completed(state), reason=reason, stop_announced=False)
    return stopped, [FinishRun("completed" if status == "done" else status, stopped.round, reason)]


def unannounced_stop(state: RunState) -> FinishRun | None:
    """The stop of a run decided but not yet published (its decider died between the state's
    write and the RunDone, or the publish failed): what to publish now. None: nothing pending."""
    if state.status in ACTIVE or state.stop_announced:
        return None
    return FinishRun("completed" if state.status == "done" else state.status, state.round, state.reason)


def on_stop_announced(state: RunState, epoch: int) -> tuple[RunState, list[Action]]:
    """The RunDone of the stop in epoch `epoch` is published (nothing, if the run moved on)."""
    if state.stop_announced or state.status in ACTIVE or state.epoch != epoch:
        return state, []
    return state.model_copy(update={"stop_announced": True}), []


def on_failure(state: RunState, reason: str) -> tuple[RunState, list[Action]]:
    return _stop(state, "failed", reason)


def on_cancel(state: RunState, reason: str, request: Request | None = None) -> tuple[RunState, list[Action]]:
    """Stop at once; the round in play is dropped (it is played again on resume). A stale
    `request` (see `stale`) changes nothing."""
    if stale(state, request):
        return state, []
    stopped, actions = _stop(state, "cancelled", reason)
    return (_requested(stopped, request) if actions else stopped), actions


def on_pause(state: RunState, reason: str) -> tuple[RunState, list[Action]]:
    """Stop after the last completed round with a reason; `resume` continues."""
    return _stop(state, "paused", reason)


def resume_refusal(state: RunState, budget: Budget | None = None) -> str | None:
    """Why `state` cannot be resumed (with `budget` replacing its own when given), or None."""
    if state.status not in RESUMABLE:
        return f"the run is {state.status}"
    if state.round >= state.config.rounds:
        return f"all {state.config.rounds} rounds are played"
    asked = planned_interviews(state.config, state.round + 1, state.interviews, state.last_round)
    over = over_budget(budget or state.config.budget, state.used + state.interviews, state.last_round + asked,
                       interviews=asked)
    if over is not None:
        return f"{over}: give a larger budget"
    return None


def on_resume(state: RunState, placement: Placement, incarnations: dict[str, float] | None = None,
              budget: Budget | None = None, request: Request | None = None) -> tuple[RunState, list[Action]]:
    """A failed, cancelled or paused run continues after its last completed round, in a new
    epoch, on `placement` (whatever hosts are up now), its agents restored from the checkpoint;
    `budget`, when given, replaces the run's. A stale `request` (see `stale`) changes nothing."""
    if stale(state, request) or resume_refusal(state, budget) is not None:
        return state, []
    epoch, after = state.epoch + 1, state.round
    shares = shares_for(placement, epoch, after + 1, incarnations)
    config, ref = state.config, state.config_ref
    if budget is not None:  # a new config from the first round the resume plays: hosts fetch it by its digest
        config = state.config.model_copy(update={"budget": budget})
        ref = ConfigRef.of(config, after + 1)
    resumed = _now(state, status="spawning", config=config, config_ref=ref, shares=shares, spawned=[], epoch=epoch,
                   reason=None, phase_at=time.time(), nudged=0, layouts=[*state.layouts, layout(after + 1, shares)])
    return _requested(resumed, request), [SpawnShares(tuple(sh.key for sh in shares), resumed=True)]


def lost_shares(state: RunState, hosts: list[HostInfo], live: set[str]) -> list[Share]:
    """Shares the run needs whose host stopped heartbeating or restarted (a new process has
    none of their agents)."""
    if state.status not in ACTIVE:
        return []
    started = {h.host_id: h.started_at for h in hosts}
    return [sh for sh in state.shares if sh.host_id not in live
            or (sh.incarnation is not None and started.get(sh.host_id, sh.incarnation) != sh.incarnation)]


def on_hosts_lost(state: RunState, hosts: list[HostInfo], live: set[str], silent_s: float,
                  unit: int = 1, policy: Policy = "spread") -> tuple[RunState, list[Action]]:
    """Place a lost host's shares again on the hosts up (a restarted host counts as up), in a
    new epoch: their agents restart from the last checkpoint and replay their part of the
    round in play. With nowhere to place them, the run pauses with a reason."""
    lost = lost_shares(state, hosts, live)
    if not lost:
        return state, []
    gone = sorted({sh.host_id for sh in lost if sh.host_id not in live})
    restarted = sorted({sh.host_id for sh in lost} - set(gone))
    what = "; ".join([*([f"agent-host {', '.join(gone)} stopped (no heartbeat for {silent_s:g}s)"] if gone else []),
                      *([f"agent-host {', '.join(restarted)} restarted"] if restarted else [])])
    where = f"round {state.round}" if state.status == "running" else "spawning"
    agents = sum(sh.count for sh in lost)
    up = [h for h in hosts if h.host_id in live]
    keep = [sh for sh in state.shares if sh not in lost]
    # the survivors' agents of this run already count against their hosts' room
    try:
        moved = place_ranges([r for sh in lost for r in sh.ranges], up, unit, policy)
    except PlacementError as err:
        return on_pause(state, f"{what} during {where} and no agent-host can take its {agents} agents ({err}); "
                               f"`populace resume {state.run_id}` continues once hosts are up")
    epoch = state.epoch + 1
    from_round = state.round if state.status == "running" else state.round + 1
    new = shares_for(moved, epoch, from_round, {h.host_id: h.started_at for h in up})
    shares = sorted([*keep, *new], key=lambda sh: min(f for f, _ in sh.ranges))
    lost_keys = {sh.key for sh in lost}
    replaced = _now(state, shares=shares, spawned=[k for k in state.spawned if k not in lost_keys], epoch=epoch,
                    layouts=[*state.layouts, layout(from_round, shares)],
                    reason=f"{what} during {where}: its {agents} agents re-placed on {', '.join(sorted(moved))}")
    return replaced, [SpawnShares(tuple(sh.key for sh in new))]


def on_stalled(state: RunState, stalled_s: float, deadline_s: float,
               busy: dict[str, float] | None = None) -> tuple[RunState, list[Action]]:
    """No progress for `stalled_s`: past the deadline, announce the round (or the spawn) once
    more — a host that missed it plays it, one that played it ignores it — then pause. `busy`:
    the run's hosts whose event loop has not turned for that long (their heartbeats say so): the
    pause names them, for the simulation's code is holding them."""
    if state.status not in ACTIVE or stalled_s < deadline_s:
        return state, []
    if state.nudged == 0:
        nudged = _now(state, nudged=1, phase_at=time.time())
        if state.status == "running":
            return nudged, [OpenRound(state.round, state.config.agents, again=True)]
        return nudged, [SpawnShares(tuple(sh.key for sh in state.shares if sh.key not in state.spawned))]
    what = f"round {state.round}" if state.status == "running" else "spawning"
    held = sorted((busy or {}).items())
    why = ("a service is down or stuck" if not held else
           "the simulation's code holds the event loop of " + ", ".join(f"agent-host {h} ({s:.0f}s without a turn)"
                                                                       for h, s in held)
           + " (a view, turn, settle or scene that does not return; fix it first)")
    return on_pause(state, f"{what} made no progress for {deadline_s:g}s (announced again once): {why}; "
                           f"`populace resume {state.run_id}` continues from round {completed(state)}")


def stall_deadline(config: RunConfig, infer_timeout_s: float, infer_attempts: int,
                   override: float | None = None) -> float:
    """How long a round may go without progress: one inference batch's worst case (every
    attempt timing out, as agent-hosts time them) and a margin; a setting overrides it."""
    if override:
        return override
    batch_s = max(infer_timeout_s, config.model.latency_s * 4 + 10)
    return max(60.0, batch_s * infer_attempts + 30.0)


# Services that may report a run's fault, each on its own subject (run.<rid>.fault.<service>),
# which only its NATS user may publish (deploy/nats/auth.conf; no host may be named after a
# user). Any other source is a host. The environment fails a run whose simulation raised; the
# recorder pauses one whose events it cannot store (its disk full).
FAULT_SERVICES = frozenset({"environment", "recorder"})


def fault_refusal(state: RunState | None, fault: RunFault, subject: str) -> str | None:
    """Why a fault (a failure or a pause) must not stop the run (None: it may). NATS
    permissions check the subject, so its last token is the sender: the body may not claim
    another; a host may speak only for a share the run's placement has (its epoch's, when it
    names one), and a service only if it is one entitled to (FAULT_SERVICES)."""
    sender = subject.rsplit(".", 1)[-1]
    if subject != subjects.run_fault(fault.run_id, fault.source):
        return f"a fault from {sender} on {subject} claims to come from {fault.source!r} about run {fault.run_id}"
    if state is None:
        return f"run {fault.run_id} is not known"
    if sender in FAULT_SERVICES:
        return None
    if fault.epoch is not None:
        if state.share(share_key(sender, fault.epoch)) is None:
            return (f"share {share_key(sender, fault.epoch)} is not in run {state.run_id}'s placement "
                    f"(epoch {state.epoch}): its fault is not the run's")
    elif sender not in state.placement:
        return (f"agent-host {sender} plays no share of run {state.run_id} (epoch {state.epoch}): "
                "its fault is not the run's")
    return None


@dataclass
class RoundTicks:
    """The round in play's progress ticks, as they count towards its deadline: only from the
    hosts of the run's live shares, only while a host's answers stay within its agents (a tick
    saying no agent answered yet, that a gateway works on its prompts, only while some of its
    agents still wait). A host placed in no run cannot keep a stalled round alive."""

    round: int
    epoch: int
    room: dict[str, int]  # host -> agents of its live shares
    answered: dict[str, int] = field(default_factory=dict)

    @classmethod
    def of(cls, state: RunState) -> RoundTicks:
        return cls(round=state.round, epoch=state.epoch,
                   room={h: sum(c for _, c in rs) for h, rs in state.placement.items()})

    def take(self, subject: str, tick: Progress) -> bool | str:
        """True: the tick is progress; False: a straggler, dropped quietly; a string: why it
        is refused (dead-lettered)."""
        if subject != subjects.progress(tick.run_id, tick.round, tick.host_id):
            return f"a progress tick on {subject} claims host {tick.host_id}, round {tick.round} of run {tick.run_id}"
        if tick.round < self.round:
            return False  # sent before the round it counted in was decided
        if tick.round > self.round:
            return f"round {tick.round} of run {tick.run_id} is not in play (round {self.round} is)"
        room = self.room.get(tick.host_id)
        if room is None:
            return f"agent-host {tick.host_id} plays no share of run {tick.run_id} (epoch {self.epoch})"
        done = self.answered.get(tick.host_id, 0)
        if tick.answered == 0:
            return done < room
        if done + tick.answered > room:
            return (f"agent-host {tick.host_id} would have answered {done + tick.answered} agents in round "
                    f"{self.round} of run {tick.run_id}; it plays {room}")
        self.answered[tick.host_id] = done + tick.answered
        return True
