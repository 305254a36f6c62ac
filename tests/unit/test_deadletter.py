"""Dead letters without a broker: screening (tombstones, too large), Kafka Connect context
headers, errors.tolerance, at-least-once flushing, and the worker's _buffer with both."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from types import SimpleNamespace

from agents.formats import RecordFormat
from agents.missing import MissingTables
from agents.routing import Router
from typing import Any

import pyarrow as pa
import pytest
from prometheus_client import CollectorRegistry

from agents.buffer import Buffers
from agents.convert import Reject
from agents.deadletter import (
    H_FIELD, H_MESSAGE, H_OFFSET, H_PARTITION, H_REASON, H_TABLE, H_TOPIC, H_VALUE_OMITTED,
    DeadLetters, DeadLetterSendError, kind_of, screen,
)
from agents.decode import BatchDecoder
from agents.parts import Replica
from agents.rounds import Rounds
from agents.tasks import TaskOwner
from icesink.shared.offload import Offload
from agents.ingest import Ingest
from icesink.shared.config import build
from icesink.shared.errors import ConfigError, DataError
from agents.kafka.source_consumer import Fetched
from icesink.shared.protocol import TopicPartition
from icesink.shared.metrics import Metrics

TP = TopicPartition("orders", 3)
SCHEMA = pa.schema([pa.field("order_id", pa.string(), nullable=False), pa.field("store_id", pa.int64())])


@dataclass
class Msg:
    offset: int
    value: bytes | None
    key: bytes | None = b"k"
    headers: list[tuple[str, bytes]] = field(default_factory=lambda: [("trace", b"t1")])
    topic: str = TP.topic
    partition: int = TP.partition
    timestamp: float = 1_700_000_000.0


class FakeProducer:
    """aiokafka's send(): awaits enqueueing, returns a delivery future. ``fail`` decides, per
    send, the exception the delivery ends with (None: acknowledged)."""

    def __init__(self, fail: Any = None) -> None:
        self.sent: list[dict[str, Any]] = []
        self.futures: list[asyncio.Future[Any]] = []
        self.fail = fail or (lambda send: None)

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def send(self, topic: str, value: bytes | None, key: bytes | None = None, headers: Any = None) -> Any:
        send = {"topic": topic, "value": value, "key": key, "headers": dict(headers)}
        self.sent.append(send)
        fut = asyncio.get_running_loop().create_future()
        exc = self.fail(send)
        fut.set_exception(exc) if exc is not None else fut.set_result(None)
        return fut


def settings(tmp_path, **extra: Any):
    return build({"topics": TP.topic, "iceberg.tables": "db.a", "state.dir": str(tmp_path), "group.id": "g", **extra})


def sink(tmp_path, producer=None, **extra: Any) -> tuple[DeadLetters, Metrics]:
    metrics = Metrics(CollectorRegistry())
    return DeadLetters(settings(tmp_path, **extra), metrics, "w1", producer=producer), metrics


def value(metrics: Metrics, name: str, **labels: str) -> float:
    return metrics.registry.get_sample_value(name, labels) or 0.0


def run(coro: Any) -> Any:
    return asyncio.run(coro)


# Screening ---------------------------------------------------------------------------------


def test_screen_skips_tombstones_and_rejects_too_large_values_before_parsing():
    msgs = [Msg(0, b'{"a":1}'), Msg(1, None), Msg(2, b"x" * 11), Msg(3, None), Msg(4, b"not json")]
    s = screen(msgs, max_bytes=10)
    assert s.values == [b'{"a":1}', b"not json"] and s.positions == [0, 4]
    assert s.tombstones == 2 and s.nbytes == 7 + 11 + 8
    assert s.rejects == (Reject(2, "record of 11 bytes exceeds errors.max-record-bytes=10", None),)
    assert kind_of(s.rejects[0].reason, None) == "too-large"
    # decode_json's indexes (into values) map back to message indexes
    assert s.at_messages([Reject(1, "malformed JSON: x", None)]) == [Reject(4, "malformed JSON: x", None)]


def test_screen_of_a_batch_without_tombstones_or_large_values_keeps_every_message_in_order():
    """The usual batch: its messages are those of its values, as they are (no copy)."""
    msgs = [Msg(0, b'{"a":1}'), Msg(1, b""), Msg(2, b"x" * 10)]
    s = screen(msgs, max_bytes=10)
    assert s.values == [b'{"a":1}', b"", b"x" * 10] and s.positions == [0, 1, 2]
    assert s.nbytes == 17 and s.tombstones == 0 and s.rejects == () and s.whole
    assert s.messages_of(msgs) is msgs
    empty = screen([], max_bytes=10)
    assert empty.values == [] and empty.positions == [] and empty.nbytes == 0 and empty.whole
    partial = screen([Msg(0, None), Msg(1, b"ab")], max_bytes=10)
    assert not partial.whole and partial.positions == [1]
    assert [m.offset for m in partial.messages_of([Msg(0, None), Msg(1, b"ab")])] == [1]


def test_reason_kinds_are_bounded_labels():
    assert kind_of("malformed JSON: Expecting value at line 1 column 1", None) == "malformed"
    assert kind_of("cannot coerce 'abc' to long", "store_id") == "uncoercible"
    assert kind_of("required field is null or missing", "order_id") == "missing-required"
    assert kind_of("change without a value for key column id", "id") == "missing-key"
    assert kind_of("operation field _cdc.op holds no operation", "_cdc.op") == "no-operation"


# Settings ----------------------------------------------------------------------------------


def test_tolerance_defaults_to_all_with_a_topic_and_none_without(tmp_path):
    assert settings(tmp_path).tolerate_errors is False
    assert settings(tmp_path, **{"errors.deadletterqueue.topic.name": ""}).dlq_topic is None
    assert settings(tmp_path, **{"errors.deadletterqueue.topic.name": "dlq"}).tolerate_errors is True
    assert settings(tmp_path, **{"errors.deadletterqueue.topic.name": "dlq", "errors.tolerance": "none"}).tolerate_errors is False
    assert settings(tmp_path, **{"errors.tolerance": "all"}).tolerate_errors is True
    with pytest.raises(ConfigError, match="errors.tolerance"):
        settings(tmp_path, **{"errors.tolerance": "some"})
    with pytest.raises(ConfigError, match="errors.max-record-bytes"):
        settings(tmp_path, **{"errors.max-record-bytes": 0})


# Headers, merging, tolerance ----------------------------------------------------------------

DLQ = {"errors.deadletterqueue.topic.name": "dlq"}
DYNAMIC = {"iceberg.tables": "", "iceberg.tables.route-field": "t", "iceberg.tables.dynamic-enabled": "true"}


def test_dead_letter_keeps_key_value_and_headers_and_adds_connect_context(tmp_path):
    producer = FakeProducer()
    dl, metrics = sink(tmp_path, producer, **DLQ)
    msgs = [Msg(40, b'{"order_id":"a","store_id":"abc"}'), Msg(41, b"{oops", key=None, headers=[])]

    async def go() -> None:
        await dl.reject(msgs, [
            (Reject(0, "cannot coerce 'abc' to long", "store_id"), "db.a"),
            (Reject(1, "malformed JSON: x", None), "db.a"),
            (Reject(1, "malformed JSON: x", None), "db.b"),  # the same error in a second table
        ])
        assert value(metrics, "icesink_records_deadlettered_total", topic="orders", reason="uncoercible") == 0
        await dl.flush()

    run(go())
    assert len(producer.sent) == 2  # one letter per bad record, not per table
    first, second = producer.sent
    assert first["topic"] == "dlq" and first["key"] == b"k" and first["value"] == msgs[0].value
    h = first["headers"]
    assert h["trace"] == b"t1"  # original headers kept
    assert (h[H_TOPIC], h[H_PARTITION], h[H_OFFSET]) == (b"orders", b"3", b"40")
    assert h["__connect.errors.exception.class.name"] == b"icesink.shared.errors.DataError"
    assert h["__connect.errors.stage"] == b"VALUE_CONVERTER"
    assert h["__connect.errors.connector.name"] == b"g" and h["__connect.errors.task.id"] == b"w1"
    assert h[H_FIELD] == b"store_id" and h[H_TABLE] == b"db.a" and h[H_REASON] == b"uncoercible"
    assert b"cannot coerce 'abc' to long" in h[H_MESSAGE] and b"offset=40" in h[H_MESSAGE]
    assert second["key"] is None and second["value"] == b"{oops"
    assert second["headers"][H_TABLE] == b"db.a,db.b" and H_FIELD not in second["headers"]
    assert value(metrics, "icesink_records_deadlettered_total", topic="orders", reason="uncoercible") == 1
    assert value(metrics, "icesink_records_rejected_total", topic="orders", reason="malformed") == 1


def test_no_route_through_dead_letter(tmp_path):
    producer = FakeProducer()
    dl, metrics = sink(tmp_path, producer, **DLQ)
    msgs = [Msg(i, b"{}") for i in range(3)]
    run(dl.dead_letter(msgs, [0, 2], "no routing rule matches", kind="no-route"))
    assert [s["headers"][H_OFFSET] for s in producer.sent] == [b"0", b"2"]
    assert producer.sent[0]["headers"]["__connect.errors.stage"] == b"TASK_PUT"
    assert value(metrics, "icesink_records_rejected_total", topic="orders", reason="no-route") == 2


def test_context_headers_can_be_switched_off(tmp_path):
    producer = FakeProducer()
    dl, _ = sink(tmp_path, producer, **DLQ, **{"errors.deadletterqueue.context.headers.enable": "false"})
    run(dl.dead_letter([Msg(0, b"{")], [0], "malformed JSON: x"))
    assert producer.sent[0]["headers"] == {"trace": b"t1"}


def test_tolerance_none_raises_for_the_first_bad_record_and_sends_nothing(tmp_path):
    producer = FakeProducer()
    dl, _metrics = sink(tmp_path, producer, **DLQ, **{"errors.tolerance": "none"})
    msgs = [Msg(7, b"{}"), Msg(8, b"{}")]
    with pytest.raises(DataError) as info:
        run(dl.reject(msgs, [(Reject(1, "cannot coerce 'x' to long", "store_id"), "db.a"),
                             (Reject(0, "malformed JSON: x", None), "db.a")]))
    text = str(info.value)
    assert "errors.tolerance=none" in text and "malformed JSON" in text
    assert "topic=orders, partition=3, offset=7" in text
    assert producer.sent == []


def test_without_a_topic_tolerance_all_falls_back_to_a_local_file(tmp_path):
    dl, metrics = sink(tmp_path, None, **{"errors.tolerance": "all"})
    run(dl.dead_letter([Msg(5, b'{"store_id":"x"}')], [0], "cannot coerce 'x' to long", field="store_id", table="db.a"))
    line = json.loads((tmp_path / "deadletter" / "orders.jsonl").read_text())
    assert (line["offset"], line["field"], line["table"], line["reason"]) == (5, "store_id", "db.a", "uncoercible")
    assert value(metrics, "icesink_records_deadlettered_total", topic="orders", reason="uncoercible") == 1


# At-least-once flushing ---------------------------------------------------------------------


def test_a_failed_send_fails_the_flush_and_is_sent_again_at_the_next(tmp_path):
    attempts = {"n": 0}

    def fail_first(send: dict[str, Any]) -> Exception | None:
        attempts["n"] += 1
        return RuntimeError("broker down") if attempts["n"] == 1 else None

    producer = FakeProducer(fail_first)
    dl, metrics = sink(tmp_path, producer, **DLQ)

    async def go() -> None:
        await dl.dead_letter([Msg(0, b"{")], [0], "malformed JSON: x")
        with pytest.raises(DeadLetterSendError, match="broker down"):
            await dl.flush()
        assert value(metrics, "icesink_deadletter_send_failures_total") == 1
        await dl.flush()  # sent again, acknowledged

    run(go())
    assert len(producer.sent) == 2
    assert value(metrics, "icesink_records_deadlettered_total", topic="orders", reason="malformed") == 1


def test_a_letter_too_large_for_the_topic_is_sent_without_its_value(tmp_path):
    class MessageSizeTooLargeError(Exception):
        pass

    producer = FakeProducer(lambda send: MessageSizeTooLargeError("too big") if send["value"] else None)
    dl, metrics = sink(tmp_path, producer, **DLQ)

    async def go() -> None:
        await dl.dead_letter([Msg(0, b"y" * 100)], [0], "record of 100 bytes exceeds errors.max-record-bytes=10")
        await dl.flush()

    run(go())
    assert producer.sent[-1]["value"] is None and producer.sent[-1]["key"] == b"k"
    assert producer.sent[-1]["headers"][H_VALUE_OMITTED].startswith(b"100 bytes")
    assert value(metrics, "icesink_records_deadlettered_total", topic="orders", reason="too-large") == 1


# The worker's _buffer ------------------------------------------------------------------------


class Hooks:
    """The rest of the replica as the round responder sees it (agents/worker.py wires the real one)."""

    def __init__(self) -> None:
        self.failures: list[Exception] = []

    async def evolution_ready(self) -> None:
        return None

    async def release_backpressure(self) -> None:
        pass

    async def reseek_and_resume(self, st: Any) -> None:
        pass

    def update_gauges(self) -> None:
        pass

    def fail(self, exc: Exception, exit_code: int = 2) -> None:
        self.failures.append(exc)


class Tables:
    """The replica's tables (agents/table_lookup.py), every one of them existing."""

    def __init__(self, targets: dict[str, Any]) -> None:
        self.targets = targets

    async def targets_of(self, wanted: Any) -> dict[str, Any]:
        return {name: self.targets.get(name) for name in wanted}

    async def held_back(self, tp: TopicPartition, names: Any) -> list[str]:
        return []

    async def refresh(self, by_table: Any, values: Any) -> bool:
        return False

    async def look_for_missing(self) -> list[TopicPartition]:
        return []


