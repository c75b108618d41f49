"""node service: one per machine. Registers the machine in KV `nodes` (resources and every
child with its state, CPU and memory; a heartbeat), and answers requests on
`node.<node_id>.<verb>.<requester>` (core NATS request/reply; contracts.StartProcess, StopProcess,
ListProcesses, TailLog, Cleanup -> NodeReply, only on the requester's own reply subject:
populace.core.replies): start agent-hosts, gateways, LLM replicas and
other services as children, stop them, tail their logs, clean up. Every request gets a reply,
a malformed one included (it is dead-lettered to dlq.node too). A request with a `request_id`
the node has answered (of the last 512) gets that answer again and does nothing (replies.py).
When the node stops (SIGTERM, SIGINT) it stops every child; when it is killed, its children get
SIGTERM from the kernel.

Run with `populace node [--nats URL] [--node-id ID] [--log-dir DIR]`."""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import TypeVar

import psutil
from faststream.nats.annotations import NatsMessage
from nats.js.errors import KeyNotFoundError
from pydantic import ValidationError

from populace.core import bus, replica_hosts, serve, subjects
from populace.core.contracts import (
    Cleanup,
    ListProcesses,
    NodeInfo,
    NodeReply,
    NodeRequest,
    ProcessInfo,
    StartProcess,
    StopProcess,
    TailLog,
)
from populace.core.service import Service
from populace.core.settings import Settings
from populace.node import commands, resources
from populace.node.children import Child
from populace.node.logtail import tail
from populace.node.replies import Replies, ReusedRequestId

DESCRIPTION = ("One per machine: starts, watches, restarts and stops Populace processes (agent-hosts, gateways, "
               "LLM replicas, services) on request, and registers the machine and its processes in KV nodes.")
SUPERVISE_S = 0.25  # how soon a dead child is noticed (and, by its policy, restarted)
MAX_PROCESSES = 256  # children one node keeps (its KV entry stays well under NATS's 1 MB payload)
R = TypeVar("R", bound=NodeRequest)


class NodeIdTaken(RuntimeError):
    pass


@dataclass(frozen=True)
class NodeConfig:
    node_id: str = field(default_factory=resources.default_node_id)
    log_dir: Path | None = None  # default: <temp>/populace-node-<node_id>
    stop_grace_s: float = 10.0  # SIGTERM to SIGKILL, when the node itself stops


def _version() -> str:
    try:
        return metadata.version("populace")
    except metadata.PackageNotFoundError:  # pragma: no cover - only the libs installed
        return metadata.version("populace-core")


