"""Operator metrics without a running stack: the Grafana dashboard queries only metrics that
populace.core.metrics defines, Prometheus scrapes every service compose.yaml runs, Grafana's
provisioning points at both, a local stack lays its metrics ports out as documented, and the
gateway's per-batch export counts what its decisions did."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from prometheus_client import REGISTRY

from populace.client.stack import Stack, StackError, metrics_layout, service_keys
from populace.core import metrics
from populace.gateway.dispatcher import Decision, export_metrics

ROOT = Path(__file__).resolve().parents[2]
MONITORING = ROOT / "deploy" / "monitoring"
DASHBOARD = MONITORING / "grafana" / "dashboards" / "populace.json"
PROMQL_WORDS = {
    "sum", "avg", "min", "max", "count", "rate", "irate", "increase", "histogram_quantile", "by", "without", "on",
    "ignoring", "and", "or", "unless", "group_left", "group_right", "offset", "bool", "topk", "bottomk",
    "clamp_min", "clamp_max", "abs", "vector", "scalar", "time", "delta", "deriv", "sum_over_time", "avg_over_time",
    "max_over_time", "min_over_time", "label_replace", "absent",
}


def compose() -> dict:
    return yaml.safe_load((ROOT / "compose.yaml").read_text())


def panels(dashboard: dict) -> list[dict]:
    out = []
    for p in dashboard["panels"]:
        out.append(p)
        out.extend(p.get("panels", []))  # a collapsed row holds its panels
    return out


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects: what is left once strings, label
    matchers, range durations, grouping clauses, functions and keywords are taken out."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', "", expr)
    expr = re.sub(r"\{[^}]*\}", "", expr)
    expr = re.sub(r"\[[^\]]*\]", "", expr)
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", expr)
    names = set()
    for m in re.finditer(r"[A-Za-z_:][\w:]*", expr):
        following = expr[m.end():].lstrip()[:1]
        if m.group(0) not in PROMQL_WORDS and following != "(":
            names.add(m.group(0))
    return names


def test_the_promql_reader_finds_the_metric_names():
    assert metric_names('histogram_quantile(0.95, sum by (le, replica) (rate(populace_llm_seconds_bucket'
                        '{service="a b"}[$__rate_interval])))') == {"populace_llm_seconds_bucket"}
    assert metric_names('sum by (instance) (populace_agents_hosted and on (instance) '
                        'populace_rounds_total{service="agent-host"})') == {"populace_agents_hosted",
                                                                             "populace_rounds_total"}


def test_the_dashboard_is_valid_and_queries_only_metrics_populace_defines():
    dashboard = json.loads(DASHBOARD.read_text())
    datasource = yaml.safe_load((MONITORING / "grafana/provisioning/datasources/prometheus.yaml").read_text())
    (source,) = datasource["datasources"]
    assert dashboard["uid"] and dashboard["title"] == "Populace"
    every = panels(dashboard)
    ids = [p["id"] for p in every]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    queried = set()
    for p in every:
        grid = p["gridPos"]
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24, p["title"]
        if p["type"] == "row":
            continue
        assert p["targets"], p["title"]
        for t in p["targets"]:
            assert t["datasource"]["uid"] == source["uid"], p["title"]
            names = metric_names(t["expr"])
            assert names, (p["title"], t["expr"])
            queried |= names
    assert queried <= metrics.series_names(), queried - metrics.series_names()
    # every histogram and counter the platform defines shows somewhere
    shown = {re.sub(r"_(bucket|sum|count)$", "", n) for n in queried}
    defined = {f.name + ("_total" if f.type == "counter" else "")
               for m in metrics.EXPORTED for f in m.describe()}
    assert not defined - shown, defined - shown


def test_prometheus_scrapes_every_service_compose_runs_on_its_metrics_port():
    doc = compose()
    exporting = {(name, int(svc["environment"]["POPULACE_METRICS_PORT"]))
                 for name, svc in doc["services"].items()
                 if "POPULACE_METRICS_PORT" in (svc.get("environment") or {}) and not svc.get("profiles")}
    assert {name for name, _ in exporting} == {"orchestrator", "environment", "gateway", "recorder", "agent-host"}
    config = yaml.safe_load((MONITORING / "prometheus.yml").read_text())
    scraped = set()
    for job in config["scrape_configs"]:
        for sd in job.get("dns_sd_configs", []):
            scraped |= {(name, sd["port"]) for name in sd["names"]}
        for static in job.get("static_configs", []):
            scraped |= {(host, int(port)) for host, port in (t.rsplit(":", 1) for t in static["targets"])}
    assert scraped == exporting


def test_the_monitoring_profile_mounts_the_files_and_grafana_finds_them():
    services = compose()["services"]
    prometheus, grafana = services["prometheus"], services["grafana"]
    assert prometheus["profiles"] == grafana["profiles"] == ["monitoring"]
    mounts = {}
    for svc in (prometheus, grafana):
        for volume in svc["volumes"]:
            source, target, *_ = volume.split(":")
            if source.startswith("./"):
                assert (ROOT / source).exists(), source
                mounts[target] = ROOT / source
    assert mounts["/etc/prometheus/prometheus.yml"] == MONITORING / "prometheus.yml"
    provider = yaml.safe_load((mounts["/etc/grafana/provisioning"] / "dashboards/populace.yaml").read_text())
    (dashboards,) = provider["providers"]
    assert (mounts[dashboards["options"]["path"]] / DASHBOARD.name) == DASHBOARD
    assert grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"] == \
        f"{dashboards['options']['path']}/{DASHBOARD.name}"
    datasource = yaml.safe_load((mounts["/etc/grafana/provisioning"] / "datasources/prometheus.yaml").read_text())
    assert datasource["datasources"][0]["url"] == "http://prometheus:9090"
    assert "127.0.0.1:9090:9090" in prometheus["ports"]


def test_a_stack_lays_its_metrics_ports_out_in_the_documented_order(monkeypatch):
    assert metrics_layout(service_keys(2), 19464) == {
        "orchestrator": 19464, "environment": 19465, "gateway": 19466, "recorder": 19467,
        "agent-host-0": 19468, "agent-host-1": 19469}
    monkeypatch.delenv("POPULACE_METRICS_PORT", raising=False)
    assert Stack(hosts=1)._metrics_ports(service_keys(1)) == {}
    free = Stack(hosts=1, metrics=True)._metrics_ports(service_keys(1))
    assert set(free) == set(service_keys(1)) and all(free.values())
    with pytest.raises(StackError, match=r"POPULACE_METRICS_PORT='x' is not a port number"):
        Stack(hosts=1, env={"POPULACE_METRICS_PORT": "x"})._metrics_ports(service_keys(1))
    monkeypatch.setenv("POPULACE_METRICS_PORT", "65533")  # read from the environment too
    with pytest.raises(StackError, match=r"POPULACE_METRICS_PORT=65533: the stack's 5 services need ports "
                                         r"65533-65537"):
        Stack(hosts=1)._metrics_ports(service_keys(1))


def value(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_the_gateway_exports_a_batch_of_decisions_per_replica():
    def decision(replica: str, valid: bool = True, reasks: int = 0, failed: str | None = None) -> Decision:
        return Decision("{}", valid, 1 + reasks, replica, prompt_tokens=10, completion_tokens=3, latency_ms=250.0,
                        failed=failed, reasks=reasks)

    names = [("populace_llm_calls_total", {"replica": "r-a"}), ("populace_llm_calls_total", {"replica": "r-b"}),
             ("populace_llm_tokens_total", {"kind": "prompt", "replica": "r-a"}),
             ("populace_llm_tokens_total", {"kind": "completion", "replica": "r-a"}),
             ("populace_reasks_total", {"replica": "r-a"}), ("populace_invalid_answers_total", {"service": "gateway"}),
             ("populace_llm_seconds_count", {"replica": "r-a"}), ("populace_llm_seconds_sum", {"replica": "r-a"})]
    before = [value(n, **labels) for n, labels in names]
    export_metrics([decision("r-a"), decision("r-a", valid=False, reasks=1), decision("r-b", reasks=1),
                    decision("", valid=False, failed="no replica")])  # infrastructure: no answer, not invalid
    moved = [value(n, **labels) - b for (n, labels), b in zip(names, before)]
    assert moved == [2, 1, 20, 6, 1, 1, 2, 0.5]
