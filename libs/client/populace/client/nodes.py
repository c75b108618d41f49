"""Nodes (`populace node`, one per machine) seen and driven from a client: the CLI's
`populace nodes …` and the manager use this module.

    nodes = await list_nodes(js)                                   # KV `nodes`, live ones
    reply = await node_request(nc, "gpu-1", StartProcess(spec=AgentHostSpec(), count=2))
    reply.processes[0].proc_id                                     # 'agent-host-1'

A request is core NATS request/reply on `node.<node_id>.<verb>`; a node that does not answer
is NodeUnreachable, a refusal (`ok` False) is NodeError with the node's reason. A StartProcess
is sent with a `request_id` (a uuid unless the caller set one): re-sending the same id, after a
timeout (`retries`) or by the caller, gets the node's first reply and starts nothing twice."""

from __future__ import annotations

import time
import uuid

import nats.errors
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.errors import BucketNotFoundError
from pydantic import ValidationError

from populace.core import bus, replies, subjects
from populace.core.contracts import NodeInfo, NodeReply, NodeRequest, StartProcess

REQUEST_TIMEOUT_S = 10.0
# a stop or clean-up waits up to its grace time before it answers
REPLY_MARGIN_S = 10.0


class NodeError(RuntimeError):
    """The node refused the request; the message is its reason."""


class NodeUnreachable(NodeError):
    """No node with this id answered (not running, cut off, or no such node)."""


async def list_nodes(js: JetStreamContext, include_gone: bool = False) -> list[NodeInfo]:
    """The nodes in KV `nodes`, by id; those that missed their last heartbeats are left out
    unless `include_gone`. No bucket (no node ever ran): none."""
    try:
        entries = await bus.registry_entries(js, subjects.NODES_BUCKET, NodeInfo)
    except BucketNotFoundError:
        return []
    now = time.time()
    return sorted((n for n in entries if include_gone or not n.gone(now)), key=lambda n: n.node_id)


def reply_timeout(request: NodeRequest) -> float:
    return REQUEST_TIMEOUT_S + float(getattr(request, "grace_s", 0.0)) + REPLY_MARGIN_S


def with_request_id(request: NodeRequest) -> NodeRequest:
    """A StartProcess with a request id (a new uuid if it has none); other requests as they are."""
    if isinstance(request, StartProcess) and request.request_id is None:
        return request.model_copy(update={"request_id": uuid.uuid4().hex})
    return request


async def node_request(nc: Client, node_id: str, request: NodeRequest, timeout: float | None = None,
                       check: bool = True, retries: int = 0) -> NodeReply:
    """Send one request to node `node_id` and return its reply. `check`: a refusal raises
    NodeError (else the reply is returned as it is). A request that gets no reply in time is
    sent again up to `retries` times; a StartProcess always carries a request id (see
    with_request_id), so the node answers a repeat without starting anything again."""
    if not subjects.valid_token(node_id):
        raise NodeError(f"{node_id!r} is not a node id (one subject token: no '.', ' ', '*', '>')")
    request = with_request_id(request)
    subject = subjects.node_request(node_id, request.VERB, replies.requester(nc))
    for attempt in range(retries + 1):
        try:
            msg = await replies.request(nc, "node", subject, bus.encode(request),
                                        timeout=timeout or reply_timeout(request))
            break
        except nats.errors.NoRespondersError:
            raise NodeUnreachable(f"node {node_id!r} is not running (nobody listens on {subject})") from None
        except nats.errors.TimeoutError:
            if attempt == retries:
                raise NodeUnreachable(f"node {node_id!r} did not answer {request.VERB!r} in time"
                                      + (f" ({retries + 1} tries)" if retries else "")) from None
    try:
        reply = NodeReply.model_validate_json(msg.data)
    except ValidationError as err:
        raise NodeError(f"node {node_id!r} sent a reply this client cannot read: {bus.short_error(err)}") from None
    if check and not reply.ok:
        raise NodeError(reply.error or "refused")
    return reply
