"""Personas are fetched and parsed once per process: an agent-host's casts and the recorder's
profile rows are kept by the personas' digest (bounded), so a second run or spawn of the same
personas, or two asking at once, read and parse the file once."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import pytest

from populace.agent_host import app as host_app
from populace.core.contracts import PopulationRef, RunConfig, RunStarted
from populace.population.by_digest import ByDigest
from populace.recorder import app as recorder_app
from populace.sdk.registry import resolve
from populace.store.store import Event, Store

DIGEST = "a" * 64
PERSONAS = "".join(json.dumps({"profile": {"age": 20 + i}, "persona": {"name": f"N{i}"}}) + "\n"
                   for i in range(3)).encode()


def config(digest: str = DIGEST) -> RunConfig:
    return RunConfig(agents=3, population=PopulationRef(personas="p.jsonl", digest=digest))


@pytest.fixture
def fetched(monkeypatch) -> list[str]:
    """Every personas file read from the object store, by digest."""
    reads: list[str] = []

    async def get_personas(js, digest: str) -> bytes:
        reads.append(digest)
        await asyncio.sleep(0.01)  # a second asker comes while the first is still reading
        return PERSONAS

    monkeypatch.setattr(host_app.objects, "get_personas", get_personas)
    monkeypatch.setattr(recorder_app.objects, "get_personas", get_personas)
    return reads


def test_a_hosts_second_spawn_and_an_interview_of_the_same_personas_parse_them_once(fetched, monkeypatch):
    parses: list[bytes] = []
    real = host_app.cast_from_jsonl
    monkeypatch.setattr(host_app, "cast_from_jsonl", lambda data, source: parses.append(data) or real(data, source))
    host = host_app.AgentHost(SimpleNamespace(settings=SimpleNamespace(host_id="h1"), js=None))

    async def go():
        first, second = await asyncio.gather(host.load_cast(config()), host.load_cast(config()))  # two runs at once
        again = await host.load_cast(config())  # a later run (or an interview) of the same personas
        other = await host.load_cast(config("b" * 64))  # another population replaces it (one kept)
        return first, second, again, other

    first, second, again, other = asyncio.run(go())
    assert first is second is again and len(first) == 3
    assert fetched == [DIGEST, "b" * 64] and len(parses) == 2
    assert other is not first and DIGEST not in host.casts


def test_the_recorder_reads_a_populations_profiles_once_for_every_run_of_it(fetched, tmp_path):
    rec = recorder_app.Recorder.__new__(recorder_app.Recorder)
    rec.svc = SimpleNamespace(js=None)
    rec.profiles = ByDigest(limit=4, max_bytes=recorder_app.PROFILES_KEPT_BYTES,
                            size=lambda rows: 0 if rows is None else rows.nbytes)
    tables = resolve(config()).tables()

    async def go():
        return await asyncio.gather(*(rec.profiles_of(DIGEST) for _ in range(3)))

    rows = asyncio.run(go())
    assert fetched == [DIGEST] and rec.profiles.made == 1 and rows[0] is rows[1] is rows[2]
    store = Store(tmp_path / "p.duckdb")
    for rid, blob in (("r1", rows[0]), ("r2", rows[1])):  # two runs of one population, one parse
        started = RunStarted(run_id=rid, config=config(), started_at=1e9, hosts=["h1"], tables=tables)
        store.ingest([Event(f"{rid}.started", "started", started, blob=blob)])
    got = store.con.execute("SELECT run_id, agent_id, persona->>'name' FROM agent_profiles "
                            "ORDER BY run_id, agent_id").fetchall()
    store.close()
    assert got == [(rid, i, f"N{i}") for rid in ("r1", "r2") for i in range(3)]


def test_kept_values_are_bounded_by_count_and_bytes_and_a_failure_is_not_kept():
    async def go():
        kept: ByDigest[str] = ByDigest(limit=2, max_bytes=100, size=len)
        made: list[str] = []

        def maker(value: str, fail: bool = False):
            async def make():
                made.append(value)
                if fail:
                    raise OSError("unreadable")
                return value
            return make

        await kept.get("a", maker("x" * 10))
        await kept.get("b", maker("y" * 10))
        await kept.get("c", maker("z" * 10))  # beyond two entries: the least recently used goes
        assert "a" not in kept and "b" in kept and "c" in kept
        await kept.get("d", maker("w" * 95))  # beyond the bytes: the others go
        assert "d" in kept and "b" not in kept and "c" not in kept
        await kept.get("e", maker("v" * 101))  # too big alone: made, used, not kept
        assert "e" not in kept
        with pytest.raises(OSError):
            await kept.get("f", maker("f", fail=True))
        assert await kept.get("f", maker("f")) == "f"  # asked again: made again
        return made

    assert asyncio.run(go()) == ["x" * 10, "y" * 10, "z" * 10, "w" * 95, "v" * 101, "f", "f"]


def test_a_prepared_run_holds_its_personas_parsed_once_for_a_local_run():
    from pathlib import Path

    from populace.client.prepare import prepare_file
    from populace.population import cast as casts

    prepared = prepare_file(Path(__file__).resolve().parents[2] / "examples" / "opinion.yaml")  # graph-ordered
    parsed = casts.cast_from_jsonl(prepared.personas)  # what a local run parsed from the bytes before
    assert prepared.cast is not None and len(prepared.cast) == prepared.config.agents
    assert [(p.text, dict(p.profile)) for p in prepared.cast.personas] == \
        [(p.text, dict(p.profile)) for p in parsed.personas]
