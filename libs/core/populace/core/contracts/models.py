"""A run's models as configuration (the scenario's `models:` section, or a gateway's own models
file): each one an endpoint with a name, its kind, where it is, the served model id, where its
key comes from (an environment variable or a file, never the key itself), its limits and its
prices; and how the population's agents are assigned to them (`assign:`).

Nothing here holds a key: `api_key_env` and `api_key_file` name where the gateway that calls the
model reads it (populace.gateway.keys). A config, a manifest, a row, a message or a log line can
carry every field of a `ModelEndpoint`.
"""

from __future__ import annotations

import math
import re
from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, field_validator, model_validator

from populace.core.contracts.wire_base import Count, FiniteFloat, Strict, Token

MAX_MODELS = 32
ModelKind = Literal["openai", "vllm", "llamacpp", "sim", "dummy"]
# kinds whose replicas may register themselves (KV `replicas`) under the model's name, so a
# model of these kinds needs no base_url; a hosted `openai` model is always at its base_url
SELF_REGISTERING: tuple[str, ...] = ("vllm", "llamacpp", "sim")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
_MILLION = 1_000_000


class ModelLimits(Strict):
    """What the provider allows. `requests_per_min` and `tokens_per_min` are shared by every
    gateway that calls the model (they pace together, just under the limit); `concurrency` is
    the calls one gateway keeps in flight to it at once."""

    requests_per_min: Count | None = Field(None, ge=1, le=100_000_000)
    tokens_per_min: Count | None = Field(None, ge=1, le=10_000_000_000)
    concurrency: Count = Field(16, ge=1, le=100_000)


class ModelPrices(Strict):
    """US dollars per million tokens: input (prompt) tokens, the part of them the provider served
    from its prompt cache (`cached_input`; default: the input price), and output tokens."""

    input: FiniteFloat = Field(0.0, ge=0, le=1_000_000)
    cached_input: FiniteFloat | None = Field(None, ge=0, le=1_000_000)
    output: FiniteFloat = Field(0.0, ge=0, le=1_000_000)

    @property
    def free(self) -> bool:
        return self.input == 0 and self.output == 0 and not self.cached_input

    def dollars(self, prompt_tokens: float, cached_tokens: float, completion_tokens: float) -> float:
        """What these tokens cost (cached tokens are part of the prompt tokens)."""
        cached = min(cached_tokens, prompt_tokens)
        cached_price = self.input if self.cached_input is None else self.cached_input
        return ((prompt_tokens - cached) * self.input + cached * cached_price
                + completion_tokens * self.output) / _MILLION


def money(dollars: float) -> str:
    """US dollars as people read them: '$1,234', '$12.35', and below a dollar two significant
    digits ('$0.50', '$0.0065'), so a small cost is never rounded to '$0.00'."""
    if dollars <= 0:
        return "$0"
    if dollars >= 1000:
        return f"${dollars:,.0f}"
    if dollars >= 1:
        return f"${dollars:,.2f}"
    if dollars < 1e-9:
        return "<$0.000000001"
    digits = max(2, 1 - math.floor(math.log10(dollars)))
    if digits > 2 and float(f"{dollars:.{digits}f}") >= 10.0 ** (2 - digits):  # 0.009999 rounds up a place
        digits -= 1
    return f"${dollars:.{digits}f}"


class ModelEndpoint(Strict):
    """One model a run's agents may call."""

    name: Token  # how the run, its rows and its reports name the model
    kind: ModelKind  # the API dialect: openai (any hosted OpenAI-compatible API), vllm, llamacpp, sim, dummy
    # e.g. https://api.openai.com/v1 or http://127.0.0.1:8000 (a trailing /v1 is optional); none:
    # the replicas that register under this name (populace replicas … --name NAME)
    base_url: str | None = Field(None, min_length=1, max_length=2000)
    model: str | None = Field(None, min_length=1, max_length=300)  # the served model id sent in requests
    api_key_env: str | None = None  # the environment variable the gateway reads the key from
    api_key_file: str | None = Field(None, min_length=1, max_length=4096)  # or a file holding it
    limits: ModelLimits = ModelLimits()
    prices: ModelPrices = ModelPrices()
    latency_s: FiniteFloat = Field(0.05, ge=0, le=3600)  # dummy only: its answer's delay
    share: FiniteFloat | None = Field(None, gt=0, le=1)  # the share of the agents it answers for

    @field_validator("api_key_env")
    @classmethod
    def _env_name(cls, v: str | None) -> str | None:
        if v is not None and not _ENV_NAME.match(v):
            # the value is not repeated: it may be the key itself, pasted here
            raise ValueError("must be the NAME of the environment variable that holds the key (letters, digits, "
                             "'_'), never the key itself")
        return v

    @field_validator("base_url")
    @classmethod
    def _url(cls, v: str | None) -> str | None:
        if v is None:
            return v
        parts = urlsplit(v)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("must be an http:// or https:// URL with a host")
        if parts.username or parts.password:
            raise ValueError("must not hold credentials: give the key with api_key_env or api_key_file")
        if parts.query or parts.fragment:
            raise ValueError("must not have a query or fragment (a key in a URL would be recorded)")
        try:
            parts.port  # noqa: B018 — raises on a port out of range
        except ValueError as err:
            raise ValueError(str(err)) from None
        return v.rstrip("/")

    @model_validator(mode="after")
    def _consistent(self) -> ModelEndpoint:
        if self.api_key_env and self.api_key_file:
            raise ValueError("api_key_env, api_key_file: give one place the key comes from, not both")
        if self.kind == "dummy":
            if self.base_url or self.api_key_env or self.api_key_file:
                raise ValueError("kind: a dummy model has no base_url and no key")
        elif self.kind == "openai" and self.base_url is None:
            raise ValueError("base_url: a hosted (kind: openai) model needs its API's URL, "
                             "e.g. https://api.openai.com/v1")
        return self

    @property
    def keyed(self) -> bool:
        return bool(self.api_key_env or self.api_key_file)

    @property
    def api_base(self) -> str | None:
        """The URL chat completions go under (`{api_base}/chat/completions`): the base_url as given
        when it has a path (`…/v1`, Gemini's `…/v1beta/openai`), else `{base_url}/v1`."""
        if self.base_url is None:
            return None
        return self.base_url if urlsplit(self.base_url).path not in ("", "/") else f"{self.base_url}/v1"


