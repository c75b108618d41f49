"""`populace bench gateway` under load: a reply that is not a valid answer is counted, by kind, and
reported in the result's JSON; the bench does not stop at it (it once died with
`AssertionError: None` on an invalid answer in the end-to-end throughput pass)."""

from __future__ import annotations

import asyncio
import json
from dataclasses import asdict
from types import SimpleNamespace

import pytest
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeout
from rich.console import Console

from populace.bench import gateway as bench
from populace.bench.gateway import GatewayBenchResult, ReplyCount
from populace.core.contracts import InferReply


def reply(valid: list[bool], failed: list[str | None] | None = None, error: str | None = None) -> InferReply:
    if error is not None:
        return InferReply(batch_id="b", error=error)
    return InferReply(batch_id="b", texts=["{}"] * len(valid), valid=valid, failed=failed or [])


def test_each_kind_of_reply_is_counted_apart():
    c = ReplyCount()
    assert c.add(reply([True, True]), 2) is True
    assert c.add(reply([True, False]), 2) is False  # the model's invalid answer: what crashed the bench
    assert c.add(reply([False, True], failed=["no replica answered", None]), 2) is False  # infrastructure
    assert c.add(reply([], error="gateway overloaded: 10 prompts in service"), 3) is False  # refused whole
    assert c.add(reply([True]), 2) is False  # one answer for two prompts: not trusted, refused
    assert c.add(b"{not json", 4) is False
    assert c.add(reply([True, True, False]).model_dump_json().encode(), 3) is False  # off the wire
    assert c.add_lost(5, NatsTimeout()) is False
    assert (c.prompts, c.valid, c.invalid, c.failed, c.refused) == (23, 6, 2, 6, 9)
    assert c.not_valid == 17 and c.prompts == c.valid + c.not_valid
    assert c.errors[:3] == ["no replica answered", "gateway overloaded: 10 prompts in service",
                            "reply carries 1 answers for 2 prompts"]
    assert c.errors[3].startswith("unreadable reply: ") and c.errors[4].startswith("no reply: TimeoutError")
    h = ReplyCount()
    assert (h.add_http(200), h.add_http(503)) == (True, False)
    assert (h.prompts, h.valid, h.failed, h.errors) == (2, 1, 1, ["HTTP 503"])


def test_the_end_to_end_pass_counts_bad_replies_instead_of_raising(monkeypatch):
    batches = iter([reply([True] * 4), reply([True, False, True, True]), NatsTimeout(),
                    reply([], error="gateway overloaded"), reply([True, True, True, False])])

    async def infer(nc, data, timeout):
        if b'"batch_id":"t' not in data:  # the warm-up's one-prompt batches
            return SimpleNamespace(data=reply([True]).model_dump_json().encode())
        got = next(batches)
        if isinstance(got, Exception):
            raise got
        return SimpleNamespace(data=got.model_dump_json().encode())

    monkeypatch.setattr(bench, "infer", infer)
    count = ReplyCount()
    rps = asyncio.run(bench.e2e_throughput(None, "x", count, batches=5, size=4))
    assert rps > 0
    assert asdict(count) == {"prompts": 20, "valid": 10, "invalid": 2, "failed": 4, "refused": 4,
                             "errors": ["no reply: TimeoutError nats: timeout", "gateway overloaded"]}


def test_a_failure_of_the_bench_itself_is_not_counted_as_a_reply(monkeypatch):
    async def infer(nc, data, timeout):
        if b'"batch_id":"t' not in data:
            return SimpleNamespace(data=reply([True]).model_dump_json().encode())
        raise KeyError("a bug")

    monkeypatch.setattr(bench, "infer", infer)
    with pytest.raises(KeyError):
        asyncio.run(bench.e2e_throughput(None, "x", ReplyCount(), batches=2, size=2))


def test_the_warm_up_waits_for_a_gateway_that_has_not_subscribed_yet(monkeypatch):
    calls = {"n": 0}

    async def infer(nc, data, timeout):
        calls["n"] += 1
        if calls["n"] == 1:
            raise NoRespondersError
        return SimpleNamespace(data=reply([True] * (2 if b'"batch_id":"t' in data else 1)).model_dump_json().encode())

    monkeypatch.setattr(bench, "infer", infer)
    count = ReplyCount()
    asyncio.run(bench.e2e_throughput(None, "x", count, batches=2, size=2))
    assert (count.prompts, count.valid) == (4, 4)


def test_the_dispatcher_pass_counts_the_models_invalid_answers(monkeypatch):
    """The real dispatcher against a replica that answers every call with text the schema refuses."""
    bad = json.loads(bench.CANNED)
    bad["choices"][0]["message"]["content"] = '{"guess": "many"}'
    monkeypatch.setattr(bench, "CANNED", json.dumps(bad).encode())
    rps, count = asyncio.run(bench.routed_rps_mock(total=20, batch_size=10))
    assert rps > 0 and (count.prompts, count.valid, count.invalid, count.failed, count.refused) == (20, 0, 20, 0, 0)


def test_the_result_reports_the_counts_in_its_json_and_table():
    counts = {"e2e aiohttp": ReplyCount(prompts=10_000, valid=9_990, invalid=7, failed=3),
              "mock dispatcher": ReplyCount(prompts=20_000, valid=20_000)}
    r = GatewayBenchResult(*([None] * 6), *([1.0] * 10), *([None] * 4),
                           replies={k: asdict(v) for k, v in counts.items()})
    assert json.loads(r.to_json())["replies"]["e2e aiohttp"] == {
        "prompts": 10_000, "valid": 9_990, "invalid": 7, "failed": 3, "refused": 0, "errors": []}
    console = Console(width=200, record=True)
    console.print(r.table())
    rows = {cells[0]: cells[1] for line in console.export_text().splitlines() if line.startswith("│")
            for cells in [[c.strip() for c in line.strip("│").split("│")]]}
    assert rows["prompts without a valid answer, e2e aiohttp"] == "10 of 10,000 (invalid 7, no model 3, refused 0)"
    assert rows["prompts without a valid answer, mock dispatcher"] == "0 of 20,000"
    assert rows["added latency p50 (gateway − direct)"] == "—"  # no pair answered on both paths
