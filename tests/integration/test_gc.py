"""``icesink gc`` against a real SQLite catalog and broker: it deletes old unreferenced files and
never a committed one (including files only older snapshots reference), nor a file named by an
in-flight DataWritten in the control log, nor a young file."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

pytestmark = pytest.mark.integration


def _plain(uri: str) -> Path:
    from icesink.shared.iceberg import local_path

    return local_path(uri)


def _write(path: Path, rows: range) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"id": pa.array(list(rows), pa.int64())}), path)


def _age(path: Path, seconds: float) -> None:
    t = time.time() - seconds
    os.utime(path, (t, t))


def test_gc_deletes_only_old_unreferenced_unannounced_files(broker, catalog_props, tmp_path):
    from pyiceberg.catalog import load_catalog
    from pyiceberg.expressions import LessThan

    from icesink.shared.control import ControlProducer, ensure_control_topic
    from icesink.shared.protocol import DataWritten, FileInfo
    from tests.support import duck

    catalog = load_catalog("gc", **catalog_props)
    catalog.create_namespace("db")
    table = catalog.create_table("db.t", schema=pa.schema([pa.field("id", pa.int64())]))
    for start in (0, 100, 200):  # three snapshots, three committed files
        table.append(pa.table({"id": pa.array(range(start, start + 100), pa.int64())}))
    table.delete(LessThan("id", 100))  # a fourth snapshot: file 0 only referenced by older ones
    committed = {_plain(e.data_file.file_path) for s in table.snapshots()
                 for m in s.manifests(table.io) for e in m.fetch_manifest_entry(table.io, discard_deleted=False)}
    assert len(committed) >= 3
    for p in committed:
        _age(p, 7200)

    data = _plain(table.location()) / "data"
    old_orphan, young_orphan, in_flight = (data / "crashed" / f"{n}-{uuid.uuid4()}.parquet"
                                           for n in ("old", "young", "announced"))
    for p in (old_orphan, young_orphan, in_flight):
        _write(p, range(5))
    _age(old_orphan, 7200)
    _age(in_flight, 7200)

    control = f"gc-control-{uuid.uuid4().hex[:6]}"

    async def announce() -> None:
        await ensure_control_topic(broker.bootstrap, control, {})
        producer = ControlProducer(broker.bootstrap, control, "gc-group", {})
        await producer.start()
        try:
            await producer.send(DataWritten("r1", "resp", "w1", "db.t", (
                FileInfo(path=f"file://{in_flight}", record_count=5, size_bytes=in_flight.stat().st_size, spec_id=0),)))
        finally:
            await producer.stop()

    asyncio.run(announce())
    cfg = tmp_path / "sink.json"
    cfg.write_text(json.dumps({
        "topics": "unused", "iceberg.tables": "db.t", "iceberg.catalog": "gc",
        **{f"iceberg.catalog.{k}": v for k, v in catalog_props.items()},
        "iceberg.control.topic": control, "group.id": "gc-group", "bootstrap.servers": broker.bootstrap,
    }))

    def gc(*flags: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "icesink", "gc", "--config", str(cfg), "--older-than", "1h", *flags],
                              capture_output=True, text=True, timeout=120, check=True)

    listed = gc()
    assert [line.split("\t")[1] for line in listed.stdout.splitlines()] == [str(old_orphan)], listed.stdout
    assert "1 orphan files" in listed.stderr and old_orphan.exists()  # listing deletes nothing

    deleted = gc("--delete")
    assert "deleted 1 of 1" in deleted.stderr, deleted.stderr
    assert not old_orphan.exists()
    assert young_orphan.exists() and in_flight.exists()
    assert all(p.exists() for p in committed)

    # Every snapshot still reads in full with an engine that is not ours.
    table = catalog.load_table("db.t")
    assert duck.count_and_distinct(table.metadata_location, "id") == (200, 200)
    assert gc().stdout == ""


def test_gc_reads_the_control_log_from_the_checkpoint_or_the_tables_state_never_from_the_start(
        broker, catalog_props, tmp_path):
    """The first events of a group's control log name two old files (responses long settled:
    whatever they named is committed or dropped). The group then commits rounds: its checkpoint
    and the table's state replay from later. ``icesink gc --delete`` reads the log from the
    checkpoint, so the file named only before it is not protected and goes. With the
    coordinator group's offset deleted (expired offsets), it reads from the table's state, not
    from offset 0: the second file goes too."""
    from pyiceberg.catalog import load_catalog

    from icesink.app.pizzas import PIZZA_SCHEMA, pizza_values, produce
    from icesink.app.replicas import ReplicaSet
    from icesink.shared.control import ControlProducer, ensure_control_topic
    from icesink.shared.kafka_admin import ensure_topic
    from icesink.shared.protocol import DataWritten, FileInfo, encode
    from tests.integration.test_control_log import _delete_groups
    from tests.support.sinkrun import total_rows, wait_rows, write_config, write_control

    group, name = "gcl", "gcl.pizzas"
    catalog = load_catalog("it", **catalog_props)
    catalog.create_namespace("gcl")
    data = _plain(catalog.create_table(name, schema=PIZZA_SCHEMA).location()) / "data"
    first, second = data / "settled" / "first.parquet", data / "settled" / "second.parquet"

    async def announce() -> None:
        await ensure_control_topic(broker.bootstrap, f"{group}-control", {}, replication_factor=1)
        producer = ControlProducer(broker.bootstrap, f"{group}-control", group, {})
        await producer.start()
        try:
            for i, p in enumerate((first, second)):
                await producer.send(DataWritten("r0", f"resp-{i}", "w0", name, (
                    FileInfo(path=f"file://{p}", record_count=5, size_bytes=100, spec_id=0),)))
        finally:
            await producer.stop()

    asyncio.run(announce())
    asyncio.run(ensure_topic(broker.bootstrap, f"{group}-src", 2))
    cfg = write_config(tmp_path / "sink.json", topics=f"{group}-src", tables=name, bootstrap=broker.bootstrap,
                       catalog_props=catalog_props, state_dir=tmp_path / "state", group=group)
    replicas = ReplicaSet(cfg, tmp_path / "logs")
    try:
        replicas.start("w1")
        asyncio.run(produce(broker.bootstrap, f"{group}-src", pizza_values(1000, seed=61), partitions=2))
        wait_rows(catalog, replicas, (name,), 1000, timeout_s=300)
        time.sleep(6)  # more rounds: the checkpoint's replay start moves past the first events
    finally:
        replicas.stop_all()
    assert total_rows(catalog, name) == 1000

    def gc() -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "icesink", "gc", "--config", str(cfg), "--older-than", "1h",
                               "--delete"], capture_output=True, text=True, timeout=120, check=True)

    _write(first, range(5))
    _age(first, 7200)
    done = gc()
    assert not first.exists(), done.stderr
    assert "of the checkpoint at control offset" in done.stderr, done.stderr

    _delete_groups(broker.bootstrap, [f"{group}-coordinator"])
    _write(second, range(5))
    _age(second, 7200)
    done = gc()
    assert not second.exists(), f"gc read the control log from its start:\n{done.stderr}"
    assert "tables' sink state" in done.stderr, done.stderr

    # An outsider's DataWritten (unsigned) naming an old file: gc checks the group's signature,
    # from the catalog as its replicas do, so the forged event protects nothing.
    third = data / "settled" / "third.parquet"
    write_control(broker.bootstrap, f"{group}-control", [(group.encode(), encode(DataWritten("r9", "forged", "w0", name, (
        FileInfo(path=f"file://{third}", record_count=5, size_bytes=100, spec_id=0),))))])
    _write(third, range(5))
    _age(third, 7200)
    done = gc()
    assert not third.exists(), f"gc kept a file only a forged event named:\n{done.stderr}"
