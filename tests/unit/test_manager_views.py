"""The manager's pure parts: runs' rows and the live payloads (runs list, run page), progress
ticks summed per round, the SSE framing, the node form's request, and the start form's
validation — the CLI's own messages, split by the field they name."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from populace.client.prepare import parse_config
from populace.core.contracts import (
    AgentHostSpec,
    GatewaySpec,
    Progress,
    ReplicasSpec,
    RoundResult,
    RunConfig,
    RunRecorded,
    RunState,
    ServiceSpec,
    Share,
    Usage,
)
from populace.core.scenario import ScenarioError, yaml_mapping
from populace.manager import is_loopback, scenarios, views
from populace.manager.app import start_request


def state(status: str = "running", rnd: int = 2, rounds: int = 3, rid: str = "r1", updated: float = 100.0,
          **kw) -> RunState:
    return RunState(run_id=rid, status=status, round=rnd, updated_at=updated,
                    config=RunConfig(agents=2000, rounds=rounds, name="ratio"),
                    shares=[Share(host_id="h1", ranges=[(0, 2000)])], **kw)


def result(n: int, rid: str = "r1") -> RoundResult:
    return RoundResult(run_id=rid, round=n, n=2000, n_valid=1990, observation={}, closed_at=1.0 + n,
                       summary={"mean": 30.5 + n, "target": 20.0 + n, "winner_agent_id": 7, "ok": True},
                       usage=Usage(llm_calls=2000, prompt_tokens=100, completion_tokens=20))


def tick(n: int, answered: int, rid: str = "r1") -> bytes:
    return Progress(run_id=rid, round=n, host_id="h1", answered=answered).model_dump_json().encode()


# --- runs --------------------------------------------------------------------------------
def test_a_running_run_counts_the_rounds_before_the_one_in_play():
    row = views.run_row(state("running", rnd=2, used=Usage(llm_calls=10, prompt_tokens=5, completion_tokens=3)))
    assert (row["round"], row["completed"], row["rounds"], row["progress"]) == (2, 1, 3, round(1 / 3, 4))
    assert (row["llm_calls"], row["tokens"], row["simulation"], row["agents"]) == (10, 8, "ratio-game", 2000)
    done = views.run_row(state("done", rnd=3))
    assert (done["round"], done["completed"], done["progress"]) == (None, 3, 1.0)


def test_a_run_on_priced_models_shows_its_dollars_and_their_projection_to_the_last_round():
    priced = RunConfig(agents=2000, rounds=10, models=[{"name": "m", "kind": "sim", "prices": {"input": 1.0}}])
    s = state("running", rnd=5, used=Usage(dollars=0.3), interviews=Usage(dollars=0.1)).model_copy(
        update={"config": priced})
    row = views.run_row(s)  # 4 rounds done, $0.40 spent with the interviews': $1.00 by round 10
    assert (row["priced"], row["dollars"], row["dollars_text"]) == (True, pytest.approx(0.4), "$0.40")
    assert (row["dollars_projected"], row["dollars_projected_text"]) == (pytest.approx(1.0), "$1.00")
    first = views.run_row(state("running", rnd=1).model_copy(update={"config": priced}))
    assert (first["dollars_text"], first["dollars_projected"]) == ("$0", None)  # nothing to project from yet
    assert views.run_row(state("running"))["priced"] is False
    closed = views.result_row(result(1).model_copy(update={"usage": Usage(llm_calls=2000, prompt_tokens=100,
                                                                          cached_tokens=40, dollars=0.05)}))
    assert (closed["cached_tokens"], closed["dollars"]) == (40, 0.05)


def test_the_runs_payload_is_newest_first_and_bounded():
    states = [state(rid=f"r{i}", updated=float(i)) for i in range(5)]
    payload = views.runs_payload(states, limit=3)
    assert [r["run_id"] for r in payload["runs"]] == ["r4", "r3", "r2"]
    assert payload["total"] == 5
    json.dumps(payload)  # what the stream sends


@pytest.mark.parametrize(("status", "rnd", "cancel", "resume"), [
    ("spawning", 0, True, False), ("running", 2, True, False), ("paused", 1, False, True),
    ("cancelled", 2, False, True), ("failed", 3, False, False), ("done", 3, False, False)])
def test_cancel_and_resume_are_offered_as_the_cli_allows_them(status, rnd, cancel, resume):
    s = state(status, rnd=rnd)
    assert (views.can_cancel(s), views.can_resume(s)) == (cancel, resume)


# --- the run page ------------------------------------------------------------------------
def test_the_chart_takes_the_first_numbers_of_a_summary():
    assert views.numeric_summary({"label": "x", "ok": True, "mean": 1, "target": 2.5, "third": 3}) == {
        "mean": 1.0, "target": 2.5}
    row = views.result_row(result(1))
    assert row["series"] == {"mean": 31.5, "target": 21.0}
    assert (row["llm_calls"], row["tokens"], row["n_valid"]) == (2000, 120, 1990)


def test_a_prototype_rounds_result_row_carries_each_prototypes_calls_copies_audits_and_divergence():
    from populace.core.contracts import PrototypeRound, PrototypeStat

    assert views.result_row(result(1))["prototypes"] == []
    report = PrototypeRound(stats=[PrototypeStat(label="education=Ph.D.", agents=400, share=0.04, representatives=16,
                                                 valid=15, drawn=384, audited=12, audited_valid=11, metric="w1",
                                                 divergence=18.5, ci_low=4.7, ci_high=27.8, breach=False,
                                                 next_share=0.04)], representatives=16, audited=12)
    row = views.result_row(result(1).model_copy(update={"prototypes": report}))
    assert row["prototypes"] == [{"prototype": "education=Ph.D.", "agents": 400, "share": 0.04, "representatives": 16,
                                  "valid": 15, "drawn": 384, "unanswered": 0, "audited": 12, "audited_valid": 11,
                                  "metric": "w1", "divergence": 18.5, "ci_low": 4.7, "ci_high": 27.8,
                                  "breach": False, "next_share": 0.04}]
    json.dumps(row)  # as the page's server-sent event carries it


def test_ticks_are_summed_per_round_and_others_are_skipped():
    ticks = views.RoundTicks("r1")
    for data in (tick(1, 100), tick(1, 50), tick(2, 7), tick(1, 9, rid="other"), b"{not json"):
        ticks.add(data)
    assert ticks.answered == {1: 150, 2: 7}
    assert ticks.malformed == 2
    ticks.opened(2)
    assert (ticks.complete(1), ticks.complete(2), ticks.complete(3)) == (False, True, True)


def test_the_run_payload_of_a_round_in_play():
    ticks = views.RoundTicks("r1")
    ticks.opened(2)
    ticks.add(tick(2, 1500))
    ticks.add(tick(2, 900))  # a batch sent again after a re-placement: never more than expected
    p = views.run_payload("r1", state("running", rnd=2), ticks, 2000, [result(1)])
    assert (p["current_round"], p["answered"], p["expected"], p["answered_lower_bound"]) == (2, 2000, 2000, False)
    assert (p["can_cancel"], p["can_resume"]) == (True, False)
    assert [r["round"] for r in p["results"]] == [1]
    late = views.RoundTicks("r1")
    late.opened(3)  # the page opened during round 2
    late.add(tick(2, 10))
    assert views.run_payload("r1", state("running", rnd=2), late, 2000, [])["answered_lower_bound"] is True


def test_a_done_run_shows_its_status_as_recorded_incomplete_with_what_lacks():
    why = "round 2: 24 of 2,000 outcomes missing (group 17 of h1@0 refused: acts.agent_id: agent 9 has no outcome)"
    recorded = RunRecorded(run_id="r1", outcomes=5976, db_path="/db", status="incomplete", reason=why,
                           outcomes_missing=24)
    p = views.run_payload("r1", state("done", rnd=3), views.RoundTicks("r1"), None, [], recorded)
    assert (p["status"], p["reason"]) == ("incomplete", why)
    assert views.run_row(state("done", rnd=3))["status"] == "done"  # not read: the state's
    # a record of an earlier epoch (the stop before a resume), or of a run still going, is not its status
    assert views.run_row(state("done", rnd=3, epoch=1), recorded)["status"] == "done"
    assert views.run_row(state("running", rnd=2), recorded)["status"] == "running"
    whole = RunRecorded(run_id="r1", outcomes=6000, db_path="/db", status="completed")
    assert views.run_row(state("done", rnd=3), whole)["status"] == "done"


def test_the_run_payload_before_the_orchestrator_knows_the_run():
    p = views.run_payload("r9", None, views.RoundTicks("r9"), None, [])
    assert (p["status"], p["known"], p["results"]) == ("submitted", False, [])


def test_sse_framing_is_one_json_line_per_event():
    assert views.sse({"a": 1}) == b'data: {"a":1}\n\n'
    assert views.sse({"a": "x\ny"}, event="run") == b'event: run\ndata: {"a":"x\\ny"}\n\n'


# --- nodes -------------------------------------------------------------------------------
def test_the_node_form_builds_typed_requests():
    req = start_request({"kind": "agent-host", "count": "2", "max_in_flight": "500", "servers": "1"})
    assert (req.spec, req.count, req.restart.mode) == (AgentHostSpec(max_in_flight=500), 2, "never")
    req = start_request({"kind": "replicas", "count": "1", "backend": "sim", "servers": "3", "restart": "on-failure"})
    assert (req.spec, req.restart.mode) == (ReplicasSpec(backend="sim", servers=3), "on-failure")
    assert start_request({"kind": "gateway"}).spec == GatewaySpec()
    assert start_request({"kind": "recorder"}).spec == ServiceSpec(name="recorder")
    with pytest.raises(ValidationError):
        start_request({"kind": "agent-host", "count": "65"})
    with pytest.raises(ValidationError):
        start_request({"kind": "Bad Name"})
    with pytest.raises(ValueError):
        start_request({"kind": "agent-host", "count": "two"})


def test_only_loopback_addresses_are_served_without_a_token():
    assert all(is_loopback(h) for h in ("127.0.0.1", "::1", "localhost", "127.0.0.2"))
    assert not any(is_loopback(h) for h in ("0.0.0.0", "10.0.0.5", "example.org", ""))


# --- the start form ----------------------------------------------------------------------
def cli_message(text: str) -> str:
    """What `populace validate` prints for this scenario (its ScenarioError)."""
    with pytest.raises(ScenarioError) as err:
        parse_config(yaml_mapping(text, scenarios.WHERE))
    return str(err.value)


def test_the_field_errors_split_the_cli_text_by_field():
    text = ("agents: Input should be greater than or equal to 1 (got 0)\n"
            "game.ratio: unknown key\n"
            "population.config: /x.yaml is not a valid population:\n  groups: required\n"
            "(this scenario names no `simulation:`, so it is played as ratio-game; …)")
    errors = views.field_errors(text)
    assert [e.field for e in errors] == ["agents", "game.ratio", "population.config"]
    assert [e.top for e in errors] == ["agents", "game", "population"]
    assert errors[2].message.endswith("  groups: required\n(this scenario names no `simulation:`, so it is "
                                      "played as ratio-game; …)")
    assert views.field_errors("something odd")[0].field == ""


@pytest.mark.parametrize(("text", "field"), [
    ("agents: 0\nrounds: 3\n", "agents"),
    ("agents: 10\nrounds: many\n", "rounds"),
    ("agents: 10\nmodel:\n  backend: gpt-9\n", "model.backend"),
    ("agents: 10\ngame:\n  ratio: lots\n", "game.ratio"),
    ("agents: 10\nbogus: 1\n", "bogus"),
])
def test_a_bad_scenario_shows_the_clis_message_under_its_field(text, field):
    checked = scenarios.validate(text)
    assert checked.prepared is None
    assert any(e.field == field or e.field.startswith(field + ".") for e in checked.errors), checked.errors
    assert "\n".join(e.message for e in checked.errors) == cli_message(text)


def test_yaml_that_is_not_a_mapping_or_not_yaml_is_named():
    assert scenarios.validate("- 1\n- 2\n").errors[0].field == "(scenario)"
    bad = scenarios.validate("agents: [1,\n")
    assert bad.errors[0].field == "(scenario)" and "not valid YAML" in bad.errors[0].message


def test_the_menu_names_the_simulation_unless_the_scenario_does():
    ok = scenarios.validate("agents: 20\nrounds: 2\n", "vote")
    assert ok.errors == [] and ok.prepared.config.simulation == "vote"
    clash = scenarios.validate("simulation: vote\nagents: 20\n", "ratio-game")
    assert [e.field for e in clash.errors] == ["simulation"]
    unknown = scenarios.validate("agents: 20\n", "no-such-sim")
    assert unknown.errors[0].field == "simulation"


def test_a_good_scenario_is_prepared_with_its_manifest():
    text = "simulation: ratio-game\nagents: 2000\nrounds: 3\nmodel:\n  backend: dummy\n"
    checked = scenarios.validate(text)
    assert checked.errors == []
    p = checked.prepared
    assert (p.config.agents, p.config.rounds, p.config.model.backend) == (2000, 3, "dummy")
    assert p.manifest["scenario"]["text"] == text and p.manifest["config"]["agents"] == 2000


def test_the_form_cannot_import_a_module_or_read_outside_the_working_directory():
    imported = scenarios.validate("simulation: os:system\nagents: 2\n")
    assert [e.field for e in imported.errors] == ["simulation"] and "import path" in imported.errors[0].message
    for path in ("/etc/passwd", "../secrets.jsonl", "~/p.jsonl"):
        bad = scenarios.validate(f"agents: 2\npopulation:\n  personas: {path}\n")
        assert [e.field for e in bad.errors] == ["population.personas"], path
    assert views.field_errors("simulation 'x:y' (import path): cannot import")[0].field == "simulation"


# --- the parameter form (from the JSON schemas) ------------------------------------------
def test_the_parameter_form_has_the_runs_fields_and_the_simulations():
    fields = {f.name: f for f in scenarios.param_fields("ratio-game")}
    assert {"agents", "rounds", "seed", "model.backend", "model.latency_s", "budget.tokens", "game.ratio",
            "prompt.answer", "prompt.persona"} <= set(fields)
    assert "simulation" not in fields and "population.digest" not in fields
    assert fields["population.personas"].optional and fields["population.config"].optional
    assert fields["model.backend"].choices == ("dummy", "local", "sim", "openai")
    assert (fields["agents"].kind, fields["agents"].default) == ("integer", 1000)
    assert fields["budget.tokens"].optional and not fields["agents"].optional
    assert fields["placement.agents_per_process"].int_choices
    assert "ballot.options" in {f.name for f in scenarios.param_fields("vote")}


def test_the_parameter_form_becomes_the_scenario_its_fields_name():
    fields = scenarios.param_fields("vote")
    form = {"p.agents": "50", "p.rounds": "2", "p.model.latency_s": "0.5", "p.model.name": "",
            "p.ballot.options": "yes, no, maybe", "p.prompt.persona": "false", "p.placement.agents_per_process": "0",
            "p.budget.tokens": ""}
    data = scenarios.form_mapping(form, fields, "vote")
    assert data == {"simulation": "vote", "agents": 50, "rounds": 2, "model": {"latency_s": 0.5},
                    "placement": {"agents_per_process": 0}, "ballot": {"options": ["yes", "no", "maybe"]},
                    "prompt": {"persona": False}}
    text, checked = scenarios.validate_form(form, "vote")
    assert checked.errors == [] and checked.prepared.config.agents == 50
    assert checked.prepared.manifest["scenario"]["text"] == text


def test_a_population_from_the_form_is_read_and_checked_like_the_yamls(monkeypatch):
    monkeypatch.chdir(Path(__file__).parents[2] / "examples")  # the manager reads under its working directory
    form = {"p.agents": "", "p.rounds": "2", "p.population.personas": "personas/education-50.jsonl"}
    _, checked = scenarios.validate_form(form, "ratio-game")
    assert checked.errors == [] and checked.prepared.config.agents == 50
    assert checked.prepared.config.population.digest is not None
    both = {**form, "p.population.config": "population/education.yaml"}
    _, checked = scenarios.validate_form(both, "ratio-game")
    assert [e.field for e in checked.errors] == ["population"]
    outside = {"p.population.personas": "../examples/personas/education-50.jsonl"}
    _, checked = scenarios.validate_form(outside, "ratio-game")
    assert [e.field for e in checked.errors] == ["population.personas"]


def test_a_bad_parameter_is_shown_next_to_its_input():
    form = {"p.agents": "0", "p.rounds": "three", "p.game.max_value": "-5"}
    _, checked = scenarios.validate_form(form, "ratio-game")
    ctx = scenarios.param_form_context("ratio-game", form, checked.errors)
    assert ctx["field_errors"]["agents"][0].startswith("agents: Input should be greater than or equal to 1")
    assert ctx["field_errors"]["rounds"][0].startswith("rounds: Input should be a valid integer")
    assert ctx["field_errors"]["game.max_value"][0].startswith("game.max_value:")
    assert ctx["values"]["rounds"] == "three"  # what was typed stays in the form


def test_the_trace_id_comes_from_a_w3c_traceparent():
    assert views.trace_id("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01") == "4bf92f3577b34da6a3ce929d0e0e4736"
    assert views.trace_id("00-00000000000000000000000000000000-00f067aa0ba902b7-01") is None
    assert views.trace_id("") is None and views.trace_id("garbage") is None


# --- replicas ----------------------------------------------------------------------------
def test_a_replicas_metrics_give_its_load_and_prefix_cache_hit_rate():
    from populace.core.contracts import ReplicaInfo

    text = ('# HELP vllm:num_requests_running x\n'
            'vllm:num_requests_running{model_name="sim"} 3\n'
            'vllm:num_requests_waiting{model_name="sim"} 2\n'
            'vllm:prefix_cache_queries_total{model_name="sim"} 1000\n'
            'vllm:prefix_cache_hits_total{model_name="sim"} 750\n'
            'vllm:kv_cache_usage_perc{model_name="sim"} 0.25\nbroken line\n')
    m = views.parse_metrics(text)
    info = ReplicaInfo(replica_id="sim-0", url="http://127.0.0.1:1", backend="sim", kind="sim", model="sim",
                       heartbeat_at=100.0)
    row = views.replica_row(info, True, m, now=102.0)
    assert (row["running"], row["waiting"], row["prefix_hit_rate"], row["kv_cache"]) == (3, 2, 0.75, 0.25)
    assert row["heartbeat_age_s"] == 2.0
    llama = views.replica_row(info, True, views.parse_metrics("llamacpp:requests_processing 1\n"
                                                              "llamacpp:requests_deferred 4\n"))
    assert (llama["running"], llama["waiting"], llama["prefix_hit_rate"]) == (1, 4, None)
    assert views.replica_row(info, False, None)["metrics"] is False


def test_the_replicas_of_a_backend_in_one_line_weigh_hit_rates_by_queries():
    from populace.core.contracts import ReplicaInfo

    def row(rid: str, backend: str, healthy: bool, metrics: str | None) -> dict:
        info = ReplicaInfo(replica_id=rid, url="http://127.0.0.1:1", backend=backend, kind="sim", model="sim",
                           heartbeat_at=1.0)
        return views.replica_row(info, healthy, views.parse_metrics(metrics) if metrics else None, now=2.0)

    rows = [row("a", "sim", True, "vllm:num_requests_running 2\nvllm:prefix_cache_queries_total 900\n"
                                  "vllm:prefix_cache_hits_total 900\n"),
            row("b", "sim", True, "vllm:num_requests_waiting 5\nvllm:prefix_cache_queries_total 100\n"
                                  "vllm:prefix_cache_hits_total 0\n"),
            row("c", "sim", False, None),
            row("d", "local", True, "llamacpp:requests_processing 1\n")]
    sim = views.replicas_summary(rows, "sim")
    assert (sim["replicas"], sim["healthy"], sim["running"], sim["waiting"]) == (3, 2, 2, 5)
    assert sim["prefix_hit_rate"] == 0.9  # 900 of 1,000 queries, not the mean of 100 % and 0 %
    local = views.replicas_summary(rows, "local")
    assert (local["replicas"], local["running"], local["prefix_hit_rate"]) == (1, 1, None)
    assert views.replicas_summary(rows, "openai")["replicas"] == 0
    assert views.replicas_summary(rows)["replicas"] == 4


def test_a_form_post_from_another_site_is_told_apart_from_ours():
    from starlette.requests import Request

    from populace.manager.app import _same_origin

    def request(**headers) -> Request:
        raw = [(k.encode(), v.encode()) for k, v in {"host": "127.0.0.1:8080", **headers}.items()]
        return Request({"type": "http", "method": "POST", "path": "/", "headers": raw})

    assert _same_origin(request())  # no Origin or Referer: not a browser's cross-site form
    assert _same_origin(request(origin="http://127.0.0.1:8080"))
    assert _same_origin(request(referer="http://127.0.0.1:8080/runs/x"))
    assert not _same_origin(request(origin="http://evil.example"))
    assert not _same_origin(request(origin="http://127.0.0.1:9999"))


def test_the_nodes_payload_leaves_out_nodes_that_stopped_heartbeating():
    from populace.core.contracts import NodeInfo

    def node(node_id: str, beat: float) -> NodeInfo:
        return NodeInfo(node_id=node_id, hostname="h", pid=1, version="0", cpus=2, memory_bytes=2**30,
                        memory_available_bytes=2**29, log_dir="/tmp", started_at=0.0, heartbeat_at=beat,
                        heartbeat_s=2.0)

    payload = views.nodes_payload([node("b", 100.0), node("a", 99.0), node("gone", 50.0)], now=100.5)
    assert [n["node_id"] for n in payload["nodes"]] == ["a", "b"]
    json.dumps(payload)


def test_a_rounds_row_counts_the_models_invalid_answers_the_simulations_errors_and_retries_apart():
    row = views.result_row(result(1).model_copy(update={"n_simulation_errors": 4,
                                                         "usage": Usage(llm_calls=2000, infra_retries=3)}))
    assert (row["n_valid"], row["n_invalid_answers"], row["n_simulation_errors"], row["infra_retries"]) == \
        (1990, 6, 4, 3)
