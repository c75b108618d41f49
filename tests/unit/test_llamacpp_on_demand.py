"""llama.cpp installed on first use (populace.replicas.llamacpp): which installer runs where,
that it runs once (a second caller finds it installed), and that a failed install is an error
naming its log, never a traceback from the replica's start."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from populace.replicas import llamacpp


def test_in_the_projects_own_environment_the_build_runs_beside_it_then_syncs_from_the_cache():
    build, install = llamacpp.install_steps(Path("/repo"), "/bin/uv", python="/repo/.venv/bin/python",
                                            staging=Path("/tmp/stage"))
    sync = ["/bin/uv", "sync", "--project", "/repo", "--inexact", "--no-default-groups", "--extra", "local"]
    assert (build.command, build.env) == ([*sync, "--python", "/repo/.venv/bin/python"],
                                          {"UV_PROJECT_ENVIRONMENT": "/tmp/stage"})
    assert (install.command, install.env) == ([*sync[:4], "--offline", *sync[4:]], {})


def test_elsewhere_uv_pip_or_pip_installs_the_extras_requirement(monkeypatch):
    find_spec = llamacpp.importlib.util.find_spec
    monkeypatch.setattr(llamacpp.importlib.util, "find_spec", lambda name: name == "pip" or find_spec(name))
    [step] = llamacpp.install_steps(None, "/bin/uv", python="/env/bin/python")
    assert step.command == ["/bin/uv", "pip", "install", "--python", "/env/bin/python", *llamacpp.REQUIREMENTS]
    [step] = llamacpp.install_steps(None, None, python="/env/bin/python")
    assert step.command[:3] == ["/env/bin/python", "-m", "pip"]


def test_the_extra_and_the_requirement_agree():
    pyproject = (Path(__file__).parents[2] / "pyproject.toml").read_text()
    assert "local = [" + ", ".join(f'"{r}"' for r in llamacpp.REQUIREMENTS) + "]" in pyproject


def test_project_root_only_when_its_environment_is_this_one(tmp_path, monkeypatch):
    (tmp_path / "pyproject.toml").write_text("[tool.uv.workspace]\nmembers = []\n")
    inner = tmp_path / "a" / "b.py"
    monkeypatch.setattr(sys, "prefix", str(tmp_path / ".venv"))
    monkeypatch.delenv("UV_PROJECT_ENVIRONMENT", raising=False)
    assert llamacpp.project_root(inner) == tmp_path
    monkeypatch.setattr(sys, "prefix", "/somewhere/else")
    assert llamacpp.project_root(inner) is None


def test_installs_once_and_says_so(monkeypatch, tmp_path):
    state = {"installed": False, "runs": []}
    monkeypatch.setattr(llamacpp, "installed", lambda: state["installed"])
    monkeypatch.setattr(llamacpp, "project_root", lambda: None)  # one step: uv pip install
    monkeypatch.setattr(sys, "prefix", str(tmp_path))

    def run(cmd, **kw):
        state["runs"].append((cmd, kw["env"]["CMAKE_ARGS"]))
        state["installed"] = True
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(llamacpp.subprocess, "run", run)
    said: list[str] = []
    llamacpp.ensure(say=said.append)
    llamacpp.ensure(say=said.append)
    assert len(state["runs"]) == 1 and state["runs"][0][1] == "-DGGML_NATIVE=OFF"
    assert "installing it once" in said[0] and said[1].startswith("llama.cpp installed in")
    assert len(said) == 2


def test_a_failed_install_names_its_log(monkeypatch, tmp_path):
    monkeypatch.setattr(llamacpp, "installed", lambda: False)
    monkeypatch.setattr(llamacpp, "project_root", lambda: None)
    monkeypatch.setattr(sys, "prefix", str(tmp_path))
    monkeypatch.setattr(llamacpp.subprocess, "run", lambda cmd, **kw: subprocess.CompletedProcess(cmd, 1))
    with pytest.raises(llamacpp.LlamaCppUnavailable, match=r"exited 1\); log: .*populace-llama-cpp-install-"):
        llamacpp.ensure(say=lambda _: None)
