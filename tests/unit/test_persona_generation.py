"""Persona generation: the pure parts (`populace.population.generation`: meta-prompt and
schema, answer parsing, consistency checks, the de-duplication key, `--unique K` assignment)
and, from `populace personas generate` (`populace.client.personas`), the template path and, from
`populace.population.over_nats`, the regenerate / de-duplicate / fall back loop against a
scripted gateway (no NATS)."""

from __future__ import annotations

import asyncio
import json
import re
from collections import Counter
from pathlib import Path

import pytest

from populace.client import personas as P
from populace.core import replies, subjects
from populace.core.contracts import InferBatch, InferReply
from populace.gateway import schema_check as answers
from populace.population import PopulationError, load_population, over_nats, read_jsonl, sample_profiles
from populace.population import generation as G

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "population"
EDUCATION = EXAMPLES / "education.yaml"
LEVELS = ["elementary school", "high school", "bachelor's", "master's", "Ph.D."]


def good(profile: dict, name: str = "Laura Bennett", description: str | None = None) -> dict:
    lo, _ = G.age_bounds(profile)
    return {"name": name, "gender": G.profile_gender(profile) or "female", "age": lo,
            "description": description or "Laura works as a nurse in a small town. She is calm and kind."}


# --------------------------------------------------------------------------- prompt and schema

@pytest.mark.parametrize(("profile", "bounds"), [
    ({"age": 34}, (34, 34)),
    ({"Age": 34.0}, (34, 34)),
    ({"age": 34.6}, (34, 35)),
    ({"age": "25-34"}, (25, 34)),
    ({"age": "25 to 34"}, (25, 34)),
    ({"age": "34–25"}, (25, 34)),
    ({"age": "65+"}, (65, 90)),
    ({"age": "95+"}, (95, 95)),
    ({"age": "young"}, G.DEFAULT_AGE_BOUNDS),
    ({"age": True}, G.DEFAULT_AGE_BOUNDS),
    ({"education": "Ph.D."}, G.DEFAULT_AGE_BOUNDS),
])
def test_age_bounds(profile, bounds):
    assert G.age_bounds(profile) == bounds


def test_schema_bounds_age_and_fixes_gender():
    profile = {"education": "master's", "age": 40, "gender": "male"}
    schema = G.persona_schema(profile)
    assert schema["type"] == "object"
    assert set(schema["required"]) == {"name", "gender", "age", "description"}
    props = schema["properties"]
    assert props["age"] == {"type": "integer", "minimum": 40, "maximum": 40, "enum": [40]}
    assert props["gender"] == {"type": "string", "enum": ["male"]}
    assert props["name"]["type"] == props["description"]["type"] == "string"
    # the gateway's own check (type, required, minimum/maximum)
    ok = json.dumps({"gender": "male", "age": 40, "name": "Tom Hale", "description": "x" * 50})
    assert answers.check(ok, schema)
    assert not answers.check(ok.replace("40", "41"), schema)
    assert not answers.check(json.dumps({"gender": "male", "age": 40, "name": "Tom Hale"}), schema)


def test_schema_without_age_or_gender_uses_defaults():
    props = G.persona_schema({"education": "Ph.D."})["properties"]
    assert props["age"]["minimum"] == 18 and props["age"]["maximum"] == 90
    assert props["age"]["enum"] == list(range(18, 91))
    assert props["gender"] == {"type": "string"}
    wide = G.persona_schema({"age": "0-150"})["properties"]["age"]
    assert "enum" not in wide and (wide["minimum"], wide["maximum"]) == (0, 150)


def test_schema_becomes_a_llama_cpp_grammar():
    from llama_cpp.llama_grammar import json_schema_to_gbnf

    gbnf = json_schema_to_gbnf(json.dumps(G.persona_schema({"age": 40, "gender": "male"})))
    assert 'age ::= "40"' in gbnf
    assert 'gender ::= "\\"male\\""' in gbnf


