"""When a finished run is recorded, and whether it is whole. Pure: the store counts, the service
announces.

A run is announced recorded once every outcome its round results counted is in DuckDB, or is
known to be missing: a group refused from a batch that was otherwise recorded (its message id is
in the ledger, so no redelivery brings it back). An outcome neither recorded nor refused may still
come (a redelivery, a restarted recorder's successor): the recorder waits for it, but only while
outcomes keep coming — once none came for `wait_s`, what is still missing is missing. A run
announced with anything missing (outcomes, acts or lines) is never `completed`: it is
`incomplete`, with a reason that says which rounds lack how many rows, and why."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RoundTally:
    """One round of a run as recorded: what its result counted, what is in, what was refused."""

    round: int
    n: int | None  # outcomes its round result counted (None: no result recorded)
    got: int  # outcomes recorded
    refused: int = 0  # outcomes of refused groups, not recorded since
    acts: int = 0  # acts of refused groups
    lines: int = 0  # lines of refused groups
    groups: int = 0  # refused groups
    first: str | None = None  # the first refused group, where and why: "group 17 of host-1@0 refused: …"


@dataclass(frozen=True)
class Verdict:
    wait: bool  # some outcomes may still come: ask again later
    reason: str | None = None  # what is missing (None: nothing)
    outcomes_missing: int = 0
    acts_missing: int = 0
    lines_missing: int = 0
    refused_groups: int = 0
    unexplained: int = 0  # outcomes neither recorded nor refused (waited for, in vain)


def verdict(rounds: list[RoundTally], quiet_s: float, wait_s: float) -> Verdict:
    """Whether to announce the run now, and what it lacks. `rounds`: its rounds from the first
    it plays to its last; `quiet_s`: how long no outcome of it was recorded."""
    unexplained = sum(max(0, r.n - r.got - r.refused) for r in rounds if r.n is not None)
    unclosed = [r.round for r in rounds if r.n is None]
    if (unexplained or unclosed) and quiet_s < wait_s:
        return Verdict(wait=True)
    parts = [line for r in rounds if (line := _round_line(r, wait_s))]
    if unclosed:
        parts.append(f"round{'s' if len(unclosed) > 1 else ''} {_spans(unclosed)}: no result recorded "
                     f"(none came in {wait_s:g}s)")
    missing = sum(max(0, r.n - r.got) for r in rounds if r.n is not None)
    acts, lines = sum(r.acts for r in rounds), sum(r.lines for r in rounds)
    return Verdict(wait=False, reason="; ".join(parts) or None, outcomes_missing=missing, acts_missing=acts,
                   lines_missing=lines, refused_groups=sum(r.groups for r in rounds),
                   unexplained=unexplained + len(unclosed))


def _round_line(r: RoundTally, wait_s: float) -> str | None:
    """One round's shortfall: "round 2: 24 of 4,000 outcomes, 30 acts and 26 lines missing (…)"."""
    if r.n is None:
        return None
    missing = max(0, r.n - r.got)
    what = [f"{missing:,} of {r.n:,} outcomes"] if missing else []
    what += [f"{r.acts:,} act{'s' if r.acts != 1 else ''}"] if r.acts else []
    what += [f"{r.lines:,} line{'s' if r.lines != 1 else ''}"] if r.lines else []
    if not what:
        return None
    why = []
    if r.groups:
        why.append(r.first if r.groups == 1 else f"{r.groups:,} groups refused, the first {r.first}")
    lost = missing - r.refused
    if lost > 0:
        why.append(f"{lost:,} never arrived: none came in {wait_s:g}s")
    listed = what[0] if len(what) == 1 else ", ".join(what[:-1]) + " and " + what[-1]
    return f"round {r.round}: {listed} missing" + (f" ({'; '.join(why)})" if why else "")


def _spans(rounds: list[int]) -> str:
    """1, 2, 3, 5 -> "1-3, 5"."""
    out: list[str] = []
    start = prev = rounds[0]
    for n in [*rounds[1:], None]:
        if n is not None and n == prev + 1:
            prev = n
            continue
        out.append(str(start) if start == prev else f"{start}-{prev}")
        if n is not None:
            start = prev = n
    return ", ".join(out)
