"""Wire contracts: every model round-trips through JSON, rejects unknown keys, and validates
its invariants; subject helpers build bounded, well-formed subjects."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest
from pydantic import BaseModel, ValidationError

from populace.core import contracts as c
from populace.core import subjects as s

CONFIG = c.RunConfig(
    name="unit-run", agents=2500, rounds=4, seed=11,
    model=c.ModelConfig(latency_s=0.0, seed=9),
    placement=c.PlacementConfig(agents_per_process=0),
    population=c.PopulationRef(personas="personas.jsonl", digest="ab" * 32),
    budget=c.Budget(tokens=1_000_000),
    # the simulation's own sections: kept as written, validated by the simulation
    game={"ratio": "1/2", "offset": 5, "max_value": 50, "history_window": 3},
    prompt={"system": "rational", "answer": "cot", "population_note": True},
)
TABLES = c.SimulationTables(
    simulation="ratio-game", outcomes="guesses", outcome_columns=[c.Column(name="value", type="DOUBLE")],
    rounds="rounds", summary_columns=[c.Column(name="mean", type="DOUBLE"), c.Column(name="target", type="DOUBLE")],
    measure="value", measure_kind="numeric")

NODE_POLICY = c.RestartPolicy(mode="on-failure", max_restarts=2, backoff_s=0.5)
NODE_PROCESS = c.ProcessInfo(proc_id="agent-host-1", spec=c.AgentHostSpec(), restart=NODE_POLICY, state="running",
                             pid=123, restarts=1, exit_code=-9, started_at=1.0, cpu_percent=12.5, rss_bytes=2**26,
                             log_path="/tmp/populace-node-gpu-1/agent-host-1.log")
NODE_INFO = c.NodeInfo(node_id="gpu-1", hostname="gpu-1.lab", pid=77, version="0.1.0", cpus=8, memory_bytes=2**34,
                       memory_available_bytes=2**33, gpus=[c.GpuInfo(index=0, name="NVIDIA L4", memory_mb=23034)],
                       free_ports=[40001, 40002], log_dir="/tmp/populace-node-gpu-1", started_at=1.0,
                       heartbeat_at=2.0, heartbeat_s=2.0, processes=[NODE_PROCESS])

INSTANCES: dict[str, BaseModel] = {
    "ModelConfig": c.ModelConfig(backend="dummy", latency_s=1.25, seed=3),
    "ModelLimits": c.ModelLimits(requests_per_min=600, tokens_per_min=200_000, concurrency=8),
    "ModelPrices": c.ModelPrices(input=0.15, cached_input=0.075, output=0.6),
    "ModelEndpoint": c.ModelEndpoint(name="gpt-mini", kind="openai", base_url="https://api.example.com/v1",
                                     model="gpt-4o-mini", api_key_env="OPENAI_API_KEY",
                                     limits=c.ModelLimits(requests_per_min=500), prices=c.ModelPrices(input=0.15),
                                     share=0.5),
    "ModelAssign": c.ModelAssign(attribute="education", map={"phd": "gpt-mini"}, default="local"),
    "ModelUse": c.ModelUse(llm_calls=2, prompt_tokens=100, cached_tokens=40, completion_tokens=10, dollars=0.25),
    "PlacementConfig": c.PlacementConfig(agents_per_process=1),
    "PopulationRef": c.PopulationRef(config="population/education.yaml", newcomers=10,
                                     changes=[c.PopulationChange(after="every", left=0.01, arrived=5)]),
    "PopulationChange": c.PopulationChange(after=[3], died=0.05, reason="a famine"),
    "LivingRef": c.LivingRef(name="r1.3.population", digest="c" * 64, round=3, size=1010, first=1005, living=990),
    "RunConfig": CONFIG,
    "RunStart": c.RunStart(run_id="run-20240101_abc", config=CONFIG, requested_at=1700000000.5,
                           manifest={"config_hash": "x", "seeds": {"run": 11}}),
    "Restore": c.Restore(run_id="run-parent", round=3, ranges=[(0, 1250), (1250, 1250)],
                         digests={"run-parent.3.agents.0": "e" * 64}, writers={"run-parent.3.agents.0": "h1"}),
    "Share": c.Share(host_id="h2", epoch=1, ranges=[(1250, 1250)], from_round=2, incarnation=17.5),
    "Layout": c.Layout(from_round=4, ranges=[(0, 2500)]),
    "AskedShare": c.AskedShare(host_id="h2", ranges=[(1250, 1250)], incarnation=17.5, placement=1),
    "Asking": c.Asking(request="q1", after_round=2, expected=625, order_seq=41, placements=1, placed_at=1.0,
                       shares=[c.AskedShare(host_id="h1", ranges=[(0, 1250)], incarnation=1.5)]),
    "RunCancel": c.RunCancel(run_id="r1", reason="enough data"),
    "RunResume": c.RunResume(run_id="r1", budget=c.Budget(tokens=10_000)),
    "Budget": c.Budget(tokens=5000, llm_calls=300),
    "Usage": c.Usage(llm_calls=3, prompt_tokens=120, completion_tokens=12, tokens_sq=5000.0, infra_retries=2,
                     cached_tokens=30, dollars=0.5, by_model={"a": c.ModelUse(llm_calls=3, dollars=0.5)}),
    "RunResumed": c.RunResumed(run_id="r1", epoch=1, after_round=2, hosts=["h1"], resumed_at=5.0),
    "HostInfo": c.HostInfo(host_id="host-1", capacity=100000, agents=1200, pid=4242,
                           started_at=1700000000.0, heartbeat_at=1700000005.0),
    "ServiceInfo": c.ServiceInfo(service="gateway", instance="gw-1", pid=77, heartbeat_at=1700000001.0),
    "RunState": c.RunState(run_id="r1", status="running", config=CONFIG,
                           shares=[c.Share(host_id="h1", ranges=[(0, 1250)], incarnation=1.5),
                                   c.Share(host_id="h2", epoch=1, ranges=[(1250, 1250)], from_round=2)],
                           spawned=["h1@0", "h2@1"], round=2,
                           env_state=c.StateRef(name="r1.1.env", digest="c" * 64),
                           observation={"history": [33.0, 22.5]}, reason=None, updated_at=1700000009.0,
                           asking=[c.Asking(request="q1", after_round=1, expected=10, order_seq=7, placed_at=1.0,
                                            shares=[c.AskedShare(host_id="h1", ranges=[(0, 1250)])])]),
    "Column": c.Column(name="group_id", type="BIGINT"),
    "SimulationTables": TABLES,
    "RunStarted": c.RunStarted(run_id="r1", config=CONFIG, started_at=1.5, hosts=["h1", "h2"], tables=TABLES),
    "SpawnBatch": c.SpawnBatch(run_id="r1", host_id="h2", ranges=[(1250, 1000), (3000, 250)], config_ref=c.ConfigRef.of(CONFIG)),
    "HostSpawned": c.HostSpawned(run_id="r1", host_id="h2", agents=1250, seconds=0.75),
    "RoundOpen": c.RoundOpen(run_id="r1", round=2, expected=2500, config_ref=c.ConfigRef.of(CONFIG),
                             observation={"history": [33.0]},
                             env_state=c.StateRef(name="r1.1.env", digest="c" * 64), opened_at=2.0),
    "GraphRef": c.GraphRef(generator="small-world", degree=6, digest="a" * 64),
    "Broadcast": c.Broadcast(round=2, text="a rumour", fields={"stance": 1.0}, to="top-degree", count=5),
    "PostColumns": c.PostColumns(texts=["hi", None], fields=[{"stance": 0.5}, None], heard=[3, 0],
                                 heard_digest=[12345, 0]),
    "ActColumns": c.ActColumns(group_id=[3, 3], seq=[0, 1], agent_id=[6, 7], phase=["offer", "respond"],
                               columns={"amount": [4, None], "accept": [None, True]}, valid=[True, True],
                               raw=['{"amount": 4}', '{"accept": true}'], latency_ms=[3.0, 2.5], error=[None, None]),
    "WorldRef": c.WorldRef(name="r1.3.world", digest="b" * 64),
    "StateRef": c.StateRef(name="r1.3.env", digest="d" * 64),
    "StoredObject": c.StoredObject(name="r1.3.agents.0", writer="h1", size=300_000, sha256="d" * 64, chunks=3,
                                   first_seq=7, last_seq=12, needs=["r1.2.agents.0"]),
    "RunWriters": c.RunWriters(run_id="r1", shares=[c.Share(host_id="h1", ranges=[(0, 10)])],
                               layouts=[c.Layout(from_round=1, ranges=[(0, 10)], shares=["h0@0"])]),
    "ConfigRef": c.ConfigRef(digest="c" * 64, from_round=3),
    "RunHead": c.RunHead(run_id="r1", status="running", config_ref=c.ConfigRef.of(CONFIG),
                         shares=[c.Share(host_id="h1", ranges=[(0, 10)])], round=2),
    "EdgeColumns": c.EdgeColumns(follower=[3, 3], author=[8, 2], kind=["follow", "follow"], op=["add", "remove"]),
    "ShownColumns": c.ShownColumns(agent_id=[3, 9], items=[[41, 7, 12], []], ranks=[[1, 2, 3], []]),
    "LineColumns": c.LineColumns(group_id=[3, 3], seq=[2, 3], speaker=[6, -1], text=["4 for you", "deal"],
                                 fields=['{"amount":4}', None]),
    "MailBatch": c.MailBatch(run_id="r1", round=2, host_id="h1", epoch=0, to="h2@0", shard=0, shards=1,
                             authors=[4, 9], texts=["hi", "there"], fields=[{"stance": 0.5}, None]),
    "OutcomeBatch": c.OutcomeBatch(run_id="r1", round=2, host_id="h1", seq=7, agent_ids=[0, 1, 2],
                                   columns={"value": [12.0, None, 99.5]}, valid=[True, False, True],
                                   raws=['{"guess": 12}', "no idea", "99.5"], latency_ms=[50.1, 51.0, 49.9],
                                   errors=[None, None, None]),
    "ShareProfile": c.ShareProfile(agents=3, wall_s=1.5, view_s=0.75, turn_s=0.25, merge_s=0.01, model_wait_s=1.0,
                                   view_bytes=3000, view_max_bytes=1200, observation_bytes=40, held=2,
                                   note="Env.view returned 1.2 MB for agent 1 in round 2"),
    "DecideProfile": c.DecideProfile(merge_s=0.01, decide_s=0.5, observation_bytes=40),
    "ProfileRequest": c.ProfileRequest(run_id="r1", rounds=20),
    "GroupsRequest": c.GroupsRequest(run_id="r1", by="model", round=2),
    "GroupsReply": c.GroupsReply(ok=True, run_id="r1", by="model", attributes=["education", "model"],
                                 rows=[{"group": "a", "n": 3, "mean": 40.0, "ci_low": 30.0, "ci_high": 50.0}]),
    "ProfileReply": c.ProfileReply(ok=True, run_id="r1", rows=[{"round": 1, "role": "host", "view_s": 0.5}],
                                   rounds_total=1, seconds={"view_s": 0.5}, top=("view_s", 0.5), notes=["a note"]),
    "PartialRef": c.PartialRef(ref="r1.2.partial.h1-0", sha256="ab" * 32, size=300_000),
    "RoundPartial": c.RoundPartial(run_id="r1", round=2, host_id="h1", n=3, n_valid=2,
                                   payload={"n_valid": 2, "total": 111.5, "by_value": [[12.0, 1, 0], [99.5, 1, 2]]},
                                   profile=c.ShareProfile(agents=3, view_s=0.5)),
    "RoundResult": c.RoundResult(run_id="r1", round=2, n=3, n_valid=2,
                                 summary={"mean": 55.75, "target": 32.875, "winner_agent_id": 0},
                                 observation={"history": [12.0]}, closed_at=3.0,
                                 profile=c.DecideProfile(decide_s=0.5)),
    "RunFault": c.RunFault(run_id="r1", source="host-1", round=None, reason="no such simulation"),
    "RunDone": c.RunDone(run_id="r1", status="failed", rounds=2, finished_at=4.0, reason="host lost"),
    "RunRecorded": c.RunRecorded(run_id="r1", outcomes=10000, db_path="/tmp/populace.duckdb"),
    "Progress": c.Progress(run_id="r1", round=2, host_id="h1", answered=640),
    "InferBatch": c.InferBatch(batch_id="b-1", run_id="r1", round=2, model=CONFIG.model,
                               system="You are playing a game.", keys=[4, 5],
                               prompts=["You are player 4.", "You are player 5."]),
    "InferReply": c.InferReply(batch_id="b-1", texts=['{"guess": 1}', 'fifty'], error=None,
                               valid=[True, False], attempts=[1, 2]),
    "LlmCallBatch": c.LlmCallBatch(run_id="r1", round=2, batch_id="b-1", agent_ids=[4, 5],
                                   replicas=["llama-0", "llama-1"], prompt_tokens=[90, 95],
                                   completion_tokens=[6, 14], latency_ms=[120.5, 310.0], attempts=[1, 2],
                                   valid=[True, False]),
    "ReplicaInfo": c.ReplicaInfo(replica_id="llama-0", url="http://127.0.0.1:8100", backend="local",
                                 kind="llamacpp", model="SmolLM2-135M-Instruct", max_concurrency=2,
                                 pid=99, heartbeat_at=1700000003.0),
    # nodes (`populace node`)
    "RestartPolicy": NODE_POLICY,
    "AgentHostSpec": c.AgentHostSpec(max_in_flight=1000, capacity=50_000),
    "GatewaySpec": c.GatewaySpec(router="least-loaded", max_workers=64),
    "ReplicasSpec": c.ReplicasSpec(backend="vllm", model="Qwen/Qwen2.5-0.5B", gpus=[0, 1], base_port=8100),
    "ServiceSpec": c.ServiceSpec(name="recorder"),
    "NodeRequest": c.NodeRequest(),
    "StartProcess": c.StartProcess(spec=c.AgentHostSpec(capacity=10), count=2, restart=NODE_POLICY,
                                   request_id="0f3c2a"),
    "StopProcess": c.StopProcess(proc_id="agent-host-1", grace_s=5.0),
    "ListProcesses": c.ListProcesses(),
    "TailLog": c.TailLog(proc_id="agent-host-1", lines=20, max_bytes=4096),
    "Cleanup": c.Cleanup(grace_s=2.5),
    "ProcessInfo": NODE_PROCESS,
    "GpuInfo": c.GpuInfo(index=0, name="NVIDIA L4", memory_mb=23034),
    "NodeInfo": NODE_INFO,
    "NodeReply": c.NodeReply(node_id="gpu-1", ok=True, node=NODE_INFO, processes=[NODE_PROCESS], log="a\nb",
                             log_truncated=True),
    "ReadRequest": c.ReadRequest(),
    "SnapshotRequest": c.SnapshotRequest(run_ids=["r1", "r2"]),
    "ReadReply": c.ReadReply(ok=False, error="malformed request"),
    "SnapshotReply": c.SnapshotReply(ok=True, snapshot="snapshot-1", size=12288, runs=["r1"]),
    "AgentsRequest": c.AgentsRequest(run_id="r1", search="teacher chess", offset=50, limit=50),
    "AgentRound": c.AgentRound(round=2, values={"value": 33.5}, valid=True, raw='{"guess": 33.5}'),
    "AgentRow": c.AgentRow(agent_id=7, profile="education: master's · age: 38", persona="Maria — a teacher",
                           rounds=[c.AgentRound(round=1, values={"value": None}, valid=False, error="not a number")]),
    "AgentsReply": c.AgentsReply(ok=True, run_id="r1", total=1, limit=50, columns=["value"], rounds=[1],
                                 rounds_total=1, personas=True, agents=[c.AgentRow(agent_id=7)]),
    # interviews (populace.sdk.interview)
    "Question": c.Question(id="trust", text="How much do you trust the council?", labels=["none", "some", "a lot"]),
    "Survey": c.Survey(id="s1", mode="together", questions=[c.Question(id="car", text="A car?", options=["yes", "no"])]),
    "PlannedInterview": c.PlannedInterview(id="panel", after="every", sample=0.25, questions=[
        c.Question(id="n", text="How many?", min=0, max=10, integer=True)]),
    "InterviewBatch": c.InterviewBatch(run_id="r1", after_round=2, host_id="h1", seq=0, survey=c.Survey(
        id="s1", questions=[c.Question(id="car", text="A car?", options=["yes", "no"])]), agent_ids=[4, 5],
        questions=["car", "car"], answers=["yes", None], values=[None, None], raws=['{"answer": "yes"}', "boat"],
        valid=[True, False], errors=[None, "'boat' is not one of the options"], latency_ms=[50.0, 61.5],
        usage=c.Usage(llm_calls=3)),
    "InterviewRequest": c.InterviewRequest(run_id="r1", request="q1", after_round=2, sample=0.5, survey=c.Survey(
        id="s1", questions=[c.Question(id="car", text="A car?", options=["yes", "no"])]), requested_at=1.0),
    "InterviewOrder": c.InterviewOrder(
        run_id="r1", host_id="h1", request="q1", after_round=2, agents=[4, 5], ranges=[(0, 1250)],
        survey=c.Survey(id="s1", questions=[c.Question(id="car", text="A car?", options=["yes", "no"])]),
        restore=c.Restore(run_id="r1", round=2, ranges=[(0, 1250)], digests={"r1.2.0": "ab" * 32}),
        config_ref=c.ConfigRef.of(CONFIG), placement=2),
    "InterviewPlaced": c.InterviewPlaced(run_id="r1", request="q1", after_round=2, survey=c.Survey(
        id="s1", questions=[c.Question(id="car", text="A car?", options=["yes", "no"])]),
        hosts={"h1": [(0, 1250)]}, expected=625, placed_at=1.0, placement=1,
        reason="agent-host h2 stopped (no heartbeat for 30s) while answering interview q1 after round 2"),
    "InterviewsRecorded": c.InterviewsRecorded(run_id="r1", request="q1", answers=625, db_path="/tmp/p.duckdb"),
    "InterviewsRequest": c.InterviewsRequest(run_id="r1", request="q1", by="education"),
    "InterviewsReply": c.InterviewsReply(ok=True, run_id="r1", request="q1", by="education",
                                         questions=[{"id": "car", "kind": "options"}],
                                         rows=[{"question": "car", "answer": "yes", "n": 3}], attributes=["education"]),
    # prototypes (issue 39)
    "PrototypesConfig": c.PrototypesConfig(share=0.05, by=["education"], audits=30, tolerance=4.0, on_breach="pause"),
    "PrototypeStat": c.PrototypeStat(label="education=phd", agents=500, share=0.05, representatives=25, valid=24,
                                     drawn=475, audited=20, audited_valid=20, metric="w1", divergence=3.5,
                                     ci_low=1.0, ci_high=6.0, breach=False, next_share=0.05),
    "PrototypeRound": c.PrototypeRound(stats=[c.PrototypeStat(label="all", agents=10, share=0.2, representatives=2,
                                                              valid=2, drawn=8, next_share=0.4)],
                                       shares={"all": 0.4}, representatives=2, audited=0),
    "RepresentativeRows": c.RepresentativeRows(agent_id=[3, 8], prototype=["all", "all"], valid=[True, False],
                                               columns={"value": [12.0, None]}),
    "AuditValues": c.AuditValues(agent_id=[5], prototype=["all"], valid=[True], value=[40.0]),
    "DrawTally": c.DrawTally(position=[0, 1], count=[4, 2], first=[0, 1]),
    "PrototypeEvidence": c.PrototypeEvidence(
        agents={"all": 10}, reps=c.RepresentativeRows(agent_id=[3], prototype=["all"], valid=[True],
                                                      columns={"value": [12.0]}),
        drawn=c.DrawTally(position=[0], count=[9], first=[0]),
        audits=c.AuditValues(agent_id=[], prototype=[], valid=[], value=[])),
    "DistributionRequest": c.DistributionRequest(run_id="r1", round=3, bins=20),
    "DistributionReply": c.DistributionReply(ok=True, run_id="r1", round=3, closed=3, measure="choice",
                                             kind="categorical", n=10, options=["yes", "no"], counts=[7, 3],
                                             shares=[0.7, 0.3], leader="yes", leader_share=0.7,
                                             summary={"leader": "yes"}),
}


def _family_modules():
    """The package's modules, one per contract family (run_config, run_events, …)."""
    return [importlib.import_module(f"{c.__name__}.{m.name}") for m in pkgutil.iter_modules(c.__path__)]