class Owner:
    """Partition ownership (agents/ownership.py): every partition owned, seeks done at once."""

    def owns(self, st: Any, generation: int) -> bool:
        return True

    async def seek(self, st: Any, offset: int) -> None:
        pass

    async def seek_all(self, targets: Any) -> None:
        pass


class Consumer:
    def pause_partitions(self, tps: Any) -> None:
        pass

    def resume_partitions(self, tps: Any) -> None:
        pass

    def highwater(self, tp: Any) -> None:
        return None


def worker_stub(tmp_path, producer, targets: dict[str, Any] | None = None, sender: Any = None, **extra: Any) -> Any:
    """The ingest and the round responder of a replica without clients, built from their parts."""
    s = settings(tmp_path, **{"errors.max-record-bytes": 64}, **extra)
    metrics = Metrics(CollectorRegistry())
    buffers = Buffers(10**9)
    targets = {"db.a": SimpleNamespace(arrow_schema=SCHEMA, keys=None)} if targets is None else targets
    deadletters = DeadLetters(s, metrics, "w1", producer=producer)
    replica, missing, app = Replica("w1", {}), MissingTables(), SimpleNamespace(consumer=Consumer())
    tasks, hooks, owner = TaskOwner(lambda exc: None), Hooks(), Owner()
    requests = FakeProducer()
    record_format = RecordFormat(s)
    decoder = BatchDecoder(s, record_format, Router(s), None, None, targets, requests.send)
    rounds = Rounds(s, metrics, replica, buffers, targets, None, SimpleNamespace(), Offload(), deadletters, app,
                    sender or requests, tasks, owner, hooks=hooks)
    ingest = Ingest(s, metrics, replica, buffers, missing, decoder, deadletters, Tables(targets), app, owner, tasks,
                    requests.send, rounds.maybe_write_early)
    buffers.claim(TP, 1)
    buffers.resume(TP, 0, now=0.0)
    return SimpleNamespace(settings=s, metrics=metrics, buffers=buffers, targets=targets, replica=replica,
                           format=record_format, decoder=decoder, rounds=rounds, ingest=ingest, hooks=hooks)


