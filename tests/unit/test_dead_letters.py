"""What a dead letter keeps: the refused message's reference and a bounded excerpt, never an
unbounded copy (issue 26, item 7: 150 MB of junk became 314 MB stored)."""

from __future__ import annotations

from types import SimpleNamespace

from populace.core import bus, subjects


def test_the_sender_a_subject_names():
    assert subjects.sender_of(subjects.run_partial("r", 2, "h-1", 3)) == "h-1"
    assert subjects.sender_of(subjects.run_outcomes("r", 2, "h-1")) == "h-1"
    assert subjects.sender_of(subjects.run_mail("r", 2, "h-2", 0, "h-1")) == "h-1"
    assert subjects.sender_of(subjects.run_spawned("r", "h-1")) == "h-1"
    assert subjects.sender_of(subjects.progress("r", 2, "h-1")) == "h-1"
    assert subjects.sender_of(subjects.run_round_open("r", 2)) == ""  # only the orchestrator may: not named
    assert subjects.sender_of(subjects.RUN_START) == ""


def _msg(subject: str, data: bytes, reply: str = ""):
    return SimpleNamespace(subject=subject, data=data, reply=reply)


def test_a_dead_letter_keeps_the_reference_and_an_excerpt():
    big = _msg(subjects.run_outcomes("r", 1, "h-9"), b"x" * 300_000)
    h = bus.dlq_headers(big, "why", "recorder.1")
    assert h["Populace-Size"] == "300000" and h["Populace-Sender"] == "h-9" and h["Populace-Truncated"] == "1"
    assert h["Populace-Subject"] == "run.r.outcomes.1.h-9" and h["Populace-Error"] == "why"
    assert "Populace-Sequence" not in h  # a core message is stored nowhere
    small = bus.dlq_headers(_msg("llm.infer.h-9", b"{}"), "e" * 5000)
    assert "Populace-Truncated" not in small and len(small["Populace-Error"]) == 1000


def test_a_stored_message_is_referenced_by_stream_and_sequence():
    class Stored:
        subject, data = subjects.run_outcomes("r", 1, "h-9"), b"junk"
        reply = "$JS.ACK.RUN.recorder.1.57.42.1700000000000000000.0"
        metadata = SimpleNamespace(stream="RUN", sequence=SimpleNamespace(stream=57))

    h = bus.dlq_headers(Stored(), "why")
    assert (h["Populace-Stream"], h["Populace-Sequence"]) == ("RUN", "57")
