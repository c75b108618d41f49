"""Collecting a round's partials until every expected agent is counted, then deciding it with
the run's simulation environment. Pure: no broker; the service does the I/O around it.

A host's partial counts once per round (a replay changes nothing); partials that arrive
before their round's open wait for it; partials of a closed round are ignored. Partials are
merged in host order, so the decision does not depend on arrival order. Everything is keyed
by (round, epoch): a resumed run plays a round again in a new epoch, which is a new round
here, and a straggler of the old epoch changes nothing.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from pydantic import ValidationError

from populace.core.contracts import RoundOpen, RoundPartial, RoundResult
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
    opened: dict[tuple[int, int], RoundOpen] = field(default_factory=dict)  # (round, epoch) ->
    partials: dict[tuple[int, int], dict[str, tuple[RoundPartial, Partial]]] = field(default_factory=dict)
    closed: set[tuple[int, int]] = field(default_factory=set)
    epoch: int = 0  # the newest epoch seen: older ones are stale

    def open(self, opened: RoundOpen) -> RoundResult | None:
        key = (opened.round, opened.epoch)
        if key in self.closed or opened.epoch < self.epoch:
            return None
        self.epoch = opened.epoch
        self.opened[key] = opened
        return self._maybe_close(key)

    def add(self, partial: RoundPartial) -> RoundResult | None:
        """Count a host's partial (once); raises BadPartial when its payload does not validate."""
        key = (partial.round, partial.epoch)
        if key in self.closed or partial.epoch < self.epoch:
            return None
        try:
            payload = self.env.Partial.model_validate(partial.payload) if partial.n else None
        except ValidationError as err:
            raise BadPartial(f"payload is not a {self.env.Partial.__name__}: {err.errors()[0]['msg']}") from None
        self.partials.setdefault(key, {})[partial.host_id] = (partial, payload)
        return self._maybe_close(key)

    def _maybe_close(self, key: tuple[int, int]) -> RoundResult | None:
        opened = self.opened.get(key)
        parts = self.partials.get(key, {})
        if opened is None or sum(p.n for p, _ in parts.values()) < opened.expected:
            return None
        result = self.decide(opened, [parts[h] for h in sorted(parts)])
        self.closed.add(key)
        self.opened.pop(key, None)
        self.partials.pop(key, None)
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
            closed_at=time.time(), epoch=opened.epoch,
        )
