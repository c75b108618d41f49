"""`populace node` (the daemon, one per machine) and `populace nodes …` (what a client asks of
nodes: list them, start and stop processes on them, tail a process's log, clean a node up)."""

# No `from __future__ import annotations` (typer evaluates string ones at each start: populace.cli.main)
import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from populace.cli import display
from populace.cli.choices import ReplicaBackend, RestartMode, Router
from populace.cli.common import NATS_DEFAULT, NATS_ENV

if TYPE_CHECKING:  # the contracts and the bus are imported where a command needs them: the CLI starts fast
    from rich.table import Table

    from populace.core.contracts import NodeInfo, NodeReply, NodeRequest, ProcessInfo, ProcessSpec

NatsOption = Annotated[str, typer.Option("--nats", envvar=NATS_ENV, help="NATS URL of the stack the nodes serve")]
NodeArg = Annotated[str, typer.Argument(help="node id (`populace nodes` lists them)")]
ProcArg = Annotated[str, typer.Argument(help="process id on that node, e.g. agent-host-1")]
GraceOption = Annotated[float, typer.Option("--grace", min=0, max=300, help="seconds from SIGTERM to SIGKILL")]
KINDS_HELP = ("agent-host, gateway, replicas, or an installed service by name (orchestrator, environment, "
              "recorder)")

nodes_app = typer.Typer(help="Nodes (`populace node` daemons): list them, start and stop processes on them, "
                             "tail logs, clean up. With no command: the table of nodes and their processes.",
                        invoke_without_command=True, rich_markup_mode=None)  # plain help: see populace.cli.main


def _fail(message: str, code: int = 2) -> None:
    display.console.print(f"[red]error:[/red] {message}", soft_wrap=True, markup=True, highlight=False)
    raise typer.Exit(code)


# --- the daemon ---------------------------------------------------------------------------
def node(
    nats: NatsOption = NATS_DEFAULT,
    node_id: Annotated[str | None, typer.Option("--node-id", help="this node's id (default: the host name)")] = None,
    log_dir: Annotated[Path | None, typer.Option(help="where each process's log goes "
                                                      "(default: <temp>/populace-node-<id>)")] = None,
    stop_grace: Annotated[float, typer.Option(min=0, max=300, help="when the node stops: seconds from its "
                                                                   "processes' SIGTERM to SIGKILL")] = 10.0,
) -> None:
    """Run this machine's node daemon in the foreground: it registers in KV `nodes` and starts,
    watches, restarts and stops Populace processes when asked over the bus (`populace nodes …`,
    the manager). SIGTERM or Ctrl-C stops every process it started; if it is killed, they get
    SIGTERM from the kernel. With NATS users it connects as POPULACE_NATS_USER (`node`) and
    starts each process as its kind's user, whose password it reads from POPULACE_PASSWORD_<USER>."""
    from populace.core import serve, subjects
    from populace.core.settings import Settings
    from populace.node.app import NodeConfig, NodeIdTaken, create
    from populace.node.resources import default_node_id

    node_id = node_id or default_node_id()
    if not subjects.valid_token(node_id) or len(node_id) > 64:
        _fail(f"--node-id {node_id!r}: one subject token of at most 64 characters (no '.', ' ', '*', '>')")
    if log_dir is not None:
        from populace.cli import checks

        checks.output_folder(log_dir, "--log-dir")
    svc = create(Settings(nats_url=nats), NodeConfig(node_id=node_id, log_dir=log_dir, stop_grace_s=stop_grace))
    with serve.event_loop_runner() as runner:
        try:
            runner.run(svc.app.run())
        except NodeIdTaken as err:
            _fail(str(err), code=1)


# --- the client verbs ---------------------------------------------------------------------
async def _ask(nats: str, node_id: str, request: "NodeRequest") -> "NodeReply":
    from populace.client.nodes import node_request
    from populace.core import bus

    nc = await bus.connect_or_fail(nats, "populace-cli")
    try:
        # one re-send on a timeout: a start carries a request id, so the node starts nothing twice
        return await node_request(nc, node_id, request, retries=1)
    finally:
        await nc.close()


def _run(coro_factory):
    """Run a client coroutine; a node's refusal exits 2, an unreachable node or NATS exits 1."""
    import asyncio

    from populace.client.nodes import NodeError, NodeUnreachable

    try:
        return asyncio.run(coro_factory())
    except NodeUnreachable as err:
        _fail(str(err), code=1)
    except NodeError as err:
        _fail(str(err))
    except (ConnectionError, OSError, TimeoutError) as err:
        _fail(str(err), code=1)
    raise AssertionError  # unreachable


def _mb(n: int) -> str:
    return f"{n / 2**20:,.0f} MB"


def _spec_text(p: "ProcessInfo") -> str:
    spec = p.spec.model_dump(exclude_defaults=True, exclude={"kind"})
    return ", ".join(f"{k}={v}" for k, v in spec.items())


