"""Posts, inboxes and mail, pure: what an agent hears is exactly its in-neighbours' posts of the
round before (and the round's broadcasts), whatever way the mail travels — in shards, twice, in
any order — and a post that cannot travel is its agent's invalid outcome, never a lost round."""

from __future__ import annotations

import asyncio
import math
import sys
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from populace.core.contracts import Broadcast, RunConfig
from populace.graph import build_graph, parse_graph
from populace.sdk.mailbox import Mailbox, MailIn, owned_mask, route
from populace.sdk.mailroom import BROADCAST_AUTHOR, SHARD_BYTES, Mailroom
from populace.sdk.post import Post, PostError, post_hash, to_wire

sys.path.insert(0, str(Path(__file__).parents[1] / "e2e" / "sims"))


class Say(Post):
    stance: float = 0.0


class Out:
    def __init__(self, post) -> None:
        self.post = post
        self.valid = True


def graph(n=60, degree=6, seed=1):
    return build_graph(parse_graph({"generator": "small-world", "degree": degree, "rewire": 0.4}, n), n, seed=seed)


def naive_inbox(g, posts: dict[int, tuple[str, dict]], aid: int) -> list[int]:
    return [int(s) for s in g.sources[g.offsets[aid]:g.offsets[aid + 1]] if int(s) in posts]


def test_to_wire_names_what_cannot_travel():
    names = ("stance",)
    assert to_wire(Say(text="hi", stance=0.5), Say, names) == ("hi", {"stance": 0.5})
    with pytest.raises(PostError, match="not the simulation's Say"):
        to_wire(Post(text="hi"), Say, names)
    with pytest.raises(PostError, match="outcome.post.text"):
        to_wire(Say(text=3), Say, names)  # type: ignore[arg-type]
    with pytest.raises(PostError, match="finite"):
        to_wire(Say(text="x", stance=math.nan), Say, names)
    with pytest.raises(PostError, match="JSON"):
        to_wire(Say(text="x", stance=object()), Say, names)  # type: ignore[arg-type]


def test_heard_counts_and_digests_match_a_naive_recount():
    g = graph(200, 8)
    rng = np.random.default_rng(4)
    box = Mailbox(g, Say, 1)
    posts = {}
    for a in rng.choice(200, 130, replace=False).tolist():
        posts[a] = (f"post {a}", {"stance": float(rng.uniform(-1, 1))})
        box.put(a, None, *posts[a])
    ids = np.arange(200)
    counts, digests = box.heard(ids)
    for a in range(200):
        heard = naive_inbox(g, posts, a)
        assert counts[a] == len(heard)
        assert digests[a] == sum(post_hash(s, *posts[s]) for s in heard) % 2**63
        assert [m.author for m in box.inbox(a)] == heard
        assert all(m.post == Say(text=posts[m.author][0], stance=posts[m.author][1]["stance"]) for m in box.inbox(a))


def test_route_sends_each_share_exactly_the_authors_its_agents_hear():
    g = graph(90, 6)
    shares = {"a@0": [(0, 30)], "b@0": [(30, 30)], "c@1": [(60, 30)]}
    own = owned_mask(90, shares["a@0"])
    routed = route(g, own, {k: v for k, v in shares.items() if k != "a@0"})
    for key, ranges in shares.items():
        if key == "a@0":
            continue
        hearers = [v for f, c in ranges for v in range(f, f + c)]
        expect = sorted({int(s) for v in hearers for s in g.sources[g.offsets[v]:g.offsets[v + 1]] if s < 30})
        assert routed[key].tolist() == expect


def test_mail_in_keeps_each_shard_once_and_knows_what_is_missing():
    m = MailIn(3)
    assert m.missing(["x@0", "y@0"]) == ["x@0", "y@0"]
    assert m.add("x@0", 1, 2, "second") and not m.add("x@0", 1, 2, "again")
    assert not m.add("x@0", 0, 3, "a contradicting count")
    assert not m.add("x@0", 5, 2, "out of range")
    assert m.missing(["x@0"]) == ["x@0"]
    assert m.add("x@0", 0, 2, "first")
    assert m.add("y@0", 0, 1, None)
    assert m.missing(["x@0", "y@0"]) == []
    assert sorted(m.payloads(["x@0"])) == ["first", "second"]
    assert list(m.payloads(["z@9"])) == []


def _played(room: Mailroom, round_: int, ids, texts):
    outs = [Out(Say(text=t, stance=0.25)) for t in texts]
    return room.record(round_, room.reading(round_), list(ids), outs, [None] * len(outs), [True] * len(outs))


