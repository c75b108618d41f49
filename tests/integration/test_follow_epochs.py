"""Following a resumed run on a real nats-server: the recorder may record the stop before the
resume only after the resumed run finished (it waited for disk room), so a `recorded` of an
older epoch arrives after the run's last `done`. It is not the run's end: the follower waits for
the record of the epoch it saw finish."""

from __future__ import annotations

import pytest

from populace.client.run import _Following
from populace.core import bus, subjects
from populace.core.contracts import RunDone, RunRecorded, RunResumed

pytestmark = pytest.mark.integration

RID = "r-resumed"


# Each subject has its own subscription, so their events may reach the follower in either order.
@pytest.mark.parametrize("stale_before_done", [False, True], ids=["after-done", "before-done"])
async def test_a_record_of_the_stop_before_a_resume_is_not_the_resumed_runs_end(nc, stale_before_done):
    stale = RunRecorded(run_id=RID, outcomes=4000, db_path="/db", epoch=0)  # the pause at round 2
    events = [(subjects.run_resumed(RID), RunResumed(run_id=RID, epoch=1, after_round=2, hosts=["h0"],
                                                     resumed_at=1.0)),
              (subjects.run_done(RID), RunDone(run_id=RID, status="completed", rounds=5, finished_at=2.0, epoch=1)),
              (subjects.run_recorded(RID), stale),
              (subjects.run_recorded(RID), RunRecorded(run_id=RID, outcomes=5000, db_path="/db", epoch=1))]
    if stale_before_done:
        events[1], events[2] = events[2], events[1]
    async with _Following(nc, RID, None, stall_s=30) as following:
        for subject, model in events:
            await nc.publish(subject, bus.encode(model))
        out = await following.until_recorded()
    assert (out.status, out.recorded) == ("completed", events[3][1])


@pytest.mark.parametrize("recorded_first", [False, True], ids=["done-first", "recorded-first"])
async def test_a_run_recorded_with_rows_missing_is_incomplete_whichever_event_comes_first(nc, recorded_first):
    why = "round 2: 24 of 4,000 outcomes missing (group 17 of host-1@0 refused: acts.agent_id: agent 9 has no outcome)"
    events = [(subjects.run_done(RID), RunDone(run_id=RID, status="completed", rounds=2, finished_at=2.0)),
              (subjects.run_recorded(RID), RunRecorded(run_id=RID, outcomes=7976, db_path="/db", status="incomplete",
                                                       reason=why, outcomes_missing=24))]
    if recorded_first:
        events.reverse()
    async with _Following(nc, RID, None, stall_s=30) as following:
        for subject, model in events:
            await nc.publish(subject, bus.encode(model))
        out = await following.until_recorded()
    assert (out.status, out.reason, out.recorded.outcomes_missing) == ("incomplete", why, 24)
