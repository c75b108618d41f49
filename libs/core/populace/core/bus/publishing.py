"""Publishing: a model's bytes, JetStream de-duplication ids other users cannot predict, and one
control-plane publish awaiting its PubAck through transient errors."""

from __future__ import annotations

import hashlib
import hmac

from nats.js import JetStreamContext
from nats.js.api import PubAck
from pydantic import BaseModel

from populace.core import telemetry
from populace.core.bus.retries import until_ready


def encode(model: BaseModel) -> bytes:
    return model.model_dump_json().encode()


def seal(conn, msg_id: str) -> str:
    """A JetStream de-duplication id other users cannot predict. De-duplication is stream-wide,
    whatever the subject: a user who guessed another's next id could publish it first, on a
    subject of its own, and JetStream would drop the real message as a duplicate. So the id
    carries an HMAC of itself keyed by the publisher's NATS password (`conn`: its Client or
    JetStreamContext): each user has its own, and a restarted process the same, so a retried
    publish is still de-duplicated. On an open bus (no password) the id stays as it is."""
    nc = getattr(conn, "_nc", conn)  # nats-py keeps the JetStreamContext's connection there
    password = (getattr(nc, "options", None) or {}).get("password")
    if not password:
        return msg_id
    mac = hmac.new(password.encode(), msg_id.encode(), hashlib.sha256).hexdigest()[:16]
    return f"{msg_id}.{mac}"


async def publish_js(js: JetStreamContext, subject: str, model: BaseModel, msg_id: str | None = None,
                     timeout: float = 5.0, attempts: int = 12) -> PubAck:
    """One JetStream publish awaiting its PubAck (control plane), which it returns (a message
    stored before under the same msg_id: that one's sequence). De-duplicated by msg_id, so
    it is retried through transient errors — e.g. the stream's leader being re-elected after a
    node died (~5–10 s), during which a lost publish would otherwise stall a run."""
    headers = telemetry.inject({"Nats-Msg-Id": seal(js, msg_id)} if msg_id else None)
    data = encode(model)

    async def once() -> PubAck:
        return await js.publish(subject, data, headers=headers, timeout=timeout)

    return await until_ready(once, f"publish {subject}", attempts=attempts if msg_id else 1)
