"""Call records bound to who asked (issue 26, item 6): the gateway names the requester (the NATS
user of its request subject), and the recorder counts a host's call records only about its own
agents, so another host's calls can neither replace nor add to them."""

from __future__ import annotations

from populace.core.contracts import LlmCallBatch
from populace.store.expected import RunShape, calls_refusal


def _calls(agents: list[int], requester: str) -> LlmCallBatch:
    n = len(agents)
    return LlmCallBatch(run_id="r", round=1, batch_id="b", agent_ids=agents, replicas=["x"] * n,
                        prompt_tokens=[1] * n, completion_tokens=[1] * n, latency_ms=[1.0] * n, attempts=[1] * n,
                        valid=[True] * n, requester=requester)


def test_call_records_count_only_for_the_requesters_own_agents():
    shape = RunShape(agents=200, rounds=2)
    assert calls_refusal(_calls([0, 5, 99], "host-0"), shape, [(0, 100)]) is None
    assert "agent 100 is not one of requester host-0's" in calls_refusal(_calls([99, 100], "host-0"), shape, [(0, 100)])
    assert "holds no share" in calls_refusal(_calls([0], "host-9"), shape, [])
    assert calls_refusal(_calls([150], "agent-host"), shape, None) is None  # a shared user: not checked