def test_every_wire_model_is_covered():
    # every model any family module defines (a model re-exported from elsewhere is not its own)
    defined = {name for module in _family_modules() for name, obj in vars(module).items()
               if inspect.isclass(obj) and issubclass(obj, BaseModel)
               and obj.__module__ == module.__name__ and name not in ("Strict", "Wire")}
    assert defined == set(INSTANCES)


def test_every_family_name_is_importable_from_the_package():
    # users and services import `from populace.core.contracts import X`, whichever family X is in
    for module in _family_modules():
        public = {name for name, obj in vars(module).items() if not name.startswith("_")
                  and getattr(obj, "__module__", module.__name__) == module.__name__ and not inspect.ismodule(obj)}
        missing = {name for name in public if getattr(c, name, None) is not getattr(module, name)}
        assert not missing, f"{module.__name__} defines {sorted(missing)}, not re-exported by {c.__name__}"
        assert public <= set(c.__all__)


@pytest.mark.parametrize("name", sorted(INSTANCES))
def test_json_round_trip(name):
    obj = INSTANCES[name]
    cls = type(obj)
    text = obj.model_dump_json()
    back = cls.model_validate_json(text)
    assert back == obj
    assert back.model_dump() == obj.model_dump()
    assert back.model_dump_json() == text


