"""The game's rules, pure: what is on the table, when a conversation ends in a deal, who gets
what, and the round's exact counts (integers only, so one host or many give the same round)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import NamedTuple

from pydantic import Field

from populace.sdk import Partial, Summary


class Line(NamedTuple):
    """One message of a conversation, as the game reads it. A message that was not a valid
    answer is kept (the turn is used) with every field None: it proposes and accepts nothing."""

    speaker: int
    say: str | None
    propose: int | None  # coins the speaker would give the other
    accept: bool | None  # accepts the other's proposal on the table

    @property
    def valid(self) -> bool:
        return self.propose is not None


class View(NamedTuple):
    """What a scene shows the speaker of message `turn` (1-based): the conversation so far."""

    turn: int
    lines: tuple[Line, ...]


class Agreement(NamedTuple):
    turn: int  # messages used, the accepting one included
    proposer: int  # whose proposal was accepted
    acceptor: int
    given: int  # coins the proposer gives the acceptor (the proposer keeps the rest)


def on_table(lines: Sequence[Line], speaker: int) -> Line | None:
    """The proposal `speaker` may accept: the other's latest valid one (None: nothing yet)."""
    for line in reversed(lines):
        if line.speaker != speaker and line.valid:
            return line
    return None


def agreement(lines: Sequence[Line]) -> Agreement | None:
    """The conversation's deal: the first valid accept of a proposal on the table (an accept
    with nothing on the table does nothing). None: no deal."""
    for i, line in enumerate(lines):
        if line.valid and line.accept:
            offer = on_table(lines[:i], line.speaker)
            if offer is not None:
                return Agreement(i + 1, offer.speaker, line.speaker, offer.propose)
    return None


def shares(pie: int, deal: Agreement | None, agent: int) -> int:
    """What `agent` gets: the accepted split, or nothing without a deal."""
    if deal is None:
        return 0
    if agent == deal.acceptor:
        return deal.given
    return pie - deal.given if agent == deal.proposer else 0


class Counts(Partial):
    pairs: int = 0  # conversations (counted once, by their first speaker)
    deals: int = 0
    messages: int = 0  # messages sent in all conversations
    deal_messages: int = 0  # messages sent in conversations that ended in a deal
    first_coins: int = 0  # coins the first speakers got in deals
    unmatched: int = 0  # the odd agent of a block: no partner this round


def merge(parts: Iterable[Counts]) -> Counts:
    total = dict.fromkeys(Counts.model_fields, 0)
    for p in parts:
        for k in total:
            total[k] += getattr(p, k)
    return Counts(**total)


class RoundSummary(Summary):
    pairs: int = Field(0, title="pairs")
    deals: int = Field(0, title="deals")
    deal_rate: float | None = Field(None, title="deal rate")  # deals / pairs
    mean_turns: float | None = Field(None, title="mean messages")  # per conversation, deal or not
    mean_turns_to_deal: float | None = Field(None, title="messages to a deal")  # in conversations with a deal
    mean_first_share: float | None = Field(None, title="first speaker's coins")  # in deals
    first_share_of_pie: float | None = Field(None, title="first speaker's share")  # mean_first_share / pie
    unmatched: int = Field(0, title="unmatched")


def summary(total: Counts, pie: int) -> RoundSummary:
    first = total.first_coins / total.deals if total.deals else None
    return RoundSummary(
        pairs=total.pairs, deals=total.deals,
        deal_rate=total.deals / total.pairs if total.pairs else None,
        mean_turns=total.messages / total.pairs if total.pairs else None,
        mean_turns_to_deal=total.deal_messages / total.deals if total.deals else None,
        mean_first_share=first, first_share_of_pie=total.first_coins / (total.deals * pie) if total.deals else None,
        unmatched=total.unmatched)