class ModelAssign(Strict):
    """How agents get their model when the shares are not the rule: by a persona attribute
    (`attribute` + `map`, the rest to `default`), or by agent ids (`ranges`: model name ->
    [[first, last], …], inclusive; the rest to `default`). An agent keeps its model for the run."""

    attribute: str | None = Field(None, min_length=1, max_length=100)
    map: dict[str, Token] = {}
    ranges: dict[Token, list[tuple[Count, Count]]] = {}
    default: Token | None = None

    @model_validator(mode="after")
    def _one_rule(self) -> ModelAssign:
        if (self.attribute is None) == (not self.ranges):
            raise ValueError("assign: give `attribute` (with `map`) or `ranges`, one of them")
        if self.attribute is not None and not self.map:
            raise ValueError("assign.map: which model answers for which value of the attribute")
        for name, spans in self.ranges.items():
            for first, last in spans:
                if first > last:
                    raise ValueError(f"assign.ranges.{name}: [{first}, {last}] is empty (first > last)")
        return self

    def names(self) -> set[str]:
        return {*self.map.values(), *self.ranges, *([self.default] if self.default else [])}


def check_models(models: list[ModelEndpoint], assign: ModelAssign | None, agents: int) -> None:
    """Raise ValueError naming the field when a run's `models:` and `assign:` cannot work
    together (run config validation calls it)."""
    if len(models) > MAX_MODELS:
        raise ValueError(f"models: {len(models)} models; at most {MAX_MODELS}")
    names = [m.name for m in models]
    dup = next((n for n in names if names.count(n) > 1), None)
    if dup is not None:
        raise ValueError(f"models: {dup!r} is named twice (each model's name is its own)")
    if assign is not None:
        unknown = sorted(assign.names() - set(names))
        if unknown:
            raise ValueError(f"assign: names {unknown[0]!r}, which is not one of the models ({', '.join(names)})")
        for i, m in enumerate(models):
            if m.share is not None:
                raise ValueError(f"models.{i}.share: with `assign:` the agents go by its rule, not by shares")
        for name, spans in assign.ranges.items():
            for _first, last in spans:
                if last >= agents:
                    raise ValueError(f"assign.ranges.{name}: agent {last} does not exist (ids are 0..{agents - 1})")
        return
    shares = [m.share for m in models]
    if len(models) > 1 and any(s is None for s in shares):
        raise ValueError("models: with several models give each a `share` (summing to 1), or an `assign:` rule")
    if len(models) > 1 and abs(sum(s or 0 for s in shares) - 1) > 1e-9:
        raise ValueError(f"models: the shares sum to {sum(s or 0 for s in shares):g}, not 1")


LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "[::1]")


def gateway_bindings(models: list[ModelEndpoint]) -> tuple[str, str]:
    """(POPULACE_GATEWAY_KEYS, POPULACE_GATEWAY_MODEL_HOSTS) that let a private stack's gateway
    call exactly these models (populace.gateway.keys): each keyed model's key source bound to its
    URL's host, or to this machine for replicas started here; what `populace demo/run` give the
    gateway they start. Names and hosts only: never a key."""
    keys, hosts = [], list(LOOPBACK_HOSTS)
    for m in models:
        source = (f"env:{m.api_key_env}" if m.api_key_env else f"file:{m.api_key_file}" if m.api_key_file
                  else None)
        if m.base_url is None:
            targets = list(LOOPBACK_HOSTS)
        else:
            parts = urlsplit(m.base_url)
            host = f"[{parts.hostname}]" if ":" in (parts.hostname or "") else parts.hostname
            targets = [f"{host}:{parts.port}" if parts.port else str(host)]
            hosts.extend(targets)
        if source is not None:
            keys.extend(f"{source}@{target}" for target in targets)
    return ",".join(dict.fromkeys(keys)), ",".join(dict.fromkeys(hosts))