# A scenario's own sections (RunConfig) and a graph generator's keys (GraphRef) are open here:
# the simulation's Params and populace.graph.parse_graph check them, naming the field. A RunHead
# (or RunWriters) is a run state read in part (the rest, its config first, is left unread).
@pytest.mark.parametrize("name", sorted(set(INSTANCES) - {"RunConfig", "GraphRef", "RunHead", "RunWriters"}))
def test_unknown_field_rejected(name):
    obj = INSTANCES[name]
    data = obj.model_dump(mode="json")
    data["bogus_field"] = 1
    with pytest.raises(ValidationError) as exc:
        type(obj).model_validate(data)
    assert exc.value.errors()[0]["type"] == "extra_forbidden"


@pytest.mark.parametrize("name", sorted(n for n, o in INSTANCES.items() if "v" in type(o).model_fields))
def test_other_schema_version_rejected(name):
    obj = INSTANCES[name]
    assert obj.v == c.SCHEMA_VERSION == 1
    data = obj.model_dump(mode="json")
    data["v"] = 2
    with pytest.raises(ValidationError):
        type(obj).model_validate(data)


def test_control_plane_models_are_frozen():
    with pytest.raises(ValidationError):
        CONFIG.agents = 5  # type: ignore[misc]
    assert CONFIG.agents == 2500


