"""The report's pure parts, by hand: CIs cut to the game's range, padded axes, paging and caps of
the answers, the reasoning read from a CoT answer, and the tables comparing runs."""

from __future__ import annotations

import pytest

from populace.analysis.report.answer_rows import page_count, profile_text, reasoning_of, shown_note
from populace.analysis.report.comparison import comparison_params, comparison_rounds, share_series
from populace.analysis.report.intervals import clip_interval, padded_range
from populace.analysis.report.text import flat_params, manifest_model_names, model_text


def test_a_ci_past_the_range_is_cut_and_says_so():
    # a 95% CI of [-196.83, 336.83] for n = 2 on a [0, 100] game
    drawn = clip_interval(-196.83, 336.83, (0.0, 100.0))
    assert (drawn.low, drawn.high) == (0.0, 100.0)
    assert drawn.clipped_low and drawn.clipped_high and drawn.clipped
    assert (drawn.true_low, drawn.true_high) == (-196.83, 336.83)
    assert drawn.hover() == "95% CI [-196.83, 336.83], CI clipped to the range [0.00, 100.00]"
    one_side = clip_interval(90.0, 120.5, (0.0, 100.0))
    assert (one_side.low, one_side.high, one_side.clipped_low, one_side.clipped_high) == (90.0, 100.0, False, True)
    inside = clip_interval(10.0, 20.0, (0.0, 100.0))
    assert not inside.clipped and inside.hover() == "95% CI [10.00, 20.00]"
    assert clip_interval(-5.0, 5.0, None).low == -5.0  # no declared range: drawn as is
    assert clip_interval(None, None, (0.0, 100.0)) is None  # a group of one has no interval
    assert clip_interval(float("nan"), 1.0, (0.0, 1.0)) is None


def test_padded_range_keeps_an_edge_line_visible():
    assert padded_range([10.0, 20.0, 0.0]) == pytest.approx([-1.0, 21.0])  # the equilibrium 0 off the edge
    assert padded_range([30.0], (0.0, 100.0)) == pytest.approx([-5.0, 105.0])
    assert padded_range([5.0, None, float("nan")]) == pytest.approx([4.75, 5.25])  # a single value still has a span
    assert padded_range([None]) is None


def test_paging_and_caps():
    assert [page_count(n) for n in (0, 1, 50, 51, 120, 150)] == [1, 1, 1, 2, 3, 3]
    assert page_count(10, size=3) == 4
    assert shown_note(120, 120, "invalid answers", "first") is None
    assert shown_note(2000, 5120, "invalid answers", "first") == (
        "Showing the first 2,000 of 5,120 invalid answers, to keep this file small.")


def test_reasoning_is_read_from_the_structured_answer():
    assert reasoning_of('{"reasoning": "2/3 of 50 is 33", "guess": 33}') == "2/3 of 50 is 33"
    assert reasoning_of('Sure! {"reasoning": "think", "guess": 1} Hope it helps') == "think"  # text around the JSON
    assert reasoning_of('{"guess": 12}') is None
    assert reasoning_of("I pick 42") is None and reasoning_of(None) is None and reasoning_of("") is None
    assert profile_text('{"education": "Ph.D.", "age": 34}') == "education: Ph.D., age: 34"
    assert profile_text(None) == "" and profile_text("[1]") == ""


def test_model_names_come_from_the_config_or_the_manifest():
    manifest = {"model": {"backend": "local", "name": None,
                          "replicas": [{"replica_id": "local-0", "model": "SmolLM2-135M-Instruct"}]}}
    assert manifest_model_names(manifest) == ["SmolLM2-135M-Instruct"]
    assert model_text({"backend": "local", "temperature": 0.7}, manifest) == (
        "local (SmolLM2-135M-Instruct); temperature=0.7")
    assert model_text({"backend": "openai", "name": "llama"}, manifest).startswith("openai (llama)")
    assert manifest_model_names(None) == [] and model_text({}) == "—"
    assert flat_params({"game": {"ratio": "2/3", "offset": 5}, "tags": ["a"]}) == {
        "game.ratio": "2/3", "game.offset": "5", "tags": '["a"]'}


