"""The opinion simulation's parameters: the scenario's `statement:`, `extreme:` and `prompt:`.

Three top-level keys: the statement every agent takes a stance on, the stance from which a
stance counts as extreme, and the prompt variant. The graph and the broadcasts are the
platform's keys (`graph:`, `broadcasts:`); `check_run` only checks that a broadcast's fields
are this simulation's post fields.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from populace.sdk import Count, FiniteFloat, Params

MAX_STATEMENT_CHARS = 2000
POST_MAX_CHARS = 200  # one sentence: the answer schema's maxLength for a post
MAX_POSTS_SHOWN = 100  # an upper bound for prompt.max_posts: beyond it a prompt is a feed, not a round
DEFAULT_STATEMENT = "Cities should ban private cars from their centres."
# A direct answer is `{"stance": -0.35, "post": "<up to 200 characters>"}`: about 65 tokens,
# more than the platform's default of 48, which would cut the post off and lose the answer.
DIRECT_MAX_TOKENS = 96
COT_MAX_TOKENS = 320  # chain of thought needs room to think before it answers


def _statement(value: object) -> str:
    """A YAML scalar that must be text, trimmed and on one line (it is quoted in the prompt).
    YAML reads unquoted yes/no/on/off as booleans and numbers as numbers: say so."""
    if isinstance(value, bool) or not isinstance(value, str):
        raise ValueError(f"must be text, not {type(value).__name__} (quote it in YAML)")
    text = " ".join(value.split())
    if not text:
        raise ValueError("must not be empty")
    if len(text) > MAX_STATEMENT_CHARS:
        raise ValueError(f"must be at most {MAX_STATEMENT_CHARS} characters, not {len(text)}")
    return text


Statement = Annotated[str, BeforeValidator(_statement)]


class PromptConfig(BaseModel):
    """Which prompt variant the agents get. The system prompt (shared by every agent, so
    replicas cache it) is the discussion, the statement, the stance scale and the answer
    instruction; the user prompt carries the agent's persona, its own last stance, the posts
    it heard and the request."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # direct: answer at once; cot: think step by step first (chain of thought), still one
    # structured call: {"reasoning": ..., "stance": ..., "post": ...}.
    answer: Literal["direct", "cot"] = "direct"
    persona: bool = True  # put the agent's persona in its prompt (when the run has a population)
    # how many of the posts an agent heard go into its prompt: broadcasts first, then a seeded
    # sample of its in-neighbours' posts (every post heard still counts in `heard`)
    max_posts: Count = Field(10, ge=1, le=MAX_POSTS_SHOWN)


class OpinionParams(Params):
    statement: Statement = DEFAULT_STATEMENT
    # |stance| >= extreme counts as an extreme stance (the summary's extreme_share)
    extreme: FiniteFloat = Field(0.8, gt=0, le=1)
    prompt: PromptConfig = PromptConfig()
