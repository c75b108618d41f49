"""Issue #4's list of bad population configs: each is rejected with exit code 2 and a message
naming the field — by `personas generate` (writing nothing) and by a scenario that names the
config. In process (the `cli` fixture); tests/e2e/test_cli.py runs `personas generate` as a real
process."""

from __future__ import annotations

import pytest

HEAD = "name: bad\ntotal: 10\nattributes:\n"

BAD = {
    "weights do not sum to 1": (HEAD + "  education:\n    weights: {a: 0.5, b: 0.5000011}\n",
                                "attributes.education.weights"),
    "a negative weight": (HEAD + "  education:\n    weights: {a: 1.5, b: -0.5}\n", "attributes.education.weights"),
    "a negative count": (HEAD + "  education:\n    quotas: {a: 12, b: -2}\n", "attributes.education.quotas"),
    "an unknown key": (HEAD + "  education:\n    weights: {a: 1.0}\n    colour: red\n", "attributes.education.colour"),
    "an unknown top-level key": ("name: bad\ntotal: 10\nsize: 3\nattributes:\n  e:\n    weights: {a: 1.0}\n", "size"),
    "a duplicate category name": (HEAD + "  education:\n    weights: {a: 0.5, a: 0.5}\n",
                                  "attributes.education.weights"),
    "a condition on an unknown attribute": (
        HEAD + "  occupation:\n    quotas: {x: 10}\n  education:\n    given: schooling\n"
               "    weights_by:\n      x: {a: 1.0}\n", "attributes.education.given"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_personas_generate_rejects_it(cli, tmp_path, case):
    text, field = BAD[case]
    cfg = tmp_path / "pop.yaml"
    cfg.write_text(text)
    res = cli("personas", "generate", str(cfg), "--count", "10", "--model", "template",
              "--out", str(tmp_path / "p.jsonl"))
    assert res.returncode == 2, (case, res.stdout, res.stderr)
    assert field in res.stderr, (case, res.stderr)
    assert not (tmp_path / "p.jsonl").exists()


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_scenario_naming_it_is_rejected(cli, tmp_path, case):
    text, field = BAD[case]
    (tmp_path / "pop.yaml").write_text(text)
    scenario = tmp_path / "scenario.yaml"
    scenario.write_text("rounds: 2\npopulation: {config: pop.yaml}\n")
    res = cli("validate", str(scenario))
    assert res.returncode == 2, (case, res.stdout, res.stderr)
    assert "population.config" in res.stderr and field in res.stderr, (case, res.stderr)
