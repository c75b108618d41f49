"""The opinion simulation's prompts and answer schema, as pure functions.

The *system* prompt is shared by every agent of a run (replicas keep it in their prefix
cache): the discussion, the statement, the stance scale, what a post is, and the answer
instruction. The *user* prompt is per agent, one part per line: its persona (first, and the
same every round, so it stays in the replica's prefix cache), its own last stance, what it
read of what it heard, and the request.

Heard texts are shown as JSON strings (quoted, newlines escaped), so a post can neither end
its line nor pass for an instruction of ours.
"""

from __future__ import annotations

from collections.abc import Iterable
from json.encoder import encode_basestring

from populace.sdk import Message
from populace_opinion.hearing import Reading
from populace_opinion.params import POST_MAX_CHARS
from populace_opinion.scale import to_micro

# Bump when any text below changes: the manifest records it with every run.
PROMPT_VERSION = "opinion-v1"

DISCUSSION = "You are taking part in a public discussion together with many other people."
SCALE = "Your stance on it is a number from -1 (strongly disagree) through 0 (neutral) to 1 (strongly agree)."
ROUNDS = ("The discussion goes over several rounds. In each round you read posts that people you follow "
          "wrote in the round before, with the stance each of them took, and then give your own stance again.")
POST = (f"With your stance you write one post: a single sentence of at most {POST_MAX_CHARS} characters, "
        "read by the people who follow you.")
SPEAK_AS_PERSONA = "Answer in the role of the person described to you, from their circumstances and views."

ANSWER_INSTRUCTIONS: dict[str, str] = {
    "direct": ('Answer with JSON only, in the form {"stance": <a number from -1 to 1>, "post": "<your post>"}.'),
    "cot": ("Think step by step about the statement from your own point of view before you answer. Answer with "
            'JSON only, in the form {"reasoning": "<your step-by-step thinking>", '
            '"stance": <a number from -1 to 1>, "post": "<your post>"}.'),
}

USER_REQUESTS: dict[str, str] = {
    "direct": "What is your stance now, and what do you post?",
    "cot": "Think step by step, then give your stance and your post.",
}


def quoted(text: str) -> str:
    """`text` as a JSON string literal (what json.dumps(text, ensure_ascii=False) gives), via
    json's C encoder directly: this runs once per heard post per agent."""
    return encode_basestring(text)


def stance_text(value: float) -> str:
    return f"{value:+.2f}"


def system_prompt(statement: str, answer: str = "direct", persona: bool = False, rounds: int = 1) -> str:
    """`persona`: whether the agents' prompts carry personas (then they are told to answer as
    that person); `rounds`: the run's rounds (a single round is never announced as several)."""
    parts = [DISCUSSION, f"The statement under discussion: {quoted(statement)}", SCALE]
    if rounds > 1:
        parts.append(ROUNDS)
    parts.append(POST)
    if persona:
        parts.append(SPEAK_AS_PERSONA)
    parts.append(ANSWER_INSTRUCTIONS[answer])
    return " ".join(parts)


def own_stance_text(memory: Iterable[tuple[int, float]]) -> str:
    """The agent's last valid stance (its memory: (round, stance)), or '' before it gave one."""
    last = None
    for item in memory:
        last = item
    if last is None:
        return ""
    round_, stance = last
    return f"Your stance in round {round_} was {stance_text(stance)}."


def post_line(text: str, stance: float | None) -> str:
    """One heard post in a prompt: its text quoted, and its stance when it has one on the
    scale (a broadcast may come without)."""
    line = f"- {quoted(text)}"
    return line if stance is None else f"{line} (stance {stance_text(stance)})"


def _line(message: Message) -> str:
    post = message.post
    line = getattr(post, "line", None)  # the simulation's Say renders itself once per host
    if line is not None:
        return line
    stance = getattr(post, "stance", None)
    return post_line(post.text, stance if to_micro(stance) is not None else None)


def heard_text(reading: Reading) -> str:
    """The messages read, broadcasts first, one per line ('' when none)."""
    parts = []
    if reading.broadcasts:
        parts.append("Sent to many people at once, not by someone you follow:")
        parts.extend(_line(m) for m in reading.broadcasts)
    if reading.posts:
        shown, heard = len(reading.posts), reading.posts_heard
        some = "" if shown == heard else f" ({shown} of the {heard} you heard)"
        parts.append(f"Posts of people you follow, from the last round{some}:")
        parts.extend(_line(m) for m in reading.posts)
    return "\n".join(parts)


def user_prompt(persona: str | None, own: str, heard: str, answer: str = "direct") -> str:
    """Persona first (constant per agent: the cacheable prefix), then what changes per round."""
    return "\n".join(p for p in (persona, own, heard, USER_REQUESTS[answer]) if p)


def answer_schema(answer: str = "direct") -> dict:
    """One JSON object, one call per decision. With chain of thought the reasoning comes first,
    so the model thinks before it commits."""
    properties: dict[str, dict] = {
        "stance": {"type": "number", "minimum": -1, "maximum": 1},
        "post": {"type": "string", "minLength": 1, "maxLength": POST_MAX_CHARS},
    }
    if answer == "cot":
        properties = {"reasoning": {"type": "string"}, **properties}
    return {"type": "object", "properties": properties, "required": list(properties),
            "additionalProperties": False}
