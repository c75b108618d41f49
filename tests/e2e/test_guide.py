"""docs/simulations.md, followed exactly: the commands of its code blocks marked `tested`
(```bash tested, ```bash tested background, ```python tested) run in the guide's order, as
written, in a copy of this working tree, so the page and the platform cannot drift apart.

What the test changes, and only that:
- it runs in a temporary copy of the tree (the files git tracks or would track) with a copy
  of the environment running this test as its `.venv`, relocated to the copied tree (its
  scripts and the project's editable installs point there), so the guide's own `uv sync`
  finds a synced clone and only drops what the guide does not install (the `local` extra).
  A fresh `uv sync` would build llama-cpp-python for minutes, and the project's 24 packages
  (over 120 s on a loaded machine); CI's sync of its clean clone builds those. The installed packages'
  files are hard links (nothing here writes one in place). Nothing is installed into this
  environment or written into this tree;
- `populace up`, in the foreground in the guide, starts in the background on a free port
  (`--port N` added; `nats://127.0.0.1:4222` becomes that port elsewhere). At the end it
  gets a Ctrl-C (SIGINT to its pid), then SIGTERM, then SIGKILL if need be. Every process
  it started (nats-server, the services) is checked, by pid, to be gone;
- a python block runs like a notebook cell: top-level `await` allowed, the last expression
  printed.

It asserts that the template's own tests pass, that `--local` on 1 and 3 hosts, the fleet,
a notebook cell and the import path all give the same rounds, that the recorded and
exported tables hold them, and that installing changed neither pyproject.toml nor uv.lock.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import duckdb
import psutil
import pytest
import yaml

from populace.core.natsserver import free_port

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(280)]

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "simulations.md"
FLEET_URL = "nats://127.0.0.1:4222"
FENCE = re.compile(r"^```(\w+)[ \t]*([^\n]*)\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
COMMAND_TIMEOUT = 120  # seconds, per command (the first `uv sync` may re-lock)

# Runs a python block like a notebook cell: top-level await, the last expression shown.
CELL_RUNNER = r"""
import ast, asyncio, inspect, sys

tree = ast.parse(open(sys.argv[1]).read())
if tree.body and isinstance(tree.body[-1], ast.Expr):
    last = tree.body.pop()
    tree.body.append(ast.copy_location(ast.Assign(targets=[ast.Name("_out_", ast.Store())], value=last.value), last))
    ast.fix_missing_locations(tree)