def test_spawn_batch_count():
    assert INSTANCES["SpawnBatch"].count == 1250


def test_round_trip_keeps_none_values():
    g = c.OutcomeBatch.model_validate_json(INSTANCES["OutcomeBatch"].model_dump_json())
    assert g.columns == {"value": [12.0, None, 99.5]}
    r = c.RoundResult(run_id="r", round=1, n=4, n_valid=0, summary={"mean": None}, observation={},
                      closed_at=0.0)
    assert c.RoundResult.model_validate_json(r.model_dump_json()) == r


# --- batches: equal-length columns --------------------------------------------------------
@pytest.mark.parametrize("column", ["agent_ids", "valid", "raws", "latency_ms", "errors", "columns"])
def test_outcome_batch_unequal_lengths_rejected(column):
    data = INSTANCES["OutcomeBatch"].model_dump()
    if column == "columns":
        data["columns"] = {"value": [1.0]}
    else:
        data[column] = data[column][:-1]
    with pytest.raises(ValidationError, match="one value per agent id"):
        c.OutcomeBatch.model_validate(data)


def test_outcome_batch_group_ids_must_match_too():
    data = INSTANCES["OutcomeBatch"].model_dump()
    data["group_ids"] = [0, 0]
    with pytest.raises(ValidationError, match="one value per agent id"):
        c.OutcomeBatch.model_validate(data)
    data["group_ids"] = [0, 0, 1]
    assert c.OutcomeBatch.model_validate(data).group_ids == [0, 0, 1]


