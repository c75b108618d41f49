"""What the players read. The system prompt (the rules) is shared by every call, so replicas cache
it; the user prompt carries the agent's persona, its last rounds, the conversation so far and
what is on the table. What the other player said is quoted as JSON text, so it stays one line
of the prompt whatever it holds."""

from __future__ import annotations

import json
from collections.abc import Sequence

from populace_bargaining.rules import Line, on_table

PROMPT_VERSION = "bargaining-1"


def system_prompt(pie: int, turns: int, say_chars: int) -> str:
    first, second = (turns + 1) // 2, turns // 2
    each = f"{first} each" if first == second else f"{first} for the first speaker, {second} for the second"
    return (f"You bargain with one other player over how to split {pie} coins. You take turns sending messages, "
            f"at most {turns} in all ({each}). In each message you say something to the other player (at most "
            f"{say_chars} characters), propose how many coins you would give them (a whole number from 0 to {pie}; "
            "you would keep the rest), and say whether you accept their latest proposal. Accepting ends the "
            "conversation: you get what they proposed to give you and they keep the rest. If no proposal is "
            "accepted by the last message, both of you get nothing. Answer with JSON only.")


def history_text(memory: Sequence[tuple], pie: int) -> str:
    if not memory:
        return ""
    lines = []
    for round_, role, deal, share, turns in memory:
        who = "spoke first" if role == "first" else "spoke second"
        what = (f"deal after {turns} messages: you got {share} of {pie} coins" if deal
                else f"no deal after {turns} messages: you got nothing")
        lines.append(f"- round {round_}: you {who}; {what}.")
    return "Your last rounds:\n" + "\n".join(lines) + "\n"


def transcript_text(lines: Sequence[Line], me: int, pie: int) -> str:
    if not lines:
        return "No messages yet: you speak first.\n"
    out = []
    for line in lines:
        mine = line.speaker == me
        if not line.valid:
            out.append(f"- {'You' if mine else 'They'}: (no valid message)")
        elif mine:
            out.append(f"- You: {json.dumps(line.say, ensure_ascii=False)} (you proposed to give them "
                       f"{line.propose}, keeping {pie - line.propose})")
        else:
            out.append(f"- They: {json.dumps(line.say, ensure_ascii=False)} (they propose to give you "
                       f"{line.propose}, keeping {pie - line.propose})")
    return "The conversation so far:\n" + "\n".join(out) + "\n"


def table_text(lines: Sequence[Line], me: int, pie: int) -> str:
    offer = on_table(lines, me)
    if offer is None:
        return "Nothing is on the table yet, so `accept` has no effect in this message.\n"
    return (f"On the table: they give you {offer.propose} of {pie} coins and keep {pie - offer.propose}. "
            "Accepting ends the conversation with that split.\n")


def message_prompt(persona: str | None, history: str, lines: Sequence[Line], me: int, turn: int, turns: int,
                   pie: int, cot: bool) -> str:
    lead = f"{persona}\n" if persona else ""
    when = (f"This is message {turn} of {turns}, the last: if you do not accept now, both of you get nothing."
            if turn == turns else f"This is message {turn} of {turns}.")
    ask = ('Think step by step, then answer {"reasoning": "...", "say": "...", "propose": n, "accept": true|false}.'
           if cot else 'Answer {"say": "...", "propose": n, "accept": true|false}.')
    return f"{lead}{history}{transcript_text(lines, me, pie)}{table_text(lines, me, pie)}{when} {ask}"


def answer_schema(pie: int, say_chars: int, cot: bool) -> dict:
    props: dict = {"reasoning": {"type": "string"}} if cot else {}
    props["say"] = {"type": "string", "maxLength": say_chars}
    props["propose"] = {"type": "integer", "minimum": 0, "maximum": pie}
    props["accept"] = {"type": "boolean"}
    return {"type": "object", "properties": props, "required": list(props), "additionalProperties": False}