code = compile(tree, "<cell>", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
ns = {"__name__": "__main__"}
if code.co_flags & inspect.CO_COROUTINE:
    async def cell():
        await eval(code, ns)
    asyncio.run(cell())
else:
    exec(code, ns)
if ns.get("_out_") is not None:
    print(ns["_out_"])
"""


@dataclass
class Step:
    kind: str  # bash | background | python
    text: str


def guide_steps(markdown: str) -> list[Step]:
    """The tested commands, in the guide's order: each line of a ```bash tested block is one
    command; a ```bash tested background block is started in the background; a ```python
    tested block is one cell."""
    steps = []
    for m in FENCE.finditer(markdown):
        lang, info, body = m.group(1), m.group(2).split(), m.group(3)
        if "tested" not in info:
            continue
        if lang == "python":
            steps.append(Step("python", body))
            continue
        assert lang == "bash", f"a tested block must be bash or python, not {lang}"
        kind = "background" if "background" in info else "bash"
        for line in body.splitlines():
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            assert not line.endswith("\\"), f"one command per line: {line!r}"
            assert not line.startswith("cd "), f"every command runs from the clone's root: {line!r}"
            steps.append(Step(kind, line))
    return steps


def rows(output: str) -> list[list[str]]:
    """The body rows of the first table printed (the rounds; `results` adds the LLM work's)."""
    out = []
    for line in output.splitlines():
        if line.lstrip().startswith("│"):
            out.append([c.strip() for c in line.strip().strip("│").split("│")])
        elif out and line.lstrip().startswith("└"):
            break
    return out


def copy_tree(dst: Path) -> None:
    """The files a clone would have, as they are in this working tree (uncommitted included)."""
    listed = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z", "-co", "--exclude-standard"],
                            capture_output=True, check=True).stdout.decode().split("\0")
    for rel in filter(None, listed):
        src = ROOT / rel
        if src.is_file():  # a tracked file may be deleted in the working tree
            (dst / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst / rel)


def _shared(rel: Path) -> bool:
    """Whether a file of the environment (its path inside it) belongs to an installed package's
    own directory (lib/pythonX.Y/site-packages/<package>/…): nothing the guide runs writes such a
    file in place (uv removes and adds files, Python replaces bytecode atomically), so the copy
    may share it. Scripts, .pth files, metadata and the environment's own files are copied."""
    parts = rel.parts
    return (len(parts) >= 5 and parts[0] == "lib" and parts[2] == "site-packages"
            and not parts[3].endswith((".dist-info", ".data", ".pth")))


def copy_venv(dst: Path) -> None:
    """This test's environment, relocated: scripts whose shebang names the old interpreter get
    the new one, the project's editable installs point at the copied tree. The installed
    packages' files (~900 MB, 13k files) are hard links where the filesystem allows: copying
    them took about 10 s on a quiet machine and 50-90 s on a loaded one (10-16 s linked)."""
    src = Path(sys.prefix)

    def link_or_copy(s: str, d: str) -> None:
        if _shared(Path(s).relative_to(src)):
            try:
                os.link(s, d)
                return
            except OSError:  # another filesystem, or links refused: a copy
                pass
        shutil.copy2(s, d)

    shutil.copytree(src, dst, symlinks=True, copy_function=link_or_copy)
    relocate_editables(dst, ROOT, dst.parent)
    old, new = f"#!{src}/bin/", f"#!{dst}/bin/"
    for script in (dst / "bin").iterdir():
        if script.is_file() and not script.is_symlink():
            with open(script, "rb") as f:
                head = f.read(len(old))
            if head == old.encode():
                script.write_bytes(new.encode() + script.read_bytes()[len(old):])


def relocate_editables(venv: Path, old: Path, new: Path) -> None:
    """The project's own packages, installed editable from `old`, pointed at the copy `new`
    (their .pth and direct_url.json), with the freshness uv recorded for them (uv_cache.json:
    the ctime of each package's pyproject.toml and of the directories it watches) taken from the
    copy. The guide's `uv sync` then finds them installed, as in a user's synced clone, instead
    of building all 27 again. Should uv record freshness differently, it rebuilds them:
    slower, never wrong. Every file written here is the copy's own (none is a hard link)."""
    site = next((venv / "lib").glob("python*/site-packages"))
    here = re.compile(re.escape(str(old)) + r"(?=[/\"\n]|$)")
    for pth in site.glob("*.pth"):  # uv_build's editables: <distribution>.pth, the member's directory
        text = pth.read_text()
        if here.search(text):
            pth.write_text(here.sub(str(new), text))
    for url in site.glob("*.dist-info/direct_url.json"):
        text = url.read_text()
        if not here.search(text):
            continue
        url.write_text(here.sub(str(new), text))
        source = Path(here.sub(str(new), json.loads(text)["url"]).removeprefix("file://"))
        cache = url.with_name("uv_cache.json")
        if not cache.exists():
            continue
        info = json.loads(cache.read_text())
        keys = [source / name for name in ("pyproject.toml", "setup.py", "setup.cfg") if (source / name).exists()]
        info["timestamp"] = _uv_timestamp(max(os.stat(k).st_ctime_ns for k in keys))
        info["directories"] = {d: _uv_timestamp(os.stat(source / d).st_ctime_ns) if t is not None else None
                               for d, t in info.get("directories", {}).items()}
        cache.write_text(json.dumps(info))


def _uv_timestamp(ns: int) -> dict[str, int]:
    return {"secs_since_epoch": ns // 10**9, "nanos_since_epoch": ns % 10**9}


def clean_env(tmp: Path) -> dict[str, str]:
    """The environment of a user's terminal: no virtualenv of ours active, no POPULACE_* set."""
    drop = {"VIRTUAL_ENV", "CONDA_PREFIX", "PYTHONPATH", "PYTHONHOME", "UV_PROJECT_ENVIRONMENT", "UV_NO_SYNC",
            "UV_FROZEN", "UV_LOCKED", "PYTEST_CURRENT_TEST", "PYTEST_ADDOPTS"}
    env = {k: v for k, v in os.environ.items() if k not in drop and not k.startswith("POPULACE_")}
    ours = str(Path(sys.prefix) / "bin")
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if p != ours)
    env["TMPDIR"] = str(tmp)  # the stack's logs and stores land in pytest's temporary directory
    return env


def dist_infos() -> set[str]:
    site = next(Path(sys.prefix).glob("lib/python*/site-packages"))
    return {p.name for p in site.glob("*.dist-info")}


class Background:
    """`populace up` as the guide's first terminal has it, in its own process group."""

    def __init__(self, command: str, cwd: Path, env: dict[str, str], log: Path) -> None:
        self.log = log
        self.out = open(log, "wb")
        self.proc = subprocess.Popen(["bash", "-c", f"exec {command}"], cwd=cwd, env=env, stdout=self.out,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        self.started: dict[int, str] = {}  # pid -> name of every process under it, once ready

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_ready(self, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        while "ready" not in self.text():
            assert self.proc.poll() is None, f"populace up exited ({self.proc.returncode}):\n{self.text()}"
            assert time.monotonic() < deadline, f"populace up not ready in {timeout}s:\n{self.text()}"
            time.sleep(0.2)
        for child in psutil.Process(self.proc.pid).children(recursive=True):
            self.started[child.pid] = child.name()

    def stop(self) -> None:
        """Ctrl-C, as the guide says, to the one process the test started (uv passes it on to
        `populace up`; in a terminal the terminal delivers it to both, and uv does not pass it
        on again); then SIGTERM and SIGKILL if it did not stop."""
        try:
            os.kill(self.proc.pid, signal.SIGINT)
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        except ProcessLookupError:
            pass
        finally:
            self.out.close()
        deadline = time.monotonic() + 15
        left = self.alive()
        while left and time.monotonic() < deadline:
            time.sleep(0.2)
            left = self.alive()
        for pid in left:  # only processes this `populace up` started, by pid
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        assert not left, f"populace up left processes running after Ctrl-C: {left}"

    def alive(self) -> dict[int, str]:
        out = {}
        for pid, name in self.started.items():
            try:
                p = psutil.Process(pid)
                if p.name() == name and p.status() != psutil.STATUS_ZOMBIE:
                    out[pid] = name
            except psutil.NoSuchProcess:
                pass
        return out


@pytest.fixture
def workspace(tmp_path):
    if sys.prefix == sys.base_prefix:
        pytest.skip("needs the project's virtual environment (run with `uv run pytest`)")
    if shutil.which("uv") is None or shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("the guide uses uv, and the copy is made from a git work tree")
    clone = tmp_path / "populace"
    t0 = time.monotonic()
    copy_tree(clone)
    t1 = time.monotonic()
    copy_venv(clone / ".venv")
    print(f"\n{t1 - t0:6.1f} s  (copy of the tree)\n{time.monotonic() - t1:6.1f} s  (copy of the environment)")
    (tmp_path / "tmp").mkdir()
    yield clone
    shutil.rmtree(clone / ".venv", ignore_errors=True)  # ~750 MB; the logs and outputs stay


def test_the_guide_works_as_written(workspace, tmp_path):
    clone = workspace
    env = clean_env(tmp_path / "tmp")
    steps = guide_steps(GUIDE.read_text())
    port = free_port()
    url = f"nats://127.0.0.1:{port}"
    before = dist_infos()
    outputs: list[tuple[Step, str]] = []  # each command's stdout (stderr has progress bars and logs)
    fleet: Background | None = None
    locked = None
    scenario = None
    try:
        for step in steps:
            started = time.monotonic()
            if step.kind == "background":
                assert "populace up" in step.text
                fleet = Background(f"{step.text} --port {port}", clone, env, tmp_path / "up.log")
                fleet.wait_ready()
                print(f"{time.monotonic() - started:6.1f} s  {step.text} (until ready)")
                continue
            text = step.text.replace(FLEET_URL, url)
            if step.kind == "python":
                cell = tmp_path / f"cell{len(outputs)}.py"
                cell.write_text(text)
                runner = tmp_path / "cell_runner.py"
                runner.write_text(CELL_RUNNER)
                args = ["uv", "run", "python", str(runner), str(cell)]
            else:
                args = ["bash", "-c", f"set -euo pipefail\n{text}"]
            try:
                res = subprocess.run(args, cwd=clone, env=env, capture_output=True, text=True,
                                     timeout=COMMAND_TIMEOUT)
            except subprocess.TimeoutExpired:
                pytest.fail(f"`{step.text}` took more than {COMMAND_TIMEOUT}s (a `uv sync` that builds "
                            "llama-cpp-python: this environment was built from another lock or build settings)")
            assert res.returncode == 0, f"`{step.text}` exited {res.returncode}:\n{res.stdout}\n{res.stderr}"
            print(f"{time.monotonic() - started:6.1f} s  {step.text.splitlines()[0]}")  # where the time goes
            outputs.append((step, res.stdout))
            if step.text == "uv sync":  # from here on, nothing may touch the project's lock or manifest
                locked = {name: hashlib.sha256((clone / name).read_bytes()).digest()
                          for name in ("uv.lock", "pyproject.toml")}
            if scenario is None and (clone.parent / "my-simulation" / "scenario.yaml").exists():
                scenario = yaml.safe_load((clone.parent / "my-simulation" / "scenario.yaml").read_text())
        assert fleet is not None, "the guide starts `populace up`"
        with duckdb.connect() as con:
            db_rows = con.execute(f"SELECT count(*) FROM '{clone}/export/dictator_outcomes.parquet'").fetchone()
            exported = con.execute(f"SELECT round, n, n_valid, mean_given, given_pct, zero_pct, half_pct, "
                                   f"llm_calls, prompt_tokens + completion_tokens, infra_retries "
                                   f"FROM '{clone}/export/dictator_rounds.parquet' ORDER BY round").fetchall()
    finally:
        if fleet is not None:
            started = time.monotonic()
            fleet.stop()
            print(f"{time.monotonic() - started:6.1f} s  (Ctrl-C to populace up, until its processes are gone)")
    assert locked is not None, "the guide starts with `uv sync`"
    assert {name: hashlib.sha256((clone / name).read_bytes()).digest() for name in locked} == locked
    assert not {d for d in dist_infos() - before if d.startswith("dictator")}, "installed into the test's env"

    def output(*needles: str, without: str = "", nth: int = 0) -> str:
        found = [o for s, o in outputs if all(n in s.text for n in needles) and not (without and without in s.text)]
        assert len(found) > nth, f"no tested command with {needles} in the guide"
        return found[nth]

    agents, rounds = scenario["agents"], scenario["rounds"]
    # the package is listed, its tests pass
    listed = output("populace simulations")
    assert "dictator_game:DictatorGame" in listed and "dictator_rounds" in listed
    tested = output("pytest")
    passed = re.search(r"(\d+) passed", tested)
    assert passed and int(passed.group(1)) >= 20 and not re.search(r"\b\d+ (failed|errors?)\b", tested), tested

    # one process, one host or three; the fleet; the import path: the same rounds
    local = rows(output("--local", without="--hosts"))
    assert [r[0] for r in local] == [str(n) for n in range(1, rounds + 1)]
    assert all(r[1] == f"{agents}/{agents}" for r in local)
    assert rows(output("--local --hosts 3")) == local
    fleet_run = output("populace run", "--nats")
    assert rows(fleet_run) == local, fleet_run
    assert f"recorded {agents * rounds} outcomes (table dictator_outcomes)" in fleet_run.replace("\n", " ")
    assert rows(output("simulation=dictator_game:DictatorGame")) == local
    header = next(line for line in fleet_run.splitlines() if "round" in line and "valid" in line)
    assert all(title in header for title in ("mean given", "given %", "gave nothing %", "equal split %"))

    # what the recorder stored is what was printed
    assert db_rows == (agents * rounds,)
    assert [[str(r[0]), f"{r[2]}/{r[1]}", *(f"{v:.2f}" for v in r[3:7]), *(f"{v:,}" for v in r[7:])]
            for r in exported] == [row[:-2] for row in local]
    assert all(row[-2:] == ["0", "0"] for row in local)  # no invalid answer, no simulation error
    results = output("populace results last")
    assert "dictator" in results and len(rows(results)) == rounds

    # the notebook cell (the fleet and its own process) and the script: the same rounds again
    notebook = output("await start(")
    *_, same, last = notebook.strip().splitlines()
    assert same == "True", notebook
    shown = ast.literal_eval(last)
    assert [[str(r["round"]), f"{r['n_valid']}/{agents}", *(f"{r[k]:.2f}" for k in list(r)[2:])]
            for r in shown] == [row[:6] for row in local], notebook  # the cell prints no LLM work
    means = ast.literal_eval(output("simulate(").strip().splitlines()[-1])
    assert len(means) == rounds and all(0 <= m <= scenario["game"]["endowment"] for m in means)
    queried = output("duckdb.connect(")
    assert "mean_given" in queried and "invalid" in queried and len(rows(queried)) >= rounds, queried

    # after `uv pip uninstall`, the entry point is gone (the import path ran without it)
    after = output("populace simulations", nth=1)
    assert "dictator" not in after
