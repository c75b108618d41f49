"""Template personas (no LLM) and the personas JSONL format."""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from pathlib import Path

from populace.population import (
    TEMPLATE_PROMPT_VERSION,
    config_hash,
    load_population,
    persona_record,
    read_jsonl,
    sample_profiles,
    template_persona,
    template_provenance,
    template_records,
    write_jsonl,
)
from populace.population.names import FEMALE_FIRST, LAST, MALE_FIRST, NEUTRAL_FIRST

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "population"


def test_persona_copies_gender_and_age_from_the_profile():
    profile = {"education": "master's", "age": 34, "gender": "female", "occupation": "economist"}
    p = template_persona(profile, 0, 0)
    assert set(p) == {"name", "gender", "age", "description"}
    assert p["gender"] == "female" and p["age"] == 34
    first, last = p["name"].split(" ", 1)
    assert first in FEMALE_FIRST and last in LAST
    assert p["description"].startswith("A 34-year-old economist with a master's degree who is ")


def test_name_follows_gender():
    for i in range(50):
        assert template_persona({"gender": "male"}, i, 1)["name"].split()[0] in MALE_FIRST
        assert template_persona({"gender": "female"}, i, 1)["name"].split()[0] in FEMALE_FIRST
        assert (template_persona({"gender": "non-binary"}, i, 1)["name"].split()[0]
                in NEUTRAL_FIRST)


def test_education_phrases():
    cases = {
        "elementary school": "with an elementary school education",
        "high school": "with a high school diploma",
        "bachelor's": "with a bachelor's degree",
        "master's": "with a master's degree",
        "Ph.D.": "with a Ph.D.",
        "vocational": "with a vocational education",
    }
    for level, phrase in cases.items():
        d = template_persona({"education": level, "age": 50, "gender": "male"}, 3, 0)["description"]
        assert d.startswith(f"A 50-year-old man {phrase} who is "), d


def test_articles_before_ages():
    for age, art in [(8, "An"), (11, "An"), (18, "An"), (80, "An"), (84, "An"), (7, "A"),
                     (34, "A"), (100, "A")]:
        d = template_persona({"age": age}, 0, 0)["description"]
        assert d.startswith(f"{art} {age}-year-old "), d


def test_missing_age_and_gender_are_drawn_deterministically():
    a = template_persona({"occupation": "artist"}, 5, 9)
    assert a == template_persona({"occupation": "artist"}, 5, 9)
    assert a["gender"] in ("female", "male")
    assert 18 <= a["age"] <= 80
    people = [template_persona({}, i, 9) for i in range(400)]
    assert len({p["gender"] for p in people}) == 2
    assert len({p["age"] for p in people}) > 30
    assert len({p["name"] for p in people}) > 200
    assert people != [template_persona({}, i, 10) for i in range(400)]


def test_float_age_is_rounded_and_other_attributes_are_described():
    p = template_persona({"age": 41.6, "sex": "Female", "region": "north", "income_band": 3}, 0, 0)
    assert p["age"] == 42 and p["gender"] == "Female"
    assert p["description"].endswith("Her region is north and her income band is 3.")


def test_description_is_one_or_two_sentences():
    cfg = load_population(EXAMPLES / "occupation.yaml")
    for i, profile in enumerate(sample_profiles(cfg, 200)):
        p = template_persona(profile, i, cfg.seed)
        d = p["description"]
        assert profile["occupation"] in d and f"{profile['age']}-year-old" in d
        assert d.endswith(".") and 1 <= d.count(". ") + 1 <= 2
        assert p["age"] == profile["age"] and p["gender"] == profile["gender"]


def test_persona_record_shape():
    prov = {"mode": "template", "prompt_version": "v", "model": None, "seed": 1,
            "config_hash": "x"}
    rec = persona_record({"a": 1}, {"name": "n"}, prov)
    assert rec == {"profile": {"a": 1}, "persona": {"name": "n"}, "provenance": prov}


def test_template_provenance():
    cfg = load_population(EXAMPLES / "education.yaml")
    prov = template_provenance(cfg)
    assert prov["mode"] == "template"
    assert prov["prompt_version"] == TEMPLATE_PROMPT_VERSION
    assert prov["model"] is None
    assert prov["seed"] == cfg.seed
    canonical = cfg.canonical_json().encode()
    assert prov["config_hash"] == hashlib.sha256(canonical).hexdigest() == config_hash(cfg)
    assert template_provenance(cfg, seed=7)["seed"] == 7


def test_jsonl_roundtrip_and_quotas(tmp_path):
    cfg = load_population(EXAMPLES / "education.yaml")
    out = tmp_path / "sub" / "personas.jsonl"
    n = write_jsonl(out, template_records(cfg, count=2000))
    assert n == 2000
    assert [p.name for p in out.parent.iterdir()] == ["personas.jsonl"]  # no temp file left
    lines = out.read_text(encoding="utf-8").splitlines()
    assert len(lines) == 2000
    first = json.loads(lines[0])
    assert list(first) == ["profile", "persona", "provenance"]
    assert set(first["persona"]) == {"name", "gender", "age", "description"}
    assert {"mode", "prompt_version", "model", "seed", "config_hash"} <= set(first["provenance"])
    assert '"model":null' in lines[0]
    records = list(read_jsonl(out))
    assert [r["provenance"]["index"] for r in records] == list(range(2000))
    assert Counter(r["profile"]["education"] for r in records) == dict.fromkeys(("elementary school", "high school", "bachelor's", "master's", "Ph.D."), 400)
    for r in records:
        assert r["persona"]["age"] == r["profile"]["age"]
        assert r["persona"]["gender"] == r["profile"]["gender"]


def test_records_are_deterministic_and_follow_given_profiles(tmp_path):
    cfg = load_population(EXAMPLES / "occupation.yaml")
    a = list(template_records(cfg, count=50))
    assert a == list(template_records(cfg, count=50))
    profiles = sample_profiles(cfg, 10)
    recs = list(template_records(cfg, profiles=profiles))
    assert [r["profile"] for r in recs] == profiles


def test_unicode_is_written_as_is(tmp_path):
    out = tmp_path / "u.jsonl"
    write_jsonl(out, [persona_record({"city": "Zürich"}, {"name": "Zoë"}, {"mode": "template"})])
    text = out.read_text(encoding="utf-8")
    assert "Zürich" in text and text.endswith("\n") and text.count("\n") == 1
