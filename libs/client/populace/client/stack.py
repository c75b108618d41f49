"""A local stack: embedded nats-server plus every service as its own OS process. Used by
`populace up`, `populace demo`, `populace bench`, `populace.client.simulate` and the
end-to-end tests. Services start by name (`python -m populace.core.serve NAME`); extra
processes (LLM replicas) are `populace …` commands.

Metrics: with POPULACE_METRICS_PORT=P (in `env` or the environment) every service process
gets its own /metrics port, in this order: orchestrator P, environment P+1, gateway P+2,
recorder P+3, agent-host-i P+4+i (`metrics_layout`); `metrics=True` without P picks free
ports. `metrics_ports` says which is which.

`one_process=True` (tests): the services run together in one child process and one event
loop (`python -m populace.core.serve --together`, key ONE_PROCESS), each with the settings its
own process would have had (host id, NATS user), so the world is imported once instead of once
per service. What needs a process per service (kill or restart one, its own log file, its rss,
per-service metrics) is a StackError there, never done to the whole process. `apart=("environment",
"agent-host-1")` keeps a process each for the services a test kills, restarts or reads the log of,
while the rest share one."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from populace.core import bus, replica_hosts, subjects
from populace.core.contracts import HostInfo, ReplicaInfo, ServiceInfo
from populace.core.natsserver import EmbeddedNats, free_port
from populace.core.processes import guarded, stop_all, uninterrupted

CORE_SERVICES = ["orchestrator", "environment", "gateway", "recorder"]
METRICS_PORT_VARIABLE = "POPULACE_METRICS_PORT"
ONE_PROCESS = "services"  # the key (and log file name) of a one-process stack's services' process
SETTINGS_PREFIX = "POPULACE_"


class StackError(RuntimeError):
    pass


def service_keys(hosts: int) -> list[str]:
    """The stack's service processes, in start order (and metrics port order)."""
    return [*CORE_SERVICES, *(f"agent-host-{i}" for i in range(hosts))]


def metrics_layout(keys: list[str], base: int) -> dict[str, int]:
    """Each service's metrics port from `base` on: one each, in the order of `keys`."""
    return {key: base + i for i, key in enumerate(keys)}


def _port_taken(port: int) -> bool:
    """Whether a listener holds `port` (bound as the metrics server binds it: every address,
    reusing a port left in TIME_WAIT)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return True
    return False


def settings_of(env: dict[str, str], what: str) -> dict[str, str]:
    """Environment variables meant for one service as its Settings' init arguments
    (POPULACE_HOST_ID -> host_id): in a process shared with other services, the environment is
    everyone's. A variable that is no setting cannot be given to one service alone there."""
    foreign = sorted(k for k in env if not k.startswith(SETTINGS_PREFIX))
    if foreign:
        raise StackError(f"{what}: {', '.join(foreign)} cannot be set for one service of a one-process stack "
                         f"(only {SETTINGS_PREFIX}* settings can): start it with one_process=False")
    return {k[len(SETTINGS_PREFIX):].lower(): v for k, v in env.items()}


def _host_id(key: str) -> str:
    """The host id of the agent-host `key` (agent-host-3 -> host-3)."""
    return "host-" + key.removeprefix("agent-host-")


def _raise_interrupt(*_) -> None:
    raise KeyboardInterrupt


def _sigterm_stops_us() -> None:
    """SIGTERM unwinds like Ctrl-C, so `finally: stack.stop()` runs."""
    import threading

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _raise_interrupt)


