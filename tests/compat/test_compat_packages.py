"""Packages written against earlier SDK releases keep running (issue 37, item 6). Two of six
packages written a month before (a negotiation and a feed pool) failed after round 1: a tuple in
their state came back from JSON as a list. The packages in `packages/` are written the way those
were — one per shape: turns, a world with views, groups, scenes (in turn, and acts at once), a
graph, interviews — and keep
what Python authors keep: tuples, frozensets, sets, deques, dicts with int or tuple keys,
Fractions, tuples inside memory items, loose `Any` fields of a State and a Partial.

Each plays in one process, resumed after every round (`check_resume`: every agent's state is
compared with what its checkpoint gives back, between every two rounds, and every row with the
uninterrupted run's), and gives the rows it gave when pinned (`compat_rows.json`): a change of
the SDK that breaks one of them fails here. Regenerate the digests only for an intended change
of results: `POPULACE_WRITE_DIGESTS=1 uv run pytest tests/compat`."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import sys
from collections import deque
from fractions import Fraction
from pathlib import Path

import pytest

from populace.core.contracts import RunConfig
from populace.sdk import interview
from populace.sdk.local import run_local
from populace.sdk.registry import resolve
from populace.sdk.testing import check_resume, prompt_seeded

PACKAGES = Path(__file__).with_name("packages")
sys.path.insert(0, str(PACKAGES))  # the services find them by import path too (PYTHONPATH)
from compat_panel import INTERVIEWS  # noqa: E402

DIGESTS = Path(__file__).with_name("compat_rows.json")

# (import path, scenario, local options)
CASES = {
    "negotiation": ("compat_negotiation:Negotiation", {"agents": 24, "rounds": 4, "seed": 3}, {"hosts": 2}),
    "feedpool": ("compat_feedpool:FeedPool", {"agents": 20, "rounds": 4, "seed": 4}, {"hosts": 2}),
    "teams": ("compat_teams:Teams", {"agents": 22, "rounds": 4, "seed": 5}, {"hosts": 2}),  # 5 groups of 4, one of 2
    "haggle": ("compat_haggle:Haggle", {"agents": 21, "rounds": 3, "seed": 6}, {"hosts": 2}),  # one agent alone
    "auction": ("compat_auction:Auction", {"agents": 20, "rounds": 3, "seed": 9}, {"hosts": 2}),  # bids at once
    "gossip": ("compat_gossip:Gossip", {"agents": 30, "rounds": 4, "seed": 7,
                                        "graph": {"generator": "small-world", "degree": 4}}, {"hosts": 2}),
    "panel": ("compat_panel:Panel", {"agents": 24, "rounds": 3, "seed": 8, "interviews": INTERVIEWS}, {"hosts": 2}),
}
DROPPED = ("run_id", "latency_ms", "closed_at", "cached_tokens", "dollars")


def config(case: str) -> RunConfig:
    path, scenario, _ = CASES[case]
    return RunConfig.model_validate({"simulation": path, "model": {"seed": 1}, **scenario})


def played(case: str):
    _, _, options = CASES[case]
    return asyncio.run(run_local(resolve(config(case)), llm=prompt_seeded, **options))


def digest(columns: dict[str, list]) -> str:
    kept = {k: v for k, v in sorted(columns.items()) if k not in DROPPED}
    return hashlib.sha256(json.dumps(kept, sort_keys=True, default=str).encode()).hexdigest()


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_package_resumes_exactly_after_every_round(case):
    path, scenario, options = CASES[case]
    check_resume(path, {"model": {"seed": 1}, **scenario}, hosts=options.get("hosts", 1))


def test_every_package_gives_the_rows_it_gave():
    got = {}
    for case in sorted(CASES):
        result = played(case)
        assert result.status == "completed"
        got[case] = {"outcomes": digest(result.outcomes), "rounds": digest(result.rounds)}
        for table in ("posts", "acts", "transcripts", "interviews"):
            if getattr(result, table):
                got[case][table] = digest(getattr(result, table))
    if os.environ.get("POPULACE_WRITE_DIGESTS"):
        DIGESTS.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
    assert got == json.loads(DIGESTS.read_text())


def kept_state(case: str, after_round: int, agent_id: int):
    """An agent as a resume (or an interview) builds it from the checkpoint its host wrote after
    `after_round` (the run's frozen state: the same JSON), and the run's simulation instance."""
    result = played(case)
    states = dict(interview.thawed(b"[" + b",".join(s[1:-1] for s in result.states[after_round]) + b"]"))
    sim = result.resolved.instance(result.run_id, result.cast)
    return interview.copy_of(sim, agent_id, states[agent_id])


def test_what_a_checkpoint_gives_back_has_the_types_the_package_kept():
    negotiator = kept_state("negotiation", 3, 5)
    assert type(negotiator.offers) is tuple and len(negotiator.offers) == 3
    assert all(type(o) is tuple and len(o) == 2 for o in negotiator.offers)
    assert type(negotiator.best) is tuple and type(negotiator.memory[0]) is tuple

    reader = kept_state("feedpool", 3, 2)
    assert type(reader.seen) is frozenset and reader.seen
    assert type(reader.feeds) is deque and reader.feeds.maxlen == 2 and all(type(f) is tuple for f in reader.feeds)
    assert all(type(k) is int for k in reader.liked)

    member = kept_state("teams", 3, 1)
    assert type(member.share) is Fraction and type(member.payoffs) is deque and member.payoffs.maxlen == 3
    assert all(type(m[1]) is tuple for m in member.memory)  # (round, (put, total)): the inner tuple too

    trader = kept_state("haggle", 2, 0)
    assert type(trader.deals) is set and all(type(k) is tuple for k in trader.ledger) and trader.ledger

    listener = kept_state("gossip", 3, 4)
    assert type(listener.authors) is set and type(listener.levels) is tuple and listener.authors

    citizen = kept_state("panel", 2, 3)
    assert type(citizen.opinions) is tuple and all(type(o) is tuple for o in citizen.opinions)
    assert citizen.context().startswith("opinions (('")  # what an interview's prompt says, as the agent kept it


def test_the_negotiation_plays_the_same_one_agent_per_process():
    """One agent per process: the state comes from the agent's own process (pickled) and is
    written as a host writes it; the rows are those of agents in this process."""
    here = played("negotiation")
    apart = asyncio.run(run_local(resolve(config("negotiation")), llm=prompt_seeded, hosts=2, one_per_process=True))
    assert digest(apart.outcomes) == digest(here.outcomes) and digest(apart.rounds) == digest(here.rounds)


def test_the_panels_interviews_answer_from_the_state_the_agents_kept():
    """A post-hoc interview after round 2 (copies made from the checkpointed state) gives the
    answers the planned panel gave after round 2."""
    result = played("panel")
    survey = interview.Survey.model_validate({"id": "panel", "questions": INTERVIEWS[0]["questions"]})
    later = asyncio.run(interview_local_of(result, survey))
    planned = {(a, v) for r, a, v in zip(result.interviews["after_round"], result.interviews["agent_id"],
                                          result.interviews["answer"], strict=True) if r == 2}
    assert planned and {(a, v) for a, v in zip(later["agent_id"], later["answer"], strict=True)} == planned


async def interview_local_of(result, survey):
    from populace.sdk.local import interview_local

    return await interview_local(result, 2, survey, sample=INTERVIEWS[0]["sample"], llm=prompt_seeded)


def test_acts_started_together_are_numbered_as_started_and_play_alike_one_per_process():
    """The auction's bids are `asyncio.gather`ed (docs/simulations.md, scenes): each group's acts
    are numbered 0, 1, 2 in the members' order, whatever order they finished in, and the rows are
    the same with the agents in their own processes."""
    here = played("auction")
    acts = list(zip(here.acts["round"], here.acts["group_id"], here.acts["seq"], here.acts["agent_id"], strict=True))
    groups = {(r, g) for r, g, _, _ in acts}
    for r, g in groups:
        mine = sorted((seq, a) for rr, gg, seq, a in acts if (rr, gg) == (r, g))
        assert mine == [(i, a) for i, a in enumerate(sorted(a for _, a in mine))]
    apart = asyncio.run(run_local(resolve(config("auction")), llm=prompt_seeded, hosts=2, one_per_process=True))
    for table in ("outcomes", "rounds", "acts"):
        assert digest(getattr(apart, table)) == digest(getattr(here, table)), table