def test_a_batch_of_only_tombstones_still_moves_the_position(tmp_path):
    w = worker_stub(tmp_path, FakeProducer(), **DLQ)
    run(w.ingest.buffer(w.buffers.partitions[TP], [Msg(0, None), Msg(1, None)]))
    snap = w.buffers.take(1)
    assert [(r.start, r.end) for r in snap.ranges] == [(0, 2)] and snap.rows == 0
    assert value(w.metrics, "icesink_tombstones_total", topic="orders") == 2


def test_good_records_of_a_batch_are_buffered_and_the_bad_ones_dead_lettered(tmp_path):
    producer = FakeProducer()
    w = worker_stub(tmp_path, producer, **DLQ)
    msgs = [
        Msg(0, b'{"order_id":"a","store_id":1}'), Msg(1, b'{"order_id":"b","store_id":"abc"}'),
        Msg(2, None), Msg(3, b'{"order_id":'), Msg(4, b'{"order_id":"' + b"z" * 80 + b'"}'),
        Msg(5, b'{"order_id":"c","store_id":2}'),
    ]
    run(w.ingest.buffer(w.buffers.partitions[TP], msgs))
    snap = w.buffers.take(1)
    assert [(r.start, r.end) for r in snap.ranges] == [(0, 6)]
    assert snap.tables()["db.a"].column("order_id").to_pylist() == ["a", "c"]
    sent = {s["headers"][H_OFFSET]: s["headers"] for s in producer.sent}
    assert sorted(sent) == [b"1", b"3", b"4"]
    assert sent[b"1"][H_FIELD] == b"store_id" and sent[b"1"][H_REASON] == b"uncoercible"
    assert sent[b"3"][H_REASON] == b"malformed" and sent[b"4"][H_REASON] == b"too-large"
    assert H_TABLE not in sent[b"4"]  # rejected before any table