def test_mail_in_shards_twice_and_shuffled_fills_the_same_mailbox_as_one_process():
    g = graph(120, 8)
    place = {"a@0": [(0, 60)], "b@0": [(60, 60)]}
    whole = Mailroom(g, Say, [(0, 120)])
    long = "x" * 6000  # big posts: several shards per pair
    _played(whole, 1, range(120), [f"{i} {long}" for i in range(120)])
    a, b = Mailroom(g, Say, place["a@0"]), Mailroom(g, Say, place["b@0"])
    _played(a, 1, range(60), [f"{i} {long}" for i in range(60)])
    _played(b, 1, range(60, 120), [f"{i} {long}" for i in range(60, 120)])
    out = b.outgoing(1, place, me=["b@0"])
    assert len(out) > 1 and all(m.to == "a@0" and m.shards == len(out) for m in out)
    assert all(sum(len(t) * 2 for t in m.texts) <= SHARD_BYTES + 13000 for m in out)
    assert b.outgoing(1, place, me=["b@0"]) == []  # sent once
    for m in [*reversed(out), *out]:  # in any order, every shard twice
        a.receive(1, "b@0", m.shard, m.shards, (m.authors, m.texts, m.fields))
    assert a.missing(1, ["b@0"]) == []
    assert a.deliver(1, {"b@0": place["b@0"]})[1] == 0
    for v in range(60):
        assert a.box(1).inbox(v) == whole.box(1).inbox(v)
    assert (a.box(1).heard(np.arange(60))[1] == whole.box(1).heard(np.arange(60))[1]).all()


def test_a_share_with_no_author_heard_still_gets_one_empty_message_and_a_new_share_gets_the_round_again():
    g = graph(40, 4)
    place = {"a@0": [(0, 20)], "b@0": [(20, 20)]}
    a = Mailroom(g, Say, place["a@0"])
    a.record(1, a.reading(1), list(range(20)), [Out(None)] * 20, [None] * 20, [True] * 20)  # nobody posted
    out = a.outgoing(1, place, me=["a@0"])
    assert [(m.to, m.shards, m.authors) for m in out] == [("b@0", 1, [])]
    replaced = {"a@0": [(0, 20)], "c@1": [(20, 20)]}
    assert [m.to for m in a.outgoing(1, replaced, me=["a@0"])] == ["c@1"]


def test_mail_naming_authors_outside_its_sender_is_refused():
    g = graph(40, 4)
    a = Mailroom(g, Say, [(0, 20)])
    a.receive(1, "b@0", 0, 1, ([21, 5], ["ok", "forged: agent 5 is a's own"], [None, None]))
    kept, refused = a.deliver(1, {"b@0": [(20, 20)]})
    assert (kept, refused) == (1, 1)
    assert a.box(1).has[21] and not a.box(1).has[5]


def test_a_post_that_cannot_travel_is_its_agents_invalid_outcome():
    g = graph(20, 4)
    room = Mailroom(g, Say, [(0, 20)])
    outs = [Out(Say(text="fine")), Out(Post(text="not a Say")), Out(Say(text="x", stance=math.inf))]
    errors, valid = [None] * 3, [True] * 3
    cols = room.record(1, room.reading(1), [0, 1, 2], outs, errors, valid)
    assert cols["texts"] == ["fine", None, None]
    assert valid == [True, False, False] and not outs[1].valid
    assert "not the simulation's Say" in errors[1] and "finite" in errors[2]


def test_broadcasts_reach_whom_they_name_in_their_round_only():
    g = graph(50, 4)
    casts = [Broadcast(round=2, text="to all"), Broadcast(round=2, text="top", to="top-degree", count=3),
             Broadcast(round=3, text="two", to="agents", agents=[4, 7], fields={"stance": 1.0})]
    room = Mailroom(g, Say, [(0, 50)], casts)
    assert room.reading(1).inbox(0) == ()
    top = np.lexsort((np.arange(50), -g.out_degree()))[:3].tolist()
    box = room.reading(2)
    for v in range(50):
        texts = [m.post.text for m in box.inbox(v) if m.author == BROADCAST_AUTHOR]
        assert texts == (["to all", "top"] if v in top else ["to all"])
    box = room.reading(3)
    assert [m.post for m in box.inbox(7) if m.author == BROADCAST_AUTHOR] == [Say(text="two", stance=1.0)]
    assert [m for m in box.inbox(8) if m.author == BROADCAST_AUTHOR] == []


