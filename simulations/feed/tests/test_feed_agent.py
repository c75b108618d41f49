"""The agent and its view, played by the platform's own round engine with a scripted model:
what each agent is asked (its feed, numbered, with the authors it follows marked), what its
answer does (likes and reposts by post id, follows and unfollows as edge edits, an invalid
answer nothing), and that whom it follows reaches its feed through the view on its host, also
when it runs in its own process."""

from __future__ import annotations

import json
import re

import pytest
from populace_feed import Microblog, Timeline, User
from populace_feed.parsing import Answer
from populace_feed.simulation import act

from populace.core.contracts import RunConfig
from populace.sdk import Cast, Persona, ScriptedLLM, resolve
from populace.sdk.hosting import host_run
from populace.sdk.local import run_local

POST = re.compile(r"^\[(\d+)\] @(\d+)( \(you follow them\))?,", re.M)


def config(agents: int = 6, rounds: int = 1, **params) -> RunConfig:
    return RunConfig.model_validate({"simulation": "feed", "agents": agents, "rounds": rounds, "seed": 2,
                                     "activity": {"default": 1.0}, "pool": {"seed_posts": 8, "size": 20},
                                     "recommender": {"k": 4}, **params})


def reply(stance=1, post="", like=0, repost=0, follow=0, unfollow=0) -> str:
    return json.dumps({"stance": stance, "post": post, "like": like, "repost": repost, "follow": follow,
                       "unfollow": unfollow})


def feed_of(prompt: str) -> list[tuple[int, int, bool]]:
    """(number, author, followed) of each post in a prompt's feed."""
    return [(int(n), int(a), bool(f)) for n, a, f in POST.findall(prompt)]


async def play_one(run, llm, round_: int = 1):
    batches = []
    share = await run.engine.play(round_, None, None, llm, emit=batches.append)
    return share, batches


FEED = Timeline(3, -1, (40, 41, 42), (7, 8, 9), (2, -1, 0), (5, 0, 1), (0, 2, 0), ("a", "b", "c"),
                (False, True, False))


def test_a_valid_answer_likes_reposts_and_edits_by_the_feeds_ids():
    out = act(FEED, Answer(2, "Hi.", 3, 1, 1, 2), "raw")
    assert (out.stance, out.text, out.liked, out.reposted, out.followed, out.unfollowed) == (2, "Hi.", 42, 40, 7, 8)
    assert [(e.op, e.author, e.kind) for e in out.edits] == [("add", 7, "follow"), ("remove", 8, "follow")]
    assert out.valid and out.raw == "raw"


def test_a_follow_of_a_followed_author_or_an_unfollow_of_another_does_nothing():
    out = act(FEED, Answer(0, None, 0, 0, 2, 1), "raw")  # follows 8 (already), unfollows 7 (not followed)
    assert (out.followed, out.unfollowed, out.edits, out.text, out.liked, out.reposted) == (None, None, None, None,
                                                                                            None, None)
    same = act(FEED, Answer(0, None, 0, 0, 2, 2), "raw")  # both name author 8, whom it follows: an unfollow
    assert (same.followed, same.unfollowed) == (None, 8)


async def test_the_prompt_shows_the_feed_numbered_and_the_schema_fits_it():
    cast = Cast([Persona(i, f"You are Person {i}.", {"activity": "high"}) for i in range(6)])
    run = host_run(resolve(config(activity={"rates": {"high": 1.0}})), "r", [(0, 6)], cast, freeze=False)
    llm = ScriptedLLM(lambda key, prompt: reply())
    share, _ = await play_one(run, llm)
    assert share.n == share.n_valid == 6
    sim: Microblog = run.sim
    for a in llm.asked:
        persona = f"You are Person {a.key}."
        assert a.prompt.startswith(persona + "\nThe topic: \"Cities should ban private cars from their centres.\"\n")
        assert a.prefix_chars == len(persona) and a.schema is sim.schema
        shown = feed_of(a.prompt)
        assert [n for n, _, _ in shown] == [1, 2, 3, 4]  # k = 4
        assert all(author != a.key and not followed for _, author, followed in shown)
        assert a.prompt.endswith('n is a post\'s number in your feed (1 to 4), or 0 for none; follow and unfollow are '
                                 "about that post's author.")
    assert sim.schema["properties"]["like"] == {"type": "integer", "minimum": 0, "maximum": 4}
    assert sim.system_prompt().startswith("You use a microblogging platform.")