def test_tolerance_none_buffers_nothing_of_the_failing_batch(tmp_path):
    w = worker_stub(tmp_path, None)  # no topic: tolerance defaults to none
    st = w.buffers.partitions[TP]
    run(w.ingest.buffer(st, [Msg(0, b'{"order_id":"a","store_id":1}')]))
    with pytest.raises(DataError, match=r"offset=2, field=store_id"):
        run(w.ingest.buffer(st, [Msg(1, b'{"order_id":"b","store_id":1}'), Msg(2, b'{"order_id":"c","store_id":"x"}')]))
    assert st.next_offset == 1
    assert w.buffers.take(1).tables()["db.a"].num_rows == 1


# At-least-once ordering in a commit round ---------------------------------------------------------


class LateAcks(FakeProducer):
    """Deliveries acknowledged a little after the send (or failed, with ``fail``)."""

    async def send(self, topic: str, value: bytes | None, key: bytes | None = None, headers: Any = None) -> Any:
        self.sent.append({"topic": topic, "value": value, "key": key, "headers": dict(headers)})
        fut = asyncio.get_running_loop().create_future()
        exc = self.fail(self.sent[-1])
        asyncio.get_running_loop().call_later(
            0.05, lambda: fut.set_exception(exc) if exc is not None else fut.set_result(None))
        self.futures.append(fut)
        return fut