@dataclass
class Stack:
    hosts: int = 1
    db: str = "populace.duckdb"
    nats_url: str | None = None  # use an existing server instead of an embedded one
    log_dir: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    host_env: dict[str, str] = field(default_factory=dict)
    extra: dict[str, list[str]] = field(default_factory=dict)  # more `populace …` processes, by name
    replicas: int = 0  # LLM replicas that must be registered before the stack is ready
    metrics: bool = False  # every service exports metrics, on free ports unless POPULACE_METRICS_PORT says
    metrics_ports: dict[str, int] = field(default_factory=dict)  # service key -> its /metrics port
    nats_args: list[str] = field(default_factory=list)  # extra nats-server flags (embedded server only)
    # NATS user -> password (deploy/nats/auth.conf's users): each service connects as its own
    # user (an agent-host as its host id if listed, else `agent-host`), the stack itself as
    # `admin`. None: no users.
    users: dict[str, str] | None = None
    # every service in one process and event loop (tests that need no process per service)
    one_process: bool = False
    # service keys that keep a process each in a one-process stack: those a test kills, restarts
    # or reads the log of (the rest still share one process and import the world once)
    apart: tuple[str, ...] = ()
    # Environment variables that hold models' keys (a run's `models:` api_key_env): kept only in the
    # gateway's environment (which calls the models) and the replicas' (which ask for the key), taken
    # out of every other process's, so no host or recorder even holds a key. (A one-process stack
    # shares one environment.)
    secrets: tuple[str, ...] = ()
    nats: EmbeddedNats | None = None
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)
    specs: dict[str, tuple[list[str], dict[str, str], bool]] = field(default_factory=dict)  # to restart one

    @property
    def url(self) -> str:
        return self.nats_url or self.nats.url  # type: ignore[union-attr]

    def start(self) -> Stack:
        _sigterm_stops_us()
        keys = service_keys(self.hosts)
        self.metrics_ports = self._metrics_ports(keys)  # before anything starts: a taken port stops here
        own = self._apart(keys)  # so does what one process cannot do
        together = self._together([key for key in keys if key not in own]) if self.one_process else None
        self.log_dir = self.log_dir or tempfile.mkdtemp(prefix="populace-logs-")
        Path(self.log_dir).mkdir(parents=True, exist_ok=True)
        if not self.nats_url:
            self.nats = EmbeddedNats(log_file=str(Path(self.log_dir) / "nats-server.log"),
                                     extra_args=self.nats_args).start()
        base = {**os.environ, "POPULACE_NATS_URL": self.url, "POPULACE_DB": str(Path(self.db).absolute()),
                "POPULACE_LOG_FORMAT": "json", "POPULACE_PARENT_PID": str(os.getpid()), **self.env}
        # One port per process: none inherits the stack's base port (they would all bind it).
        base[METRICS_PORT_VARIABLE] = "0"
        if together:
            from populace.core.serve import TOGETHER_VARIABLE  # only here: it imports the service frame

            self._spawn(ONE_PROCESS, ["-m", "populace.core.serve", "--together"],
                        {**base, TOGETHER_VARIABLE: json.dumps(together)}, service=True)
        self._spawn_each(own, base)
        for key, args in self.extra.items():
            # --nats goes before a `--` (what follows it is passed through to another program)
            cut = args.index("--") if "--" in args else len(args)
            # `populace replicas …` registers as the `replicas` user (deploy/nats/auth.conf), or as a
            # replica set's own user named like the process (`replicas-<set>`) if the stack has one
            user = (self._user(key if self.users and key in self.users else "replicas") if args[:1] == ["replicas"]
                    else {})
            self._spawn(key, ["-m", "populace.cli", *args[:cut], "--nats", self.url, *args[cut:]], {**base, **user})
        return self

    def _apart(self, keys: list[str]) -> list[str]:
        """The services that get a process each, in start order: every one, or in a one-process
        stack those named in `apart` (a name that is no service of this stack is a StackError)."""
        if not self.one_process:
            if self.apart:
                raise StackError("apart names services that keep their own process in a one-process stack: "
                                 "set one_process=True with it (here every service has a process anyway)")
            return keys
        unknown = sorted(set(self.apart) - set(keys))
        if unknown:
            raise StackError(f"apart: {', '.join(unknown)} is no service of this stack (its services: "
                             f"{', '.join(keys)})")
        return [key for key in keys if key in self.apart]

    def _spawn_each(self, keys: list[str], base: dict[str, str]) -> None:
        """A process for each service of `keys`, each with its own environment."""
        for key in keys:
            name = key if key in CORE_SERVICES else "agent-host"
            self._spawn(key, ["-m", "populace.core.serve", name],
                        {**base, **self._own_env(key), **self._metrics_env(key)}, service=True)

    def _together(self, keys: list[str]) -> list[tuple[str, dict[str, str]]]:
        """The services of `keys` in a one-process stack, each with the settings its own process
        would have had (`populace.core.serve --together`)."""
        if self.metrics_ports:
            raise StackError("a one-process stack has no per-service /metrics (its services share one Prometheus "
                             f"registry): start it with one_process=False, or set {METRICS_PORT_VARIABLE}=0")
        return [(key, settings_of(self._own_env(key), key)) if key in CORE_SERVICES
                else ("agent-host", settings_of(self._own_env(key), "host_env")) for key in keys]

    def _own_env(self, key: str) -> dict[str, str]:
        """The variables only the service `key` gets, over the stack's: its NATS user; a host's id
        and `host_env` too. Its own process's environment, or (`settings_of`) its settings in a
        shared one."""
        if key in CORE_SERVICES:
            return self._user(key)
        host_id = _host_id(key)
        return {"POPULACE_HOST_ID": host_id, **self._host_user(host_id), **self.host_env}

    def _process(self, key: str) -> subprocess.Popen:
        """The process `key` names; in a one-process stack a service's name is a StackError."""
        if key not in self.procs and self.one_process and key in service_keys(self.hosts):
            raise StackError(f"{key} shares the one process of this stack with every service "
                             f"(one_process=True): it cannot be killed, restarted or measured alone; "
                             f"name it in the stack's apart=(…), or start the stack with one_process=False")
        return self.procs[key]

    def _metrics_ports(self, keys: list[str]) -> dict[str, int]:
        """The metrics port of each service (none: metrics off). A base port that is not a
        number, does not leave room for every service, or any of whose ports is taken is a
        StackError naming the variable."""
        raw = (self.env.get(METRICS_PORT_VARIABLE) or os.environ.get(METRICS_PORT_VARIABLE) or "0").strip()
        try:
            first = int(raw)
        except ValueError:
            raise StackError(f"{METRICS_PORT_VARIABLE}={raw!r} is not a port number (0 turns metrics off)") from None
        if first == 0:
            return {key: free_port() for key in keys} if self.metrics else {}
        last = first + len(keys) - 1
        if first < 0 or last > 65535:
            raise StackError(f"{METRICS_PORT_VARIABLE}={first}: the stack's {len(keys)} services need ports "
                             f"{first}-{last}, which must lie within 1-65535")
        ports = metrics_layout(keys, first)
        taken = [f"{port} ({key})" for key, port in ports.items() if _port_taken(port)]
        if taken:
            raise StackError(f"{METRICS_PORT_VARIABLE}={first}: port {', '.join(taken)} already in use; the stack "
                             f"gives its {len(keys)} services ports {first}-{last}: choose another first port, "
                             f"or 0 to turn metrics off")
        return ports

    def _metrics_env(self, key: str) -> dict[str, str]:
        return {METRICS_PORT_VARIABLE: str(self.metrics_ports[key])} if key in self.metrics_ports else {}

    def _user(self, name: str) -> dict[str, str]:
        if self.users is None:
            return {}
        return {"POPULACE_NATS_USER": name, "POPULACE_NATS_PASSWORD": self.users[name]}

    def _host_user(self, host_id: str) -> dict[str, str]:
        """A host's own user if the stack has one (populace.core.hostauth), else the shared one."""
        return self._user(host_id if self.users and host_id in self.users else "agent-host")

    def credentials(self, user: str = "admin") -> dict[str, str]:
        """nats-py connect() arguments for one of the stack's users (none without users)."""
        return {} if self.users is None else {"user": user, "password": self.users[user],
                                              "inbox_prefix": bus.inbox_prefix(user)}

    def _spawn(self, key: str, args: list[str], env: dict[str, str], service: bool = False) -> None:
        if self.secrets and key != "gateway" and not key.startswith("replicas") and key != ONE_PROCESS:
            env = {k: v for k, v in env.items() if k not in self.secrets}
        self.specs[key] = (args, env, service)
        with open(Path(self.log_dir) / f"{key}.log", "ab") as log:  # type: ignore[arg-type]  # the child keeps its copy
            # guarded: a child gets SIGTERM when we die, even by SIGKILL (started on the main thread)
            self.procs[key] = subprocess.Popen(
                [sys.executable, *args], env=env, stdout=log, stderr=log, start_new_session=True,
                preexec_fn=guarded(),
            )

    async def wait_ready(self, timeout: float = 60.0) -> None:
        """Until every service has registered in KV `services` and every host in `hosts`."""
        nc = await bus.connect(self.url, "populace-stack", **self.credentials())
        try:
            js = nc.jetstream()
            deadline = time.monotonic() + timeout
            while True:
                self.check_alive()
                # Only our live processes count (a restarted one's predecessor may still be
                # listed); a Stack that started none waits for whoever registers.
                ours = {p.pid for p in self.procs.values() if p.poll() is None}

                def counted(pid: int, ours: set[int] = ours) -> bool:
                    return not self.procs or pid in ours
                try:
                    svcs = {s.service for s in await bus.registry_entries(js, subjects.SERVICES_BUCKET, ServiceInfo)
                            if counted(s.pid)}
                    hosts = [h for h in await bus.registry_entries(js, subjects.HOSTS_BUCKET, HostInfo)
                             if counted(h.pid)]
                    reps = (replica_hosts.bound(await bus.registry_items(js, subjects.REPLICAS_BUCKET, ReplicaInfo))
                            if self.replicas else [])
                except Exception:
                    svcs, hosts, reps = set(), [], []
                if set(CORE_SERVICES) <= svcs and len(hosts) >= self.hosts and len(reps) >= self.replicas:
                    return
                if time.monotonic() > deadline:
                    missing = sorted(set(CORE_SERVICES) - svcs)
                    raise StackError(f"services not ready after {timeout}s: missing {missing}, "
                                     f"{len(hosts)}/{self.hosts} hosts, {len(reps)}/{self.replicas} replicas; "
                                     f"logs in {self.log_dir}")
                await asyncio.sleep(0.1)
        finally:
            await nc.close()

    def kill(self, key: str, sig: int = signal.SIGKILL, timeout: float = 30.0) -> None:
        """Send `sig` to one process of the stack and wait until it is gone (fault tests)."""
        proc = self._process(key)
        if proc.poll() is None:
            os.kill(proc.pid, sig)
        proc.wait(timeout)

    def restart(self, key: str) -> None:
        """Start a process of the stack again, as it was started (a supervisor's restart)."""
        if self._process(key).poll() is None:
            raise StackError(f"{key} is still running")
        args, env, service = self.specs[key]
        self._spawn(key, args, env, service)

    def check_alive(self) -> None:
        for key, p in self.procs.items():
            if p.poll() is not None:
                tail = self.log_tail(key)
                raise StackError(f"service {key} exited with code {p.returncode}; "
                                 f"log {self.log_dir}/{key}.log:\n{tail}")

    def log_tail(self, key: str, lines: int = 15) -> str:
        self._process(key)  # a service of a one-process stack has no log of its own
        try:
            return "\n".join((Path(self.log_dir) / f"{key}.log").read_text().splitlines()[-lines:])  # type: ignore[arg-type]
        except OSError:
            return ""

    def pids(self) -> list[int]:
        pids = [p.pid for p in self.procs.values() if p.poll() is None]
        if self.nats and self.nats.pid:
            pids.append(self.nats.pid)
        return pids

    def rss_bytes(self) -> int:
        """Resident memory of every process of the stack, children included."""
        return sum(self._rss_by_key().values())

    def rss_by_process(self) -> dict[str, int]:
        """Resident memory of each process of the stack (its children included), by service key;
        NATS as "nats". A one-process stack has no rss per service: StackError."""
        if self.one_process:
            raise StackError("a one-process stack's services share one process: no rss per service; start it "
                             "with one_process=False")
        return self._rss_by_key()

    def _rss_by_key(self) -> dict[str, int]:
        named = {key: p.pid for key, p in self.procs.items() if p.poll() is None}
        if self.nats and self.nats.pid:
            named["nats"] = self.nats.pid
        out: dict[str, int] = {}
        for key, pid in named.items():
            try:
                proc = psutil.Process(pid)
                out[str(key)] = proc.memory_info().rss + sum(c.memory_info().rss
                                                             for c in proc.children(recursive=True))
            except psutil.Error:
                pass
        return out

    def stop(self, timeout: float = 15.0) -> list[str]:
        """SIGTERM every service, SIGKILL what is still running after `timeout`.
        Returns the services that had to be killed (none, when shutdown works)."""
        with uninterrupted():
            try:
                killed = stop_all(self.procs, timeout)
                self.procs.clear()
            finally:
                if self.nats:
                    self.nats.stop()
                    self.nats = None
        return killed

    def up(self, timeout: float = 60.0) -> Stack:
        """Start the stack and wait until it is ready (stopped again if it never is):
        `with Stack(...).up(90) as stack: …`."""
        self.start()
        try:
            asyncio.run(self.wait_ready(timeout=timeout))
        except BaseException:
            self.stop()
            raise
        return self

    def __enter__(self) -> Stack:
        return self if self.procs else self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
