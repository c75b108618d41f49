"""What the players read. The system prompt (the rules) is shared by every call, so replicas cache
it; the user prompt carries the agent's persona, its last rounds and this act's question."""

from __future__ import annotations

from collections.abc import Sequence

PROMPT_VERSION = "ultimatum-2"  # 2: an invalid reply is recalled as such, not as "rejected"


def system_prompt(pie: int) -> str:
    return (f"You play the ultimatum game. Two players split {pie} coins. The proposer offers the responder "
            f"a whole number of coins from 0 to {pie}. If the responder accepts, the responder gets the offer "
            "and the proposer keeps the rest; if the responder rejects, both get nothing. "
            "Answer with JSON only.")


def history_text(memory: Sequence[tuple]) -> str:
    if not memory:
        return ""
    lines = []
    for round_, role, offer, accepted, payoff in memory:
        if offer is None:
            what = "no valid offer"
        else:
            what = f"offer {offer}, {'no valid reply' if accepted is None else 'accepted' if accepted else 'rejected'}"
        lines.append(f"- round {round_}: you were the {role}; {what}; you got {payoff}.")
    return "Your last rounds:\n" + "\n".join(lines) + "\n"


def offer_prompt(persona: str | None, history: str, pie: int, cot: bool) -> str:
    lead = f"{persona}\n" if persona else ""
    ask = ('Think step by step, then answer {"reasoning": "...", "offer": n}.' if cot
           else 'Answer {"offer": n}.')
    return f"{lead}{history}You are the proposer. How many of the {pie} coins do you offer? {ask}"


def respond_prompt(persona: str | None, history: str, pie: int, offer: int, cot: bool) -> str:
    lead = f"{persona}\n" if persona else ""
    ask = ('Think step by step, then answer {"reasoning": "...", "accept": true|false}.' if cot
           else 'Answer {"accept": true} or {"accept": false}.')
    return (f"{lead}{history}You are the responder. The proposer offers you {offer} of {pie} coins "
            f"(keeping {pie - offer}). Do you accept? {ask}")


def offer_schema(pie: int, cot: bool) -> dict:
    props: dict = {"reasoning": {"type": "string"}} if cot else {}
    props["offer"] = {"type": "integer", "minimum": 0, "maximum": pie}
    return {"type": "object", "properties": props, "required": list(props), "additionalProperties": False}


def respond_schema(cot: bool) -> dict:
    props: dict = {"reasoning": {"type": "string"}} if cot else {}
    props["accept"] = {"type": "boolean"}
    return {"type": "object", "properties": props, "required": list(props), "additionalProperties": False}