def responder(tmp_path, dlq_producer) -> Any:
    """A worker stub able to run Rounds.respond for a batch holding no rows (so no Spark)."""
    events: list[str] = []
    acked_when_reported: list[bool] = []

    async def send(ev: Any) -> None:
        events.append(type(ev).__name__)
        acked_when_reported.append(all(f.done() for f in dlq_producer.futures))

    w = worker_stub(tmp_path, dlq_producer, sender=SimpleNamespace(send=send), **DLQ)
    w.replica.generation = 1
    w.events, w.acked_when_reported = events, acked_when_reported
    return w


async def _round(w: Any, msgs: list[Msg]) -> None:
    w.replica.rebalanced.set()
    w.rounds.spark_ready = asyncio.get_running_loop().create_future()
    w.rounds.spark_ready.set_result(None)
    await w.ingest.buffer(w.buffers.partitions[TP], msgs)
    await w.rounds.respond("round-1")


def test_dead_letters_are_acknowledged_before_their_offsets_are_reported(tmp_path):
    producer = LateAcks()
    w = responder(tmp_path, producer)
    run(_round(w, [Msg(0, b"{"), Msg(1, None)]))
    assert w.events == ["DataComplete"] and w.acked_when_reported == [True]


def test_a_round_is_not_answered_while_dead_letters_fail(tmp_path):
    producer = LateAcks(lambda send: RuntimeError("dlq down"))
    w = responder(tmp_path, producer)
    run(_round(w, [Msg(0, b"{"), Msg(1, None)]))
    assert w.events == []  # no DataComplete: the offsets are not reported
    assert [(r.start, r.end) for r in w.buffers.take(1).ranges] == [(0, 2)]  # kept for the next round