def processes_table(processes: "list[ProcessInfo]", title: str) -> "Table":
    t = display.table(title=title)
    for col, justify in (("process", "left"), ("state", "left"), ("pid", "right"), ("exit", "right"),
                         ("restarts", "right"), ("cpu %", "right"), ("memory", "right"), ("settings", "left")):
        t.add_column(col, justify=justify)  # type: ignore[arg-type]
    for p in processes:
        t.add_row(p.proc_id, p.state, str(p.pid or ""), "" if p.exit_code is None else str(p.exit_code),
                  f"{p.restarts}" + (f"/{p.restart.max_restarts}" if p.restart.mode != "never" else ""),
                  f"{p.cpu_percent:.0f}" if p.state == "running" else "",
                  _mb(p.rss_bytes) if p.state == "running" else "", _spec_text(p))
    return t


def nodes_table(nodes: "list[NodeInfo]") -> "Table":
    t = display.table(title="nodes")
    for col in ("node", "host", "cpus", "memory (free)", "gpus", "processes", "version", "up"):
        t.add_column(col)
    for n in nodes:
        running = sum(p.state == "running" for p in n.processes)
        gpus = ", ".join(f"{g.index}: {g.name}" for g in n.gpus) or "-"
        t.add_row(n.node_id + (" (gone)" if n.gone() else ""), n.hostname, str(n.cpus),
                  f"{_mb(n.memory_bytes)} ({_mb(n.memory_available_bytes)})", gpus,
                  f"{running} running / {len(n.processes)}", n.version, f"{n.heartbeat_at - n.started_at:,.0f} s")
    return t


@nodes_app.callback()
def nodes_list(
    ctx: typer.Context,
    nats: NatsOption = NATS_DEFAULT,
    include_gone: Annotated[bool, typer.Option("--all", help="also nodes that stopped heartbeating")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="print the nodes' entries as JSON")] = False,
) -> None:
    """Every node, its machine and its processes (state, PID, exit code, restarts, CPU, memory)."""
    if ctx.invoked_subcommand is not None:
        return
    from populace.client.nodes import list_nodes
    from populace.core import bus

    async def read() -> "list[NodeInfo]":
        nc = await bus.connect_or_fail(nats, "populace-cli")
        try:
            return await list_nodes(nc.jetstream(), include_gone=include_gone)
        finally:
            await nc.close()

    found = _run(read)
    if json_out:
        print(json.dumps([n.model_dump(mode="json") for n in found], indent=2))
        return
    if not found:
        display.out.print("no nodes: start one on each machine with `populace node --nats URL`")
        return
    display.out.print(nodes_table(found))
    for n in found:
        if n.processes:
            display.out.print(processes_table(n.processes, f"node {n.node_id}"))


def _spec(kind: str, options: dict) -> "ProcessSpec":
    """The typed spec of a process kind from the options given on the command line (an option
    that is not the kind's is refused, naming the option)."""
    from pydantic import TypeAdapter, ValidationError

    from populace.core.contracts import ProcessSpec

    given = {k: v for k, v in options.items() if v not in (None, False, [])}
    body = {"kind": kind, **given} if kind in ("agent-host", "gateway", "replicas") else {
        "kind": "service", "name": kind, **given}
    try:
        return TypeAdapter(ProcessSpec).validate_python(body)
    except ValidationError as err:
        problems = []
        for e in err.errors():
            field = next((str(x) for x in reversed(e["loc"]) if str(x) in given), None)
            flag = f"--{field.replace('_', '-')}" if field else ("KIND" if "kind" in str(e["loc"]) else "")
            msg = f"not an option of {kind}" if e["type"] == "extra_forbidden" else e["msg"]
            problems.append(f"{flag}: {msg}" if flag else msg)
        _fail("; ".join(problems))
    raise AssertionError  # unreachable