@pytest.mark.parametrize("shown", [{"agent_id": [3], "items": [[1, 2]], "ranks": [[1]]},  # a rank per item
                                   {"agent_id": [3, 4], "items": [[1]], "ranks": [[1]]},  # a record per agent
                                   {"agent_id": [3], "items": [[1]], "ranks": [[0]]},  # ranks count from 1
                                   {"agent_id": [3], "items": [list(range(1001))], "ranks": [list(range(1, 1002))]}])
def test_shown_records_are_one_rank_per_item_and_bounded(shown):
    with pytest.raises(ValidationError):
        c.ShownColumns.model_validate(shown)


def test_an_outcome_batch_cut_keeps_each_agents_shown_record_with_it():
    batch = c.OutcomeBatch(run_id="r", round=1, host_id="h", seq=0, agent_ids=[3, 9, 11], columns={},
                           valid=[True] * 3, raws=[""] * 3, latency_ms=[0.0] * 3, errors=[None] * 3,
                           shown=INSTANCES["ShownColumns"])
    assert batch.take([0]).shown.agent_id == [3] and batch.take([0]).shown.items == [[41, 7, 12]]
    assert batch.take([1, 2]).shown.agent_id == [9] and batch.take([1, 2]).shown.ranks == [[]]
    assert batch.take([2]).shown is None


