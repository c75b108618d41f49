"""The game's environment, an Env: owns the rounds of one run, accepts host (or group)
partials, and fires a `round.result` trigger when every expected agent has answered."""

from __future__ import annotations

import time

from populace.core.contracts import GameConfig, HostPartial, RoundResult
from populace.games.rules import decide_round, merge
from populace.sdk.env import Env


class RatioGameEnv(Env):
    def __init__(self, run_id: str, parent: Env | None = None) -> None:
        super().__init__(run_id, parent)
        self.run_id = run_id
        self.results: dict[int, RoundResult] = {}
        self._expected: dict[int, tuple[int, GameConfig]] = {}
        self._partials: dict[int, dict[str, HostPartial]] = {}

    @property
    def history(self) -> list[RoundResult]:
        return [self.results[k] for k in sorted(self.results)]

    async def open_round(self, round_: int, expected: int, game: GameConfig) -> RoundResult | None:
        self._expected[round_] = (expected, game)
        return await self._maybe_close(round_)

    async def report(self, partial: HostPartial) -> RoundResult | None:
        """A host's partial for a round. Replays (same host, same round) count once."""
        if partial.round in self.results:
            return None
        self._partials.setdefault(partial.round, {})[partial.host_id] = partial
        return await self._maybe_close(partial.round)

    async def _maybe_close(self, round_: int) -> RoundResult | None:
        if round_ in self.results or round_ not in self._expected:
            return None
        expected, game = self._expected[round_]
        parts = self._partials.get(round_, {})
        if sum(p.n for p in parts.values()) < expected:
            return None
        result = decide_round(self.run_id, round_, merge(parts.values()), game, time.time())
        self.results[round_] = result
        self._partials.pop(round_, None)
        await self.emit("round.result", result)
        return result