def test_acknowledged_letters_are_not_kept_in_memory_and_counted_once(tmp_path):
    producer = FakeProducer()
    dl, metrics = sink(tmp_path, producer, **DLQ)
    msgs = [Msg(i, b"{") for i in range(3000)]

    async def go() -> None:
        await dl.dead_letter(msgs, range(3000), "malformed JSON: x")
        assert len(dl._inflight) < 1024
        await dl.flush()

    run(go())
    assert value(metrics, "icesink_records_deadlettered_total", topic="orders", reason="malformed") == 3000


def test_a_fan_out_decodes_a_fetch_once_for_all_tables_of_one_schema(tmp_path, monkeypatch):
    """Tables a fetch is routed to that take one schema are decoded together (one decode per
    fetch, not per table: at 200 tables that fixed cost was most of the worker's Python time).
    Each table gets its rows in offset order; each bad record is dead-lettered under its own
    table and offset, as when the tables were decoded one by one."""
    producer = FakeProducer()
    w = worker_stub(tmp_path, producer, targets={n: SimpleNamespace(arrow_schema=SCHEMA, keys=None)
                                                 for n in ("db.a", "db.b", "db.c")}, **DLQ, **DYNAMIC)
    calls: list[int] = []
    convert = w.format.convert

    def counted(messages: Any, values: Any, *a: Any, **k: Any) -> Any:
        calls.append(len(values))
        return convert(messages, values, *a, **k)

    monkeypatch.setattr(w.format, "convert", counted)
    rows = [("db.a", "a1", 1), ("db.b", "b1", 2), ("db.a", "a2", "x"), ("db.c", "c1", 3), ("db.b", "b2", 4),
            ("db.a", "a3", 5), ("db.c", "c2", "y"), ("db.b", "b3", 6)]
    msgs = [Msg(i, json.dumps({"t": t, "order_id": o, "store_id": s}).encode()) for i, (t, o, s) in enumerate(rows)]
    run(w.ingest.buffer(w.buffers.partitions[TP], msgs))
    assert calls == [8]  # one decode for the three tables
    tables = w.buffers.take(1).tables()
    assert tables["db.a"].column("order_id").to_pylist() == ["a1", "a3"]
    assert tables["db.b"].column("order_id").to_pylist() == ["b1", "b2", "b3"]
    assert tables["db.c"].column("order_id").to_pylist() == ["c1"]
    letters = sorted((s["headers"][H_OFFSET], s["headers"][H_TABLE], s["headers"][H_FIELD]) for s in producer.sent)
    assert letters == [(b"2", b"db.a", b"store_id"), (b"6", b"db.c", b"store_id")]
    assert value(w.metrics, "icesink_records_converted_total", topic=TP.topic) == 6