def test_patterns_accept_plain_answers_and_reject_junk():
    name, desc = re.compile(G.NAME_PATTERN), re.compile(G.DESCRIPTION_PATTERN)
    assert name.match("Laura Bennett") and not name.match("laura") and not name.match("Amina_Baba-12")
    assert desc.match("Laura works as a nurse in a small town. She is calm and kind.")
    assert not desc.match("Too short.")
    assert not desc.match("{<Person>: name = Emily Carter, job title = Bachelors of Science}")
    assert not desc.match("born in [address] and worked at [company_name] for many years now")
    assert not desc.match("A" * 201)


def test_user_prompt_lists_the_profile_and_repeats_age_and_gender():
    text = G.user_prompt({"education": "master's", "age": 40, "gender": "male", "job_title": "nurse",
                          "income": 52000.5})
    assert text.splitlines()[:6] == ["Profile:", "- education: master's", "- age: 40", "- gender: male",
                                     "- job title: nurse", "- income: 52000.5"]
    assert text.endswith("Write the persona of this 40-year-old man as JSON.")
    assert G.user_prompt({"gender": "female"}).endswith("of this woman as JSON.")
    assert G.user_prompt({"age": "25-34"}).endswith("of this person as JSON.")
    assert "JSON" in G.SYSTEM_PROMPT and "profile" in G.SYSTEM_PROMPT


# --------------------------------------------------------------------------- parsing and checks

def test_parse_persona():
    text = '{"gender": "female", "age": 34.0, "name": " Ana   Ruiz ", "description": "A  nurse.\\nKind."}'
    assert G.parse_persona(text) == {"name": "Ana Ruiz", "gender": "female", "age": 34,
                                     "description": "A nurse. Kind."}
    assert G.parse_persona("not json") is None
    assert G.parse_persona("[1, 2]") is None
    assert G.parse_persona('{"gender": "f", "age": 34, "name": "A B"}') is None  # no description
    assert G.parse_persona('{"gender": "f", "age": true, "name": "A B", "description": "x"}') is None
    assert G.parse_persona('{"gender": "f", "age": 34.5, "name": "A B", "description": "x"}') is None


def test_a_consistent_persona_passes():
    profile = {"education": "master's", "age": 38, "gender": "female"}
    assert G.consistency_problem(good(profile), profile) is None
    # synonyms, a stated age that matches, the other gender mentioned next to her own
    p = good(profile, description="A 38-year-old woman in her late thirties who married a man she met at work.")
    assert G.consistency_problem({**p, "gender": "Woman"}, profile) is None
    # no gender in the profile: any gender and pronouns
    assert G.consistency_problem(good({"age": 30}, description="He is a kind and patient teacher."),
                                 {"age": 30}) is None


@pytest.mark.parametrize(("change", "reason"), [
    ({"age": 39}, "age 39 is not the profile's age (38)"),
    ({"gender": "male"}, "gender 'male' is not the profile's ('female')"),
    ({"name": "Laura"}, "name 'Laura' is not a first and last name"),
    ({"name": "Amina_Baba-12"}, "name 'Amina_Baba-12' is not a first and last name"),
    ({"description": "Kind."}, "description is too short"),
    ({"description": "She is a 16-year-old student who loves art."}, "description states age 16"),
    ({"description": "A woman in her late fifties who loves art and music."},
     "description states age 'in her late fifties'"),
    ({"description": "He is a kind man and his friends love him."}, "description speaks of a man"),
    ({"description": "Born in [address], she worked at [company] for years."}, "description is not prose"),
    ({"description": "Amara Khalidi-Hazratinollamaahfakabilhimaamadmaflam is her name."},
     "description is not prose"),
    ({"description": "She is a first and last name that fits her gender."},
     "description repeats the instructions"),
])
def test_inconsistent_personas_are_named(change, reason):
    profile = {"education": "master's", "age": 38, "gender": "female"}
    problem = G.consistency_problem({**good(profile), **change}, profile)
    assert problem is not None and problem.startswith(reason), problem


