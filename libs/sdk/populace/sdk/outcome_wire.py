"""An engine batch (`populace.sdk.play.OutcomeRows`) as the wire's `OutcomeBatch`: the one
conversion every row goes through. An agent-host publishes it to the recorder; the local runner
keeps it and hands it to the same ingest (`populace.store.local_runs.record_local`)."""

from __future__ import annotations

from populace.core.contracts import ActColumns, EdgeColumns, LineColumns, OutcomeBatch, PostColumns, ShownColumns
from populace.sdk.play import OutcomeRows

# an act row's platform columns; the others are the simulation's Act columns
ACT_PLATFORM = ("group_id", "seq", "agent_id", "phase", "valid", "raw", "latency_ms", "error")


def act_columns(rows: dict[str, list]) -> dict:
    """The engine's act rows as the wire has them: the simulation's Act columns apart."""
    return {**{k: rows[k] for k in ACT_PLATFORM}, "columns": {k: v for k, v in rows.items() if k not in ACT_PLATFORM}}


def outcome_batch(batch: OutcomeRows, *, run_id: str, round_: int, host_id: str, epoch: int = 0,
                  seq: int | None = None) -> OutcomeBatch:
    """The wire batch, made around the batch's own lists (the sink validated them: not again, on
    the hot path). `seq`: the batch's number in the round (default: the sink's)."""
    return OutcomeBatch.model_construct(
        v=1, run_id=run_id, round=round_, host_id=host_id, seq=batch.seq if seq is None else seq,
        agent_ids=batch.agent_ids, columns=batch.columns, valid=batch.valid, raws=batch.raws,
        latency_ms=batch.latency_ms, errors=batch.errors, group_ids=batch.group_ids, epoch=epoch,
        posts=None if batch.posts is None else PostColumns.model_construct(v=1, **batch.posts),
        levels=batch.levels, lines=None if batch.lines is None else LineColumns.model_construct(v=1, **batch.lines),
        acts=None if batch.acts is None else ActColumns.model_construct(v=1, **act_columns(batch.acts)),
        edits=None if batch.edits is None else EdgeColumns.model_construct(v=1, **batch.edits),
        audit=batch.audit, prototypes=batch.prototypes,
        shown=None if batch.shown is None else ShownColumns.model_construct(v=1, **batch.shown),
    )
