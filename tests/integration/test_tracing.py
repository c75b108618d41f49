"""One run yields one trace whose spans come from orchestrator, agent-host, gateway,
environment and recorder, correctly parented — with an in-memory exporter."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration


def test_one_run_is_one_trace_across_every_service(nats_server, tmp_path):
    env = {**os.environ, "POPULACE_NATS_URL": nats_server.url, "POPULACE_DB": str(tmp_path / "t.duckdb"),
           "POPULACE_STORAGE": "memory", "POPULACE_HOST_ID": "trace-host", "POPULACE_LOG_LEVEL": "WARNING"}
    env.pop("OTEL_TRACES_EXPORTER", None)
    res = subprocess.run([sys.executable, str(Path(__file__).with_name("trace_child.py"))], env=env,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["status"] == "completed"
    spans = [s for s in out["spans"] if s["trace_id"] == next(
        x["trace_id"] for x in out["spans"] if x["name"] == "orchestrator.run" and x["run_id"] == out["run_id"])]

    names = Counter(s["name"] for s in spans)
    # every service took part in the run's one trace
    for prefix in ("orchestrator.", "agent-host.", "gateway.", "environment.", "recorder."):
        assert any(n.startswith(prefix) for n in names), (prefix, names)
    # one root (the run), a span per round, never one per agent
    roots = [s for s in spans if s["parent_id"] is None]
    assert [r["name"] for r in roots] == ["orchestrator.run"]
    assert names["orchestrator.round"] == 2
    assert names["environment.decide"] == 2
    assert names["agent-host.round"] == 2  # one host, two rounds
    assert sum(names.values()) < 60  # 60 agents × 2 rounds would be 120 spans if per agent
    # correctly parented: every parent is in the trace, and the chain is run → round → host → batch
    by_id = {s["span_id"]: s for s in spans}
    assert all(s["parent_id"] in by_id for s in spans if s["parent_id"])

    def parent(s):
        return by_id[s["parent_id"]]["name"]

    assert {parent(s) for s in spans if s["name"] == "orchestrator.round"} == {"orchestrator.run"}
    assert {parent(s) for s in spans if s["name"] == "agent-host.round"} == {"orchestrator.round"}
    assert {parent(s) for s in spans if s["name"] == "agent-host.infer"} == {"agent-host.round"}
    assert {parent(s) for s in spans if s["name"] == "gateway.batch"} == {"agent-host.infer"}
    assert {parent(s) for s in spans if s["name"] == "environment.decide"} == {"orchestrator.round"}
    assert {parent(s) for s in spans if s["name"] == "recorder.ingest"} <= {
        "orchestrator.run", "orchestrator.round", "agent-host.round", "environment.decide"}
    # and no other trace carries this run's spans
    others = [s for s in out["spans"] if s["run_id"] == out["run_id"] and s["trace_id"] != spans[0]["trace_id"]]
    assert others == []