def test_outcome_batch_empty_is_fine():
    g = c.OutcomeBatch(run_id="r", round=1, host_id="h", seq=0, agent_ids=[], columns={}, valid=[], raws=[],
                       latency_ms=[], errors=[])
    assert g.agent_ids == []


@pytest.mark.parametrize("name", ["Guesses", "1st", "a-b", "x" * 64, ""])
def test_table_and_column_names_are_plain_identifiers(name):
    with pytest.raises(ValidationError):
        c.Column(name=name, type="DOUBLE")
    with pytest.raises(ValidationError):
        c.SimulationTables.model_validate({**TABLES.model_dump(), "outcomes": name})


@pytest.mark.parametrize("keys,prompts", [([1, 2], ["a"]), ([1], ["a", "b"]), ([], ["a"])])
def test_infer_batch_unequal_lengths_rejected(keys, prompts):
    data = INSTANCES["InferBatch"].model_dump()
    data.update(keys=keys, prompts=prompts)
    with pytest.raises(ValidationError, match="equal length"):
        c.InferBatch.model_validate(data)


# --- run config --------------------------------------------------------------------------------
def test_run_config_defaults():
    cfg = c.RunConfig()
    assert (cfg.simulation, cfg.name, cfg.agents, cfg.rounds, cfg.model.backend) == (
        "ratio-game", "ratio-game", 1000, 3, "dummy")
    assert cfg.params == {}


