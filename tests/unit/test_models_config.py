"""A run's `models:` section: validated naming the field (never echoing a key), agents assigned to
models exactly and the same everywhere, prices in dollars, and the gateway's key ring, which reads
keys from its own environment or files and sends each only where its source is bound."""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError

from populace.core.contracts import ModelEndpoint, ModelPrices, RunConfig, gateway_bindings
from populace.core.scenario import ScenarioError, format_validation_error, parse_scenario
from populace.gateway.keys import KeyRing, KeyUnavailable, parse_bindings
from populace.population.cast import Persona, cast_from_records
from populace.population.model_assignment import AssignmentError, assignment, counts

HOSTED = {"name": "gpt", "kind": "openai", "base_url": "https://api.example.com/v1", "model": "gpt-4o-mini",
          "api_key_env": "EXAMPLE_API_KEY"}


def problem(data: dict) -> str:
    with pytest.raises((ValidationError, ScenarioError)) as err:
        parse_scenario(data)
    e = err.value
    return format_validation_error(e) if isinstance(e, ValidationError) else str(e)


@pytest.mark.parametrize("data,needle", [
    ({"models": [{"name": "a", "kind": "openai"}]}, "models.0: base_url: a hosted"),
    ({"models": [{"name": "a", "kind": "dummy", "share": 0.3}, {"name": "b", "kind": "dummy", "share": 0.3}]},
     "the shares sum to 0.6, not 1"),
    ({"models": [{"name": "a", "kind": "dummy"}, {"name": "b", "kind": "dummy"}]}, "give each a `share`"),
    ({"models": [{"name": "a", "kind": "dummy"}, {"name": "a", "kind": "dummy"}]}, "'a' is named twice"),
    ({"models": [{**HOSTED, "prices": {"input": -1}}]}, "models.0.prices.input"),
    ({"models": [{**HOSTED, "share": 1.5}]}, "models.0.share"),
    ({"models": [{**HOSTED, "api_key_file": "/k"}]}, "give one place the key comes from"),
    ({"models": [{"name": "a", "kind": "dummy"}], "model": {"backend": "local"}}, "model.backend: with a"),
    ({"models": [{"name": "a", "kind": "dummy"}], "assign": {"ranges": {"b": [[0, 9]]}}}, "names 'b'"),
    ({"models": [{"name": "a", "kind": "dummy"}], "assign": {"attribute": "education", "map": {"phd": "a"}}},
     "assign.attribute: assigning models by a persona attribute needs a `population`"),
    ({"agents": 10, "models": [{"name": "a", "kind": "dummy"}], "assign": {"ranges": {"a": [[0, 10]]}}},
     "agent 10 does not exist"),
    ({"budget": {"dollars": 5}}, "budget.dollars: needs `models:`"),
    ({"models": [{**HOSTED, "base_url": "ftp://x"}]}, "models.0.base_url"),
    ({"models": [{"name": "a.b", "kind": "dummy"}]}, "models.0.name"),
])
def test_a_models_section_that_cannot_work_is_refused_naming_the_field(data, needle):
    assert needle in problem(data)


@pytest.mark.parametrize("field,value", [("api_key_env", "sk-proj-0123456789abcdefSECRET"),
                                         ("base_url", "https://user:sk-proj-0123456789abcdefSECRET@api.example.com")])
def test_a_key_pasted_where_its_source_belongs_is_refused_and_never_repeated(field, value):
    text = problem({"models": [{**HOSTED, field: value}]})
    assert f"models.0.{field}" in text and "SECRET" not in text


def test_a_section_refused_as_a_whole_is_repeated_without_its_key_fields():
    text = problem({"models": [{"name": "a", "kind": "dummy", "api_key_file": "sk-proj-0123456789abcdefSECRET"}]})
    assert "a dummy model has no base_url and no key" in text and "SECRET" not in text


def test_prices_are_dollars_per_million_tokens_with_cached_tokens_at_their_own_price():
    p = ModelPrices(input=0.15, cached_input=0.075, output=0.6)
    # 1M prompt tokens of which 400k cached, 100k completion
    assert p.dollars(1_000_000, 400_000, 100_000) == pytest.approx(0.6 * 0.15 + 0.4 * 0.075 + 0.1 * 0.6)
    assert ModelPrices(input=1.0).dollars(1000, 1000, 0) == pytest.approx(0.001)  # cached: the input price
    assert ModelPrices().free


def test_the_api_base_keeps_a_given_path_and_adds_v1_to_a_bare_host():
    def base(url):
        return ModelEndpoint(name="m", kind="vllm", base_url=url).api_base

    assert base("http://127.0.0.1:8000") == "http://127.0.0.1:8000/v1"
    assert base("https://api.openai.com/v1/") == "https://api.openai.com/v1"
    assert base("https://generativelanguage.googleapis.com/v1beta/openai") == \
        "https://generativelanguage.googleapis.com/v1beta/openai"


