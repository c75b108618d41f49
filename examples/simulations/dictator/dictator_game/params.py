"""The scenario's own keys: every top-level key that is not the platform's (agents, rounds,
seed, model, placement, population …) is validated by `DictatorParams`.

Pydantic does the validation; the platform turns its errors into one line per field, named
as the scenario wrote it (`game.endowment: Input should be greater than or equal to 1`), and
an unknown key is an error too (`game.endowmnet: unknown key`), so a typo never runs.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from populace.sdk import Count, Params


class _Section(BaseModel):
    # frozen: every agent of a run shares one params object; extra="forbid": typos are errors
    model_config = ConfigDict(extra="forbid", frozen=True)


class GameConfig(_Section):
    """`game:` — the rules."""

    # Count: an int that refuses `true` (YAML's bool); bounds keep prompts and sums sane
    endowment: Count = Field(10, ge=1, le=1_000_000)  # whole units each agent is given every round
    show_average: bool = True  # from round 2 on, tell every agent last round's average gift


class PromptConfig(_Section):
    """`prompt:` — how the question is put."""

    persona: bool = True  # with a `population`, each agent's persona leads its prompt
    # chain of thought is the platform's, not a key of ours: `model: {answer: cot}` in a scenario


class DictatorParams(Params):
    game: GameConfig = GameConfig()
    prompt: PromptConfig = PromptConfig()