def test_run_config_keeps_the_simulations_sections_flat_and_as_written():
    cfg = c.RunConfig(simulation="vote", agents=10, vote={"question": "Q?"}, prompt={"answer": "cot"})
    assert cfg.params == {"vote": {"question": "Q?"}, "prompt": {"answer": "cot"}}
    dumped = cfg.model_dump(mode="json")
    assert dumped["vote"] == {"question": "Q?"} and "params" not in dumped
    assert c.RunConfig.model_validate_json(cfg.model_dump_json()) == cfg
    assert cfg.name == "vote"  # the default name is the simulation's


@pytest.mark.parametrize("simulation", ["", "a b", "x;rm", "a/b", "x" * 201])
def test_run_config_rejects_bad_simulation_names(simulation):
    with pytest.raises(ValidationError) as exc:
        c.RunConfig(simulation=simulation)
    assert exc.value.errors()[0]["loc"] == ("simulation",)


@pytest.mark.parametrize("field,value", [("agents", 0), ("agents", -5), ("rounds", 0), ("rounds", -1),
                                         ("name", "x" * 201), ("agents", "many"), ("rounds", 10_001)])
def test_run_config_rejects(field, value):
    with pytest.raises(ValidationError) as exc:
        c.RunConfig(**{field: value})
    assert exc.value.errors()[0]["loc"] == (field,)


def test_one_agent_per_process_is_bounded():
    one = c.PlacementConfig(agents_per_process=1)
    assert c.RunConfig(agents=10_000, placement=one).agents == 10_000
    with pytest.raises(ValidationError, match="too many"):
        c.RunConfig(agents=10_001, placement=one)
    # the many-per-process default has no such limit
    assert c.RunConfig(agents=1_000_000).agents == 1_000_000
    with pytest.raises(ValidationError):
        c.PlacementConfig(agents_per_process=2)


@pytest.mark.parametrize("run_id", ["a.b", "run 1", "run*", "run>", "", "x\ty", "r\n", "a" * 65])
def test_run_start_rejects_bad_run_id(run_id):
    with pytest.raises(ValidationError):
        c.RunStart(run_id=run_id, config=CONFIG)


def test_run_start_accepts_token_and_defaults_requested_at():
    r = c.RunStart(run_id="run-1_B", config=CONFIG)
    assert r.requested_at > 1_600_000_000


@pytest.mark.parametrize("host_id", ["h.1", "h 1", "h*", "h>"])
def test_host_info_rejects_bad_host_id(host_id):
    with pytest.raises(ValidationError):
        c.HostInfo(host_id=host_id, capacity=1, pid=1, started_at=0, heartbeat_at=0)


def test_host_info_capacity_at_least_one():
    with pytest.raises(ValidationError):
        c.HostInfo(host_id="h", capacity=0, pid=1, started_at=0, heartbeat_at=0)


@pytest.mark.parametrize("field,value", [("round", 0), ("expected", 0)])
def test_round_open_bounds(field, value):
    data = INSTANCES["RoundOpen"].model_dump()
    data[field] = value
    with pytest.raises(ValidationError):
        c.RoundOpen.model_validate(data)


