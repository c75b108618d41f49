"""How a node starts each kind of process: its command line and environment, from the request's
typed spec only (a request never passes raw arguments or environment variables through)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from populace.core import replica_hosts, subjects
from populace.core.contracts import AgentHostSpec, GatewaySpec, ReplicasSpec, ServiceSpec
from populace.core.replica_hosts import ReplicaHosts
from populace.core.replicaauth import user_of

# The node's own settings that must not reach a child: each child connects as its own NATS
# user, registers under its own id, serves metrics on its own port and watches the node.
NOT_INHERITED = ("POPULACE_NATS_USER", "POPULACE_NATS_PASSWORD", "POPULACE_HOST_ID", "POPULACE_GATEWAY_ID",
                 "POPULACE_METRICS_PORT", "POPULACE_PARENT_PID")
# With NATS users, the node starts a child as the user of its kind, whose password it reads
# from POPULACE_PASSWORD_<USER> (e.g. POPULACE_PASSWORD_AGENT_HOST) in its own environment.
PASSWORD_PREFIX = "POPULACE_PASSWORD_"


class Refusal(ValueError):
    """A well-formed request this node cannot carry out; the reply says why."""


class UnknownProcess(Refusal):
    """A kind of process this node does not know (a service that is not installed)."""


@dataclass(frozen=True)
class Launch:
    argv: list[str]
    env: dict[str, str]


Spec = AgentHostSpec | GatewaySpec | ReplicasSpec | ServiceSpec


def nats_user(spec: Spec) -> str:
    """The NATS user a child of `spec` connects as (deploy/nats/auth.conf's users; a replica set's
    own, `replicas-<set>`: populace.core.replicaauth)."""
    if isinstance(spec, ReplicasSpec) and spec.set is not None:
        return user_of(spec.set)
    return spec.name if isinstance(spec, ServiceSpec) else spec.kind


def password_variable(user: str) -> str:
    return PASSWORD_PREFIX + user.upper().replace("-", "_")


def _service(name: str) -> list[str]:
    return [sys.executable, "-m", "populace.core.serve", name]


def _replicas_args(spec: ReplicasSpec, nats_url: str) -> list[str]:
    args = [sys.executable, "-m", "populace.cli", "replicas", spec.backend, f"--nats={nats_url}"]
    options = {"--max-concurrency": spec.max_concurrency, "--threads": spec.threads, "--ctx": spec.ctx,
               "--model": spec.model, "--base-port": spec.base_port, "--bind": spec.bind,
               "--advertise": spec.advertise}
    if spec.backend != "vllm":
        options["--count"] = spec.servers
    elif spec.gpus:
        options["--gpus"] = ",".join(str(g) for g in spec.gpus)
    for flag, value in options.items():
        if value is not None:  # one argument each: a value is never read as an option
            args.append(f"{flag}={value}")
    return args


def _advertised(spec: ReplicasSpec) -> str:
    """The host its replicas register at (populace.replicas.launch: advertise, else the bind
    address, loopback for a wildcard one)."""
    bind = spec.bind or "127.0.0.1"
    return spec.advertise or ("127.0.0.1" if bind in ("0.0.0.0", "::", "[::]") else bind)


def check_replicas(spec: ReplicasSpec, hosts: ReplicaHosts, model_roots: Sequence[str], with_users: bool) -> None:
    """Refuse replicas the gateways would never call (advertised outside POPULACE_REPLICA_HOSTS)
    and a model path outside the node's POPULACE_NODE_MODEL_ROOTS (the spec itself refuses options
    and `..`: contracts.ReplicasSpec)."""
    writer = nats_user(spec) if with_users else subjects.REPLICAS_WRITER
    ports = ([(spec.base_port or 8000) + i for i in range(max(1, len(spec.gpus)))] if spec.backend == "vllm"
             else None)
    if why := hosts.advertise_refusal(_advertised(spec), writer, ports):
        raise Refusal(f"advertise: {why}: the gateways would never call these replicas")
    if spec.model is not None and spec.model.startswith("/"):
        path = os.path.realpath(spec.model)  # a link under a root may lead out of it
        roots = [os.path.realpath(r) for r in model_roots]
        if not any(path == root or path.startswith(root.rstrip("/") + "/") for root in roots):
            raise Refusal(f"model: {spec.model!r} is not under this node's model folders (POPULACE_NODE_MODEL_ROOTS: "
                          f"{', '.join(model_roots) or 'none'}); give a model id, or a path under one")


def launch(spec: Spec, *, proc_id: str, node_id: str, nats_url: str, node_pid: int,
           services: Iterable[str], environ: Mapping[str, str], with_users: bool,
           hosts: ReplicaHosts | None = None, model_roots: Sequence[str] = ()) -> Launch:
    """The command and environment of one child. `services`: the installed service names;
    `with_users`: the node itself connects with a NATS user, so the child needs its own;
    `hosts`, `model_roots`: where replicas may advertise, and the folders a model path may name
    (the node's POPULACE_REPLICA_HOSTS, default loopback, and POPULACE_NODE_MODEL_ROOTS)."""
    env = {k: v for k, v in environ.items() if k not in NOT_INHERITED and not k.startswith(PASSWORD_PREFIX)}
    env.update({"POPULACE_NATS_URL": nats_url, "POPULACE_PARENT_PID": str(node_pid), "POPULACE_LOG_FORMAT": "json",
                "POPULACE_METRICS_PORT": "0"})
    if isinstance(spec, AgentHostSpec):
        argv = _service("agent-host")
        env["POPULACE_HOST_ID"] = f"{node_id}-{proc_id}"
        settings = {"POPULACE_MAX_IN_FLIGHT": spec.max_in_flight, "POPULACE_HOST_CAPACITY": spec.capacity,
                    "POPULACE_ONE_AGENT_PER_PROCESS": "true" if spec.one_agent_per_process else None}
    elif isinstance(spec, GatewaySpec):
        argv = _service("gateway")
        env["POPULACE_GATEWAY_ID"] = f"{node_id}-{proc_id}"
        settings = {"POPULACE_GATEWAY_ROUTER": spec.router, "POPULACE_GATEWAY_MAX_WORKERS": spec.max_workers}
    elif isinstance(spec, ReplicasSpec):
        check_replicas(spec, hosts or replica_hosts.parse(replica_hosts.LOOPBACK), model_roots, with_users)
        argv, settings = _replicas_args(spec, nats_url), {}
    else:
        if spec.name not in set(services):
            raise UnknownProcess(f"service {spec.name!r} is not installed on this node; installed: "
                                 f"{', '.join(sorted(services))}")
        argv, settings = _service(spec.name), {}
    env.update({k: str(v) for k, v in settings.items() if v is not None})
    if with_users:
        user = nats_user(spec)
        password = environ.get(password_variable(user))
        if not password:
            raise Refusal(f"this node connects with a NATS user, but has no password for a {spec.kind}'s user "
                          f"{user!r}: start the node with {password_variable(user)} set")
        env.update({"POPULACE_NATS_USER": user, "POPULACE_NATS_PASSWORD": password})
    return Launch(argv, env)
