"""Every NATS subject name Populace uses. No subject string is typed anywhere else.

Cardinality is bounded: subjects are per run, round and host (or shard), never per agent.
"""

from __future__ import annotations

# --- streams -------------------------------------------------------------------------
CTL_STREAM = "CTL"
RUN_STREAM = "RUN"
DLQ_STREAM = "DLQ"
CTL_SUBJECTS = ["ctl.>"]
RUN_SUBJECTS = ["run.>"]
DLQ_SUBJECTS = ["dlq.>"]

# --- KV buckets ----------------------------------------------------------------------
RUNS_BUCKET = "runs"
HOSTS_BUCKET = "hosts"
SERVICES_BUCKET = "services"
REPLICAS_BUCKET = "replicas"
# A replica's key in KV `replicas` is `<writer>.<replica id>`: each replica set's NATS user may
# write only keys under its own name (`$KV.replicas.<user>.>`), so the key says who wrote it
# (populace.core.replica_hosts); without NATS users the writer is REPLICAS_WRITER.
REPLICAS_WRITER = "replicas"
NODES_BUCKET = "nodes"  # machines running `populace node`: resources, processes (TTL'd)
# the gateways' shared pacing: one entry per provider limit (populace.gateway.pacing.limit_key),
# its token buckets and any pause its provider asked for (TTL'd); the gateways' alone
PACING_BUCKET = "pacing"

# --- object store: content-addressed blobs (personas files), named by their sha256 ----
PERSONAS_BUCKET = "personas"
# --- object store: what a run needs to continue after a round (agents' and env's state) --
CHECKPOINTS_BUCKET = "checkpoints"
# --- object store: social graphs (and their agent orders), named by their sha256 ----------
GRAPHS_BUCKET = "graphs"


def replica_key(writer: str, replica_id: str) -> str:
    """A replica's key in KV `replicas`: under its writer's (its NATS user's) name."""
    return f"{writer}.{replica_id}"


def replica_key_parts(key: str) -> tuple[str, str] | None:
    """(writer, replica id) of a key in KV `replicas`; None when it is under no writer's name."""
    writer, dot, replica_id = key.partition(".")
    return (writer, replica_id) if dot and writer and valid_token(replica_id) else None


def checkpoint_agents(rid: str, n: int, first: int) -> str:
    """The declared state of the agents of one id range, after round n."""
    return f"{rid}.{n}.agents.{first}"


def checkpoint_agents_prefix(rid: str, n: int) -> str:
    return f"{rid}.{n}.agents."


def checkpoint_env(rid: str, n: int) -> str:
    """The environment's state and next observation after round n."""
    return f"{rid}.{n}.env"


def checkpoint_world(rid: str, n: int) -> str:
    """A simulation's world after round n (0: as it started), Arrow IPC bytes."""
    return f"{rid}.{n}.world"


def checkpoint_population(rid: str, n: int) -> str:
    """Who is alive after round n and its changes (populace.sdk.population's bytes)."""
    return f"{rid}.{n}.population"


def checkpoint_partial(rid: str, n: int, share: str) -> str:
    """A share's round-n partial too large for a message (the message names it and its digest)."""
    return f"{rid}.{n}.partial.{share.replace('@', '-')}"


def checkpoint_config(rid: str, n: int, digest: str) -> str:
    """A run's config from round n on (its canonical JSON), named by its sha256."""
    return f"{rid}.{n}.config.{digest}"


# How the `checkpoints` bucket is laid out (populace.core.owned_objects): every byte one writer
# stores for one run goes on one chunk subject, which the stream bounds (max messages per
# subject), and each object's metadata on a subject of its writer, which only that writer may
# publish: a reader looks for an object under its expected writer only.
CHECKPOINTS_STREAM = f"OBJ_{CHECKPOINTS_BUCKET}"
CHECKPOINTS_ALL = f"$O.{CHECKPOINTS_BUCKET}.>"
CHECKPOINT_CHUNKS_ROOT = f"$O.{CHECKPOINTS_BUCKET}.C"
CHECKPOINT_META_ROOT = f"$O.{CHECKPOINTS_BUCKET}.M"


def checkpoint_run_of(name: str) -> str:
    """The run a checkpoint object belongs to: its name's first token (every name starts with it)."""
    return name.split(".", 1)[0]


def checkpoint_chunks(writer: str, rid: str) -> str:
    """The chunks of every object `writer` stores for run `rid`, in the order written."""
    return f"{CHECKPOINT_CHUNKS_ROOT}.{writer}.{rid}"


def checkpoint_meta(writer: str, rid: str, name_b64: str) -> str:
    """The metadata of one object (its name base64url-encoded: names have dots), by its writer."""
    return f"{CHECKPOINT_META_ROOT}.{writer}.{rid}.{name_b64}"


