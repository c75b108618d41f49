"""Collecting a round's partials until every live share has one, then deciding it with the
run's simulation environment. Pure: no broker; the service does the I/O around it.

Partials are keyed by share (`host@epoch`), never by host alone: a replayed partial counts
once, a replacement's share replaces the one it was placed for, and a partial from a share
the round's newest announcement does not list never counts. Partials that arrive before
their round's announcement wait for it. They are merged in share order, so the decision does
not depend on arrival order. A round announced again with a new placement (a lost host's
agents re-placed) is decided again once the new shares' partials are in; the survivors'
partials are kept for that until the next round opens.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from pydantic import ValidationError

from populace.core.contracts import RoundOpen, RoundPartial, RoundResult, Usage, share_key
from populace.sdk.env import Env, Partial
from populace.sdk.registry import Resolved


class EnvironmentFailed(RuntimeError):
    """The simulation's environment raised while deciding a round."""


class BadPartial(ValueError):
    """A partial whose payload is not the simulation's partial: refused, never counted."""


@dataclass
class RunTally:
    run_id: str
    resolved: Resolved
    env: Env
    opened: dict[int, RoundOpen] = field(default_factory=dict)  # round -> its newest announcement
    partials: dict[int, dict[str, tuple[RoundPartial, Partial | None]]] = field(default_factory=dict)
    decided: dict[int, frozenset[str]] = field(default_factory=dict)  # round -> the shares it folded

    @property
    def epoch(self) -> int:
        return max((o.epoch for o in self.opened.values()), default=0)

    def open(self, opened: RoundOpen) -> RoundResult | None:
        r = opened.round
        current = self.opened.get(r)
        if current is not None and opened.epoch < current.epoch:
            return None  # an older announcement of a round placed again since
        if r < max(self.opened, default=0):
            return None  # a round before the newest one: long decided
        self.opened[r] = opened
        for old in [n for n in self.opened if n < r]:  # an earlier round is never announced again
            self.opened.pop(old)
            self.partials.pop(old, None)
            self.decided.pop(old, None)
        parts = self.partials.get(r, {})
        for key in [k for k, (p, _) in parts.items() if k not in opened.shares and p.epoch < opened.epoch]:
            parts.pop(key)  # a share this placement replaced
        return self._maybe_close(r)

    def add(self, partial: RoundPartial) -> RoundResult | None:
        """Count a share's partial (once); raises BadPartial when its payload does not validate
        or it covers more agents than its share has."""
        r, key = partial.round, share_key(partial.host_id, partial.epoch)
        opened = self.opened.get(r)
        if opened is None and r < max(self.opened, default=0):
            return None  # a straggler of a round long decided
        if opened is not None and key not in opened.shares and partial.epoch <= opened.epoch:
            return None  # not a share of this round's placement: replaced, or never placed
        if opened is not None and key in opened.shares and partial.n > opened.shares[key]:
            raise BadPartial(f"share {key} has {opened.shares[key]} agents, the partial counts {partial.n}")
        try:
            payload = self.env.Partial.model_validate(partial.payload) if partial.n else None
        except ValidationError as err:
            raise BadPartial(f"payload is not a {self.env.Partial.__name__}: {err.errors()[0]['msg']}") from None
        self.partials.setdefault(r, {})[key] = (partial, payload)
        return self._maybe_close(r)

    def _maybe_close(self, r: int) -> RoundResult | None:
        opened = self.opened.get(r)
        parts = self.partials.get(r, {})
        if opened is None or not opened.shares or any(k not in parts for k in opened.shares):
            return None
        folded = frozenset(opened.shares)
        if self.decided.get(r) == folded:
            return None  # decided already, with exactly these shares
        result = self.decide(opened, [parts[k] for k in sorted(folded)])
        self.decided[r] = folded
        return result

    def decide(self, opened: RoundOpen, parts: list[tuple[RoundPartial, Partial | None]]) -> RoundResult:
        env = self.env
        sim = type(env.sim)
        try:
            payloads = [payload for _, payload in parts if payload is not None]
            state = env.start() if opened.env_state is None else env.State.model_validate(opened.env_state)
            total = env.merge(payloads)
            state, summary = env.decide(state, opened.round, total)
            observation = env.observe(state, opened.round + 1)
            summary = sim.Summary.model_validate(summary.model_dump())
        except Exception as err:  # noqa: BLE001 - the simulation's code: the run fails, named
            raise EnvironmentFailed(f"simulation {sim.name!r}: its environment failed to decide round "
                                    f"{opened.round}: {type(err).__name__}: {err}") from err
        return RoundResult(
            run_id=self.run_id, round=opened.round, n=sum(p.n for p, _ in parts),
            n_valid=sum(p.n_valid for p, _ in parts), summary=summary.model_dump(mode="json"),
            observation=observation.model_dump(mode="json"), state=state.model_dump(mode="json"),
            closed_at=time.time(), epoch=opened.epoch, shares=sorted(opened.shares),
            usage=sum((p.usage for p, _ in parts), Usage()),
        )
