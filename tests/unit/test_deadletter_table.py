"""deadletter.table: the key's checks, the rows' schema, and dead letters buffered as rows of
the chunk that holds their offsets (so the round that covers a bad record commits its row)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from pyiceberg.io.pyarrow import schema_to_pyarrow

from agents.deadletter import Letter
from icesink.shared.deadletter_table import SCHEMA, letter_rows
from icesink.shared.errors import ConfigError
from tests.unit.test_deadletter import (
    DLQ, ROUTED, TP, FakeProducer, Msg, fan_out_stub, routed_fetch, run, settings, value, worker_stub,
)

DL = "dead.letters"
ARROW = schema_to_pyarrow(SCHEMA)


def with_table(targets: dict[str, Any]) -> dict[str, Any]:
    return {**targets, DL: SimpleNamespace(arrow_schema=ARROW, keys=None)}


def test_the_key_is_a_table_name_and_needs_tolerance_all(tmp_path):
    s = settings(tmp_path, **{"deadletter.table": DL})
    assert s.deadletter_table == DL and s.tolerate_errors is True  # as a dead-letter topic does
    assert settings(tmp_path, **{"deadletter.table": " "}).deadletter_table is None
    for bad in ("letters", "db.a", "a..b", "a b.c"):  # no namespace, a routed table, not a name
        with pytest.raises(ConfigError, match="deadletter.table"):
            settings(tmp_path, **{"deadletter.table": bad})
    with pytest.raises(ConfigError, match="deadletter.table.*errors.tolerance=all"):
        settings(tmp_path, **{"deadletter.table": DL, "errors.tolerance": "none"})


def test_rows_have_the_fixed_schema_with_origin_key_value_and_own_headers():
    letters = [
        Letter(b"k", b"{bad", (("h", b"1"), ("__connect.errors.topic", b"t")), "t", 2, 7, "malformed",
               "malformed JSON", None, None, 1_700_000_000_123, (("h", b"1"),)),
        Letter(None, None, (), "t", 0, 9, "uncoercible", "cannot coerce", "a.b", "db.a,db.b"),
    ]
    rows = letter_rows(letters, "grp", ARROW)
    assert rows.schema.equals(ARROW)
    got = rows.to_pylist()
    assert [(r["topic"], r["partition"], r["offset"], r["key"], r["value"]) for r in got] == [
        ("t", 2, 7, b"k", b"{bad"), ("t", 0, 9, None, None)]
    assert got[0]["headers"] == [{"key": "h", "value": b"1"}] and got[1]["headers"] == []
    assert got[0]["timestamp"].timestamp() == 1_700_000_000.123 and got[1]["timestamp"] is None
    assert [(r["reason"], r["field"], r["tables"], r["connector"]) for r in got] == [
        ("malformed", None, None, "grp"), ("uncoercible", "a.b", "db.a,db.b", "grp")]


def test_bad_records_are_rows_of_the_dead_letter_table_in_the_chunk_of_their_offsets(tmp_path):
    producer = FakeProducer()
    w = worker_stub(tmp_path, producer, targets=with_table({"db.a": worker_stub(tmp_path, None).targets["db.a"]}),
                    **DLQ, **{"deadletter.table": DL})
    st = w.buffers.partitions[TP]
    run(w.ingest.buffer(st, [Msg(0, b'{"order_id":"a","store_id":1}'), Msg(1, b'{"order_id":"b","store_id":"x"}')]))
    run(w.ingest.buffer(st, [Msg(2, b'{"order_id":"c","store_id":2}')]))  # good only: no dead-letter rows
    run(w.ingest.buffer(st, [Msg(3, b'{"order_id":'), Msg(4, b'{"order_id":"' + b"z" * 80 + b'"}')]))
    assert [list(c.tables) for c in st.chunks] == [["db.a", DL], ["db.a"], [DL]]
    snap = w.buffers.take(1)
    assert [(r.start, r.end) for r in snap.ranges] == [(0, 5)]
    rows = snap.tables()[DL].to_pylist()
    assert [(r["offset"], r["reason"], r["field"], r["tables"]) for r in rows] == [
        (1, "uncoercible", "store_id", "db.a"), (3, "malformed", None, "db.a"), (4, "too-large", None, None)]
    assert rows[0]["headers"] == [{"key": "trace", "value": b"t1"}]  # its own, not the context headers
    assert len(producer.sent) == 3  # the topic still gets them


def test_without_a_topic_the_table_alone_takes_them_and_no_file_is_written(tmp_path):
    w = worker_stub(tmp_path, None, targets=with_table({"db.a": worker_stub(tmp_path, None).targets["db.a"]}),
                    **{"deadletter.table": DL})
    run(w.ingest.buffer(w.buffers.partitions[TP], [Msg(0, b"nope"), Msg(1, b'{"order_id":"a","store_id":1}')]))
    snap = w.buffers.take(1)
    assert snap.tables()[DL].column("offset").to_pylist() == [0]
    assert not (tmp_path / "deadletter").exists()
    assert value(w.metrics, "icesink_records_deadlettered_total", topic="orders", reason="malformed") == 1


def test_a_fan_out_fetch_carries_its_dead_letters_too(tmp_path):
    names = ["db.a", "db.b"]
    w = fan_out_stub(tmp_path, FakeProducer(), names)
    w.settings = w.ingest.settings = w.settings.model_copy(update={"deadletter_table": DL})
    w.targets[DL] = SimpleNamespace(arrow_schema=ARROW, keys=None)
    st = w.buffers.partitions[TP]
    for msgs in (routed_fetch(0, [("db.a", "a1", 1), ("db.b", "b1", 2)]),
                 routed_fetch(2, [("db.a", "a2", "x"), ("db.b", "b2", 3), (None, "n", 4)])):
        run(w.ingest.buffer(st, msgs))
    assert any(c.fanout is not None and DL in c.names() for c in st.chunks)
    tables = w.buffers.take(1).tables()
    assert sorted(tables[DL].column("offset").to_pylist()) == [2, 4]
    assert tables["db.a"].column("order_id").to_pylist() == ["a1"] and tables["db.a"].schema.equals(ROUTED)