async def test_a_short_feed_gets_a_schema_that_names_only_its_posts():
    run = host_run(resolve(config(pool={"seed_posts": 2, "size": 20})), "r", [(0, 6)], freeze=False)
    llm = ScriptedLLM(lambda key, prompt: reply(like=len(feed_of(prompt))))
    await play_one(run, llm)
    for a in llm.asked:
        n = len(feed_of(a.prompt))
        assert n <= 2 and a.schema["properties"]["like"]["maximum"] == n
        assert a.schema is run.sim.schema_for(n)  # one object per length


async def test_an_invalid_answer_does_nothing_and_keeps_its_text():
    run = host_run(resolve(config()), "r", [(0, 6)], freeze=False)
    llm = ScriptedLLM(lambda key, prompt: reply(stance=9, follow=1) if key % 2 else reply(follow=1, like=1))
    share, batches = await play_one(run, llm)
    (batch,) = batches
    rows = {aid: i for i, aid in enumerate(batch.agent_ids)}
    for aid, i in rows.items():
        if aid % 2:
            assert batch.valid[i] is False and batch.raws[i] == reply(stance=9, follow=1)
            assert batch.columns["stance"][i] is None and batch.columns["followed"][i] is None
        else:
            assert batch.valid[i] and batch.columns["followed"][i] is not None and batch.columns["liked"][i] is not None
    assert batch.edits["follower"] == [aid for aid in batch.agent_ids if aid % 2 == 0]
    p = share.partial
    assert (p.agents, p.answered, p.follows, int(p.liked_n.sum())) == (6, 3, 3, 3)


@pytest.mark.parametrize("one_per_process", [False, True])
async def test_whom_an_agent_follows_reaches_its_next_feed_through_its_hosts_view(one_per_process):
    """Round 1: every agent follows the author of its first post (and posts); round 2: those
    authors are marked and their posts lifted to the top by the boost, read from the host's edges —
    also when the agent's turn runs in its own process, where following() is not available."""
    chosen: dict[int, int] = {}

    def script(run, round_):
        def answer(key: int, prompt: str) -> str:
            shown = feed_of(prompt)
            if round_ == 1:
                chosen[key] = shown[0][1]
                return reply(post=f"from {key}", follow=1)
            followed = {author for _, author, f in shown if f}
            assert followed == {chosen[key]} & {a for _, a, _ in shown}, (key, shown)
            assert shown[0][1] == chosen[key]  # a boost of 10 puts its posts first
            return reply()
        return ScriptedLLM(answer)

    c = config(rounds=2, recommender={"k": 4, "follow_boost": 10.0})
    result = await run_local(c, llm=script, one_per_process=one_per_process)
    assert result.rounds["follows"] == [6, 0] and result.rounds["posts"] == [6, 0]
    assert result.edges["follower"] == list(range(6)) and result.edges["author"] == [chosen[a] for a in range(6)]


def test_an_agent_is_a_small_object():
    assert User.__slots__ == ()
    agent = host_run(resolve(config()), "r", [(0, 6)], freeze=False).agents[0]
    assert isinstance(agent, User) and not hasattr(agent, "__dict__")


def test_the_manifests_example_prompt_is_agent_0s_first():
    sim = resolve(config()).instance()
    example = sim.user_example()
    assert example.startswith('The topic: "Cities should ban private cars from their centres."\nYour stance so far:')
    assert len(feed_of(example)) == 4
