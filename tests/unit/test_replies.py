"""Who asked, where the answer may go, and what a dead letter keeps (issue 26, items 1, 6, 7)."""

from __future__ import annotations

from types import SimpleNamespace

from populace.core import replies, subjects


def test_a_reply_subject_must_be_the_requesters_own():
    assert replies.refusal("gateway", "llm.infer.host-a", "reply.gateway.host-a.x1") is None
    assert replies.refusal("recorder", "recorder.read.agents.manager", "reply.recorder.manager.n.t") is None
    for reply in ("reply.gateway.host-b.x1",  # another requester's
                  "reply.recorder.host-a.x1",  # another responder's
                  "reply.gateway.host-a", "reply.gateway.host-a.",  # the prefix alone
                  "reply.gateway.host-a.*", "reply.gateway.host-a.>",  # wildcards
                  "$JS.API.STREAM.DELETE.RUN", "$KV.runs.r1", "_INBOX_host-a.x", "_INBOX.x",
                  "", None):
        why = replies.refusal("gateway", "llm.infer.host-a", reply)
        assert why, reply
    assert "is not one of requester host-a's" in replies.refusal("gateway", "llm.infer.host-a", "$KV.runs.r1")
    assert "no reply subject" in replies.refusal("gateway", "llm.infer.host-a", None)
    assert "names no requester" in replies.refusal("gateway", "llm", "reply.gateway.llm.x")


def test_the_requester_is_the_connections_nats_user():
    assert replies.requester(SimpleNamespace(options={"user": "host-7"})) == "host-7"
    assert replies.requester(SimpleNamespace(_nc=SimpleNamespace(options={"user": "cli"}))) == "cli"  # a JetStream
    assert replies.requester(SimpleNamespace(options={}), fallback="host-0") == "host-0"  # an open bus
    assert replies.requester(SimpleNamespace(options={})) == replies.ANONYMOUS
    assert replies.new_reply("gateway", "h").startswith("reply.gateway.h.")
    assert replies.new_reply("gateway", "h") != replies.new_reply("gateway", "h")


def test_request_subjects_name_their_requester_last():
    assert subjects.llm_infer("host-a") == "llm.infer.host-a"
    assert subjects.recorder_read("agents", "cli") == "recorder.read.agents.cli"
    assert subjects.recorder_read("agents") == "recorder.read.agents.*"  # what the recorder subscribes to
    for subject in (subjects.llm_infer("h-1"), subjects.recorder_read("snapshot", "h-1"),
                    subjects.node_request("n1", "start", "h-1")):
        assert subjects.requester_of(subject) == subjects.sender_of(subject) == "h-1"
