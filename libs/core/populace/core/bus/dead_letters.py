"""Dead letters: what a refused message's copy in `dlq.<service>` keeps and says of it, and how
many this process refused."""

from __future__ import annotations

from collections import Counter

from pydantic import ValidationError

from populace.core import subjects

# Malformed messages seen by this process, by service (dead-lettered).
dlq_counts: Counter[str] = Counter()


# A dead letter keeps this much of the refused message (enough to see what it was); its
# headers say the rest: where it came, how big it was, who sent it, why it was refused.
DLQ_EXCERPT_BYTES = 1024


def dlq_headers(msg, reason: str, instance: str = "") -> dict[str, str]:
    """A dead letter's headers, the refused message's reference: its subject, the stream and
    sequence it is stored under (JetStream; a reader fetches it there while it is kept), its
    size, its sender as its subject names it (subjects.sender_of), why it was refused, and which
    process refused it (several instances of a service may each get a core NATS message)."""
    data = msg.data or b""
    headers = {"Populace-Subject": msg.subject, "Populace-Error": reason[:1000], "Populace-Instance": instance,
               "Populace-Size": str(len(data)), "Populace-Sender": subjects.sender_of(msg.subject)}
    if is_jetstream(msg):
        try:
            meta = msg.metadata
            headers["Populace-Stream"], headers["Populace-Sequence"] = meta.stream, str(meta.sequence.stream)
        except Exception:  # an ack subject it cannot parse: the reference has no sequence
            pass
    if len(data) > DLQ_EXCERPT_BYTES:
        headers["Populace-Truncated"] = "1"
    return headers


def is_jetstream(raw_msg) -> bool:
    return raw_msg is not None and bool(raw_msg.reply) and raw_msg.reply.startswith("$JS.ACK")


def short_error(error: Exception | str) -> str:
    if isinstance(error, ValidationError):
        parts = [f"{'.'.join(str(p) for p in e['loc']) or '(body)'}: {e['msg']}" for e in error.errors()[:5]]
        return "; ".join(parts)
    return str(error)
