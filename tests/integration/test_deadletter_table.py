"""deadletter.table with real processes (Tansu, Faust + Spark workers, SQLite catalog, pyiceberg):

Good and bad records (a value a long column cannot take, malformed JSON) into two tables, with
the dead letters going to a table only (no topic). The first replica is killed (SIGKILL) right
after a round's dead letters were taken, before it reports the round's offsets; its successor
reads the same records again. The data tables hold every good record once, and the dead-letter
table every bad record once: its rows are committed with the round that passes their offsets.
"""

from __future__ import annotations

import asyncio
import json
import signal
import time
from collections import Counter
from typing import Any

import pytest

pytestmark = pytest.mark.integration

TABLES = ("rp.a", "rp.b")
DL = "rp.dead"


def _setup(broker: Any, catalog_props: dict[str, str], topic: str) -> Any:
    from pyiceberg.catalog import load_catalog
    from pyiceberg.schema import Schema
    from pyiceberg.types import LongType, NestedField, StringType

    from icesink.shared.kafka_admin import ensure_topic

    catalog = load_catalog("it", **catalog_props)
    catalog.create_namespace("rp")
    schema = Schema(NestedField(1, "id", StringType(), required=True), NestedField(2, "n", LongType(), required=False))
    for name in TABLES:
        catalog.create_table(name, schema=schema)
    asyncio.run(ensure_topic(broker.bootstrap, topic, 2))
    return catalog


def _records(count: int) -> tuple[list[tuple[int, bytes, bytes]], set[str], list[int]]:
    """(partition, key, value); the good ids; the indexes of the bad records."""
    records, good, bad = [], set(), []
    for i in range(count):
        if i % 23 == 4:
            bad.append(i)
            # "ident" where the tables want "id" (a replay with a fixed transform takes them), or no JSON
            value = (b'{"ident": "bad-' + str(i).encode() + b'", "n": 1}') if i % 2 else b'{"id": "broken", "n": '

        else:
            good.add(f"g-{i}")
            value = json.dumps({"id": f"g-{i}", "n": i}).encode()
        records.append((i % 2, f"k-{i}".encode(), value))
    return records, good, bad


def _send(bootstrap: str, topic: str, records: list[tuple[int, bytes, bytes]]) -> list[int]:
    from tests.integration.test_deadletter import _send as send

    return send(bootstrap, topic, [(p, k, v, [("origin", k)]) for p, k, v in records])


def dead_rows(catalog: Any) -> Counter[tuple[str, int, int]]:
    rows = catalog.load_table(DL).scan(selected_fields=("topic", "partition", "offset")).to_arrow().to_pylist()
    return Counter((r["topic"], r["partition"], r["offset"]) for r in rows)


