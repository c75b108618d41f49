"""Services start fast: a service process loads what it serves with, not the analysis library's
statistics and plots (scipy and plotly took the recorder seconds to import at every start, and
every private stack, `populace up` and each end-to-end test waited on it). The recorder's own
install holds neither: it depends on the store library (populace.store), not on the analysis
(docs/architecture.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# loaded by reports and statistics only; a service that reads one imports it where it reads
HEAVY = ("scipy", "plotly")


def test_no_service_loads_the_analysis_libraries():
    # one interpreter builds every service in turn, noting what each build added
    probe = ("import sys, json\nfrom populace.core import serve\nloaded = {}\n"
             "for name in serve.names():\n"
             "    before = set(sys.modules)\n    serve.build(name)\n"
             "    loaded[name] = sorted(set(sys.modules) - before)\n"
             "print(json.dumps(loaded))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=180, check=True)
    loaded = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(loaded) >= {"orchestrator", "environment", "gateway", "recorder", "agent-host"}
    heavy = {name: sorted({h for h in HEAVY for m in modules if m == h or m.startswith(f"{h}.")})
             for name, modules in loaded.items()}
    assert heavy == {name: [] for name in loaded}


def test_the_analysis_package_still_exports_every_name():
    import populace.analysis as analysis

    for name in analysis.__all__:
        assert getattr(analysis, name) is not None, name
    with pytest.raises(AttributeError):
        analysis.no_such_name  # noqa: B018


def _closure(lock: dict, name: str, extras: tuple[str, ...] = ()) -> set[str]:
    """The distributions `pip install name[extras]` installs, read from uv.lock's graph: each
    package's dependencies, and the optional ones of the extras an edge asks for (markers are
    ignored: more, never fewer, than any one platform installs)."""
    packages = {p["name"]: p for p in lock["package"]}
    seen: set[str] = set()
    todo = [(name, tuple(extras))]
    while todo:
        pkg, wanted = todo.pop()
        key = f"{pkg}[{','.join(sorted(wanted))}]"
        if key in seen:
            continue
        seen.add(key)
        entry = packages[pkg]
        edges = list(entry.get("dependencies", []))
        for extra in wanted:
            edges += entry.get("optional-dependencies", {})[extra]
        todo += [(e["name"], tuple(e.get("extra", ()))) for e in edges]
    return {k.partition("[")[0] for k in seen}


def test_the_recorders_install_holds_no_scipy_plotly_or_analysis():
    lock = tomllib.loads((ROOT / "uv.lock").read_text(encoding="utf-8"))
    recorder = _closure(lock, "populace-recorder")
    assert {"populace-store", "duckdb", "pyarrow", "faststream"} <= recorder  # the graph is the real one
    assert {"scipy", "plotly", "jinja2", "populace-analysis", "populace-sdk"} & recorder == set()
    store = _closure(lock, "populace-store")
    assert {"duckdb", "pyarrow", "populace-core", "populace-population"} <= store
    assert {"scipy", "plotly", "populace-analysis", "populace-sdk", "faststream", "nats-py"} & store == set()
    # the live reads' extra brings the analysis back: the walk sees extras
    assert {"populace-analysis", "scipy", "plotly"} <= _closure(lock, "populace-recorder", ("reads",))


def test_the_store_and_the_local_record_load_no_analysis():
    # the packages (populace's own by their second name) the store, a local run's record and the recorder load
    probe = ("import sys, json\nimport populace.store, populace.store.local_runs, populace.recorder.app\n"
             "print(json.dumps(sorted({'.'.join(m.split('.')[:2 if m.startswith('populace.') else 1])"
             " for m in sys.modules})))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    loaded = set(json.loads(done.stdout.strip().splitlines()[-1]))
    assert "populace.store" in loaded
    assert {"scipy", "plotly", "populace.analysis", "populace.sdk"} & loaded == set()


async def test_a_recorder_without_the_analysis_answers_the_stores_reads_and_refuses_the_statistics(
        monkeypatch, tmp_path):
    from types import SimpleNamespace

    from populace.core.contracts import (
        AgentsReply,
        AgentsRequest,
        GroupsReply,
        GroupsRequest,
        InterviewsReply,
        InterviewsRequest,
        ProfileReply,
        ProfileRequest,
    )
    from populace.recorder import read_server
    from populace.store import Store

    def missing(name):
        raise ModuleNotFoundError("No module named 'scipy'", name="scipy")

    monkeypatch.setattr(read_server.importlib, "import_module", missing)
    store = Store(tmp_path / "r.duckdb")
    reads = read_server.Reads(SimpleNamespace(log=SimpleNamespace(debug=lambda *a, **k: None)), store)
    # the store's reads run: an unknown run is their own refusal, not the missing library's
    agents = AgentsReply.model_validate_json(await reads.agents(AgentsRequest(run_id="r1"), None))
    assert (agents.ok, agents.error, agents.run_id) == (False, "run 'r1' is not recorded (yet)", "r1")
    profile = ProfileReply.model_validate_json(await reads.profile(ProfileRequest(run_id="r1"), None))
    assert (profile.ok, profile.error) == (False, f"run 'r1' is not in {tmp_path / 'r.duckdb'}; known runs: (none)")
    # the statistics need the analysis: refused, naming what is missing and the extra
    for handler, request, reply in ((reads.groups, GroupsRequest(run_id="r1", by="age"), GroupsReply),
                                    (reads.interviews, InterviewsRequest(run_id="r1"), InterviewsReply)):
        answered = reply.model_validate_json(
            await read_server.refused_without_analysis(handler, reply)(request, None))
        assert (answered.ok, answered.run_id) == (False, "r1")
        assert "No module named 'scipy'" in answered.error and "populace-recorder[reads]" in answered.error
    store.close()


def test_tracing_loads_the_opentelemetry_sdk_only_when_configured():
    # the SDK (and psutil, which its resources import) cost every service process's start ~0.02 s
    # of CPU for nothing when no exporter is set; with one it is installed as before
    probe = ("import os, sys\nfrom populace.core import telemetry\ntelemetry.setup('gateway')\n"
             "off = sorted(m for m in sys.modules if m.startswith(('opentelemetry.sdk', 'psutil')))\n"
             "os.environ['OTEL_TRACES_EXPORTER'] = 'console'\ntelemetry.setup('gateway')\n"
             "from opentelemetry import trace\n"
             "print(off, type(trace.get_tracer_provider()).__module__)")
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True,
                          env=env)
    assert done.stdout.split() == ["[]", "opentelemetry.sdk.trace"]


def test_a_service_process_imports_with_the_collector_off():
    # `python -m populace.core.serve` turns the cyclic collector off before its first import (the
    # usage error exits before any service is built; a library import of serve leaves it alone)
    probe = ("import gc, runpy, sys\nsys.argv = ['serve']\ntry:\n"
             "    runpy.run_module('populace.core.serve', run_name='__main__', alter_sys=True)\n"
             "except SystemExit:\n    pass\nprint(gc.isenabled())\n"
             "gc.enable()\nimport populace.core.serve\nprint(gc.isenabled())")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.split() == ["False", "True"]


@pytest.mark.parametrize("together", [False, True])
def test_a_service_runs_with_the_collector_on_and_its_imports_frozen(monkeypatch, together):
    # what the start imported is frozen out of the collector, which is on again before the
    # service's event loop runs (a service process that stayed without it would leak every cycle)
    import gc
    from types import SimpleNamespace

    from populace.core import serve

    seen = []

    class Runner:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def run(self, coro):
            coro.close()
            seen.append((gc.isenabled(), gc.get_freeze_count() > 0))

    monkeypatch.setattr(serve, "build", lambda name, settings=None: SimpleNamespace(app=SimpleNamespace()))
    monkeypatch.setattr(serve, "factory", lambda name: None)
    monkeypatch.setattr(serve, "event_loop_runner", Runner)
    gc.disable()
    try:
        if together:
            serve.run_all('[["gateway", {}]]')
        else:
            serve.run("gateway")
    finally:
        gc.unfreeze()
        gc.enable()
    assert seen == [(True, True)]
