"""The benches reach the ratio game only through the registry and the SDK (populace.bench.game);
what they send and accept must stay exactly what the game's own prompt library and parser give,
so the quoted bench figures keep measuring the same requests."""

from __future__ import annotations

import pytest
from populace_ratio_game.params import GameConfig, PromptConfig
from populace_ratio_game.parsing import parse_guess
from populace_ratio_game.prompts import answer_schema, rules, system_prompt, user_prompt

from populace.bench.game import BenchGame

GAME = GameConfig()
FREE_INSTRUCTIONS = {  # the answer instructions without the JSON form, as the benches wrote them before
    "direct": "Report your number directly.",
    "cot": "Think step by step about what the other players will do before you decide.",
}


@pytest.mark.parametrize("answer", ["direct", "cot"])
def test_prompts_and_schema_are_the_games_own(answer):
    game = BenchGame({"system": "basic", "answer": answer})
    assert game.system == system_prompt(GAME, PromptConfig(system="basic", answer=answer))
    assert game.schema == answer_schema(GAME, answer)
    assert game.free_system == f"{rules(GAME)} {FREE_INSTRUCTIONS[answer]}"
    persona = "You are Ana, 34 years old. Education: Ph.D."
    assert game.user_prompt(7, persona) == user_prompt(7, "", (), persona, answer)
    assert game.user_prompt(3) == user_prompt(3, "", (), None, answer)


def test_the_default_game_is_the_gateway_benchs():
    game = BenchGame()
    assert (game.system, game.schema) == (system_prompt(GAME), answer_schema(GAME))


@pytest.mark.parametrize("text", ['{"guess": 33}', '{"guess": 150}', "42", "no number", '{"guess": -1}', "",
                                  '{"reasoning": "x", "guess": 12.5}'])
def test_answers_are_judged_by_the_games_parser(text):
    game = BenchGame()
    assert game.value(text) == parse_guess(text, GAME.max_value)
    assert game.valid(text) == (parse_guess(text, 100) is not None)


async def test_it_works_inside_an_event_loop_too():
    assert BenchGame().valid('{"guess": 5}')