def test_age_range_profiles_accept_any_age_inside():
    profile = {"age": "25-34", "gender": "male"}
    for age, ok in ((25, True), (34, True), (24, False), (35, False)):
        p = {**good(profile, description="He is a kind and patient teacher in a small town."), "age": age}
        assert (G.consistency_problem(p, profile) is None) is ok


def test_dedupe_key_ignores_case_accents_punctuation_and_spacing():
    a = {"name": "José  Núñez", "description": "A kind, calm nurse."}
    b = {"name": "jose nunez", "description": "a kind calm nurse"}
    c = {"name": "Jose Nunez", "description": "A kind, calm doctor."}
    assert G.dedupe_key(a) == G.dedupe_key(b) != G.dedupe_key(c)


def test_fallback_persona_respects_age_ranges():
    for i in range(30):
        p = G.fallback_persona({"age": "25-34", "gender": "male"}, i, 0)
        assert 25 <= p["age"] <= 34 and p["gender"] == "male"
        assert G.consistency_problem(p, {"age": "25-34", "gender": "male"}) is None
    assert G.fallback_persona({"age": 41}, 0, 0)["age"] == 41


# --------------------------------------------------------------------------- --unique K

def _education_profiles(n: int) -> tuple[list[dict], list[str], list[str]]:
    cfg = load_population(EDUCATION)
    cats, nums = G.attribute_kinds(cfg)
    return sample_profiles(cfg, n), cats, nums


def test_attribute_kinds():
    cfg = load_population(EXAMPLES / "occupation.yaml")
    assert G.attribute_kinds(cfg) == (["occupation", "education", "gender"], ["age"])


@pytest.mark.parametrize("k", [10, 11, 25, 99, 100])
def test_unique_k_at_least_the_groups_matches_every_categorical_attribute(k):
    profiles, cats, nums = _education_profiles(100)  # 5 education levels x 2 genders = 10 groups
    a = G.assign_unique(profiles, k, cats, nums)
    assert len(a.reps) == k and len(set(a.reps)) == k
    assert sorted(set(a.persona_of)) == list(range(k))  # every persona is used
    assert all(a.exact)
    for i, j in enumerate(a.persona_of):
        rep = profiles[a.reps[j]]
        assert all(rep[c] == profiles[i][c] for c in cats)
    assert all(a.persona_of[r] == j for j, r in enumerate(a.reps))  # a representative gets its own persona
    # slots follow group sizes: no group has more personas than agents
    per_group = Counter(tuple(profiles[r][c] for c in cats) for r in a.reps)
    sizes = Counter(tuple(p[c] for c in cats) for p in profiles)
    assert all(per_group[g] <= sizes[g] for g in sizes) and set(per_group) == set(sizes)
    if k == 100:
        assert a.persona_of == [a.reps.index(i) for i in range(100)]


def test_unique_k_keeps_ages_close_inside_a_group():
    profiles, cats, nums = _education_profiles(100)
    a = G.assign_unique(profiles, 20, cats, nums)  # two personas per group
    for key in {tuple(p[c] for c in cats) for p in profiles}:
        members = [i for i, p in enumerate(profiles) if tuple(p[c] for c in cats) == key]
        js = sorted({a.persona_of[i] for i in members}, key=lambda j: profiles[a.reps[j]]["age"])
        young, old = ([profiles[i]["age"] for i in members if a.persona_of[i] == j] for j in js)
        assert max(young) <= min(old)  # contiguous age chunks


def test_unique_k_below_the_groups_prefers_the_first_attribute():
    profiles, cats, nums = _education_profiles(50)
    a = G.assign_unique(profiles, 5, cats, nums)
    assert len(a.reps) == 5 and sorted(set(a.persona_of)) == list(range(5))
    for i, j in enumerate(a.persona_of):
        rep = profiles[a.reps[j]]
        rep_keys = [tuple(profiles[r][c] for c in cats) for r in a.reps]
        mine = tuple(profiles[i][c] for c in cats)
        best = max(tuple(x == y for x, y in zip(mine, rk)) for rk in rep_keys)
        assert tuple(x == y for x, y in zip(mine, tuple(rep[c] for c in cats))) == best
        assert a.exact[i] == (tuple(rep[c] for c in cats) == mine)
    # five personas for five education levels: every agent keeps its education level
    assert all(profiles[a.reps[j]]["education"] == profiles[i]["education"] for i, j in enumerate(a.persona_of))
    a3 = G.assign_unique(profiles, 3, cats, nums)
    assert len({profiles[r]["education"] for r in a3.reps}) == 3
    a1 = G.assign_unique(profiles, 1, cats, nums)
    assert a1.persona_of == [0] * 50