def test_shares_are_exact_quotas_seeded_and_the_same_for_every_caller():
    config = RunConfig(agents=1001, seed=7, models=[{"name": "a", "kind": "dummy", "share": 0.5},
                                                    {"name": "b", "kind": "dummy", "share": 0.5}])
    first = assignment(config)
    assert first is not None and first.dtype == np.int8
    assert counts(config, first) == {"a": 501, "b": 500}  # largest remainder, ties to the first
    assert np.array_equal(first, assignment(config))
    other = assignment(config.model_copy(update={"seed": 8}))
    assert not np.array_equal(first, other)  # seeded by the run
    assert 200 < int(first[:500].sum()) < 300  # a permutation, not blocks of ids


def test_an_attribute_assigns_by_persona_and_the_rest_go_to_the_default():
    cast = cast_from_records([{"profile": {"education": e}, "persona": {"description": e}}
                              for e in ("phd", "school", "phd", "master")])
    config = RunConfig(agents=4, models=[{"name": "a", "kind": "dummy"}, {"name": "b", "kind": "dummy"}],
                       assign={"attribute": "education", "map": {"phd": "a"}, "default": "b"},
                       population={"personas": "p.jsonl"})
    assert assignment(config, cast).tolist() == [0, 1, 0, 1]
    strict = config.model_copy(update={"assign": config.assign.model_copy(update={"default": None})})
    with pytest.raises(AssignmentError, match="agent 1's education is 'school'"):
        assignment(strict, cast)
    assert isinstance(cast.personas[0], Persona)


def test_ranges_assign_by_id_and_an_agent_in_two_ranges_is_refused():
    config = RunConfig(agents=10, models=[{"name": "a", "kind": "dummy"}, {"name": "b", "kind": "dummy"}],
                       assign={"ranges": {"a": [[0, 3], [8, 9]]}, "default": "b"})
    assert assignment(config).tolist() == [0, 0, 0, 0, 1, 1, 1, 1, 0, 0]
    overlap = config.model_copy(update={"assign": config.assign.model_copy(
        update={"ranges": {"a": [[0, 3]], "b": [[3, 5]]}, "default": None})})
    with pytest.raises(AssignmentError, match="assign.ranges.b: agent 3"):
        assignment(overlap)
    gaps = overlap.model_copy(update={"assign": overlap.assign.model_copy(update={"ranges": {"a": [[0, 3]]}})})
    with pytest.raises(AssignmentError, match="agent 4 is in no range"):
        assignment(gaps)


def test_a_key_is_read_from_the_environment_or_a_file_and_sent_only_where_its_source_is_bound(tmp_path):
    secret = "sk-test-0123456789abcdef"
    key_file = tmp_path / "key"
    key_file.write_text(secret + "\n")
    env = {"EXAMPLE_API_KEY": secret}
    ring = KeyRing(f"env:EXAMPLE_API_KEY@api.example.com,file:{key_file}@127.0.0.1:8000", environ=env)
    hosted = ModelEndpoint(**HOSTED)
    assert ring.refusal(hosted) is None
    assert ring.headers(hosted) == {"Authorization": f"Bearer {secret}"}
    by_file = ModelEndpoint(name="v", kind="vllm", base_url="http://127.0.0.1:8000", api_key_file=str(key_file))
    assert ring.refusal(by_file) is None and ring.key(by_file) == secret
    # the same key source pointed elsewhere is refused, naming the model and the source, not the key
    evil = ModelEndpoint(**{**HOSTED, "base_url": "https://evil.example.net/v1"})
    why = ring.refusal(evil)
    assert why and "env:EXAMPLE_API_KEY" in why and "evil.example.net" in why and secret not in why
    other_port = ModelEndpoint(name="v", kind="vllm", base_url="http://127.0.0.1:9000", api_key_file=str(key_file))
    assert ring.refusal(other_port) is not None
    # no key: only allowed hosts (loopback by default)
    assert ring.refusal(ModelEndpoint(name="x", kind="sim", base_url="http://10.0.0.9:8000")) is not None
    assert ring.refusal(ModelEndpoint(name="x", kind="sim", base_url="http://127.0.0.1:8100")) is None
    # an unset variable or a missing file says which, never a key
    with pytest.raises(KeyUnavailable, match="api_key_env EXAMPLE_API_KEY is not set"):
        KeyRing("env:EXAMPLE_API_KEY@api.example.com", environ={}).key(hosted)
    gone = ModelEndpoint(name="v", kind="vllm", base_url="http://127.0.0.1:8000", api_key_file=str(tmp_path / "no"))
    with pytest.raises(KeyUnavailable, match="cannot be read"):
        ring.key(gone)
    assert ring.redact(f"Incorrect API key provided: {secret}.") == "Incorrect API key provided: [key]."


def test_a_private_stack_binds_exactly_its_scenarios_keys_to_their_hosts():
    models = [ModelEndpoint(**HOSTED), ModelEndpoint(name="v", kind="vllm", base_url="http://127.0.0.1:8000"),
              ModelEndpoint(name="s", kind="sim")]
    keys, hosts = gateway_bindings(models)
    assert keys == "env:EXAMPLE_API_KEY@api.example.com"
    assert "api.example.com" in hosts.split(",") and "127.0.0.1:8000" in hosts.split(",")
    ring = KeyRing(keys, hosts, environ={"EXAMPLE_API_KEY": "k" * 20})
    assert all(ring.refusal(m) is None for m in models)
    with pytest.raises(ValueError, match="POPULACE_GATEWAY_KEYS"):
        parse_bindings("OPENAI_API_KEY")