def _info(run_id: str, ratio: str, seed: int, calls: int) -> dict:
    return {"run_id": run_id, "name": "sweep", "status": "completed", "simulation": "ratio-game", "agents": 50,
            "rounds": 2, "seed": seed, "model": {"backend": "dummy"}, "manifest": None,
            "prompt": {"answer": "cot"}, "params": {"game": {"ratio": ratio, "max_value": 100}},
            "usage": {"llm_calls": calls, "prompt_tokens": 10, "completion_tokens": 5, "infra_retries": 0,
                      "invalid_answers": 1, "simulation_errors": 2}}


def test_the_runs_table_shows_what_differs_and_says_the_rest_once():
    table, same = comparison_params([_info("a", "2/3", 1, 100), _info("b", "1/2", 1, 1200)])
    assert table.headers == ["run", "name", "status", "game.ratio", "LLM calls", "tokens", "invalid answers",
                             "simulation errors"]
    assert [list(r) for r in table.rows] == [["a", "sweep", "completed", "2/3", "100", "15", "1", "2"],
                                             ["b", "sweep", "completed", "1/2", "1,200", "15", "1", "2"]]
    assert "seed=1" in same and "game.max_value=100" in same and "prompt.answer=cot" in same
    assert not any(s.startswith("game.ratio") for s in same)


def test_the_rounds_table_puts_runs_side_by_side():
    numeric = [{"round": 1, "n": 50, "n_valid": 48, "mean": 33.333}, {"round": 2, "n": 50, "n_valid": 50,
                                                                      "mean": 20.0}]
    categorical = [{"round": 2, "n": 10, "n_valid": 9, "leader": "yes", "leader_share": 0.5,
                    "options": ["yes", "no"], "shares": {"yes": 0.5, "no": 0.5}}]
    table = comparison_rounds([("a", "numeric", numeric), ("v", "categorical", categorical)])
    assert table.headers == ["round", "a: mean", "a: valid", "v: most chosen", "v: valid"]
    assert [list(r) for r in table.rows] == [["1", "33.33", "48 of 50", "—", "—"],
                                             ["2", "20.00", "50 of 50", "yes (50.0%)", "9 of 10"]]
    series, panels = share_series([({"run_id": "v"}, categorical)])
    assert panels == ["share of yes", "share of no"] and series["v\tshare of yes"] == [(2, 0.5)]


def test_the_llm_table_adds_cached_tokens_and_dollars_where_a_round_has_them_and_models_get_a_table():
    from populace.analysis.report.cost import models_table
    from populace.analysis.report.sections import llm_table

    usage = {"llm_calls": 10, "prompt_tokens": 900, "completion_tokens": 100, "infra_retries": 0}
    rounds = [{"round": 1, "n_invalid_answers": 0, "usage": {**usage, "cached_tokens": 300, "dollars": 0.0216}},
              {"round": 2, "n_invalid_answers": 0, "usage": {**usage, "cached_tokens": 0, "dollars": 0.0}}]
    t = llm_table(rounds, {})
    assert t.headers[-2:] == ["cached tokens", "dollars"]
    assert [r[-2:] for r in t.rows] == [["300", "$0.022"], ["0", "$0"]]
    plain = llm_table([{**rounds[0], "usage": usage}], {})  # a file from before, or a run without prices
    assert "dollars" not in plain.headers
    assert models_table({}) == []
    table, note = models_table({"a": {"agents": 5, "calls": 10, "valid": 9, "prompt_tokens": 900, "cached_tokens": 300,
                                      "completion_tokens": 100, "dollars": None, "latency_ms_mean": 12.5,
                                      "latency_ms_p50": 11.0}})
    assert table.rows[0][:3] == ["a", "5", "10"] and table.rows[0][7] == "—" and "llm_calls" in note.text