@pytest.mark.parametrize("k", [6, 12, 24])
def test_unique_k_keeps_the_first_attribute_before_the_others(k):
    cfg = load_population(EXAMPLES / "occupation.yaml")
    cats, nums = G.attribute_kinds(cfg)  # occupation, education (given occupation), gender
    profiles = sample_profiles(cfg)
    leaves = {tuple(p[c] for c in cats) for p in profiles}
    assert k < len(leaves)
    a = G.assign_unique(profiles, k, cats, nums)
    assert len(a.reps) == k and sorted(set(a.persona_of)) == list(range(k))
    for i, j in enumerate(a.persona_of):
        assert profiles[a.reps[j]]["occupation"] == profiles[i]["occupation"]
    per_occupation = Counter(profiles[r]["occupation"] for r in a.reps)
    assert set(per_occupation.values()) == {k // 6}  # 100 agents each: equal shares
    big = G.assign_unique(profiles, len(leaves), cats, nums)
    assert all(big.exact)


@pytest.mark.parametrize("k", [0, -1, 51, True])
def test_unique_k_out_of_range_names_the_option(k):
    profiles, cats, nums = _education_profiles(50)
    with pytest.raises(ValueError, match="--unique"):
        G.assign_unique(profiles, k, cats, nums)


def test_unique_template_mode_keeps_quotas_exactly_and_uses_k_personas(tmp_path):
    out = tmp_path / "u.jsonl"
    res = P.generate(EDUCATION, out, 100, "template", 7, None, None, 8, False)
    rows = list(read_jsonl(out))
    assert len(rows) == res.count == 100 and res.unique == 7
    assert Counter(r["profile"]["education"] for r in rows) == dict.fromkeys(LEVELS, 20)
    assert res.categories == dict.fromkeys(LEVELS, 20)
    assert len({json.dumps(r["persona"], sort_keys=True) for r in rows}) == 7
    assert {r["provenance"]["persona_index"] for r in rows} == set(range(7))
    for r in rows:
        assert r["provenance"]["unique"] == 7
        if r["provenance"]["same_categories"]:
            assert r["provenance"]["persona_profile"]["education"] == r["profile"]["education"]


# --------------------------------------------------------------------------- generate(): template and errors

def test_template_mode_writes_exact_quotas(tmp_path):
    out = tmp_path / "t.jsonl"
    res = P.generate(EDUCATION, out, 1000, "template", None, 3, None, 8, False)
    rows = list(read_jsonl(out))
    assert res.count == len(rows) == 1000 and res.path == out and res.model == "template"
    assert res.category_attribute == "education" and res.categories == dict.fromkeys(LEVELS, 200)
    assert Counter(r["profile"]["education"] for r in rows) == res.categories
    assert {r["provenance"]["mode"] for r in rows} == {"template"}
    assert {r["provenance"]["seed"] for r in rows} == {3}
    assert res.llm == res.fallbacks == 0


@pytest.mark.parametrize(("kwargs", "option"), [
    ({"count": 0}, "--count"),
    ({"count": -5}, "--count"),
    ({"unique": 0}, "--unique"),
    ({"unique": 51}, "--unique"),
    ({"count": 10, "unique": 11}, "--unique"),
    ({"model": "gpt"}, "--model"),
    ({"concurrency": 0}, "--concurrency"),
    ({"model": "openai"}, "--nats"),
])
def test_bad_options_name_the_option(tmp_path, kwargs, option):
    args = {"config_path": EDUCATION, "out": tmp_path / "x.jsonl", "count": None, "model": "template",
            "unique": None, "seed": None, "nats": None, "concurrency": 8, "show_progress": False, **kwargs}
    with pytest.raises(ValueError, match=option) as err:
        P.generate(**args)
    assert not isinstance(err.value, PopulationError)
    assert not (tmp_path / "x.jsonl").exists()


def test_bad_config_raises_population_error_naming_the_field(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\ntotal: 10\nattributes:\n  gender:\n    weights: {female: 0.5, male: 0.4}\n")
    with pytest.raises(PopulationError, match=r"attributes\.gender\.weights"):
        P.generate(bad, tmp_path / "x.jsonl", None, "template", None, None, None, 8, False)


# --------------------------------------------------------------------------- the LLM loop, scripted

class _Msg:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.subject, self.headers = "", None


class ScriptedGateway:
    """Stands in for the NATS connection: answers each InferBatch with `answer(batch, i)`, on
    the requester's own reply subject (populace.core.replies.request subscribes, then publishes)."""

    options: dict = {}  # no NATS user: the requester is anonymous

    def __init__(self, answer) -> None:
        self.answer = answer
        self.batches: list[InferBatch] = []

    async def subscribe(self, subject: str, cb) -> None:
        self.on_reply = cb

    async def publish(self, subject: str, data: bytes, reply: str, headers=None) -> None:
        assert reply.startswith(subjects.reply_prefix("gateway", replies.ANONYMOUS))
        msg = await self.request(subject, data, 0.0)
        msg.subject = reply
        await self.on_reply(msg)

    async def request(self, subject: str, data: bytes, timeout: float) -> _Msg:
        assert subject == subjects.llm_infer(replies.ANONYMOUS)
        batch = InferBatch.model_validate_json(data)
        self.batches.append(batch)
        texts, valid = [], []
        for i in range(len(batch.keys)):
            text = self.answer(batch, i)
            texts.append(text)
            valid.append(answers.check(text, batch.response_schema))
        return _Msg(InferReply(batch_id=batch.batch_id, texts=texts, valid=valid,
                               attempts=[1] * len(texts)).model_dump_json().encode())


def _run(profiles, answer, concurrency=4):
    gw = ScriptedGateway(answer)
    done = []
    gen = over_nats.LlmGenerator(gw, profiles, "local", 7, "personas-test", concurrency, lambda: done.append(1))
    outcomes = asyncio.run(gen.run())
    assert len(done) == len(profiles)  # the progress bar reaches the total
    return outcomes, gen, gw


def _answer_for(profile: dict, name: str, description: str) -> str:
    return json.dumps({"gender": profile["gender"], "age": profile["age"], "name": name,
                       "description": description})


NAMES = ["Ana Ruiz", "Ben Cole", "Cara Diaz", "Dan Ford", "Eva Gray", "Finn Hale", "Gia Ives", "Hal Jones"]


def test_good_answers_are_kept_on_the_first_try_in_schema_batches():
    profiles = [{"education": "x", "age": 30 + i % 2, "gender": "female"} for i in range(8)]
    outcomes, gen, gw = _run(profiles, lambda b, i: _answer_for(
        profiles[b.keys[i]], NAMES[b.keys[i]], f"She is a kind nurse number {b.keys[i]} in a town."))
    assert all(o.persona and o.first_try and o.attempts == 1 for o in outcomes)
    assert gen.regenerated == gen.duplicates_removed == 0
    # one schema per age: two groups of four, each within `concurrency`
    assert sorted(len(b.keys) for b in gw.batches) == [4, 4]
    for b in gw.batches:
        assert len({json.dumps(G.persona_schema(profiles[k]), sort_keys=True) for k in b.keys}) == 1
        assert b.system == G.SYSTEM_PROMPT and b.run_id == "personas-test" and b.round == 1
        assert b.prompts == [G.user_prompt(profiles[k]) for k in b.keys]
        assert b.model.backend == "local" and b.model.seed != 0
    assert outcomes[3].sampling_seed == gw.batches[0].model.seed * 1_000_003 + 3


def test_bad_answers_are_regenerated_with_a_new_seed_and_temperature():
    profiles = [{"education": "x", "age": 40, "gender": "male"} for _ in range(3)]
    tries = Counter()

    def answer(batch, i):
        k = batch.keys[i]
        tries[k] += 1
        if k == 0 and tries[k] == 1:
            return "I am not JSON"  # invalid
        if k == 1 and tries[k] < 3:
            return _answer_for(profiles[k], NAMES[k], "She is a kind nurse who loves her garden.")  # wrong pronouns
        return _answer_for(profiles[k], NAMES[k], f"He is a calm carpenter, worker {k}, who loves music.")

    outcomes, gen, gw = _run(profiles, answer)
    assert [o.attempts for o in outcomes] == [2, 3, 1]
    assert [o.first_try for o in outcomes] == [False, False, True]
    assert all(o.persona for o in outcomes)
    assert gen.regenerated == 3  # 0 once, 1 twice
    assert outcomes[0].rejected[0].startswith("invalid answer")
    assert outcomes[1].rejected == ["description speaks of a woman"] * 2
    seeds = {b.round: b.model.seed for b in gw.batches}
    temps = {b.round: b.model.temperature for b in gw.batches}
    assert len(set(seeds.values())) == 3 and list(temps.values()) == sorted(temps.values())
    assert temps == dict(zip((1, 2, 3), G.TEMPERATURES))
    # a regeneration is a new request carrying the same prompt, not a re-parse
    assert [b.prompts for b in gw.batches if b.round == 3] == [[G.user_prompt(profiles[1])]]


def test_duplicates_are_regenerated_and_persistent_failures_fall_back():
    profiles = [{"education": "x", "age": 40, "gender": "male"} for _ in range(4)]

    def answer(batch, i):
        k = batch.keys[i]
        if k == 3:
            return _answer_for(profiles[k], "Tom Hale", "He is a lawyer who is 12 years old.")  # always inconsistent
        if k == 2 and batch.round == 1:  # same persona as key 1 (up to case and punctuation)
            return _answer_for(profiles[k], "TOM  COLE", "he is a calm carpenter who loves music!")
        return _answer_for(profiles[k], f"Tom {['Ames', 'Cole', 'Dunn'][k]}",
                           "He is a calm carpenter who loves music.")

    outcomes, gen, _ = _run(profiles, answer, concurrency=16)
    assert gen.duplicates_removed == 1
    assert outcomes[2].persona["name"] == "Tom Dunn" and outcomes[2].attempts == 2
    assert outcomes[2].rejected == ["duplicate of persona 1"]
    assert outcomes[3].persona is None and outcomes[3].attempts == G.MAX_TRIES
    assert outcomes[3].reason == "description states age 12"
    keys = [G.dedupe_key(o.persona) for o in outcomes if o.persona]
    assert len(keys) == len(set(keys)) == 3


def test_gateway_errors_are_retried_then_fall_back():
    profiles = [{"education": "x", "age": 40, "gender": "male"}]

    class Failing(ScriptedGateway):
        async def request(self, subject, data, timeout):
            batch = InferBatch.model_validate_json(data)
            self.batches.append(batch)
            return _Msg(InferReply(batch_id=batch.batch_id, error="no replica").model_dump_json().encode())

    gw = Failing(None)
    gen = over_nats.LlmGenerator(gw, profiles, "local", 0, "personas-test", 4, lambda: None)
    outcomes = asyncio.run(gen.run())
    assert len(gw.batches) == G.MAX_TRIES
    assert outcomes[0].persona is None and outcomes[0].reason == "gateway error: no replica"


def test_no_gateway_is_a_clear_error():
    from nats.errors import NoRespondersError

    class Nobody(ScriptedGateway):
        async def request(self, subject, data, timeout):
            raise NoRespondersError

    gen = over_nats.LlmGenerator(Nobody(None), [{"age": 30}], "local", 0, "personas-test", 4, lambda: None)
    with pytest.raises(P.PersonaGenerationError, match="no inference gateway"):
        asyncio.run(gen.run())
