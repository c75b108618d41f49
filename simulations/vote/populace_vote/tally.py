"""Counting votes, pure: no I/O, no broker.

A host folds its agents' valid choices into `VoteCounts` (one integer per option, in ballot
order); the environment adds the hosts' counts up and decides the round from the totals.
Integer sums are exact, associative and commutative, so a run gives identical rounds on one
host or on many, however the agents were spread. Invalid answers are not counted: the
platform records how many there were (`n - n_valid`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from pydantic import Field

from populace.sdk import Partial, Summary


class VoteCounts(Partial):
    """Valid choices per option, in the ballot's order."""

    counts: list[int] = []


class VoteSummary(Summary):
    """The columns of table `vote_rounds` (besides n and n_valid)."""

    leader: str | None = Field(None, title="leading option")  # None on a tie for the lead
    leader_share: float | None = Field(None, title="leading share")  # of the valid answers
    counts: dict[str, int] = Field(default_factory=dict, title="counts")  # per option, ballot order


def count(choices: Iterable[str | None], index: Mapping[str, int]) -> VoteCounts:
    """Fold choices (an option, or None for an invalid answer) into counts; `index` maps each
    option to its position on the ballot."""
    counts = [0] * len(index)
    for choice in choices:
        if choice is not None:
            counts[index[choice]] += 1  # a choice is always an option (parse_choice returns no other)
    return VoteCounts.model_construct(counts=counts)


def merge(partials: Sequence[VoteCounts], n_options: int) -> VoteCounts:
    """Add counts up (hosts, batches or groups alike). No partials: all zeros."""
    counts = [0] * n_options
    for p in partials:
        if len(p.counts) != n_options:
            raise ValueError(f"a partial counts {len(p.counts)} options, the ballot has {n_options} "
                             "(hosts playing different ballots?)")
        for i, c in enumerate(p.counts):
            counts[i] += c
    return VoteCounts.model_construct(counts=counts)


def summarize(options: Sequence[str], total: VoteCounts) -> VoteSummary:
    """The round's distribution, its leading option and that option's share of the valid
    answers. A tie for the lead has no leader (the counts show who tied); no valid answer has
    neither leader nor share."""
    counts = dict(zip(options, total.counts, strict=True))
    n_valid = sum(total.counts)
    if n_valid == 0:
        return VoteSummary(counts=counts)
    top = max(total.counts)
    leaders = [o for o, c in counts.items() if c == top]
    return VoteSummary(leader=leaders[0] if len(leaders) == 1 else None, leader_share=top / n_valid,
                       counts=counts)

