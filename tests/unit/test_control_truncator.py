"""ControlLogTruncator's answer to DeleteRecords failures (no broker: the plan and the call are
stubbed; the real-broker tests are in tests/integration/test_control_log.py): only a definite
"unsupported" stops it asking; a transient failure (the connection lost, the broker away, a
refusal an operator may lift) is reported and tried again at the next interval."""

from __future__ import annotations

import asyncio

import pytest

from icesink.shared import kafka_admin
from icesink.shared.control import UNSUPPORTED_AFTER, ControlLogTruncator
from icesink.shared.kafka_admin import DeleteRecordsUnsupported, TopicError


def truncator(monkeypatch, outcomes: list[BaseException | int]) -> ControlLogTruncator:
    t = ControlLogTruncator("b:9092", "ctl", "g", {})

    async def plan(floor=None) -> dict:
        return {"log_start": 0, "held_by": "g", "before": 7}

    async def delete_records(*args, **kwargs) -> int:
        outcome = outcomes.pop(0)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    monkeypatch.setattr(t, "plan", plan)
    monkeypatch.setattr(kafka_admin, "delete_records", delete_records)
    return t


def test_a_transient_failure_does_not_mark_the_broker_unsupported(monkeypatch):
    t = truncator(monkeypatch, [TopicError("topic 'ctl': DeleteRecords failed: KafkaConnectionError", retriable=True),
                                DeleteRecordsUnsupported("closed the connection", definite=False), 7])
    with pytest.raises(TopicError):
        asyncio.run(t.truncate())
    assert t.unsupported is None
    assert "unsupported" not in asyncio.run(t.truncate()) and t.unsupported is None  # one closed connection
    assert asyncio.run(t.truncate()) == {"log_start": 7, "held_by": "g"}  # the next interval truncates


def test_a_definite_unsupported_answer_stops_asking_and_a_closed_connection_only_when_it_persists(monkeypatch):
    t = truncator(monkeypatch, [DeleteRecordsUnsupported("UNSUPPORTED_VERSION")])
    assert asyncio.run(t.truncate())["unsupported"] == "UNSUPPORTED_VERSION"
    assert asyncio.run(t.truncate()) == {"unsupported": "UNSUPPORTED_VERSION"}  # not asked again
    closed = [DeleteRecordsUnsupported("closed the connection", definite=False) for _ in range(UNSUPPORTED_AFTER)]
    t = truncator(monkeypatch, [*closed[:-1], 3, *closed])
    for _ in range(UNSUPPORTED_AFTER - 1):
        asyncio.run(t.truncate())
    assert asyncio.run(t.truncate())["log_start"] == 3 and t.unsupported is None  # a success starts the count anew
    for _ in range(UNSUPPORTED_AFTER):
        out = asyncio.run(t.truncate())
    assert t.unsupported == "closed the connection" and out["unsupported"] == t.unsupported


def test_a_checkpoint_not_read_in_time_is_no_answer_rather_than_no_checkpoint(monkeypatch):
    """A group whose checkpoint record is not read within 5 s (a slow broker) used to count as
    having no checkpoint, and then, with no event of its own newer than 7 days in the part of the
    log scanned, as gone: the log could be truncated past what it needs. It is no answer now:
    not truncated this time."""
    async def group_offset(*args, **kwargs) -> int:
        return 5

    class Slow:
        def seek(self, tp, offset) -> None: ...

        async def getmany(self, tp, timeout_ms, max_records):
            return {}

    monkeypatch.setattr(kafka_admin, "group_offset", group_offset)
    t = ControlLogTruncator("b:9092", "ctl", "g", {})
    with pytest.raises(TopicError, match="not read within 5 s"):
        asyncio.run(t._needs(Slow(), ("ctl", 0), "other"))