class Node:
    def __init__(self, svc: Service, config: NodeConfig) -> None:
        self.svc, self.config, self.node_id = svc, config, config.node_id
        self.log_dir = config.log_dir or Path(tempfile.gettempdir()) / f"populace-node-{config.node_id}"
        self.children: dict[str, Child] = {}
        self.started_at = time.time()
        self._numbered = 0  # proc ids are never reused, so a log file is one process's
        self._gpus: list = []
        self._services: list[str] = []
        self._kv = None
        self._heartbeat: bus.Heartbeat | None = None
        self._supervisor: asyncio.Task | None = None
        self.replies = Replies()  # by request id: a re-sent request is answered, not done, again
        s = svc.settings  # where replicas may advertise, and the folders a model path may name
        self._replica_hosts = replica_hosts.parse(s.replica_hosts)
        self._model_roots = [r.strip() for r in s.node_model_roots.split(",") if r.strip()]

    # -- lifecycle --------------------------------------------------------------------
    async def start(self) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._gpus = await asyncio.to_thread(resources.gpus)
        self._services = serve.names()
        s = self.svc.settings
        self._kv = await bus.provision_nodes(self.svc.js, storage=s.storage, replicas=s.stream_replicas)
        await self._refuse_taken_id()
        self._heartbeat = bus.Heartbeat(self._kv, self.node_id, self.info, s.heartbeat_s)
        await self._heartbeat.start()
        self._supervisor = asyncio.create_task(self._supervise())
        self.svc.log.info("node_ready", node_id=self.node_id, log_dir=str(self.log_dir), cpus=os.cpu_count(),
                          gpus=len(self._gpus))

    async def _refuse_taken_id(self) -> None:
        """Two live nodes with one id would both answer its requests: the second refuses to start."""
        try:
            other = NodeInfo.model_validate_json((await self._kv.get(self.node_id)).value)
        except (KeyNotFoundError, ValidationError):
            return
        here = other.hostname == resources.machine()["hostname"]
        if other.gone() or (here and not psutil.pid_exists(other.pid)) or (here and other.pid == os.getpid()):
            return
        raise NodeIdTaken(f"node id {self.node_id!r} is taken by pid {other.pid} on {other.hostname}: "
                          f"choose another --node-id")

    async def stop(self) -> None:
        if self._supervisor:
            self._supervisor.cancel()
        await self.cleanup(self.config.stop_grace_s)
        if self._heartbeat:
            await self._heartbeat.stop()

    async def _supervise(self) -> None:
        while True:
            now = time.time()
            for child in list(self.children.values()):
                try:
                    child.supervise(now)
                except OSError as err:  # could not start it again (a missing executable, no memory)
                    child.state = "exited"
                    self.svc.log.error("restart_failed", proc=child.proc_id, error=str(err))
            await asyncio.sleep(SUPERVISE_S)

    def info(self) -> NodeInfo:
        m = resources.machine()
        return NodeInfo(node_id=self.node_id, hostname=m["hostname"], pid=os.getpid(), version=_version(),
                        cpus=m["cpus"], memory_bytes=m["memory_bytes"],
                        memory_available_bytes=m["memory_available_bytes"], gpus=self._gpus,
                        free_ports=resources.free_ports(), log_dir=str(self.log_dir), started_at=self.started_at,
                        heartbeat_at=time.time(), heartbeat_s=self.svc.settings.heartbeat_s,
                        processes=[c.info() for c in self.children.values()])

    async def _publish(self) -> None:
        """Write the entry now, so a client sees a change without waiting for the next beat."""
        with contextlib.suppress(Exception):
            await self._kv.put(self.node_id, bus.encode(self.info()))

    # -- requests ---------------------------------------------------------------------
    def reply(self, error: str | None = None, **fields) -> bytes:
        return bus.encode(NodeReply(node_id=self.node_id, ok=error is None, error=error, **fields))

    def malformed(self, reason: str) -> NodeReply:
        return NodeReply(node_id=self.node_id, ok=False, error=f"malformed request (dead-lettered): {reason}")

    def answering(self, fn: Callable[[R], Awaitable[bytes]]) -> Callable[[R, NatsMessage], Awaitable[bytes]]:
        """Every request gets a reply: a refusal says why; a request for a kind of process this
        node does not know is also dead-lettered; anything else is logged and answered. A
        request id seen before gets the reply it got then (and nothing is done again)."""

        async def answer(request: R, msg: NatsMessage) -> bytes:
            request_id = getattr(request, "request_id", None)
            try:
                reply, repeat = await self.replies.once(request_id, request.model_dump_json(),
                                                        lambda: attempt(request, msg))
            except ReusedRequestId as err:
                self.svc.log.warning("request_refused", verb=request.VERB, error=str(err))
                return self.reply(str(err))
            if repeat:
                self.svc.log.info("request_repeated", verb=request.VERB, request_id=request_id)
            return reply

        async def attempt(request: R, msg: NatsMessage) -> bytes:
            try:
                return await fn(request)
            except commands.UnknownProcess as err:
                await self.svc.dead_letter(msg.raw_message, str(err), terminate=False)
                return self.reply(str(err))
            except commands.Refusal as err:
                self.svc.log.warning("request_refused", verb=request.VERB, error=str(err))
                return self.reply(str(err))
            except Exception as err:
                self.svc.log.error("request_failed", verb=request.VERB, error=f"{type(err).__name__}: {err}",
                                   exc_info=err)
                return self.reply(f"the node failed: {type(err).__name__}: {err}")

        answer.__name__, answer.__doc__ = f"on_{fn.__name__}", fn.__doc__
        return answer

    async def start_processes(self, req: StartProcess) -> bytes:
        """Start `count` processes of a kind (agent-host, gateway, replicas, a service by name)."""
        if len(self.children) + req.count > MAX_PROCESSES:
            raise commands.Refusal(f"this node keeps at most {MAX_PROCESSES} processes ({len(self.children)} now): "
                                   f"stop or clean up some first")
        prefix = req.spec.name if req.spec.kind == "service" else req.spec.kind
        planned = []
        for i in range(req.count):  # every launch is checked before any process starts
            proc_id = f"{prefix}-{self._numbered + 1 + i}"
            planned.append((proc_id, commands.launch(
                req.spec, proc_id=proc_id, node_id=self.node_id, nats_url=self.svc.settings.nats_url,
                node_pid=os.getpid(), services=self._services, environ=os.environ,
                with_users=bool(self.svc.settings.nats_user), hosts=self._replica_hosts,
                model_roots=self._model_roots)))
        started: list[ProcessInfo] = []
        for proc_id, how in planned:
            self._numbered += 1
            child = Child(proc_id, req.spec, req.restart, how, self.log_dir / f"{proc_id}.log")
            try:
                child.spawn()
            except OSError as err:
                await self._publish()
                return self.reply(f"{proc_id} did not start: {err}", processes=started)
            self.children[proc_id] = child
            started.append(child.info())
        await self._publish()
        return self.reply(processes=started)

    def _child(self, proc_id: str) -> Child:
        if proc_id not in self.children:
            raise commands.Refusal(f"no process {proc_id!r} on node {self.node_id}; it has: "
                                   f"{', '.join(self.children) or 'none'}")
        return self.children[proc_id]

    async def stop_process(self, req: StopProcess) -> bytes:
        """Stop one process and forget it."""
        child = self._child(req.proc_id)
        await child.stop(req.grace_s)
        self.children.pop(req.proc_id, None)
        await self._publish()
        return self.reply(processes=[child.info()])

    async def list_processes(self, req: ListProcesses) -> bytes:
        """The node's entry as it is now."""
        return self.reply(node=self.info())

    async def tail_log(self, req: TailLog) -> bytes:
        """The end of one process's log."""
        child = self._child(req.proc_id)
        text, cut = await asyncio.to_thread(tail, child.log_path, req.lines, req.max_bytes)
        return self.reply(log=text, log_truncated=cut)

    async def clean_up(self, req: Cleanup) -> bytes:
        """Stop every process this node started."""
        return self.reply(processes=await self.cleanup(req.grace_s))

    async def cleanup(self, grace_s: float) -> list[ProcessInfo]:
        children = list(self.children.values())
        await asyncio.gather(*(c.stop(grace_s) for c in children))  # all at once: one grace time in total
        for c in children:
            self.children.pop(c.proc_id, None)
        if children:
            self.svc.log.info("node_cleaned_up", stopped=len(children))
            await self._publish()
        return [c.info() for c in children]


def create(settings: Settings | None = None, config: NodeConfig | None = None) -> Service:
    svc = Service("node", settings, DESCRIPTION)
    node = Node(svc, config or NodeConfig())
    svc.on_ready(node.start)
    svc.on_stop(node.stop)
    handlers: dict[type[NodeRequest], Callable] = {
        StartProcess: node.start_processes, StopProcess: node.stop_process, ListProcesses: node.list_processes,
        TailLog: node.tail_log, Cleanup: node.clean_up}
    for model, fn in handlers.items():
        svc.handle(subjects.node_request(node.node_id, model.VERB), model, reply_on_error=node.malformed,
                   answers=True)(
            node.answering(fn))
    return svc
