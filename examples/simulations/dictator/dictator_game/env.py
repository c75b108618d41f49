"""The environment: folds what the agents gave into a round's summary and tells the next
round what it needs to hear.

It only decides; the platform does the I/O around it. On the fleet:
- `reduce` runs on every agent-host, once per batch of ~1,000 outcomes;
- `merge` folds batches into one partial per host, then hosts into the round (environment
  service), in whatever order they arrive (here the SDK's default: a partial of whole numbers
  is summed field by field);
- `decide` closes the round once, from the merged partial.

So reduce + merge must be exact and merge commutative: integer counts and sums, never a
running float mean. Then 1 host, 3 hosts or one process per agent give identical rounds.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import Field

from dictator_game.agent import Gift, Heard
from populace.sdk import Env, Partial, State, Summary


class Gifts(Partial):
    """A batch's, a host's or the whole round's gifts: counts and integer sums only, so the
    environment's default `merge` (the sum of each field) is exact in any order."""

    n: int = 0  # valid gifts
    total: int = 0  # coins given, summed over valid gifts
    zero: int = 0  # gifts of nothing
    half: int = 0  # equal splits: as close to half as whole coins allow


class Past(State):
    """What the environment keeps between rounds. It travels with every round: keep it small
    (aggregates; per-agent state belongs in agents)."""

    last_average: float | None = None


class RoundSummary(Summary):
    """One row per round in table `dictator_rounds` (the platform adds run_id, round, n, n_valid
    and closed_at). The titles label the columns of `populace run`'s table."""

    mean_given: float | None = Field(None, title="mean given")  # coins
    given_pct: float | None = Field(None, title="given %")  # mean given, % of the endowment
    zero_pct: float | None = Field(None, title="gave nothing %")  # % of valid gifts
    half_pct: float | None = Field(None, title="equal split %")  # % of valid gifts


class DictatorEnv(Env[Past, Gifts]):  # its State and Partial: Past and Gifts
    def observe(self, state: Past, round: int) -> Heard:
        shown = state.last_average if self.params.game.show_average else None
        return Heard(round=round, last_average=shown)

    def reduce(self, agent_ids: Sequence[int], outcomes: Sequence[Gift]) -> Gifts:
        endowment = self.params.game.endowment
        # only valid answers count; a failed turn recorded the outcome's defaults (given=None)
        gifts = [o.given for o in outcomes if o.valid and o.given is not None]
        return Gifts(n=len(gifts), total=sum(gifts), zero=sum(g == 0 for g in gifts),
                     half=sum(abs(2 * g - endowment) <= 1 for g in gifts))

    def decide(self, state: Past, round: int, total: Gifts) -> tuple[Past, RoundSummary]:
        if total.n == 0:  # nobody gave a valid answer: nothing to average, nothing to tell
            return Past(), RoundSummary()
        # divisions of exact integers, once per round: the same floats on any placement
        mean = total.total / total.n
        endowment = self.params.game.endowment
        summary = RoundSummary(mean_given=mean, given_pct=100 * total.total / (total.n * endowment),
                               zero_pct=100 * total.zero / total.n, half_pct=100 * total.half / total.n)
        return Past(last_average=mean), summary
