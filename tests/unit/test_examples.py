"""Every shipped example scenario and sweep validates (and resolves its population)."""

from __future__ import annotations

from pathlib import Path

import pytest

from populace.client.prepare import prepare_file
from populace.client.sweep import plan

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.name)
def test_example_scenario_prepares(path):
    prepared = prepare_file(path)
    assert prepared.config.agents >= 1
    assert prepared.manifest["config_hash"]


@pytest.mark.parametrize("path", sorted((EXAMPLES / "sweeps").glob("*.yaml")), ids=lambda p: p.name)
def test_example_sweep_plans(path):
    sp = plan(path)
    assert len(sp.cells) == len(sp.prepared) >= 2


def test_the_education_cot_example_uses_the_shipped_smollm2_personas():
    prepared = prepare_file(EXAMPLES / "education-cot.yaml")
    assert prepared.config.agents == 50 and prepared.config.params["prompt"]["answer"] == "cot"
    assert prepared.manifest["population"]["mode"] == "llm"