def test_run_state_status_is_closed_set():
    data = INSTANCES["RunState"].model_dump()
    data["status"] = "sleeping"
    with pytest.raises(ValidationError):
        c.RunState.model_validate(data)


# --- subjects ----------------------------------------------------------------------------------
def test_subject_builders():
    assert s.run_round_open("r1", 3) == "run.r1.round.3.open"
    assert s.run_round_result("r1", 3) == "run.r1.round.3.result"
    assert s.run_partial("r1", 2, "h1") == "run.r1.partial.2.h1.0"
    assert s.run_partial("r1", 2, "h1", 3) == "run.r1.partial.2.h1.3"
    assert s.run_outcomes("r1", 2, "h1") == "run.r1.outcomes.2.h1"
    assert s.run_fault("r1", "environment") == "run.r1.fault.environment"
    assert s.run_spawn("r1", "h1") == "run.r1.spawn.h1"
    assert s.any_spawn_for("h9") == "run.*.spawn.h9"
    assert s.run_all("r1") == "run.r1.>"
    assert s.dlq("gateway") == "dlq.gateway"


@pytest.mark.parametrize("subject,kind", [
    (s.run_started("r"), "started"),
    (s.run_spawn("r", "h"), "spawn"),
    (s.run_spawned("r", "h"), "spawned"),
    (s.run_round_open("r", 1), "round.open"),
    (s.run_round_result("r", 12), "round.result"),
    (s.run_outcomes("r", 1, "h"), "outcomes"),
    (s.run_fault("r", "h"), "fault"),
    (s.run_partial("r", 1, "h"), "partial"),
    (s.run_done("r"), "done"),
    (s.run_recorded("r"), "recorded"),
    (s.progress("r", 1, "h"), ""),
    ("ctl.run.start", ""),
    ("run.r", ""),
    ("", ""),
])
def test_kind_of(subject, kind):
    assert s.kind_of(subject) == kind


@pytest.mark.parametrize("token,ok", [("run-1", True), ("R_2", True), ("h", True), ("", False),
                                      ("a.b", False), ("a b", False), ("a*", False), ("a>", False),
                                      ("a\tb", False), ("a\nb", False), ("a\rb", False)])
def test_valid_token(token, ok):
    assert s.valid_token(token) is ok


def test_msg_id_is_deterministic_and_distinct():
    assert s.msg_id("r1", 2, "h1", "partial") == "r1.2.h1.partial"
    assert s.msg_id("r1", 2, 7, "outcomes") == "r1.2.7.outcomes"
    ids = {s.msg_id("r1", n, h, k) for n in (1, 2) for h in ("h1", "h2") for k in ("partial", "outcomes")}
    assert len(ids) == 8


@pytest.mark.parametrize("pattern,title", [
    (s.ANY_ROUND_OPEN, "run.{run_id}.round.{round}.open"),
    (s.ANY_PARTIAL, "run.{run_id}.partial.{round}.{host_id}.{epoch}"),
    (s.any_spawn_for("myhost-1234"), "run.{run_id}.spawn.{host_id}"),  # no machine name in the docs
    (s.ANY_FAULT, "run.{run_id}.fault.{source}"),
    (s.LLM_INFER, "llm.infer"),
])
def test_doc_titles_name_the_wildcards(pattern, title):
    assert s.doc_title(pattern) == title


def test_an_infer_batchs_shared_suffix_ends_every_prompt():
    from populace.sdk.nats_llm import common_suffix

    b = c.InferBatch(batch_id="b", run_id="r", round=1, model=c.ModelConfig(), system="s", keys=[1, 2],
                     prompts=["a", "bb"], suffix=" - the question?")
    assert [b.prompt(i) for i in range(2)] == ["a - the question?", "bb - the question?"]
    assert c.InferBatch.model_validate_json(b.model_dump_json()).suffix == " - the question?"
    end = " and then the same question for all"
    assert common_suffix(["x" + end, "yy" + end, "zzz" + end], [0, 0, 0]) == len(end)
    assert common_suffix(["ab" + end, "cb" + end], [0, 0]) == len("b" + end)
    assert common_suffix(["x" + end, "y" + end], [1, 10]) == len(end) - 9  # never into a prefix
    assert common_suffix(["x" + end, "nothing alike"], [0, 0]) == 0
