"""NATS / JetStream helpers shared by every service: provisioning, publishing, dead letters,
registries. FastStream owns each service's subscriptions; hot paths use the nats-py client
FastStream already holds (`broker.connection`) because FastStream awaits one PubAck per
JetStream publish and has no batch publish.

One module per concern, every name re-exported here (use `populace.core.bus`): `connection`
(connect, credentials, permission refusals), `retries` (`until_ready`, what is transient),
`provisioning` (streams, buckets, object stores, their limits), `publishing` (encode, `seal`,
`publish_js`), `dead_letters`, `registries` (heartbeats, registry reads, `last_on`) and
`run_states` (a run's state in KV `runs`). A part calls its siblings directly: a test that
replaces a helper patches it in the module that calls it (`bus.provisioning.until_ready`),
while callers outside the bus that go through `bus.<name>` see a patch of `bus.<name>`."""

from __future__ import annotations

from populace.core.bus.connection import (
    PermissionDenied,
    connect,
    connect_or_fail,
    credentials,
    denials,
    inbox_prefix,
    refusal,
    servers,
)
from populace.core.bus.dead_letters import (
    DLQ_EXCERPT_BYTES,
    dlq_counts,
    dlq_headers,
    is_jetstream,
    short_error,
)
from populace.core.bus.provisioning import (
    CHUNK_BYTES,
    DLQ_MAX_AGE_S,
    DLQ_MAX_BYTES,
    INSUFFICIENT_RESOURCES,
    MAX_MESSAGE_BYTES,
    MIN_DEFAULT_BYTES,
    MIN_WRITER_RUN_MESSAGES,
    NODES_TTL_S,
    PACING_TTL_S,
    PROVISION_ATTEMPTS,
    RUN_MAX_AGE_S,
    RUN_MAX_BYTES,
    SNAPSHOTS_TTL_S,
    StreamLimitError,
    ensure_kv,
    ensure_object_store,
    provision,
    provision_nodes,
    provision_pacing,
    provision_snapshots,
    stream_limits,
)
from populace.core.bus.publishing import (
    encode,
    publish_js,
    seal,
)
from populace.core.bus.registries import (
    SUBJECTS_LISTED,
    Heartbeat,
    ThreadHeartbeat,
    bucket_keys,
    forget_alive,
    last_on,
    registry_entries,
    registry_items,
    stream_subjects,
)
from populace.core.bus.retries import (
    NO_PEERS_YET,
    TRANSIENT,
    Reconnected,
    unless_reconnected,
    until_ready,
)
from populace.core.bus.run_states import (
    STATE_LAG_S,
    open_refusal,
    run_head,
    run_state,
    run_writers,
)

__all__ = [
    "CHUNK_BYTES",
    "DLQ_EXCERPT_BYTES",
    "DLQ_MAX_AGE_S",
    "DLQ_MAX_BYTES",
    "INSUFFICIENT_RESOURCES",
    "MAX_MESSAGE_BYTES",
    "MIN_DEFAULT_BYTES",
    "MIN_WRITER_RUN_MESSAGES",
    "NODES_TTL_S",
    "NO_PEERS_YET",
    "PACING_TTL_S",
    "PROVISION_ATTEMPTS",
    "RUN_MAX_AGE_S",
    "RUN_MAX_BYTES",
    "SNAPSHOTS_TTL_S",
    "STATE_LAG_S",
    "SUBJECTS_LISTED",
    "TRANSIENT",
    "Heartbeat",
    "PermissionDenied",
    "Reconnected",
    "StreamLimitError",
    "ThreadHeartbeat",
    "bucket_keys",
    "connect",
    "connect_or_fail",
    "credentials",
    "denials",
    "dlq_counts",
    "dlq_headers",
    "encode",
    "ensure_kv",
    "ensure_object_store",
    "forget_alive",
    "inbox_prefix",
    "is_jetstream",
    "last_on",
    "open_refusal",
    "provision",
    "provision_nodes",
    "provision_pacing",
    "provision_snapshots",
    "publish_js",
    "refusal",
    "registry_entries",
    "registry_items",
    "run_head",
    "run_state",
    "run_writers",
    "seal",
    "servers",
    "short_error",
    "stream_limits",
    "stream_subjects",
    "unless_reconnected",
    "until_ready",
]
