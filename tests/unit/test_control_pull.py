"""Every control-plane pull consumer fetches one message at a time. nats-py's fetch(batch=n > 1)
holds a message that arrived during its long poll until n came or the poll expired (5 s): the
environment then closed each round on its fetch loop's grid, and 1M-agent rounds ended at
exactly 10.00 s. A service that goes back to batches fails here, not in a benchmark."""

from __future__ import annotations

import pytest

from populace.environment.app import create as environment
from populace.orchestrator.app import create as orchestrator


@pytest.mark.parametrize("create", [orchestrator, environment], ids=["orchestrator", "environment"])
def test_pull_consumers_fetch_one_message_at_a_time(create):
    pulls = [s for s in create().broker.subscribers if getattr(s, "pull_sub", None) is not None]
    assert pulls, "no pull consumer found: the check would pass vacuously"
    assert {(str(s.subject), s.pull_sub.batch_size) for s in pulls} == {(str(s.subject), 1) for s in pulls}