def test_a_fan_out_counts_the_bytes_of_its_rows_once_not_per_table(tmp_path, monkeypatch):
    """The tables decoded together hold slices of one decode: the buffers count that decode's
    Arrow bytes once. Summing each table's slice (an nbytes walk per table and fetch, a
    quarter of a fetch's handling at 200 tables) also counted every slice's offsets again."""
    names = [f"db.t{i}" for i in range(40)]
    w = worker_stub(tmp_path, FakeProducer(), targets={n: SimpleNamespace(arrow_schema=SCHEMA, keys=None) for n in names},
                    **DLQ, **DYNAMIC)
    decoded: list[int] = []
    convert = w.format.convert

    def sized(messages: Any, values: Any, *a: Any, **k: Any) -> Any:
        out = convert(messages, values, *a, **k)
        decoded.append(out.table.nbytes)
        return out

    monkeypatch.setattr(w.format, "convert", sized)
    msgs = [Msg(i, json.dumps({"t": names[i % 40], "order_id": f"o{i}", "store_id": i}).encode()) for i in range(200)]
    run(w.ingest.buffer(w.buffers.partitions[TP], msgs))
    assert len(decoded) == 1
    assert w.buffers.nbytes == decoded[0]
    assert sum(t.num_rows for t in w.buffers.take(1).tables().values()) == 200


ROUTED = pa.schema([pa.field("t", pa.string()), *SCHEMA])  # tables auto-created from routed records


def fan_out_stub(tmp_path: Any, producer: FakeProducer, names: list[str]) -> Any:
    return worker_stub(tmp_path, producer, targets={n: SimpleNamespace(arrow_schema=ROUTED, keys=None) for n in names},
                       **DLQ, **DYNAMIC)


def routed_fetch(start: int, rows: list[tuple[Any, Any, Any]]) -> list[Msg]:
    return [Msg(start + i, json.dumps({"t": t, "order_id": o, "store_id": s}).encode()) for i, (t, o, s) in enumerate(rows)]


def test_a_fan_out_reads_each_record_once_after_its_first_fetch(tmp_path, monkeypatch):
    """A topic routed to many tables of one schema: once a fetch showed the fan-out, the next
    fetches are decoded once against that schema and routed by the decoded route column. The
    router read every record for its route field first (a third of a fetch's handling at 200
    tables), then the decode read it again."""
    names = [f"db.t{i}" for i in range(5)]
    w = fan_out_stub(tmp_path, FakeProducer(), names)
    route_reads: list[int] = []
    read = w.decoder.router._read

    def counted(values: Any) -> Any:
        route_reads.append(len(values))
        return read(values)

    monkeypatch.setattr(w.decoder.router, "_read", counted)
    st = w.buffers.partitions[TP]
    run(w.ingest.buffer(st, routed_fetch(0, [(names[i % 5], f"o{i}", i) for i in range(20)])))
    run(w.ingest.buffer(st, routed_fetch(20, [(names[i % 5], f"o{i}", i) for i in range(20, 50)])))
    run(w.ingest.buffer(st, routed_fetch(50, [(names[i % 5], f"o{i}", i) for i in range(50, 60)])))
    assert route_reads == [20]  # the first fetch only
    # ...and buffered whole, split per table once for the round (agents/buffer.py FanoutRows)
    assert [(c.fanout is not None, c.tables == {}) for c in st.chunks] == [(False, False), (True, True), (True, True)]
    tables = w.buffers.take(1).tables()
    for k, name in enumerate(names):
        assert tables[name].column("order_id").to_pylist() == [f"o{i}" for i in range(k, 60, 5)]
        assert tables[name].column("t").to_pylist() == [name] * 12