def checkpoint_run_chunks(rid: str, writer: str = "*") -> str:
    """Every chunk subject of run `rid` (of one writer, or of any)."""
    return checkpoint_chunks(writer, rid)


def checkpoint_run_meta(rid: str, writer: str = "*") -> str:
    """Every metadata subject of run `rid` (of one writer, or of any)."""
    return f"{CHECKPOINT_META_ROOT}.{writer}.{rid}.*"


def is_checkpoint_config(name: str) -> bool:
    """Whether a checkpoint object's name is a run's config (checkpoint_config)."""
    return name.split(".")[2:3] == ["config"]


def checkpoint_round(rid: str, name: str) -> int | None:
    """The round of one of run `rid`'s checkpoint objects (None: another run's, or not a
    checkpoint name). Run ids have no dots, so `rid.` never matches another run's names."""
    head, _, rest = name.partition(".")
    round_, _, kind = rest.partition(".")
    named = kind in ("env", "world", "population") or kind.startswith(("agents.", "partial.", "config."))
    if head != rid or not round_.isdigit() or not named:
        return None
    return int(round_)

# --- control plane -------------------------------------------------------------------
RUN_START = "ctl.run.start"
RUN_CANCEL = "ctl.run.cancel"
RUN_RESUME = "ctl.run.resume"
RUN_INTERVIEW = "ctl.run.interview"  # ask a survey after the fact (populace interview)

# --- inference (core request/reply with a queue group) -------------------------------
LLM_INFER = "llm.infer"
GATEWAY_QUEUE = "gateway"
# A request carrying INFER_KEEPALIVE_HEADER asks the gateway that takes it to say so at once
# on the reply subject (an empty message with INFER_ACCEPTED_HEADER, naming itself), then again
# every few seconds until the answers go out: an agent-host that stops hearing it knows the
# batch was lost and sends it again. Plain request/reply callers (one reply) leave it out.
INFER_KEEPALIVE_HEADER = "Populace-Keepalive"
INFER_ACCEPTED_HEADER = "Populace-Accepted"
ANY_LLM_INFER = "llm.infer.*"  # what the gateways take (queue group), one subject per requester


def llm_infer(requester: str) -> str:
    """Where `requester` (its NATS user: only it may publish here) asks for inference."""
    return f"llm.infer.{requester}"


# --- answers to requests: only on the requester's own reply subjects --------------------
# A request subject's last token names the requester (its NATS user, which alone may publish
# that subject), and the responder answers only on `reply.<responder>.<requester>.…`: a reply
# subject the requester picks elsewhere ($JS.API…, $KV…, another user's) is refused. Each user
# may subscribe to `reply.*.<user>.>` only, and each responder may publish `reply.<itself>.>`
# only. Not `_INBOX_<user>.…`: NATS wildcards are whole tokens, so no grant could let a
# responder publish on every user's `_INBOX_<user>.>` without listing every user.
REPLY_ROOT = "reply"


def reply_prefix(responder: str, requester: str) -> str:
    """The start of every reply subject `responder` may use for `requester`'s requests."""
    return f"{REPLY_ROOT}.{responder}.{requester}."


def requester_of(subject: str) -> str:
    """The requester a request subject names (its last token)."""
    return subject.rsplit(".", 1)[-1]


# --- nodes (core request/reply; outside `ctl.>`, which stream CTL captures: a request there
# would be stored and answered first by the stream's PubAck instead of the node) ---------
NODE_VERBS = ("start", "stop", "list", "logs", "cleanup")


def node_request(node_id: str, verb: str, requester: str = "*") -> str:
    """Where node `node_id` takes requests of one verb from `requester` (the NodeReply comes
    back on reply_prefix("node", requester)); "*": from anyone (what the node subscribes to)."""
    return f"node.{node_id}.{verb}.{requester}"


# --- results read while a run writes them (core request/reply, answered by the recorder:
# the only process that can open the DuckDB file while it writes) ------------------------
RECORDER_READ_VERBS = ("snapshot", "agents", "distribution", "interviews")
# object store: a DuckDB file with some runs' rows, written by the recorder for one reader
SNAPSHOTS_BUCKET = "snapshots"


def recorder_read(verb: str, requester: str = "*") -> str:
    """Where the recorder takes read requests of one verb from `requester` (the reply comes back
    on reply_prefix("recorder", requester)); "*": from anyone (what the recorder subscribes to)."""
    return f"recorder.read.{verb}.{requester}"


def dlq(service: str) -> str:
    return f"dlq.{service}"


# --- run events (all stored in the RUN stream) ---------------------------------------
def run_all(rid: str) -> str:
    return f"run.{rid}.>"


