"""The game's arithmetic, pure: payoffs of a pair, and the round's exact counts (integers only,
so one host or many give the same round)."""

from __future__ import annotations

import json
from collections.abc import Iterable

from populace.sdk import Partial, Summary


def payoffs(pie: int, offer: int | None, accepted: bool | None) -> tuple[int, int]:
    """(proposer's, responder's): a rejected or invalid offer leaves both with nothing."""
    if offer is None or not accepted:
        return 0, 0
    return pie - offer, offer


def parse(raw: str, key: str, kind: type) -> object | None:
    """The answer's `key` if it is a `kind` (bool for accept, a whole number for offer), else None."""
    try:
        value = json.loads(raw)
    except (ValueError, TypeError):
        return None
    if not isinstance(value, dict):
        return None
    v = value.get(key)
    if kind is bool:
        return v if isinstance(v, bool) else None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v != int(v):
        return None
    return int(v)


class Counts(Partial):
    pairs: int = 0  # pairs that played (a proposer and a responder)
    offers: int = 0  # valid offers
    offered: int = 0  # their sum
    replies: int = 0  # valid replies to a valid offer
    accepted: int = 0
    accepted_offered: int = 0  # the sum of accepted offers


def merge(parts: Iterable[Counts]) -> Counts:
    total = Counts()
    for p in parts:
        total = Counts(**{k: getattr(total, k) + getattr(p, k) for k in Counts.model_fields})
    return total


class RoundSummary(Summary):
    pairs: int
    mean_offer: float | None  # of valid offers, in coins
    offer_share: float | None  # mean offer / pie
    acceptance_rate: float | None  # accepted / valid replies
    mean_accepted_offer: float | None


def summary(total: Counts, pie: int) -> RoundSummary:
    mean = total.offered / total.offers if total.offers else None
    return RoundSummary(pairs=total.pairs, mean_offer=mean, offer_share=mean / pie if mean is not None else None,
                        acceptance_rate=total.accepted / total.replies if total.replies else None,
                        mean_accepted_offer=total.accepted_offered / total.accepted if total.accepted else None)
