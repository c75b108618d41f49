"""The feed's parameters: the scenario's `pool:`, `recommender:`, `stance:`, `activity:` and
`prompt:` sections. Every error names its field as the scenario wrote it."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StrictBool, ValidationInfo, field_validator

from populace.sdk import Params

ANSWER_TOKENS = 64  # the JSON around the post: stance, like, repost, follow, unfollow
CHARS_PER_TOKEN = 3  # a token holds ~3-4 characters of text: the budget never cuts a post the schema allows
MAX_POOL = 1_000_000
MAX_K = 50


def _not_bool(value: object) -> object:
    if isinstance(value, bool):  # YAML's true is not 1
        raise ValueError("must be a number, not true/false")
    return value


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PoolConfig(_Section):
    size: int = Field(10_000, ge=1, le=MAX_POOL)  # posts the world keeps (the newest and most popular)
    seed_posts: int = Field(1_000, ge=0, le=MAX_POOL)  # posts in the pool before round 1, by random agents

    @field_validator("size", "seed_posts", mode="before")
    @classmethod
    def _whole(cls, value: object) -> object:
        return _not_bool(value)

    @field_validator("seed_posts")
    @classmethod
    def _fits(cls, value: int, info: ValidationInfo) -> int:
        size = info.data.get("size")
        if size is not None and value > size:
            raise ValueError(f"{value} is more than the pool holds (pool.size {size})")
        return value


class RecommenderConfig(_Section):
    """score = (popularity·ln(1 + likes + repost_weight·reposts) + recency)·2^(−age/half_life)
    + similarity·(1 − |stance − post stance| / (2·scale)) + interest·cos(reader's interests, author's)
    + follow_boost·[follows the author]."""

    k: int = Field(10, ge=1, le=MAX_K)  # posts in a feed
    half_life: float = Field(2.0, gt=0, le=1_000_000, allow_inf_nan=False)  # rounds for a post's score to halve
    popularity: float = Field(1.0, ge=0, le=1_000, allow_inf_nan=False)
    repost_weight: float = Field(2.0, ge=0, le=1_000, allow_inf_nan=False)  # a repost counts as this many likes
    recency: float = Field(1.0, ge=0, le=1_000, allow_inf_nan=False)
    similarity: float = Field(1.0, ge=0, le=1_000, allow_inf_nan=False)
    follow_boost: float = Field(1.0, ge=0, le=1_000, allow_inf_nan=False)
    # interest similarity on vectors (populace.sdk.recommend): each agent has a seeded int8 interest
    # vector of `interest_dims` dimensions; a post carries its author's. 0: left out (no per-reader ranking)
    interest: float = Field(0.0, ge=0, le=1_000, allow_inf_nan=False)
    interest_dims: int = Field(16, ge=1, le=256)
    record_shown: StrictBool = True  # record each reader's feed in table `shown` (who saw what)

    @field_validator("k", "half_life", "popularity", "repost_weight", "recency", "similarity",
                     "follow_boost", "interest", "interest_dims", mode="before")
    @classmethod
    def _numbers(cls, value: object) -> object:
        return _not_bool(value)


class StanceConfig(_Section):
    scale: int = Field(3, ge=1, le=10)  # stances are whole numbers from -scale (against) to scale (for)
    topic: str = Field("Cities should ban private cars from their centres.", min_length=1, max_length=2_000)

    @field_validator("scale", mode="before")
    @classmethod
    def _whole(cls, value: object) -> object:
        return _not_bool(value)

    @field_validator("topic")
    @classmethod
    def _one_line(cls, value: str) -> str:
        value = " ".join(value.split())
        if not value:
            raise ValueError("must not be blank")
        return value


class ActivityConfig(_Section):
    """Who acts each round: each agent with the rate its persona's `attribute` gives (a seeded
    draw per run, round and agent); `default` for agents without it and in runs without a population."""

    attribute: str = Field("activity", min_length=1, max_length=100)
    rates: dict[str, Annotated[float, Field(ge=0.0, le=1.0, allow_inf_nan=False)]] = Field(
        default_factory=lambda: {"high": 0.5, "medium": 0.2, "low": 0.05})
    default: float = Field(0.1, ge=0.0, le=1.0, allow_inf_nan=False)

    @field_validator("rates", mode="before")
    @classmethod
    def _no_bools(cls, value: object) -> object:
        if isinstance(value, dict):
            for level, rate in value.items():
                if isinstance(rate, bool):
                    raise ValueError(f"{level}: a rate is a number from 0 to 1, not true/false")
        return value

    @field_validator("default", mode="before")
    @classmethod
    def _number(cls, value: object) -> object:
        return _not_bool(value)


class PromptConfig(_Section):
    persona: bool = True  # with a `population`, each agent's persona leads its prompt
    post_chars: int = Field(280, ge=10, le=2_000)  # the longest post an answer may carry

    @field_validator("post_chars", mode="before")
    @classmethod
    def _whole(cls, value: object) -> object:
        return _not_bool(value)


class FeedParams(Params):
    pool: PoolConfig = PoolConfig()
    recommender: RecommenderConfig = RecommenderConfig()
    stance: StanceConfig = StanceConfig()
    activity: ActivityConfig = ActivityConfig()
    prompt: PromptConfig = PromptConfig()