@pytest.mark.timeout(400)
def test_dead_letters_land_in_their_table_once_across_a_kill(broker, catalog_props, tmp_path):
    from icesink.app.replicas import ReplicaSet
    from tests.support.sinkrun import assert_exact, wait_rows, write_config

    topic = "rp-in"
    catalog = _setup(broker, catalog_props, topic)
    records, good, bad = _records(900)
    offsets = _send(broker.bootstrap, topic, records)
    state = tmp_path / "state"
    cfg = write_config(tmp_path / "sink.json", topics=topic, tables=",".join(TABLES), bootstrap=broker.bootstrap,
                       catalog_props=catalog_props, state_dir=state, group="rp-sink",
                       **{"deadletter.table": DL, "iceberg.tables.auto-create-enabled": "false",
                          "fault.crash-at": "worker.after-dead-letters"})
    replicas = ReplicaSet(cfg, tmp_path / "logs")
    try:
        first = replicas.start("w1")
        deadline = time.monotonic() + 150
        while first.alive:
            assert time.monotonic() < deadline, "the replica never reached worker.after-dead-letters"
            time.sleep(0.5)
        assert first.proc.returncode == -signal.SIGKILL and (state / "fault-worker.after-dead-letters.fired").exists()
        replicas.replicas.pop("w1").log_handle.close()
        replicas.start("w2")
        wait_rows(catalog, replicas, (*TABLES, DL), {**dict.fromkeys(TABLES, len(good)), DL: len(bad)}, timeout_s=150)
        for name in TABLES:
            assert_exact(catalog, name, good, key="id")
        expected = Counter((topic, records[i][0], offsets[i]) for i in bad)
        assert dead_rows(catalog) == expected
        row = next(r for r in catalog.load_table(DL).scan().to_arrow().to_pylist() if r["offset"] == offsets[bad[1]])
        i = bad[1]
        assert (row["key"], row["value"], row["headers"]) == (records[i][1], records[i][2],
                                                              [{"key": "origin", "value": records[i][1]}])
        assert (row["reason"], row["field"], row["tables"], row["connector"]) == ("missing-required", "id", "rp.a,rp.b",
                                                                                  "rp-sink")
        assert row["timestamp"] is not None
    finally:
        replicas.stop_all()

    # Replay with a transform that fixes the "ident" ones; killed (SIGKILL) right after its first
    # table's commit, then run again: each table holds them once; a third run adds nothing.
    fixed = {f"bad-{i}" for i in bad if i % 2}
    fix = ["--set", "transforms=fix", "--set", "transforms.fix.type=org.apache.kafka.connect.transforms.ReplaceField$Value",
           "--set", "transforms.fix.renames=ident:id"]
    killed = _replay(cfg, *fix, "--set", "fault.crash-at=replay.after-table-commit")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    counts = {name: len(catalog.load_table(name).scan().to_arrow()) for name in TABLES}
    assert sorted(counts.values()) == [len(good), len(good) + len(fixed)], counts  # one table done, one not
    done = _replay(cfg, *fix)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"{len(bad) - len(fixed)} failed again" in done.stderr
    for name in TABLES:
        assert_exact(catalog, name, good | fixed, key="id")
    snapshots = {name: catalog.load_table(name).current_snapshot().snapshot_id for name in TABLES}
    again = _replay(cfg, *fix)
    assert again.returncode == 0 and "rows added" not in again.stderr, again.stderr[-3000:]
    assert {name: catalog.load_table(name).current_snapshot().snapshot_id for name in TABLES} == snapshots
    assert dead_rows(catalog) == expected  # the dead letters stay where they were
    print(killed.stderr.splitlines()[-1], done.stderr.splitlines()[-1], again.stderr.splitlines()[-1], sep="\n")


def _replay(cfg: Any, *args: str) -> Any:
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "icesink", "deadletters", "replay", "--config", str(cfg), *args],
                          capture_output=True, text=True, timeout=180)


