"""ControlReader.read skips invalid control records: logged once with the control offset,
counted per reader, never raised to the loop that reads (a coordinator or a worker)."""

import asyncio
import logging
from types import SimpleNamespace

from prometheus_client import CollectorRegistry

from icesink.shared.control import ControlReader
from icesink.shared.protocol import CommitRequest, StartCommit, encode
from icesink.shared.metrics import Metrics

GROUP = "g"


class FakeConsumer:
    """getmany hands out the given batches, then nothing."""

    def __init__(self, batches):
        self.batches = list(batches)

    async def getmany(self, tp, timeout_ms, max_records):
        return {tp: self.batches.pop(0)} if self.batches else {}


def record(offset, key, value, headers=()):
    return SimpleNamespace(offset=offset, key=key, value=value, headers=headers)


BAD = [
    record(1, b"\xff\xfe", encode(CommitRequest("w", 1))),
    record(2, GROUP.encode(), b"not json"),
    record(3, GROUP.encode(), None),
    record(4, GROUP.encode(), b'{"v":1,"type":"data-complete","commit_id":"r","response_id":"x","worker":"w",'
                              b'"generation":1,"events_sent":0,"ranges":[{"tp":{"topic":"t","partition":0},"start":"x","end":5}]}'),
]


def reader_with(batches, metrics):
    reader = ControlReader("127.0.0.1:1", "c", GROUP, {}, metrics=metrics, reader="coordinator")
    reader._consumer = FakeConsumer(batches)
    return reader


def counted(metrics, reader="coordinator"):
    return metrics.registry.get_sample_value("icesink_control_events_invalid_total", {"reader": reader})


def test_invalid_records_are_skipped_logged_once_and_counted(caplog):
    metrics = Metrics(CollectorRegistry())
    good = [record(0, GROUP.encode(), encode(StartCommit(1, "r1"))), record(5, None, encode(StartCommit(1, "r2")))]
    other_group = record(6, b"other", b"whatever")

    async def go():
        reader = reader_with([[good[0], *BAD, good[1], other_group], BAD], metrics)
        first = await reader.read(0.1)
        again = await reader.read(0.1)  # read again after a seek back (recovery): no second report
        return first, again

    with caplog.at_level(logging.ERROR, logger="icesink.shared.control"):
        first, again = asyncio.run(go())
    assert first == [(0, StartCommit(1, "r1")), (5, StartCommit(1, "r2"))]
    assert again == []
    assert counted(metrics) == len(BAD)
    lines = [r.getMessage() for r in caplog.records if r.name == "icesink.shared.control"]
    assert len(lines) == len(BAD)
    assert "control offset 1: key: expected UTF-8 text (a sink group id), found b'\\xff\\xfe'" in lines[0]
    assert "control offset 2: expected a JSON event, found text that is not JSON" in lines[1]
    assert "control offset 3: value: expected a JSON event, found null" in lines[2]
    assert "control offset 4: data-complete field ranges[0].start: expected int >= 0, found 'x'" in lines[3]
    assert all("coordinator reader" in line for line in lines)


def test_a_reader_without_metrics_still_skips(caplog):
    async def go():
        reader = ControlReader("127.0.0.1:1", "c", GROUP, {})
        reader._consumer = FakeConsumer([BAD])
        return await reader.read(0.1)

    assert asyncio.run(go()) == []


def test_a_control_event_is_fetched_without_waiting_out_a_polling_broker(monkeypatch):
    """Each round crosses the control topic twice (StartCommit to the workers, their responses
    to the coordinator). A broker that answers a waiting fetch by polling, as the embedded Tansu
    does (it looks again every half of the fetch's max wait), delivers an event up to half that
    wait late: Kafka's default 500 ms added up to 0.25 s per hop, 0.5 s a round, to every
    row's freshness at 1 s rounds (bench/README.md, freshness). Control readers wait at most
    CONTROL_FETCH_WAIT_MS; an idle control partition costs a few more empty fetches a second."""
    import icesink.shared.control as control

    seen = {}

    class Recording:
        def __init__(self, **kwargs):
            seen.update(kwargs)

    monkeypatch.setattr(control, "AIOKafkaConsumer", Recording)
    ControlReader("127.0.0.1:1", "c", GROUP, {}, reader="worker")
    assert seen["fetch_max_wait_ms"] == control.CONTROL_FETCH_WAIT_MS <= 100