def run_started(rid: str) -> str:
    return f"run.{rid}.started"


def run_spawn(rid: str, host_id: str) -> str:
    return f"run.{rid}.spawn.{host_id}"


def run_spawned(rid: str, host_id: str) -> str:
    return f"run.{rid}.spawned.{host_id}"


def run_round_open(rid: str, n: int) -> str:
    return f"run.{rid}.round.{n}.open"


def run_outcomes(rid: str, n: int, host_id: str) -> str:
    return f"run.{rid}.outcomes.{n}.{host_id}"


def run_partial(rid: str, n: int, host_id: str, epoch: int = 0) -> str:
    """One share's partial of round n: the share is the host and the epoch it was placed in."""
    return f"run.{rid}.partial.{n}.{host_id}.{epoch}"


def run_mail(rid: str, n: int, to_host: str, to_epoch: int, from_host: str) -> str:
    """Posts of round n one share sends another: addressed to the destination share (host and
    epoch), sent by `from_host` (the last token, so a host's credentials name only itself)."""
    return f"run.{rid}.mail.{n}.{to_host}.{to_epoch}.{from_host}"


def run_mail_to(rid: str, n: int, to_host: str, to_epoch: int) -> str:
    """Every share's mail of round n to one share: what a host reads back from the stream."""
    return f"run.{rid}.mail.{n}.{to_host}.{to_epoch}.*"


def run_interviews(rid: str, n: int, host_id: str) -> str:
    """Answers to interviews asked after round n (planned, or post hoc), from one host."""
    return f"run.{rid}.interviews.{n}.{host_id}"


def run_ask(rid: str, host_id: str) -> str:
    """A post-hoc interview's order to one host (the orchestrator places it)."""
    return f"run.{rid}.ask.{host_id}"


def run_asked(rid: str, request: str) -> str:
    """A post-hoc interview placed (or refused), by the orchestrator."""
    return f"run.{rid}.asked.{request}"


def run_interviewed(rid: str, request: str) -> str:
    """Every answer of a post-hoc interview recorded, by the recorder."""
    return f"run.{rid}.interviewed.{request}"


def run_calls(rid: str, n: int, gateway_id: str) -> str:
    return f"run.{rid}.calls.{n}.{gateway_id}"


# The bulky events of a run, every round and sender: what the recorder purges once recorded.
def run_outcomes_all(rid: str) -> str:
    return f"run.{rid}.outcomes.>"


def run_calls_all(rid: str) -> str:
    return f"run.{rid}.calls.>"


def run_interviews_all(rid: str) -> str:
    return f"run.{rid}.interviews.>"


def run_round_result(rid: str, n: int) -> str:
    return f"run.{rid}.round.{n}.result"


def run_fault(rid: str, source: str) -> str:
    return f"run.{rid}.fault.{source}"


def run_resumed(rid: str) -> str:
    return f"run.{rid}.resumed"


def run_done(rid: str) -> str:
    return f"run.{rid}.done"


def run_recorded(rid: str) -> str:
    return f"run.{rid}.recorded"


# Progress ticks are core NATS only (not stored): one tiny message per outcome batch.
def progress(rid: str, n: int, host_id: str) -> str:
    return f"progress.{rid}.{n}.{host_id}"


def progress_all(rid: str) -> str:
    return f"progress.{rid}.>"


# --- wildcards services subscribe to -------------------------------------------------
ANY_RUN_SPAWN_FOR = "run.*.spawn.{host_id}"
ANY_ROUND_OPEN = "run.*.round.*.open"
ANY_PARTIAL = "run.*.partial.*.*.*"
ANY_ROUND_RESULT = "run.*.round.*.result"
ANY_SPAWNED = "run.*.spawned.*"
ANY_RUN_DONE = "run.*.done"
ANY_FAULT = "run.*.fault.*"
# Documented (AsyncAPI) as what services publish; never subscribed to with these wildcards.
ANY_STARTED = "run.*.started"
ANY_RESUMED = "run.*.resumed"
ANY_SPAWN = "run.*.spawn.*"
ANY_OUTCOMES = "run.*.outcomes.*.*"
ANY_MAIL = "run.*.mail.*.*.*.*"
ANY_MAIL_FOR = "run.*.mail.*.{host_id}.*.*"
ANY_CALLS = "run.*.calls.*.*"
ANY_INTERVIEWS = "run.*.interviews.*.*"
ANY_ASK_FOR = "run.*.ask.{host_id}"
ANY_ASK = "run.*.ask.*"
ANY_ASKED = "run.*.asked.*"
ANY_INTERVIEWED = "run.*.interviewed.*"
ANY_RECORDED = "run.*.recorded"
ANY_PROGRESS = "progress.*.*.*"
ANY_RUN_EVENT = "run.>"


