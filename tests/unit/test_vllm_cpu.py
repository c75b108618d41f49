"""populace.replicas.vllm_cpu without vLLM: where the environment goes, how it is installed
(excluding the CUDA builds), how a replica is served, and what a failure says."""

from __future__ import annotations

import json
import os

import pytest

from populace.replicas import vllm_cpu


def test_the_cache_directory_is_populace_cache_else_xdg_else_home(monkeypatch, tmp_path):
    monkeypatch.setenv("POPULACE_CACHE", str(tmp_path / "pc"))
    assert vllm_cpu.location().home == tmp_path / "pc" / f"vllm-cpu-{vllm_cpu.VERSION}"
    monkeypatch.delenv("POPULACE_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert vllm_cpu.cache_root() == tmp_path / "xdg" / "populace"


def test_install_uses_the_local_wheels_and_leaves_the_cuda_builds_out(monkeypatch, tmp_path):
    monkeypatch.setenv("PIP_FIND_LINKS", "/opt/wheels /more")
    target = vllm_cpu.VllmCpu(tmp_path / "v")
    venv, install = vllm_cpu.install_commands(target, "uv", "/usr/bin/python3.11", str(tmp_path / "ex.txt"))
    assert venv[:2] == ["uv", "venv"] and venv[-1] == str(tmp_path / "v" / "venv")
    assert install[:3] == ["uv", "pip", "install"]
    assert install[install.index("--python") + 1] == str(target.python)
    assert [install[i + 1] for i, a in enumerate(install) if a == "--find-links"] == ["/opt/wheels", "/more"]
    assert install[install.index("--excludes") + 1] == str(tmp_path / "ex.txt")
    assert f"vllm-cpu=={vllm_cpu.VERSION}" in install and {"gguf", "safetensors", "tokenizers"} <= set(install)
    assert {"torchvision", "torchaudio", "torchcodec", "llama-cpp-python"} <= set(vllm_cpu.EXCLUDES)


def test_several_replicas_get_disjoint_cores(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda _: {0, 1, 2, 3}, raising=False)
    assert vllm_cpu.cpu_sets(1) == [None]  # vLLM's own `auto`
    assert vllm_cpu.cpu_sets(2) == ["0,1", "2,3"]
    assert vllm_cpu.cpu_sets(4) == ["0", "1", "2", "3"]
    assert vllm_cpu.cpu_sets(6) == ["0", "1", "2", "3", "0", "1"]


def test_a_replica_is_served_eager_offline_and_on_its_cores(monkeypatch, tmp_path):
    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    target = vllm_cpu.VllmCpu(tmp_path)
    cmd = vllm_cpu.serve_command(target, 8123)
    # from -c, so that vLLM's spawned engine core and worker import no main module (the web server)
    assert cmd[:3] == [str(target.python), "-c", vllm_cpu.SERVER_BOOT]
    assert "from vllm.entrypoints.launchers.api_server.entry import main" in vllm_cpu.SERVER_BOOT
    assert cmd[cmd.index("--model") + 1] == str(target.model)
    assert cmd[cmd.index("--served-model-name") + 1] == vllm_cpu.MODEL_NAME
    assert {"--enforce-eager", "--enable-prefix-caching", "--no-enable-chunked-prefill",
            "--enable-prompt-tokens-details"} <= set(cmd)
    assert cmd[cmd.index("--block-size") + 1] == "32"  # a ~130-token prompt has whole blocks to cache
    assert json.loads(cmd[cmd.index("--structured-outputs-config") + 1]) == {"backend": "xgrammar",
                                                                               "disable_any_whitespace": True}
    assert cmd[cmd.index("--port") + 1] == "8123" and cmd[cmd.index("--max-model-len") + 1] == "2048"
    assert "--populace-fd" not in cmd
    # on a socket its starter bound: the descriptor first, for SERVER_BOOT to take before vLLM's parser
    on_fd = vllm_cpu.serve_command(target, 8123, fd=7)
    assert on_fd[3:5] == ["--populace-fd", "7"] and on_fd[5:] == cmd[3:]
    assert "launcher.create_server_socket = " in vllm_cpu.SERVER_BOOT
    env = vllm_cpu.serve_env("1")
    assert env["HF_HUB_OFFLINE"] == "1" and env["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "1"
    assert "VIRTUAL_ENV" not in env


def test_a_prepared_environment_is_not_prepared_again(monkeypatch, tmp_path):
    monkeypatch.setenv("POPULACE_CACHE", str(tmp_path))
    target = vllm_cpu.location()
    target.python.parent.mkdir(parents=True)
    target.python.write_text("")
    (target.home / "venv" / vllm_cpu.STAMP).write_text("")
    target.model.mkdir()
    (target.model / vllm_cpu.STAMP).write_text("")
    monkeypatch.setattr(vllm_cpu, "_install", lambda *_: pytest.fail("installed again"))
    monkeypatch.setattr(vllm_cpu, "_convert", lambda *_: pytest.fail("converted again"))
    assert vllm_cpu.ensure(say=lambda _: None) == target


def test_a_failed_preparation_names_its_log(monkeypatch, tmp_path):
    monkeypatch.setenv("POPULACE_CACHE", str(tmp_path))
    monkeypatch.setattr(vllm_cpu.shutil, "which", lambda _: "/bin/false")  # an "uv" that fails
    said = []
    with pytest.raises(vllm_cpu.VllmUnavailable, match=r"installing vLLM's CPU environment failed .*log: .*\.log"):
        vllm_cpu.ensure(say=said.append)
    assert said and "installing it once" in said[-1]
    assert not vllm_cpu.location().env_ready()


def test_no_uv_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv("POPULACE_CACHE", str(tmp_path))
    monkeypatch.setattr(vllm_cpu.shutil, "which", lambda _: None)
    with pytest.raises(vllm_cpu.VllmUnavailable, match="needs uv"):
        vllm_cpu.ensure(say=lambda _: None)


def test_vllm_keeps_the_bytecode_of_what_it_imports_where_this_process_writes_none(monkeypatch):
    """With PYTHONDONTWRITEBYTECODE set (as here and in CI), vLLM's processes compiled vllm,
    torch and transformers from source at every start: its servers may write their bytecode."""
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    assert "PYTHONDONTWRITEBYTECODE" not in vllm_cpu.serve_env(None)
    # beside its own sources, where the first start wrote it (not under the suite's prefix)
    monkeypatch.setenv("PYTHONPYCACHEPREFIX", "/tmp/elsewhere")
    assert "PYTHONPYCACHEPREFIX" not in vllm_cpu.serve_env(None)
