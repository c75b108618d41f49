"""Population configs: YAML → PopulationConfig, and errors that start with the field path."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from populace.population import (
    CategoricalAttribute,
    ConditionalAttribute,
    NumericAttribute,
    PopulationError,
    config_hash,
    load_population,
    parse_population,
    parse_population_yaml,
)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "population"

GOOD = textwrap.dedent("""\
    name: test
    total: 10
    seed: 3
    attributes:
      education:
        quotas: {high school: 4, bachelor's: 3, Ph.D.: 3}
      gender:
        weights: {female: 0.5, male: 0.5}
      age:
        normal: {mean: 40, std: 10, min: 18, max: 80}
        integer: true
      occupation:
        given: education
        weights_by:
          high school: {artist: 1.0}
          bachelor's: {teacher: 0.5, engineer: 0.5}
          Ph.D.: {economist: 0.5, game theory professor: 0.5}
""")


def err(text: str) -> str:
    with pytest.raises(PopulationError) as info:
        parse_population_yaml(textwrap.dedent(text))
    return str(info.value)


def with_attrs(attrs: str, total: int = 10, extra: str = "") -> str:
    body = textwrap.indent(textwrap.dedent(attrs), "  ")
    return f"name: t\ntotal: {total}\n{extra}attributes:\n{body}"


# ----------------------------------------------------------------------------- good configs

def test_good_config_parses_with_kinds_and_order():
    cfg = parse_population_yaml(GOOD)
    assert cfg.total == 10 and cfg.seed == 3
    assert list(cfg.attributes) == ["education", "gender", "age", "occupation"]
    assert isinstance(cfg.attributes["education"], CategoricalAttribute)
    assert isinstance(cfg.attributes["age"], NumericAttribute)
    assert cfg.attributes["age"].integer is True
    occ = cfg.attributes["occupation"]
    assert isinstance(occ, ConditionalAttribute)
    assert occ.given == "education"
    assert occ.categories() == ["artist", "teacher", "engineer", "economist",
                                "game theory professor"]


@pytest.mark.parametrize("name", ["education.yaml", "occupation.yaml"])
def test_example_configs_load(name):
    cfg = load_population(EXAMPLES / name)
    assert cfg.total >= 1


def test_education_example_is_the_papers_five_levels():
    cfg = load_population(EXAMPLES / "education.yaml")
    edu = cfg.attributes["education"]
    assert edu.categories() == ["elementary school", "high school", "bachelor's", "master's",
                                "Ph.D."]
    values = list((edu.quotas or edu.weights).values())
    assert len(set(values)) == 1  # equal quotas (or weights)
    assert isinstance(cfg.attributes["age"], NumericAttribute)
    age = cfg.attributes["age"].normal
    assert age is not None and (age.min, age.max) == (18, 80)
    assert "gender" in cfg.attributes


def test_occupation_example_has_six_occupations_and_a_condition():
    cfg = load_population(EXAMPLES / "occupation.yaml")
    assert cfg.total == 600
    kinds = {name: a.kind for name, a in cfg.attributes.items()}
    assert "conditional" in kinds.values()
    occ = cfg.attributes["occupation"]
    cats = occ.categories()
    assert len(cats) == 6
    assert "game theory professor" in cats and "economist" in cats


def test_defaults_and_python_dicts():
    cfg = parse_population({"name": "t", "total": 2,
                            "attributes": {"g": {"weights": {"a": 1}}}})
    assert cfg.seed == 0
    assert parse_population(cfg) is cfg


def test_scalar_keys_stay_text():
    cfg = parse_population_yaml(with_attrs("""\
        flag:
          weights: {yes: 0.5, no: 0.25, 1: 0.25}
    """))
    assert cfg.attributes["flag"].categories() == ["yes", "no", "1"]


def test_anchors_and_merge_keys_work():
    cfg = parse_population_yaml(with_attrs("""\
        a:
          weights: &w {x: 0.5, y: 0.5}
        b:
          weights: *w
    """))
    assert cfg.attributes["b"].weights == {"x": 0.5, "y": 0.5}


def test_config_hash_ignores_formatting_but_not_content():
    a = parse_population_yaml(GOOD)
    b = parse_population_yaml("# a comment\n" + GOOD.replace("seed: 3", "seed:   3  # three"))
    c = parse_population_yaml(GOOD.replace("seed: 3", "seed: 4"))
    assert config_hash(a) == config_hash(b)
    assert config_hash(a) != config_hash(c)
    assert len(config_hash(a)) == 64


# ----------------------------------------------------------------------------- bad configs

def test_weights_not_summing_to_one():
    msg = err(with_attrs("""\
        education:
          weights: {a: 0.3, b: 0.3, c: 0.3}
    """))
    assert msg == "attributes.education.weights: weights must sum to 1 (got 0.9)"


def test_weights_within_tolerance_are_accepted():
    parse_population_yaml(with_attrs("""\
        e:
          weights: {a: 0.3333333, b: 0.3333333, c: 0.3333333}
    """))


def test_negative_weight_names_the_category():
    msg = err(with_attrs("""\
        gender:
          weights: {female: 1.1, male: -0.1}
    """))
    assert msg.startswith("attributes.gender.weights.male: ")
    assert "greater than or equal to 0" in msg


def test_negative_quota_names_the_category():
    msg = err(with_attrs("""\
        education:
          quotas: {a: 11, b: -1}
    """))
    assert msg.startswith("attributes.education.quotas.b: ")


def test_fractional_quota_is_rejected():
    msg = err(with_attrs("""\
        education:
          quotas: {a: 5.5, b: 4.5}
    """))
    assert msg.startswith("attributes.education.quotas.a: ")


def test_quotas_must_sum_to_total():
    msg = err(with_attrs("""\
        education:
          quotas: {a: 4, b: 4}
    """))
    assert msg == "attributes.education.quotas: quotas must sum to total (10) (got 8)"


def test_both_weights_and_quotas():
    msg = err(with_attrs("""\
        education:
          weights: {a: 1.0}
          quotas: {a: 10}
    """))
    assert msg.startswith("attributes.education: give exactly one of weights or quotas")


def test_neither_weights_nor_quotas():
    msg = err(with_attrs("""\
        education: {}
    """))
    assert msg.startswith("attributes.education: an attribute needs weights or quotas")


def test_mixed_kinds():
    msg = err(with_attrs("""\
        age:
          weights: {a: 1.0}
          uniform: {min: 1, max: 2}
    """))
    assert msg.startswith("attributes.age: mixes keys of categorical")


@pytest.mark.parametrize("text, field", [
    ("name: t\ntotal: 1\ncolour: red\nattributes:\n  g: {weights: {a: 1}}\n", "colour"),
    ("name: t\ntotal: 1\nattributes:\n  g: {weights: {a: 1}, sort: true}\n",
     "attributes.g.sort"),
    ("name: t\ntotal: 1\nattributes:\n  a: {normal: {mean: 1, std: 1, min: 0, max: 2, sd: 1}}\n",
     "attributes.a.normal.sd"),
    ("name: t\ntotal: 1\nattributes:\n  a: {bins: [{min: 0, max: 1, weight: 1, w: 2}]}\n",
     "attributes.a.bins.0.w"),
    (("name: t\ntotal: 1\nattributes:\n  g: {weights: {a: 1}}\n  "
      "c: {given: g, weights_by: {a: {x: 1}}, prior: 1}\n"), "attributes.c.prior"),
])
def test_unknown_keys_are_named(text, field):
    msg = err(text)
    assert msg.startswith(f"{field}: unknown key")


def test_unknown_key_lists_the_allowed_keys():
    msg = err("name: t\ntotal: 1\nattributes:\n  g: {weights: {a: 1}, sort: true}\n")
    assert "allowed: weights, quotas" in msg


def test_duplicate_category_is_rejected():
    msg = err(with_attrs("""\
        gender:
          weights:
            female: 0.5
            male: 0.25
            male: 0.25
    """))
    assert msg.startswith("attributes.gender.weights: duplicate key 'male'")


def test_duplicate_attribute_is_rejected():
    msg = err(with_attrs("""\
        gender:
          weights: {a: 1}
        gender:
          weights: {b: 1}
    """))
    assert msg.startswith("attributes: duplicate key 'gender'")


def test_duplicate_parent_category_in_condition():
    msg = err(with_attrs("""\
        e:
          weights: {a: 0.5, b: 0.5}
        o:
          given: e
          weights_by:
            a: {x: 1}
            a: {y: 1}
            b: {x: 1}
    """))
    assert msg.startswith("attributes.o.weights_by: duplicate key 'a'")


def test_condition_on_unknown_attribute():
    msg = err(with_attrs("""\
        occupation:
          given: edu
          weights_by: {a: {x: 1}}
    """))
    assert msg.startswith("attributes.occupation.given: unknown attribute 'edu'")


def test_condition_on_later_attribute():
    msg = err(with_attrs("""\
        occupation:
          given: education
          weights_by: {a: {x: 1}}
        education:
          weights: {a: 1}
    """))
    assert msg.startswith("attributes.occupation.given: 'education' is declared after")


def test_condition_on_numeric_attribute():
    msg = err(with_attrs("""\
        age:
          uniform: {min: 1, max: 2}
        o:
          given: age
          weights_by: {a: {x: 1}}
    """))
    assert msg.startswith("attributes.o.given: 'age' is numeric")


def test_condition_on_itself():
    msg = err(with_attrs("""\
        o:
          given: o
          weights_by: {a: {x: 1}}
    """))
    assert msg.startswith("attributes.o.given: an attribute cannot depend on itself")


def test_condition_must_cover_every_parent_category():
    msg = err(with_attrs("""\
        e:
          weights: {a: 0.5, b: 0.5}
        o:
          given: e
          weights_by:
            a: {x: 1}
    """))
    assert msg.startswith("attributes.o.weights_by: no weights for e category 'b'")


def test_condition_names_unknown_parent_category():
    msg = err(with_attrs("""\
        e:
          weights: {a: 1}
        o:
          given: e
          weights_by:
            a: {x: 1}
            z: {x: 1}
    """))
    assert msg.startswith("attributes.o.weights_by.z: 'z' is not a category of 'e'")


def test_condition_inner_weights_must_sum_to_one():
    msg = err(with_attrs("""\
        e:
          weights: {a: 1}
        o:
          given: e
          weights_by:
            a: {x: 0.5, y: 0.4}
    """))
    assert msg == "attributes.o.weights_by.a: weights must sum to 1 (got 0.9)"


def test_condition_missing_weights_by():
    msg = err(with_attrs("""\
        e:
          weights: {a: 1}
        o:
          given: e
    """))
    assert msg.startswith("attributes.o.weights_by: required key is missing")


def test_condition_on_a_conditional_parent_is_allowed():
    cfg = parse_population_yaml(with_attrs("""\
        e:
          weights: {a: 1}
        o:
          given: e
          weights_by: {a: {x: 0.5, y: 0.5}}
        s:
          given: o
          weights_by: {x: {lo: 1}, y: {hi: 1}}
    """))
    assert cfg.attributes["s"].categories() == ["lo", "hi"]


@pytest.mark.parametrize("spec, field, needle", [
    ("normal: {mean: 40, std: 0, min: 18, max: 80}", "attributes.age.normal.std",
     "greater than 0"),
    ("normal: {mean: 40, std: 5, min: 80, max: 18}", "attributes.age.normal",
     "min must be below max"),
    ("normal: {mean: 40, std: 5}", "attributes.age.normal.min", "required"),
    ("normal: {mean: 0, std: 1, min: 50, max: 60}", "attributes.age.normal",
     "almost none of the mass"),
    ("uniform: {min: 5, max: 5}", "attributes.age.uniform", "min must be below max"),
    ("uniform: {min: 0.2, max: 0.8}\ninteger: true", "attributes.age.uniform",
     "no whole number"),
    ("bins: [{min: 18, max: 30, weight: 0.5}, {min: 30, max: 80, weight: 0.4}]",
     "attributes.age.bins", "bin weights must sum to 1 (got 0.9)"),
    ("bins: [{min: 18, max: 30, weight: 0.5}, {min: 25, max: 80, weight: 0.5}]",
     "attributes.age.bins.1", "overlaps bins.0"),
    ("bins: [{min: 18, max: 30, weight: 0.5}, {min: 30, max: 80, weight: 0.5}]\ninteger: true",
     "attributes.age.bins.1", "overlaps bins.0"),
    ("bins: [{min: 18.5, max: 30, weight: 1}]\ninteger: true", "attributes.age.bins.0",
     "whole numbers"),
    ("bins: [{min: 18, max: 30, weight: -1}, {min: 31, max: 80, weight: 2}]",
     "attributes.age.bins.0.weight", "greater than or equal to 0"),
    ("uniform: {min: 1, max: 2}\nnormal: {mean: 1, std: 1, min: 0, max: 2}", "attributes.age",
     "exactly one of uniform, normal or bins"),
])
def test_bad_numeric_attributes(spec, field, needle):
    msg = err("name: t\ntotal: 5\nattributes:\n  age:\n" + textwrap.indent(spec, "    ") + "\n")
    assert msg.startswith((f"{field}: ", f"{field}.")), msg
    assert needle in msg, msg


def test_float_bins_may_touch():
    parse_population_yaml(with_attrs("""\
        h:
          bins: [{min: 150, max: 170, weight: 0.5}, {min: 170, max: 190, weight: 0.5}]
    """))


@pytest.mark.parametrize("text, field", [
    ("name: t\ntotal: 0\nattributes:\n  g: {weights: {a: 1}}\n", "total"),
    ("name: t\ntotal: '5'\nattributes:\n  g: {weights: {a: 1}}\n", "total"),
    ("name: t\ntotal: 5\nseed: 1.5\nattributes:\n  g: {weights: {a: 1}}\n", "seed"),
    ("total: 5\nattributes:\n  g: {weights: {a: 1}}\n", "name"),
    ("name: t\ntotal: 5\n", "attributes"),
    ("name: t\ntotal: 5\nattributes: {}\n", "attributes"),
    ("name: t\ntotal: 5\nattributes:\n  g: [1, 2]\n", "attributes.g"),
    ("name: t\ntotal: 5\nattributes:\n  g: {weights: {}}\n", "attributes.g.weights"),
    ("name: t\ntotal: 5\nattributes:\n  g: {weights: {a: '1'}}\n", "attributes.g.weights.a"),
])
def test_bad_top_level_fields(text, field):
    msg = err(text)
    assert msg.startswith(f"{field}: "), msg


def test_several_problems_one_per_line():
    msg = err(with_attrs("""\
        a:
          weights: {x: 0.5}
        b:
          quotas: {y: -1}
    """))
    lines = msg.splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("attributes.a.weights: ")
    assert lines[1].startswith("attributes.b.quotas.y: ")


def test_not_a_mapping_and_not_yaml(tmp_path):
    assert err("- 1\n- 2\n").startswith("(population): ")
    p = tmp_path / "bad.yaml"
    p.write_text("name: [unclosed\n")
    with pytest.raises(PopulationError, match=r"bad.yaml: not valid YAML"):
        load_population(p)
    with pytest.raises(PopulationError, match=r"cannot read"):
        load_population(tmp_path / "missing.yaml")


def test_population_error_is_a_value_error():
    assert issubclass(PopulationError, ValueError)
