"""The prompts as pure functions: what an agent reads of what it heard, in which order."""

from __future__ import annotations

from populace_opinion import BROADCAST, Say
from populace_opinion.hearing import listen, read
from populace_opinion.params import POST_MAX_CHARS
from populace_opinion.prompts import (
    ANSWER_INSTRUCTIONS,
    ROUNDS,
    SPEAK_AS_PERSONA,
    answer_schema,
    heard_text,
    own_stance_text,
    system_prompt,
    user_prompt,
)

from populace.sdk import Message

STATEMENT = "Cities should ban private cars from their centres."


def post(author: int, stance: float | None, text: str = "") -> Message:
    return Message(author, Say(text=text or f"post of {author}", stance=stance))


def test_the_system_prompt_states_the_statement_scale_and_answer():
    s = system_prompt(STATEMENT, "direct", persona=True, rounds=4)
    assert f'The statement under discussion: "{STATEMENT}"' in s
    assert "-1 (strongly disagree)" in s and "1 (strongly agree)" in s and f"{POST_MAX_CHARS} characters" in s
    assert ROUNDS in s and SPEAK_AS_PERSONA in s and s.endswith(ANSWER_INSTRUCTIONS["direct"])
    one = system_prompt(STATEMENT, "cot", persona=False, rounds=1)
    assert ROUNDS not in one and SPEAK_AS_PERSONA not in one and one.endswith(ANSWER_INSTRUCTIONS["cot"])


def test_round_one_without_inbox_is_persona_and_request():
    reading = read((), 10, 0, 1, 0)
    assert heard_text(reading) == "" and own_stance_text(()) == ""
    assert user_prompt("You are Ana.", "", "", "direct") == "You are Ana.\nWhat is your stance now, and what do you post?"
    assert user_prompt(None, "", "", "cot") == "Think step by step, then give your stance and your post."


def test_the_agent_is_reminded_of_its_last_stance():
    assert own_stance_text(((2, 0.4),)) == "Your stance in round 2 was +0.40."
    assert own_stance_text(((1, -1.0), (3, -0.255))) == "Your stance in round 3 was -0.26."


def test_heard_posts_are_listed_with_their_stances_broadcasts_first_and_marked():
    inbox = (post(3, -0.4, 'I "need" my car.\nReally.'), post(7, 0.25), Message(BROADCAST, Say(text="Ban cars!", stance=1.0)),
             Message(BROADCAST, Say(text="Traffic news.")))
    text = heard_text(read(inbox, 10, 0, 2, 0))
    assert text == ("Sent to many people at once, not by someone you follow:\n"
                    '- "Ban cars!" (stance +1.00)\n'
                    '- "Traffic news."\n'  # a broadcast without a stance
                    "Posts of people you follow, from the last round:\n"
                    '- "I \\"need\\" my car.\\nReally." (stance -0.40)\n'  # quoted: one line, no injection
                    '- "post of 7" (stance +0.25)')
    prompt = user_prompt("You are Ana.", "Your stance in round 1 was +0.10.", text)
    assert prompt.startswith("You are Ana.\nYour stance in round 1 was +0.10.\nSent to many people")
    assert prompt.endswith("What is your stance now, and what do you post?")


def test_past_the_cap_a_seeded_sample_is_read_in_inbox_order():
    inbox = tuple(post(a, a / 100) for a in range(30))
    first = read(inbox, 10, 0, 2, 5)
    assert first == read(inbox, 10, 0, 2, 5)  # reproducible
    assert len(first.posts) == 10 and first.posts_heard == 30 and first.broadcasts == ()
    authors = [m.author for m in first.posts]
    assert authors == sorted(authors) and authors != list(range(10))  # not just the lowest ids
    assert [m.author for m in read(inbox, 10, 0, 3, 5).posts] != authors  # another round, another sample
    assert "Posts of people you follow, from the last round (10 of the 30 you heard):" in heard_text(first)


def test_broadcasts_take_room_first():
    inbox = (*(post(a, 0.5) for a in range(5)), Message(BROADCAST, Say(text="Ban!", stance=1.0)))
    r = read(inbox, 3, 0, 2, 0)
    assert [m.author for m in r.broadcasts] == [BROADCAST] and len(r.posts) == 2 and r.posts_heard == 5
    only = read(tuple(Message(BROADCAST, Say(text=str(i))) for i in range(4)), 3, 0, 2, 0)
    assert len(only.broadcasts) == 3 and only.posts == ()


def test_what_an_agent_heard_is_summed_without_broadcasts():
    inbox = (post(1, 0.5), post(2, -0.25), post(3, None), Message(BROADCAST, Say(text="Ban!", stance=1.0)))
    heard = listen(inbox)
    assert (heard.n, heard.total, heard.squares) == (2, 250_000, 500_000 ** 2 + 250_000 ** 2)
    assert heard.mean == 0.125 and listen(()).mean is None


def test_the_answer_schema_asks_for_a_stance_and_a_short_post():
    direct = answer_schema("direct")
    assert direct["required"] == ["stance", "post"] and direct["additionalProperties"] is False
    assert direct["properties"]["stance"] == {"type": "number", "minimum": -1, "maximum": 1}
    assert direct["properties"]["post"]["maxLength"] == POST_MAX_CHARS
    assert answer_schema("cot")["required"] == ["reasoning", "stance", "post"]  # reasoning first