@pytest.mark.timeout(600)
def test_replay_beside_a_running_sink_of_the_same_group(broker, catalog_props, tmp_path):
    """``icesink deadletters replay`` while a worker of the same group runs and commits new
    records into the same table (docs/deadletters.md allows it: the replay is one more writer, its
    commit retried on a conflict): both commit (a sink round lands on top of the replay's
    snapshot), and the table holds each good record once, each fixed letter once; a replay run
    again, the sink still running, adds nothing."""
    import subprocess
    import threading

    from pyiceberg.catalog import load_catalog
    from pyiceberg.schema import Schema
    from pyiceberg.types import LongType, NestedField, StringType

    from icesink.app.replicas import ReplicaSet
    from icesink.app.rewind import MAINTENANCE_KEY
    from icesink.shared.kafka_admin import ensure_topic, group_offset
    from icesink.shared.protocol.summary import GROUP
    from tests.support.sinkrun import assert_exact, wait_rows, write_config

    topic, table, dl, group = "rl-in", "rl.a", "rl.dead", "rl-sink"
    catalog = load_catalog("it", **catalog_props)
    catalog.create_namespace("rl")
    catalog.create_table(table, schema=Schema(NestedField(1, "id", StringType(), required=True),
                                              NestedField(2, "n", LongType(), required=False)))
    asyncio.run(ensure_topic(broker.bootstrap, topic, 2))
    records, good, bad = _records(300)
    _send(broker.bootstrap, topic, records)
    cfg = write_config(tmp_path / "sink.json", topics=topic, tables=table, bootstrap=broker.bootstrap,
                       catalog_props=catalog_props, state_dir=tmp_path / "state", group=group,
                       **{"deadletter.table": dl, "iceberg.tables.auto-create-enabled": "false"})
    fixed = {f"bad-{i}" for i in bad if i % 2}
    fix = ["--set", "transforms=fix", "--set", "transforms.fix.type=org.apache.kafka.connect.transforms.ReplaceField$Value",
           "--set", "transforms.fix.renames=ident:id"]
    later = [(i % 2, f"k-{i}".encode(), json.dumps({"id": f"h-{i}", "n": i}).encode()) for i in range(300, 700)]
    replicas = ReplicaSet(cfg, tmp_path / "logs")
    try:
        replicas.start("w1")
        wait_rows(catalog, replicas, (table, dl), {table: len(good), dl: len(bad)}, timeout_s=200)

        def flow() -> None:  # new records all through the replay: the sink commits a round every 2 s
            for start in range(0, len(later), 20):
                _send(broker.bootstrap, topic, later[start:start + 20])
                time.sleep(1.5)

        producer = threading.Thread(target=flow)
        producer.start()
        held = tmp_path / "state" / "hold-replay.before-table-commit.reached"
        running = _replay_start(cfg, *fix, "--set", "fault.hold-at=replay.before-table-commit")
        try:  # the replay holds after loading the table; a sink round commits on top; then its commit conflicts
            deadline = time.monotonic() + 120
            while not held.exists():
                assert running.poll() is None and time.monotonic() < deadline, running.communicate()
                time.sleep(0.2)
            loaded = catalog.load_table(table).current_snapshot().snapshot_id
            while catalog.load_table(table).current_snapshot().snapshot_id == loaded:
                assert time.monotonic() < deadline, "no sink round while the replay was held"
                replicas.check_alive()
                time.sleep(0.5)
            held.with_suffix(".release").touch()
            out, err = running.communicate(timeout=180)
        finally:
            producer.join()
            if running.poll() is None:
                running.kill()
        first = subprocess.CompletedProcess(running.args, running.returncode, out, err)
        assert first.returncode == 0, first.stderr[-3000:]
        # the sink's round landed between the replay's load and its commit: retried on the refreshed table
        assert "Commit failed due to a concurrent update, retrying" in first.stderr, first.stderr[-3000:]
        assert f"{table}: {len(fixed)} rows added" in first.stderr, first.stderr[-3000:]
        def replays() -> list[Any]:  # snapshots neither a sink round nor its compaction made
            return [s for s in catalog.load_table(table).snapshots()
                    if not {GROUP, MAINTENANCE_KEY} & set((s.summary or {}).additional_properties)]

        replayed = replays()
        assert len(replayed) == 1, [(s.snapshot_id, s.summary) for s in replayed]

        expected = good | fixed | {f"h-{i}" for i in range(300, 700)}
        wait_rows(catalog, replicas, (table,), len(expected), timeout_s=200)
        ends = dict.fromkeys((0, 1), 350)  # 350 records per partition: offsets 0..349
        deadline = time.monotonic() + 120
        while {p: asyncio.run(group_offset(broker.bootstrap, group, topic, p)) for p in ends} != ends:
            assert time.monotonic() < deadline, "the sink never committed the last records"
            replicas.check_alive()
            time.sleep(1)
        history = [s for s in catalog.load_table(table).snapshots()]
        after = history[[s.snapshot_id for s in history].index(replayed[0].snapshot_id) + 1:]
        assert any(GROUP in (s.summary or {}).additional_properties for s in after), "no sink round after the replay"

        again = _replay(cfg, *fix)  # the sink still running
        assert again.returncode == 0 and "rows added" not in again.stderr, again.stderr[-3000:]
        assert f"{table}: {len(fixed)} letters already replayed, skipped" in again.stderr, again.stderr[-3000:]
        assert [s.snapshot_id for s in replays()] == [replayed[0].snapshot_id]  # no second replay commit
    finally:
        replicas.stop_all()
    assert_exact(catalog, table, expected, key="id")  # DuckDB: count and key set
    ids = catalog.load_table(table).scan(selected_fields=("id",)).to_arrow()["id"].to_pylist()
    assert Counter(ids) == Counter(expected)  # pyiceberg
    print(first.stderr.splitlines()[-1], again.stderr.splitlines()[-1], sep="\n")


def _replay_start(cfg: Any, *args: str) -> Any:
    import subprocess
    import sys

    return subprocess.Popen([sys.executable, "-m", "icesink", "deadletters", "replay", "--config", str(cfg), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
