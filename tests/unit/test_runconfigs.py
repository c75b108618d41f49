"""A run's config travels by digest: round opens do not grow with it, its digest survives the
JSON round trips of KV `runs`, and a process validates it once per run however often it reads
the run's state."""

from __future__ import annotations

from populace.core import bus, metrics, runconfigs
from populace.core.admission import open_refusal
from populace.core.contracts import Budget, ConfigRef, RunConfig, RunState
from populace.orchestrator import workflow


def validated() -> float:
    return metrics.RUN_CONFIGS_VALIDATED._value.get()


def config(game: dict | None = None) -> RunConfig:
    return RunConfig.model_validate({"agents": 10, "rounds": 3, "model": {"temperature": 0.3, "latency_s": 0.125},
                                     "game": game or {"ratio": "2/3", "offset": 0.1}})


def running(cfg: RunConfig, rid: str = "r1") -> RunState:
    s = workflow.new_run(rid, cfg, {"h1": [(0, 6)], "h2": [(6, 4)]})
    s, _ = workflow.on_spawned(s, "h1", 0)
    s, _ = workflow.on_spawned(s, "h2", 0)
    return s


def test_a_round_open_is_the_same_size_whatever_the_configs_size():
    big = config({"ratio": "2/3", "notes": "x" * 50_000})  # a 50 KB simulation section
    opens = [workflow.round_open(running(c), workflow.OpenRound(1, 10), 0.0) for c in (config(), big)]
    assert len(bus.encode(big)) > 50_000
    assert len(bus.encode(opens[0])) == len(bus.encode(opens[1])) < 1_000
    assert opens[0].config_ref != opens[1].config_ref  # each names its own config
    assert all(open_refusal(running(c), o) is None for c, o in zip((config(), big), opens, strict=True))


def test_the_digest_survives_kv_round_trips_and_changes_with_the_config():
    s = running(config())
    again = RunState.model_validate_json(bus.encode(RunState.model_validate_json(bus.encode(s))))
    assert again.config_ref == s.config_ref == ConfigRef.of(again.config)
    assert ConfigRef.of(config({"ratio": "1/2"})).digest != s.config_ref.digest
    assert ConfigRef.of(s.config, 2).digest == s.config_ref.digest  # the same config from another round


def test_a_resume_with_a_new_budget_names_the_new_config_from_the_round_it_plays():
    s = running(config())
    paused = s.model_copy(update={"status": "paused", "round": 2})
    resumed, _ = workflow.on_resume(paused, {"h1": [(0, 10)]}, budget=Budget(llm_calls=99))
    assert resumed.config_ref == ConfigRef.of(resumed.config, 3) != s.config_ref
    unchanged, _ = workflow.on_resume(paused, {"h1": [(0, 10)]})
    assert unchanged.config_ref == s.config_ref


def test_reading_a_runs_state_again_and_again_validates_its_config_once():
    cache = runconfigs.ConfigCache()
    s = running(config(), rid="r-cache")
    data = bus.encode(s)
    before = validated()
    states = [cache.state(data) for _ in range(5)]
    assert validated() - before == 1
    assert all(st == s for st in states) and all(st.config is states[0].config for st in states)
    # a new config (a resume with a new budget): validated once more, then kept in its place
    changed = s.model_copy(update={"config": s.config.model_copy(update={"name": "other"})})
    changed = changed.model_copy(update={"config_ref": ConfigRef.of(changed.config, 2)})
    before = validated()
    assert [cache.state(bus.encode(changed)).config.name for _ in range(3)] == ["other"] * 3
    assert validated() - before == 1
    cache.forget("r-cache")
    assert cache.get("r-cache", changed.config_ref.digest) is None


def test_a_state_whose_config_is_not_its_digests_is_not_kept():
    cache = runconfigs.ConfigCache()
    s = running(config(), rid="r-lie")
    lying = s.model_copy(update={"config_ref": ConfigRef.of(config({"ratio": "1/2"}))})
    assert cache.state(bus.encode(lying)).config == s.config
    assert cache.get("r-lie", lying.config_ref.digest) is None


def test_the_cache_is_bounded():
    cache = runconfigs.ConfigCache(limit=2)
    for i in range(3):
        cache.put(f"r{i}", "d", config())
    assert cache.get("r0", "d") is None and cache.get("r2", "d") is not None


def test_a_configs_object_is_a_checkpoint_of_its_round_kept_with_the_last_round_and_pruned_with_all():
    from populace.core import checkpoints, subjects

    name = runconfigs.object_name("r1", ConfigRef(digest="a" * 64, from_round=3))
    assert name == "r1.3.config." + "a" * 64 and subjects.checkpoint_round("r1", name) == 3
    assert checkpoints.to_prune("r1", [name, "r1.4.env"], "none") == [name, "r1.4.env"]
    # kept with the last round: a post-hoc interview of it names the config by digest
    assert checkpoints.to_prune("r1", [name, "r1.4.env"], "last") == []


def test_an_interview_order_names_the_config_by_digest_and_does_not_carry_it():
    from populace.core.contracts import InterviewOrder

    assert "config" not in InterviewOrder.model_fields and "config_ref" in InterviewOrder.model_fields