@nodes_app.command("start")
def nodes_start(
    node_id: NodeArg,
    kind: Annotated[str, typer.Argument(help=KINDS_HELP)],
    nats: NatsOption = NATS_DEFAULT,
    count: Annotated[int, typer.Option(min=1, max=64, help="processes to start")] = 1,
    restart: Annotated[RestartMode, typer.Option(help="restart a process that dies: never, or on-failure "
                                                      "(non-zero exit or a signal)")] = "never",
    max_restarts: Annotated[int, typer.Option(min=0, max=100, help="on-failure: restarts in a row")] = 3,
    backoff: Annotated[float, typer.Option(min=0, max=60, help="on-failure: seconds before the first restart, "
                                                               "doubled each time")] = 1.0,
    max_in_flight: Annotated[int | None, typer.Option(min=1, help="agent-host: concurrent agent turns")] = None,
    capacity: Annotated[int | None, typer.Option(min=1, help="agent-host: agents it may hold")] = None,
    one_agent_per_process: Annotated[bool, typer.Option(help="agent-host: every agent in its own OS "
                                                             "process")] = False,
    router: Annotated[Router | None, typer.Option(help="gateway: routing policy")] = None,
    max_workers: Annotated[int | None, typer.Option(min=1, help="gateway: batches handled at once")] = None,
    backend: Annotated[ReplicaBackend | None, typer.Option(help="replicas: local (llama.cpp), sim or vllm")] = None,
    servers: Annotated[int | None, typer.Option(min=1, max=64, help="replicas (local, sim): servers in the "
                                                                    "process")] = None,
    max_concurrency: Annotated[int | None, typer.Option(min=1, help="replicas: gateway's cap of calls in "
                                                                    "flight per server")] = None,
    threads: Annotated[int | None, typer.Option(min=1, help="replicas (local): threads per server")] = None,
    ctx: Annotated[int | None, typer.Option(min=256, help="replicas (local): context size")] = None,
    model: Annotated[str | None, typer.Option(help="replicas (vllm): model to serve")] = None,
    gpus: Annotated[str | None, typer.Option(help="replicas (vllm): GPU indices, one server each, e.g. 0,1")] = None,
    base_port: Annotated[int | None, typer.Option(help="replicas (vllm): first port")] = None,
    bind: Annotated[str | None, typer.Option(help="replicas: address the servers listen on")] = None,
    advertise: Annotated[str | None, typer.Option(help="replicas: host name gateways should use (in the node's "
                                                       "POPULACE_REPLICA_HOSTS)")] = None,
    replica_set: Annotated[str | None, typer.Option("--set", help="replicas: the replica set, registered as its own "
                                                                  "NATS user replicas-SET")] = None,
) -> None:
    """Start processes on a node: `populace nodes start NODE agent-host --count 2`,
    `… gateway`, `… replicas --backend sim --servers 4`, `… recorder`."""
    from pydantic import ValidationError

    from populace.core import bus
    from populace.core.contracts import RestartPolicy, StartProcess

    gpu_list = None
    if gpus:
        try:
            gpu_list = [int(g) for g in gpus.split(",") if g.strip()]
        except ValueError:
            _fail(f"--gpus {gpus!r}: comma-separated GPU indices, e.g. 0,1")
    spec = _spec(kind, {"max_in_flight": max_in_flight, "capacity": capacity,
                        "one_agent_per_process": one_agent_per_process, "router": router,
                        "max_workers": max_workers, "backend": backend, "servers": servers,
                        "max_concurrency": max_concurrency, "threads": threads, "ctx": ctx, "model": model,
                        "gpus": gpu_list, "base_port": base_port, "bind": bind, "advertise": advertise,
                        "set": replica_set})
    try:
        policy = RestartPolicy(mode=restart, max_restarts=max_restarts, backoff_s=backoff)
    except ValidationError as err:
        _fail(bus.short_error(err))
    reply = _run(lambda: _ask(nats, node_id, StartProcess(spec=spec, count=count, restart=policy)))
    display.out.print(processes_table(reply.processes, f"started on node {node_id}"))


@nodes_app.command("stop")
def nodes_stop(node_id: NodeArg, proc_id: ProcArg, nats: NatsOption = NATS_DEFAULT, grace: GraceOption = 10.0) -> None:
    """Stop one process (SIGTERM, SIGKILL after --grace seconds); the node forgets it."""
    from populace.core.contracts import StopProcess

    reply = _run(lambda: _ask(nats, node_id, StopProcess(proc_id=proc_id, grace_s=grace)))
    p = reply.processes[0]
    display.out.print(f"{p.proc_id} on node {node_id} stopped (exit code {p.exit_code})")


@nodes_app.command("logs")
def nodes_logs(
    node_id: NodeArg,
    proc_id: ProcArg,
    nats: NatsOption = NATS_DEFAULT,
    lines: Annotated[int, typer.Option(min=1, max=10_000, help="last lines to show")] = 50,
    max_bytes: Annotated[int, typer.Option(min=1, max=512 * 1024, help="read at most this much of the "
                                                                       "log's end")] = 64 * 1024,
) -> None:
    """The end of a process's log (it survives the process until the node cleans up)."""
    from populace.core.contracts import TailLog

    reply = _run(lambda: _ask(nats, node_id, TailLog(proc_id=proc_id, lines=lines, max_bytes=max_bytes)))
    if reply.log_truncated:
        display.console.print(f"[dim]… (older lines of {proc_id}'s log left out)[/dim]")
    print(reply.log or "")


@nodes_app.command("cleanup")
def nodes_cleanup(node_id: NodeArg, nats: NatsOption = NATS_DEFAULT, grace: GraceOption = 10.0) -> None:
    """Stop every process the node started (SIGTERM, SIGKILL after --grace seconds)."""
    from populace.core.contracts import Cleanup

    reply = _run(lambda: _ask(nats, node_id, Cleanup(grace_s=grace)))
    names = ", ".join(p.proc_id for p in reply.processes) or "nothing was running"
    display.out.print(f"node {node_id} cleaned up: {names}")