def any_spawn_for(host_id: str) -> str:
    return ANY_RUN_SPAWN_FOR.format(host_id=host_id)


def any_ask_for(host_id: str) -> str:
    return ANY_ASK_FOR.format(host_id=host_id)


def any_mail_for(host_id: str) -> str:
    return ANY_MAIL_FOR.format(host_id=host_id)


def mail_consumer(host_id: str) -> str:
    """The one consumer on RUN a host may create (to read its own mail back): its NATS user
    may use no other name, and only with a filter of its own mail (deploy/nats/auth.conf)."""
    return f"mail-{host_id}"


def msg_id(rid: str, n: int, shard: str | int, kind: str, epoch: int = 0) -> str:
    """JetStream de-duplication id: a retried publish of the same thing is stored once. A
    resumed run plays again in a new epoch, whose events are new things."""
    return f"{rid}.{n}.{shard}.{kind}" if not epoch else f"{rid}.e{epoch}.{n}.{shard}.{kind}"


def kind_of(subject: str) -> str:
    """The event kind of a run subject: 'started', 'spawn', 'outcomes', 'round.open' …"""
    parts = subject.split(".")
    if len(parts) < 3 or parts[0] != "run":
        return ""
    if parts[2] == "round" and len(parts) >= 5:
        return f"round.{parts[4]}"
    return parts[2]


def run_of(subject: str) -> str:
    """The run id of a run subject (`run.<rid>.…`); '' for another subject."""
    parts = subject.split(".")
    return parts[1] if len(parts) >= 3 and parts[0] == "run" else ""


def sender_of(subject: str) -> str:
    """Who sent a message, as far as its subject says (the permissions let only that user, host
    or service publish it): the requester of a request, the host of an outcome batch, partial,
    post, spawned report or progress tick, the source of a fault; '' when the subject names none."""
    parts = subject.split(".")
    root = parts[0]
    if (root == "llm" and len(parts) == 3) or (root == "recorder" and len(parts) == 4) or (
            root == "node" and len(parts) == 4) or (root == "progress" and len(parts) == 4):
        return parts[-1]
    if root == "run" and len(parts) >= 4:
        kind = parts[2]
        if kind in ("outcomes", "mail", "spawned", "fault", "calls"):
            return parts[-1]
        if kind == "partial" and len(parts) == 6:
            return parts[4]
    return ""


def valid_token(token: str) -> bool:
    """A run or host id must be one subject token: no dots, spaces or wildcards."""
    return bool(token) and not any(c in token for c in ". *>\t\r\n")


def run_rounds_any(rid: str) -> str:
    return f"run.{rid}.round.*.*"


def run_spawned_any(rid: str) -> str:
    return f"run.{rid}.spawned.*"


# Placeholders a subscription's wildcards stand for, by the token before them (AsyncAPI titles).
_DOC_NAMES = {"run": "run_id", "round": "round", "outcomes": "round", "partial": "round", "calls": "round",
              "interviews": "round", "ask": "host_id", "asked": "request", "interviewed": "request",
              "spawn": "host_id", "spawned": "host_id", "fault": "source", "infer": "requester"}
_DOC_LAST = {"outcomes": "host_id", "partial": "host_id", "calls": "gateway_id", "interviews": "host_id"}


def doc_title(subject: str) -> str:
    """A subscription as documentation names it: 'run.*.round.*.open' → 'run.{run_id}.round.{round}.open'.
    A host's own subscription ('run.*.spawn.host-0') is documented for every host."""
    parts = subject.split(".")
    if parts[0] == "progress" and len(parts) == 4:
        return "progress.{run_id}.{round}.{host_id}"
    if parts[0] in ("recorder", "node") and len(parts) == 4 and parts[3] == "*":  # a request's last token
        return ".".join(parts[:3]) + ".{requester}"
    if parts[0] == "run" and len(parts) == 7 and parts[2] == "mail":  # run.*.mail.*.<host>.*.* (or all *)
        return "run.{run_id}.mail.{round}.{to_host}.{to_epoch}.{from_host}"
    out: list[str] = []
    for i, tok in enumerate(parts):
        prev = parts[i - 1] if i else ""
        if tok == "*":
            name = (_DOC_NAMES.get(prev) or (_DOC_LAST.get(parts[i - 2]) if i >= 2 else None)
                    or ("epoch" if i >= 3 and parts[i - 3] == "partial" else f"p{i}"))
            out.append("{" + name + "}")
        elif prev in ("spawn", "ask") and parts[0] == "run":
            out.append("{host_id}")
        else:
            out.append(tok)
    return ".".join(out)