def test_a_fan_out_read_once_buffers_and_dead_letters_exactly_as_the_usual_way(tmp_path, monkeypatch):
    """The same fetches through a worker that reads a fan-out once and one that never does:
    the same rows per table, in the same order, and the same dead letters (table, offset,
    field, reason) for a record that does not decode, one that is no JSON, one without a route,
    a route that is no table name, and a table reloaded between fetches."""
    names = ["db.a", "db.b", "db.c"]
    fetches = [
        routed_fetch(0, [("db.a", "a1", 1), ("db.b", "b1", 2), ("db.c", "c1", 3)]),
        routed_fetch(3, [("db.b", "b2", 4), ("db.a", "a2", 5), ("db.c", "c2", 6), ("db.a", "a3", 7)]),
        routed_fetch(7, [("db.a", "a4", "x"), ("db.b", "b3", 8), ("db.c", "c3", 9)]),  # bad store_id
        routed_fetch(10, [("db.a", "a5", 10), (None, "n1", 11), ("bad name!", "n2", 12), ("db.c", "c4", 13)]),
        [*routed_fetch(14, [("db.c", "c5", 14), ("db.b", "b4", 15)]), Msg(16, b'{"t": "db.a", "order_id": ')],
        routed_fetch(17, [("db.b", "b5", 17), ("db.a", "a6", 18)]),
    ]
    outcomes = []
    for once in (True, False):
        producer = FakeProducer()
        w = fan_out_stub(tmp_path / str(once), producer, names)
        read_once: list[int] = []
        decode_fanout = w.decoder.decode_fanout

        def fanout(*a: Any, i: list[int] = read_once, once: bool = once, f: Any = decode_fanout) -> Any:
            out = f(*a) if once else None
            i.append(out is not None)
            return out

        monkeypatch.setattr(w.decoder, "decode_fanout", fanout)
        st = w.buffers.partitions[TP]
        for i, msgs in enumerate(fetches):
            if i == 5:  # db.b reloaded (a schema change elsewhere): no longer the table the fan-out checked
                w.targets["db.b"] = SimpleNamespace(arrow_schema=pa.schema(list(ROUTED)), keys=None)
            run(w.ingest.buffer(st, msgs))
        snap = w.buffers.take(1)
        rows = {n: t.to_pydict() for n, t in snap.tables().items()}
        letters = sorted((s["headers"][H_OFFSET], s["headers"].get(H_TABLE), s["headers"].get(H_FIELD),
                          s["headers"][H_REASON]) for s in producer.sent)
        outcomes.append((rows, letters, read_once))
    (once_rows, once_letters, read_once), (usual_rows, usual_letters, _) = outcomes
    assert read_once == [False, True, True, True, True, False]  # the reloaded table: the usual way
    assert once_rows == usual_rows
    assert once_letters == usual_letters
    assert [o for o, *_ in once_letters] == [b"11", b"12", b"16", b"7"]
    assert once_rows["db.a"]["order_id"] == ["a1", "a2", "a3", "a5", "a6"]


def test_a_fetch_of_several_partitions_lets_the_loop_run_between_them(tmp_path):
    """Decoding a fetch can hold the event loop for a tenth of a second per partition after a
    round's write at many tables; the leader's coordinator reads the round's answers on the
    same loop. Other tasks run between the partitions of one fetch."""
    other = TopicPartition(TP.topic, TP.partition + 1)
    w = worker_stub(tmp_path, FakeProducer(), **DLQ)
    w.buffers.claim(other, 1)
    w.buffers.resume(other, 0, now=0.0)
    seen: list[tuple[int, int]] = []  # what a neighbouring task saw buffered, by partition

    async def go() -> None:
        async def neighbour() -> None:
            seen.append((w.buffers.partitions[TP].next_offset, w.buffers.partitions[other].next_offset))

        fetched = Fetched({tp: [Msg(0, b'{"order_id":"a","store_id":1}', partition=tp.partition)]
                           for tp in (TP, other)}, fetched_at=1.0)
        task = asyncio.ensure_future(neighbour())
        await w.ingest.on_fetch(fetched)
        await task

    run(go())
    assert seen == [(1, 0)]  # it ran after the first partition was buffered, before the second
    assert sum(t.num_rows for t in w.buffers.take(1).tables().values()) == 2