@pytest.mark.parametrize("broadcasts, field", [
    ([{"round": 1, "text": "hi"}], "broadcasts.0"),  # no graph
])
def test_broadcasts_need_a_graph(broadcasts, field):
    with pytest.raises(ValidationError, match=field):
        RunConfig.model_validate({"agents": 10, "broadcasts": broadcasts})


def test_a_local_run_on_one_host_equals_three_hosts():
    from populace.sdk.local import run_local

    config = RunConfig.model_validate({
        "simulation": "gossip_sim:Gossip", "agents": 90, "rounds": 3,
        "graph": {"generator": "scale-free", "m": 3},
        "broadcasts": [{"round": 2, "text": "b", "fields": {"level": 9}, "to": "top-degree", "count": 4}]})
    one = asyncio.run(run_local(config, hosts=1))
    three = asyncio.run(run_local(config, hosts=3))
    assert one.outcomes == three.outcomes | {"latency_ms": one.outcomes["latency_ms"]}
    assert one.posts == three.posts and len(one.posts["agent_id"]) == 90 * 3
    assert one.rounds["total"] == three.rounds["total"]


def test_a_broadcast_field_the_post_does_not_have_is_named():
    from populace.sdk.registry import resolve

    data = {"simulation": "gossip_sim:Gossip", "agents": 20, "rounds": 2,
            "graph": {"generator": "small-world", "degree": 4},
            "broadcasts": [{"round": 1, "text": "hi", "fields": {"levle": 3}}]}
    with pytest.raises(ValidationError, match=r"broadcasts.0.fields.levle: not a field of gossip's post \(it has: level\)"):
        resolve(RunConfig.model_validate(data))


def test_a_post_longer_than_the_bound_is_refused():
    with pytest.raises(PostError, match="at most 10,000"):
        to_wire(Say(text="x" * 10_001), Say, ("stance",))


@pytest.mark.parametrize("fields", [{"stance": 0.1, "b": 'é"x\n', "a": 3}, {"x": 1e-7, "y": -0.0, "z": 2**70},
                                    {"n": None, "t": True}, {"l": [1, 2.5], "d": {"k": "v"}}, {}, None])
def test_a_posts_canonical_bytes_are_its_fields_as_sorted_compact_json(fields):
    import json

    from populace.sdk.post import canonical

    body = json.dumps(fields or {}, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    assert canonical(7, "text", fields) == f"7\x1ftext\x1f{body}".encode()


def test_follows_and_unfollows_change_whom_an_agent_hears_from_the_next_round_on_any_placement():
    """Edge edits reach the mail: in round r an agent hears the round r-1 posts of whom it
    follows after round r-1 (the graph plus its edits so far, as `populace.analysis` rebuilds it
    from the `edges` table), whichever host its new authors live on."""
    from populace.sdk.edges import rebuild
    from populace.sdk.local import local_graph, run_local
    from populace.sdk.registry import resolve

    config = RunConfig.model_validate({
        "simulation": "follow_sim:Follow", "agents": 60, "rounds": 4,
        "graph": {"generator": "small-world", "degree": 4, "rewire": 0.2}})
    one = asyncio.run(run_local(config, hosts=1))
    three = asyncio.run(run_local(config, hosts=3))
    assert one.outcomes == three.outcomes | {"latency_ms": one.outcomes["latency_ms"]}
    assert one.posts == three.posts and one.edges == three.edges
    base = local_graph(resolve(config).config, None)
    edits = list(zip(one.edges["round"], one.edges["follower"], one.edges["author"], one.edges["op"], strict=True))
    assert {op for *_, op in edits} == {"add", "remove"}
    o = one.outcomes
    changed = 0
    for r, aid, authors, hears in zip(o["round"], o["agent_id"], o["authors"], o["hears"], strict=True):
        if r == 1:
            assert authors == ""  # nothing posted before round 1
            continue
        now = rebuild(60, base, edits, r - 1).get(aid, set())
        assert [int(a) for a in authors.split(",") if a] == sorted(now), (r, aid)  # everyone posts every round
        assert hears == len(now)
        changed += now != set(base.in_neighbours(aid).tolist())
    assert changed > 60  # the edits did change who hears whom


@pytest.mark.parametrize("hosts", [1, 3])
def test_a_graph_that_changes_resumes_exactly_after_any_round(hosts):
    """Each agent's edits come back from its checkpoint into the book its host's mail reads."""
    from populace.sdk.testing import check_resume

    check_resume("follow_sim:Follow", {"agents": 60, "rounds": 4,
                                       "graph": {"generator": "small-world", "degree": 4, "rewire": 0.2}}, hosts=hosts)
