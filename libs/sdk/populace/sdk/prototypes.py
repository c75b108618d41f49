"""Prototypes in the round engine (issue 39): representatives play, every other agent records an
answer drawn from its prototype's representatives of the round, and seeded audits measure the
draws' error inside the run. Who stands for whom is `populace.population.prototypes` (pure,
shared with the recorder); this module is what the engine does with it.

- On a share (`HostRound`): only its representatives play; its audited agents play on copies of
  their state (their real answers go to table `audits`, never to the run); its other agents draw
  a pool position each (the representatives of the whole run, by prototype then id), tallied
  into `PrototypeEvidence` that rides beside the share's partial. Nothing runs per drawn agent
  but numpy.
- In the environment (`fold`): the shares' representatives make the pool, an invalid answer is
  never copied (its draws go to the next valid representative of its prototype), and the
  simulation's `Env.reduce_drawn` folds each copied answer once, weighted by how many drew it,
  so the round's summary is the whole population's. Each prototype's draws are measured against
  its audits (Wasserstein-1 for a numeric measure, Jensen-Shannon and total variation for a
  categorical one) with a bootstrap interval; the guard raises a prototype's share (or pauses the
  run) when the interval lies wholly above the tolerance.

A drawn agent does not play: its state (its memory) does not change in that round. With
`redraw: keep` the representatives are the same agents every round, so their memory carries the
prototype's history; with `every-round` a representative may be one whose memory misses the
rounds it was drawn in (docs/prototypes.md).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from populace.core.contracts import (
    PROTOTYPE_COLUMNS,
    PrototypeEvidence,
    PrototypeRound,
    PrototypesConfig,
    PrototypeStat,
    RunConfig,
    SimulationTables,
)
from populace.population import prototypes as rules
from populace.population.cast import Cast
from populace.sdk.llm import TURNS, InferError, ModelUnavailable

if TYPE_CHECKING:
    from populace.sdk.env import Env, Partial
    from populace.sdk.hosting import HostedRun
    from populace.sdk.llm import LLM
    from populace.sdk.play import OutcomeRows, OutcomeSink
    from populace.sdk.simulation import Observation, Simulation

KEY = "prototypes"  # a prototype share's partial payload: {"partial": <the simulation's>, "prototypes": evidence}
LEVEL = 0.95


class PrototypesRefused(ValueError):
    """A simulation whose rounds cannot draw answers (its message starts with `prototypes:`)."""


def check(sim: type[Simulation], config: RunConfig) -> None:
    """Refuse, before the run, prototypes for a simulation whose agents' answers cannot stand for
    each other's: groups and scenes (an outcome is settled with its group), graphs and edge edits
    (an agent's posts and follows are its own), worlds (an agent's cell is its own), activation
    (only some agents act), a population that changes (its representatives and draws range over
    the first agents), or one that opts out (`Simulation.prototypes_allowed = False`)."""
    from populace.sdk.agent import Agent
    from populace.sdk.env import Env

    if config.prototypes is None:
        return
    name = sim.name
    why = None
    if config.population is not None and config.population.changes:
        # representatives, draws, audits and the recorder's expansion all range over the run's
        # first agents: a population that changes is refused rather than drawn for the dead
        raise PrototypesRefused("prototypes: a run whose population changes (population.changes) cannot have "
                                "prototypes: drop one of the two sections")
    if not sim.prototypes_allowed:
        why = "the simulation opts out of prototypes (prototypes_allowed = False)"
    elif sim.GroupEnv is not None:
        why = "its agents play in groups (a group settles its members' own outcomes)"
    elif sim.edge_kinds:
        why = "its agents edit a graph (their edits are their own)"
    elif sim.Env.World is not None:
        why = "it has a World (each agent's place in it is its own)"
    elif sim.Env.select is not Env.select or sim.Agent.wakes is not Agent.wakes:
        why = "it selects who acts (a drawn answer stands for an agent that acts every round)"
    else:
        tables = sim.tables()
        if tables.measure is None:
            why = "its outcome has no measure column to compare draws with audits on"
        clash = [c.name for c in tables.outcome_columns if c.name in dict(PROTOTYPE_COLUMNS)]
        if clash:
            why = f"its outcome column {clash[0]!r} is one a prototype run records itself"
    if why is not None:
        raise PrototypesRefused(f"prototypes: simulation {name!r} cannot draw answers: {why}")


def membership_of(config: RunConfig, cast: Cast | None) -> rules.Membership:
    p = config.prototypes
    assert p is not None
    return rules.membership(config.agents, p.by, cast.profiles if cast is not None else None)


def check_population(config: RunConfig, cast: Cast | None) -> dict[str, int]:
    """Each prototype's agents (PrototypeError naming the field when a persona lacks an attribute
    `by` names, there are too many prototypes, or one has fewer agents than its minimum
    representatives): before the run."""
    from populace.core.contracts import MAX_PROTOTYPES

    p = config.prototypes
    assert p is not None
    m = membership_of(config, cast)
    if len(m.labels) > MAX_PROTOTYPES:
        raise rules.PrototypeError(f"prototypes.by: {p.by} makes {len(m.labels):,} prototypes; at most "
                                   f"{MAX_PROTOTYPES:,} (group by fewer or coarser attributes)")
    label, size = rules.smallest_prototype(m)
    if size < p.min_representatives:
        raise rules.PrototypeError(f"prototypes.min_representatives: prototype {label!r} has {size} agent(s), fewer "
                                   f"than the {p.min_representatives} representatives each must have (lower it, "
                                   "or group by fewer attributes)")
    return {lab: int(n) for lab, n in zip(m.labels, m.sizes.tolist())}


class Plan:
    """A prototype run as one process sees it: its membership (computed once) and each round's
    representatives (kept while the shares stand, with `redraw: keep`)."""

    def __init__(self, config: RunConfig, cast: Cast | None) -> None:
        p = config.prototypes
        assert p is not None
        self.config: PrototypesConfig = p
        self.agents = config.agents
        self.seed = p.seed if p.seed is not None else config.seed
        self.members = membership_of(config, cast)
        self._reps: tuple[Any, np.ndarray, rules.Pools] | None = None

    def shares(self, raised: dict[str, float] | None) -> np.ndarray:
        return rules.shares_of(self.members, self.config.share, raised)

    def representatives(self, round_: int, raised: dict[str, float] | None) -> tuple[np.ndarray, rules.Pools]:
        """(per agent: whether it calls the model in `round_`, the run's pool)."""
        shares = self.shares(raised)
        keep = self.config.redraw == "keep"
        key = (None if keep else round_, shares.tobytes())
        if self._reps is None or self._reps[0] != key:
            is_rep = rules.representatives(self.members, shares, self.config.min_representatives, self.seed,
                                           None if keep else round_)
            self._reps = (key, is_rep, rules.pools(self.members, is_rep))
        return self._reps[1], self._reps[2]

    def audited(self, round_: int, is_rep: np.ndarray) -> np.ndarray:
        return rules.audited(self.members, is_rep, self.config.audits, self.seed, round_)


# -- a share's round -----------------------------------------------------------------------------
class HostRound:
    """One share's prototype round: who of it plays, who is audited, what the others drew."""

    def __init__(self, plan: Plan, ids: np.ndarray, round_: int, raised: dict[str, float] | None) -> None:
        self.plan, self.round = plan, round_
        m = plan.members
        is_rep, self.pool = plan.representatives(round_, raised)
        mine = is_rep[ids]
        self.selected = np.flatnonzero(mine).tolist()  # indices into the share's agents
        others = ids[~mine]
        self.drawn = others.size
        positions = rules.draw_positions(m, self.pool, others, plan.seed, round_)
        counts, first = rules.tally_draws(positions, others, self.pool.reps.size)
        hit = np.flatnonzero(counts)
        self.tally = {"position": hit.tolist(), "count": counts[hit].tolist(), "first": first[hit].tolist()}
        audited = plan.audited(round_, is_rep)
        self.audited = ids[audited[ids]]
        labels = m.labels
        self.agents = {labels[p]: int(n) for p, n in enumerate(np.bincount(m.of[ids], minlength=len(labels)))
                       if n}
        self._reps: dict[str, list] = {"agent_id": [], "valid": [], "columns": {}}
        self.audit_rows: OutcomeRows | None = None

    def label(self, agent_id: int) -> str:
        m = self.plan.members
        return m.labels[int(m.of[agent_id])]

    def capture(self, emit: Callable[[OutcomeRows], None]) -> Callable[[OutcomeRows], None]:
        """`emit`, keeping the representatives' rows for the evidence as they leave."""
        reps = self._reps
        m = self.plan.members
        of, labels = m.of, m.labels

        def both(batch: OutcomeRows) -> None:
            batch.prototypes = [labels[p] for p in of[batch.agent_ids].tolist()]
            reps["agent_id"].extend(batch.agent_ids)
            reps["valid"].extend(batch.valid)
            for name, values in batch.columns.items():
                reps["columns"].setdefault(name, []).extend(values)
            emit(batch)

        return both

    def start_audits(self, run: HostedRun, obs: Observation, llm: LLM) -> asyncio.Task | None:
        """The audited agents' turns on copies of their state, running beside the round's."""
        if self.audited.size == 0:
            return None
        return asyncio.get_running_loop().create_task(_audit(run, [int(a) for a in self.audited], obs, llm))

    async def finish_audits(self, task: asyncio.Task | None, sink: OutcomeSink, seq: int) -> OutcomeRows | None:
        """The audits' rows, validated as outcomes are (an answer the run could not record is
        invalid here too), marked as audits."""
        from populace.sdk.play import OutcomeRows

        if task is None:
            return None
        played = await task
        ids = [aid for aid, _, _, _ in played]
        outs = [out for _, out, _, _ in played]
        errs = [err for _, _, _, err in played]
        columns, valid, raws = sink.validated(outs, errs)
        self.audit_rows = OutcomeRows(seq, ids, columns, valid, raws, [lat for _, _, lat, _ in played], errs, None,
                                      audit=True, prototypes=[self.label(a) for a in ids])
        return self.audit_rows

    def evidence(self, measure: str) -> dict:
        reps = self._reps
        audits: dict[str, list] = {"agent_id": [], "prototype": [], "valid": [], "value": []}
        rows = self.audit_rows
        if rows is not None:
            audits = {"agent_id": rows.agent_ids, "prototype": rows.prototypes, "valid": rows.valid,
                      "value": [v if ok else None for v, ok in zip(rows.columns[measure], rows.valid)]}
        m = self.plan.members
        return {"agents": self.agents,
                "reps": {**reps, "prototype": [m.labels[p] for p in m.of[reps["agent_id"]].tolist()]},
                "drawn": self.tally, "audits": audits}


Played = tuple[int, Any, float, str | None]  # (agent id, outcome, latency ms, error)


async def _audit(run: HostedRun, ids: list[int], obs: Observation, llm: LLM) -> list[Played]:
    """Each audited agent's turn on a copy of its state (as it stands: a drawn agent has not played
    this round), seeded as its own turn would be: the run's agents are never touched."""
    from populace.sdk.interview import copy_of

    sim = run.sim
    index = {a.id: i for i, a in enumerate(run.agents)} if len(ids) > 64 else None
    agents = run.agents
    picked = [agents[index[aid]] if index is not None else next(a for a in agents if a.id == aid) for aid in ids]
    states = (await run._columns(picked))
    loop = asyncio.get_running_loop()
    now = loop.time
    cls = type(sim).Outcome
    failed = run.player.failed_outcome

    async def one(i: int, aid: int) -> Played:
        started = now()
        try:
            copy = copy_of(sim, aid, {name: values[i] for name, values in states.items()})
            out = await copy.turn(obs, llm)
            if not isinstance(out, cls):
                raise TypeError(f"turn returned {type(out).__name__}, not {cls.__name__}")
            error = None
        except InferError as err:
            raise err if isinstance(err, ModelUnavailable) else ModelUnavailable(str(err)) from err
        except Exception as err:
            out, error = failed(err)
        return aid, out, (now() - started) * 1000.0, error

    tasks = []
    for i, aid in enumerate(ids):
        task = loop.create_task(one(i, aid))
        TURNS[task] = aid  # its calls are seeded as the agent's own turn's would be
        task.add_done_callback(lambda t: TURNS.pop(t, None))
        tasks.append(task)
    flush = getattr(llm, "flush", None)
    if flush is not None:
        flush()
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for t in tasks:
            t.cancel()
        raise


# -- the environment's fold ------------------------------------------------------------------
@dataclass
class Folded:
    """The drawn agents' part of a round: their partial (None: nobody drew a valid answer), the
    round's report, and how many drawn rows are valid."""

    partial: Partial | None
    report: PrototypeRound
    n_valid: int
    seconds: float = 0.0


@dataclass
class _Proto:
    label: str
    agents: int = 0
    reps: int = 0
    valid: int = 0
    drawn: int = 0
    unanswered: int = 0
    values: list = field(default_factory=list)  # the copied answers' measure, valid ones
    weights: list = field(default_factory=list)  # how many drew each
    audit: list = field(default_factory=list)  # the audits' measure, valid ones
    audited: int = 0


def evidence_of(payload: dict) -> tuple[dict | None, PrototypeEvidence]:
    """A prototype share's payload: (the simulation's partial as JSON, its evidence, validated).
    ValueError when it is not one."""
    if not isinstance(payload, dict) or KEY not in payload or set(payload) - {KEY, "partial"}:
        raise ValueError("a prototype run's partial is {\"partial\": …, \"prototypes\": …}")
    return payload.get("partial"), PrototypeEvidence.model_validate(payload[KEY])


def fold(env: Env, config: RunConfig, tables: SimulationTables, round_: int, raised: dict[str, float] | None,
         shares: Sequence[PrototypeEvidence]) -> Folded:
    """The drawn agents' part of round `round_` from every share's evidence (in share order).
    ValueError when the shares' evidence does not add up (a forged or broken share)."""
    t0 = time.perf_counter()
    p = config.prototypes
    assert p is not None
    measure, kind = tables.measure, tables.measure_kind
    labels = sorted({lab for s in shares for lab in s.agents})
    rank = {lab: i for i, lab in enumerate(labels)}
    ids = np.array([a for s in shares for a in s.reps.agent_id], dtype=np.int64)
    protos = np.array([rank.get(lab, -1) for s in shares for lab in s.reps.prototype], dtype=np.int64)
    if (protos < 0).any():
        raise ValueError("a representative's prototype has no agents")
    valid = np.array([v for s in shares for v in s.reps.valid], dtype=bool)
    names = list(shares[0].reps.columns) if shares else []
    columns = {n: [v for s in shares for v in s.reps.columns.get(n, ())] for n in names}
    if any(len(v) != ids.size for v in columns.values()):
        raise ValueError("the shares' representatives carry different columns")
    order = np.lexsort((ids, protos))  # the pool: by prototype, then id
    ids, protos, valid = ids[order], protos[order], valid[order]
    if ids.size and (np.diff(ids)[np.diff(protos) == 0] <= 0).any():
        raise ValueError("an agent is a representative twice")
    starts = np.zeros(len(labels) + 1, dtype=np.int64)
    np.cumsum(np.bincount(protos, minlength=len(labels)), out=starts[1:])
    pool = rules.Pools(ids, starts)
    stand = rules.stand_ins(pool, valid)
    counts = np.zeros(ids.size, dtype=np.int64)
    first = np.full(ids.size, np.iinfo(np.int64).max, dtype=np.int64)
    for s in shares:
        pos = np.asarray(s.drawn.position, dtype=np.int64)
        if pos.size and pos.max() >= ids.size:
            raise ValueError(f"a draw names pool position {int(pos.max())}, but the pool has {ids.size}")
        np.add.at(counts, pos, np.asarray(s.drawn.count, dtype=np.int64))
        np.minimum.at(first, pos, np.asarray(s.drawn.first, dtype=np.int64))
    # an invalid answer is never copied: its draws go to its stand-in
    hit = np.flatnonzero(counts)
    to = stand[hit]
    eff = np.zeros(ids.size, dtype=np.int64)
    eff_first = np.full(ids.size, np.iinfo(np.int64).max, dtype=np.int64)
    ok = to >= 0
    np.add.at(eff, to[ok], counts[hit][ok])
    np.minimum.at(eff_first, to[ok], first[hit][ok])
    stats = {lab: _Proto(lab) for lab in labels}
    for s in shares:
        for lab, n in s.agents.items():
            stats[lab].agents += n
    for q, lab in enumerate(labels):
        st = stats[lab]
        lo, hi = int(starts[q]), int(starts[q + 1])
        st.reps, st.valid = hi - lo, int(valid[lo:hi].sum())
        st.drawn = int(counts[lo:hi].sum())
        st.unanswered = int(counts[hit[(~ok) & (hit >= lo) & (hit < hi)]].sum())
    used = np.flatnonzero(eff)
    partial = None
    n_valid = int(eff.sum())
    if used.size:
        cls = type(env.sim).Outcome
        rows = order[used]  # the used pool positions' rows, in the shares' concatenation
        outs = [cls(valid=True, **{n: columns[n][i] for n in names}) for i in rows.tolist()]
        partial = env.reduce_drawn(eff_first[used].tolist(), outs, eff[used].tolist())
        if measure is not None:
            values = columns[measure]
            for pos, i in zip(used.tolist(), rows.tolist()):
                st = stats[labels[int(protos[pos])]]
                st.values.append(values[i])
                st.weights.append(int(eff[pos]))
    for s in shares:
        a = s.audits
        for lab, good, value in zip(a.prototype, a.valid, a.value):
            st = stats.get(lab)
            if st is None:
                raise ValueError(f"an audit names prototype {lab!r}, which has no agents")
            st.audited += 1
            if good and value is not None:
                st.audit.append(value)
    seed = p.seed if p.seed is not None else config.seed
    report = _report(p, seed, stats, kind, round_, raised, {lab: (raised or {}).get(lab, p.share) for lab in labels})
    return Folded(partial, report, n_valid, time.perf_counter() - t0)


def _report(p: PrototypesConfig, seed: int, stats: dict[str, _Proto], kind: str | None, round_: int,
            raised: dict[str, float] | None, shares: dict[str, float]) -> PrototypeRound:
    out = []
    new = dict(raised or {})
    breaches = []
    for i, (lab, st) in enumerate(stats.items()):
        metric = "w1" if kind == "numeric" else "js"
        value = lo = hi = tv = None
        if st.values and st.audit:
            value, lo, hi, tv = divergence(kind or "categorical", st.values, st.weights, st.audit, p.bootstrap,
                                           seed=[seed, round_, i])
        share = shares[lab]
        breach = p.tolerance is not None and lo is not None and lo > p.tolerance
        nxt = share
        if breach:
            breaches.append(f"{lab} ({metric} {value:.3g}, 95% CI {lo:.3g}–{hi:.3g} > {p.tolerance:g})")
            if p.on_breach == "raise":
                nxt = min(1.0, share * p.raise_by)
                new[lab] = nxt
        out.append(PrototypeStat(label=lab, agents=st.agents, share=share, representatives=st.reps, valid=st.valid,
                                 drawn=st.drawn, unanswered=st.unanswered, audited=st.audited,
                                 audited_valid=len(st.audit), metric=metric if value is not None else None,
                                 divergence=value, ci_low=lo, ci_high=hi, tv=tv, breach=breach, next_share=nxt))
    pause = None
    if breaches and p.on_breach == "pause":
        pause = (f"prototypes: round {round_}: the draws of {len(breaches)} prototype(s) are further from their "
                 f"audits than the tolerance: {'; '.join(breaches[:5])}")
    return PrototypeRound(stats=out, shares=new, representatives=sum(st.reps for st in stats.values()),
                          audited=sum(st.audited for st in stats.values()), pause=pause)


# -- divergences --------------------------------------------------------------------------------
def w1(x: np.ndarray, wx: np.ndarray, y: np.ndarray, wy: np.ndarray) -> float:
    """Wasserstein-1 between two weighted samples of numbers: ∫ |F_x − F_y|."""
    xs = np.concatenate([x, y])
    order = np.argsort(xs, kind="stable")
    xs = xs[order]
    w = np.concatenate([wx / wx.sum(), -wy / wy.sum()])[order]
    cdf = np.cumsum(w)[:-1]
    return float(np.sum(np.abs(cdf) * np.diff(xs)))


def js_tv(p: np.ndarray, q: np.ndarray) -> tuple[float, float]:
    """(Jensen-Shannon divergence in bits, in [0, 1]; total variation) of two distributions."""
    p, q = p / p.sum(), q / q.sum()
    m = (p + q) / 2

    def kl(a: np.ndarray) -> float:
        nz = a > 0
        return float(np.sum(a[nz] * np.log2(a[nz] / m[nz])))

    return 0.5 * kl(p) + 0.5 * kl(q), 0.5 * float(np.abs(p - q).sum())


def divergence(kind: str, drawn: Sequence, weights: Sequence[int], audits: Sequence, resamples: int,
               seed: Sequence[int]) -> tuple[float, float, float, float | None]:
    """(divergence, 95% bootstrap interval low, high, total variation or None) between the drawn
    answers (each with how many drew it: known exactly) and the audited ones (a sample: resampled
    with replacement). Numeric: Wasserstein-1 in the measure's units; categorical: Jensen-Shannon."""
    rng = np.random.default_rng([abs(int(s)) for s in seed])
    w = np.asarray(weights, dtype=np.float64)
    m = len(audits)
    if kind == "numeric":
        x = np.asarray(drawn, dtype=np.float64)
        y = np.asarray(audits, dtype=np.float64)
        ones = np.ones(m)
        value = w1(x, w, y, ones)
        boot = [w1(x, w, y, np.bincount(rng.integers(0, m, m), minlength=m).astype(np.float64))
                for _ in range(resamples)]
        lo, hi = _basic(value, boot)
        return value, lo, hi, None
    cats = sorted({str(v) for v in drawn} | {str(v) for v in audits})
    at = {c: i for i, c in enumerate(cats)}
    pd = np.bincount([at[str(v)] for v in drawn], weights=w, minlength=len(cats))
    codes = np.array([at[str(v)] for v in audits])
    js, tv = js_tv(pd, np.bincount(codes, minlength=len(cats)).astype(np.float64))
    boot = [js_tv(pd, np.bincount(codes[rng.integers(0, m, m)], minlength=len(cats)).astype(np.float64))[0]
            for _ in range(resamples)]
    lo, hi = _basic(js, boot)
    return js, lo, hi, tv


def _basic(value: float, boot: Sequence[float]) -> tuple[float, float]:
    """The basic (reverse-percentile) bootstrap interval, at least 0. A distance between a sample
    and a distribution is biased upward (two samples of one distribution are apart), and a
    resample's more so: the percentile interval would lie above the truth, and the guard would
    raise shares for nothing; the basic interval takes the resamples' excess off."""
    q_lo, q_hi = np.quantile(boot, [(1 - LEVEL) / 2, (1 + LEVEL) / 2])
    return max(0.0, 2 * value - float(q_hi)), max(0.0, 2 * value - float(q_lo))


def report_shares(report: PrototypeRound | None, before: dict[str, float] | None) -> dict[str, float] | None:
    """The raised shares the next round plays with."""
    if report is None:
        return before
    return dict(report.shares) or None


__all__ = ["KEY", "Folded", "HostRound", "Plan", "PrototypesRefused", "check", "check_population", "divergence",
           "evidence_of", "fold", "js_tv", "w1"]

