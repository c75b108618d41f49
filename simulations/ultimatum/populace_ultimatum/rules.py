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
    """The answer's `key` if it is a `kind` (bool for accept, a whole number for offer — 4.0 counts,
    4.5, inf, nan, true and "4" do not), else None. Never raises: a model's text is only data."""
    try:
        value = json.loads(raw)
    except (ValueError, TypeError, RecursionError):  # RecursionError: "[[[[…" past the decoder's depth
        return None
    if not isinstance(value, dict):
        return None
    v = value.get(key)
    if kind is bool:
        return v if isinstance(v, bool) else None
    return _whole(v)


def _whole(v: object) -> int | None:
    if isinstance(v, bool):  # JSON true is not 1 coin
        return None
    if isinstance(v, float):
        return int(v) if v.is_integer() else None  # inf and nan are not integers
    return v if isinstance(v, int) else None


def coins(value: object, pie: int) -> int | None:
    """A whole number of coins from 0 to `pie`, or None (an author's agent may return anything)."""
    v = _whole(value)
    return v if v is not None and 0 <= v <= pie else None


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
