"""populace.client.steer: what `populace cancel|fork` and the manager's run page both check,
and the fork form's pure parts (populace.manager.views)."""

from __future__ import annotations

import pytest

from populace.client.steer import OverrideError, cancel_refusal, overrides, where
from populace.core.contracts import RoundResult, RunConfig, RunState, Usage
from populace.manager import views


def state(status: str, rnd: int) -> RunState:
    return RunState(run_id="r1", status=status, round=rnd, config=RunConfig(agents=10, rounds=4), shares=[])


def test_cancel_is_refused_unless_the_run_plays():
    assert cancel_refusal(state("running", 2)) is None and cancel_refusal(state("spawning", 0)) is None
    assert cancel_refusal(state("done", 4)) == "run r1 is done (4 of 4 rounds completed): nothing to cancel"
    assert where(state("running", 3)) == "2 of 4 rounds completed"
    assert views.can_cancel(state("running", 1)) and not views.can_cancel(state("cancelled", 1))


def test_overrides_are_the_clis_set_pairs():
    assert overrides(["game.ratio=1/2", "rounds=5", "name="]) == {"game": {"ratio": "1/2"}, "rounds": 5, "name": ""}
    with pytest.raises(OverrideError, match=r"--set: 'words' is not KEY=VALUE"):
        overrides(["words"])
    with pytest.raises(OverrideError, match="sets inside a value that is not a mapping"):
        overrides(["rounds=5", "rounds.x=1"])


def test_the_fork_forms_lines_and_fields():
    assert views.change_lines("# why\n rounds=5 \n\ngame.ratio=1/2\n") == ["rounds=5", "game.ratio=1/2"]
    assert views.fork_field("--from-round: run r1 has completed 2 round(s); fork from 1..2") == "after_round"
    assert views.fork_field("run 'x' is not known on this stack (KV 'runs')") == ""
    assert views.fork_field("agents: a fork keeps its parent's agents") == "changes"


def test_every_number_of_a_summary_is_sent_the_first_two_charted():
    r = RoundResult(run_id="r1", round=1, n=10, n_valid=10, observation={}, closed_at=0.0, usage=Usage(),
                    summary={"mean": 30.0, "target": 20.0, "label": "x", "winner_agent_id": 7, "n_winners": 1})
    row = views.result_row(r)
    assert row["series"] == {"mean": 30.0, "target": 20.0}
    assert row["numbers"] == {"mean": 30.0, "target": 20.0, "winner_agent_id": 7.0, "n_winners": 1.0}
