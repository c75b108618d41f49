"""The recommender toolkit's complete small example (examples/simulations/hot_posts, shown whole in
docs/worlds.md): identical rows — outcomes with their id-list column, rounds and `shown` — on one
host, three and one agent per process; every reader's page is what it was shown, and it upvotes
one of them."""

from __future__ import annotations

import sys
from pathlib import Path

from populace.core.contracts import RunConfig
from populace.core.scenario import load_scenario
from populace.sdk.local import run_local
from populace.sdk.registry import resolve

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "simulations" / "hot_posts"))
from hot_posts import HotPosts

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "simulations" / "hot_posts"


def without(columns: dict, *names: str) -> dict:
    return {k: v for k, v in columns.items() if k not in names}


async def test_hot_posts_plays_the_same_anywhere_and_records_what_each_reader_was_shown():
    config = load_scenario(EXAMPLE / "scenario.yaml").model_copy(update={"agents": 24, "rounds": 3})
    resolved = resolve(RunConfig.model_validate(config.model_dump()), HotPosts)
    assert resolved.tables().shown_items == "item_id"
    assert [(c.name, c.type) for c in resolved.tables().outcome_columns] == [("upvoted", "BIGINT"),
                                                                               ("passed", "BIGINT[]")]
    one = await run_local(resolved)
    for other in (await run_local(resolved, hosts=3), await run_local(resolved, one_per_process=True)):
        assert without(other.outcomes, "latency_ms") == without(one.outcomes, "latency_ms")
        assert without(other.rounds, "closed_at") == without(one.rounds, "closed_at")
        assert other.shown == one.shown
    o, s = one.outcomes, one.shown
    assert (s["round"], s["agent_id"]) == (o["round"], o["agent_id"])  # every reader, every round
    for items, ranks, upvoted, passed in zip(s["items"], s["ranks"], o["upvoted"], o["passed"]):
        assert len(items) == 5 and ranks == [1, 2, 3, 4, 5]
        assert sorted([upvoted, *passed]) == sorted(items)
    assert one.rounds["upvotes"] == [24, 24, 24]


def test_the_docs_show_the_example_as_it_is():
    page = (ROOT / "docs" / "worlds.md").read_text()
    assert (EXAMPLE / "hot_posts.py").read_text() in page
