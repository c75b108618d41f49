"""The client builds and validates a run's final config once: a scenario is validated as it is
resolved (its simulation's sections and model defaults in), what the client fills in (the
personas' count and digest, the graph's digests) is validated once more with all of it, and
nothing after (the services' resolve, the start message) validates it again.
populace_run_configs_validated_total counts every validation of a RunConfig."""

from __future__ import annotations

from pathlib import Path

from populace.client.api import prepare_scenario
from populace.client.prepare import prepare_file
from populace.core import bus, metrics
from populace.core.contracts import RunStart
from populace.sdk.registry import resolve

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def validated() -> float:
    return metrics.RUN_CONFIGS_VALIDATED._value.get()


def counted(build):
    before = validated()
    out = build()
    return out, validated() - before


def submitted(prepared) -> int:
    """What submission and the services' resolution add: nothing."""
    before = validated()
    resolve(prepared.config)  # what the orchestrator does with it: resolved already
    bus.encode(RunStart(run_id="r1", config=prepared.config, manifest=prepared.manifest))
    return validated() - before


def test_a_scenario_file_is_validated_once_from_the_file_to_the_start_message():
    prepared, n = counted(lambda: prepare_file(EXAMPLES / "guess-two-thirds.yaml"))
    assert n == 1
    assert prepared.config.params["game"]["ratio"]  # resolved: its simulation's sections as validated
    assert submitted(prepared) == 0


def test_a_mapping_with_overrides_is_validated_once():
    prepared, n = counted(lambda: prepare_scenario({"simulation": "public-goods", "agents": 12, "rounds": 2},
                                                   {"rounds": 3, "model": {"backend": "dummy"}}))
    assert n == 1 and prepared.config.rounds == 3
    assert submitted(prepared) == 0


def test_a_population_and_a_graph_add_one_validation_together_not_one_each():
    # the scenario as written, then once with the personas' count and digest and the graph's digests
    prepared, n = counted(lambda: prepare_file(EXAMPLES / "opinion.yaml"))
    assert n == 2
    assert prepared.config.population.digest and prepared.config.graph.digest
    assert submitted(prepared) == 0
