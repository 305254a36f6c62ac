"""bench/ingest_bench.py reads a round's write, answer and commits from the worker's log."""

from __future__ import annotations

import pytest

from bench.ingest_bench import commit_walls, cpu_floor, steady_note, warm_rounds_note, worker_timeline


def test_a_round_is_its_write_its_answer_and_its_commits_read_from_the_worker_log(tmp_path):
    log = tmp_path / "bench.log"
    log.write_text(
        "2026-11-26 00:00:10,000 INFO agents.rounds round r1: answered 4 partitions, 60000 rows in 200 files "
        "(200 DataWritten; written in 1.40 s, sent in 0.05 s)\n"
        "2026-11-26 00:00:10,500 INFO coordinator.service round r1 committed to db.t000: snapshot 1, 1 files, 300 rows\n"
        "2026-11-26 00:00:11,000 INFO coordinator.service round r1 committed to db.t001: snapshot 2, 1 files, 300 rows\n"
        # a worker before the answer's send time was logged
        "2026-11-26 00:00:20,000 INFO agents.rounds round r2: answered 4 partitions, 600 rows in 2 files "
        "(2 DataWritten; written in 0.30 s)\n"
        "2026-11-26 00:00:20,250 INFO coordinator.service round r2 committed to db.t000: snapshot 3, 1 files, 300 rows\n"
        # one that logs how long the round waited for its take
        "2026-11-26 00:00:30,000 INFO agents.rounds round r3: answered 4 partitions, 600 rows in 2 files "
        "(2 DataWritten; written in 0.50 s, sent in 0.01 s, taken 1.20 s after the round reached this replica)\n"
        "2026-11-26 00:00:30,500 INFO coordinator.service round r3 committed to db.t000: snapshot 4, 1 files, 300 rows\n"
    )
    walls = commit_walls(log)
    assert [w[:4] for w in walls] == [(1.40, 1.0, 200, 0.05), (0.30, 0.25, 2, 0.0), (0.50, 0.5, 2, 0.01)]
    assert walls[1][4] - walls[0][4] == 10.0  # when each round was answered


def test_warm_rounds_are_the_later_half_of_those_answered_while_producing():
    walls = [(9.0, 1.0, 200, 0.1, 100.0 + i) for i in range(2)]  # cold
    walls += [(w, 1.0, 200, 0.1, 102.0 + i) for i, w in enumerate((2.0, 3.0, 2.5))]  # warm
    walls.append((0.5, 0.5, 200, 0.1, 200.0))  # after the producer stopped
    assert warm_rounds_note(walls, 150.0) == [
        "    median round of the later half while producing (3 of 5 rounds): 3.60 s (write 2.50 s, commits 1.00 s)"]
    assert warm_rounds_note(walls, None) == []
    assert "too few rounds (1 while producing)" in warm_rounds_note(walls[:1], 150.0)[0]


def test_the_rate_after_the_first_committed_round_says_why_it_has_no_figure_when_that_round_held_every_row():
    assert steady_note([(12.0, 600_000), (15.0, 1_000_000)], 1_000_000)[0].startswith(
        "** (b): rows committed after the first committed round (12.0 s)")
    note = steady_note([(15.6, 1_000_000)], 1_000_000)
    assert "held all N rows" in note[0]
    assert steady_note([], 1_000_000) == []


def test_the_timeline_lists_early_writes_and_counts_them(tmp_path):
    from datetime import datetime

    log = tmp_path / "bench.log"
    log.write_text(
        "2026-11-26 00:00:09,000 INFO agents.rounds early write: 245728 rows of 6 partitions in 1 files, 1.69 s\n"
        "2026-11-26 00:00:09,500 INFO agents.rounds early write: 1000 rows of 2 partitions in 1 files, 0.10 s "
        "(void: a partition moved meanwhile; files deleted)\n"
        "2026-11-26 00:00:10,000 INFO agents.rounds round r1: answered 4 partitions, 246728 rows in 2 files "
        "(1 DataWritten; written in 0.00 s, sent in 0.00 s)\n"
    )
    started = datetime.strptime("2026-11-26 00:00:00,000", "%Y-%m-%d %H:%M:%S,%f").timestamp()
    lines = worker_timeline(log, started)
    assert lines[0] == "    9.0 s  early write:   245,728 rows in 1 files, 1.69 s"
    assert lines[1].endswith("0.10 s (void)")
    assert lines[-1].strip() == "1 rounds answered, 0 round commits logged, 2 early writes (246,728 rows)"


def test_the_timeline_of_many_tables_is_one_line_for_their_creation_and_one_per_rounds_commits(tmp_path):
    """--tables 200: 200 creations and 200 table commits a round were 400 lines of the
    timeline. Now each is one line (how many, first and last); a round's answer says how long
    it waited (behind an early write) and the catch-up request is a milestone."""
    from datetime import datetime

    lines = []
    for i in range(5):
        lines.append(f"2026-11-26 00:00:08,{100 + i * 100:03d} INFO agents.tables: created table db.t{i:03d} with schema "
                     "table {")
    lines += [
        "2026-11-26 00:00:11,500 INFO agents.ingest: a backlog read to the ends of this replica's partitions: round "
        "requested (iceberg.control.commit.catch-up; 383000 rows in no round yet)",
        "2026-11-26 00:00:16,000 INFO agents.rounds: round r1: answered 4 partitions, 600000 rows in 10 files "
        "(5 DataWritten; written in 2.00 s, sent in 0.10 s, taken 2.50 s after the round reached this replica)",
    ]
    lines += [f"2026-11-26 00:00:16,{200 + i * 100:03d} INFO coordinator.service: round r1 committed to db.t{i:03d}: "
              f"snapshot {i + 1}, 2 files, 120000 rows" for i in range(5)]
    log = tmp_path / "bench.log"
    log.write_text("\n".join(lines) + "\n")
    started = datetime.strptime("2026-11-26 00:00:00,000", "%Y-%m-%d %H:%M:%S,%f").timestamp()
    out = worker_timeline(log, started)
    assert out == [
        "    8.1 s  5 tables auto-created, the last at 8.5 s",
        "   11.5 s  backlog read to the partitions' ends: round requested (commit.catch-up)",
        "   16.0 s  answered round r1:   600,000 rows in 10 files, taken 2.50 s after it came",
        "   16.2 s  committed round r1 to 5 tables, the last at 16.6 s:  600,000 rows, 10 files",
        "            1 rounds answered, 5 round commits logged, 0 early writes (0 rows)",
    ]
    few = tmp_path / "few.log"
    few.write_text("\n".join(lines[:2] + lines[-2:]) + "\n")
    assert [line.split(" s  ", 1)[1] for line in worker_timeline(few, started)[:-1]] == [
        "table auto-created", "table auto-created", "committed round r1:  120,000 rows, 2 files",
        "committed round r1:  120,000 rows, 2 files"]


def test_the_start_up_timeline_names_imports_join_and_first_record_once(tmp_path):
    """Issue 42's start-up timeline: settings, imports, the group join (the first partition resumed, not
    each of them), the first record consumed (from the metrics), beside the other milestones."""
    from datetime import datetime

    log = tmp_path / "bench.log"
    log.write_text(
        "2026-11-26 00:00:00,700 INFO icesink: settings given (the rest are defaults): {}\n"
        "2026-11-26 00:00:02,400 INFO icesink.app.status: metrics on http://127.0.0.1:1/metrics, status on /status\n"
        "2026-11-26 00:00:03,200 INFO agents.worker: this replica is the leader: coordinator started\n"
        "2026-11-26 00:00:03,400 INFO agents.ownership: src[0] resumed at offset 0 (generation 1)\n"
        "2026-11-26 00:00:03,401 INFO agents.ownership: src[1] resumed at offset 0 (generation 1)\n"
    )
    started = datetime.strptime("2026-11-26 00:00:00,000", "%Y-%m-%d %H:%M:%S,%f").timestamp()
    lines = worker_timeline(log, started, consumed_at=3.6)
    assert [line.split(" s  ", 1)[1] for line in lines[:-1]] == [
        "settings read (the Spark session's start begins)", "the group join's imports done, metrics server up",
        "coordinator started",
        "first partition resumed (group joined, partitions assigned and claimed)",
        "first record consumed (icesink_records_consumed_total > 0)",
    ]


def test_the_committed_rows_poll_counts_what_the_tables_hold(tmp_path):
    """The benchmark polls the rows committed every 0.5 s while the worker runs, reading the
    catalog's pointers and only the metadata files that changed (loading 200 tables through
    pyiceberg took a large share of the worker's two cores): the rows pyiceberg counts."""
    import pyarrow as pa
    from pyiceberg.catalog import load_catalog

    from bench.ingest_bench import NAMESPACE, CommittedRows, committed_rows
    from icesink.shared.catalogs import sqlite_catalog_properties

    catalog = load_catalog("b2", **sqlite_catalog_properties(tmp_path))
    poll = CommittedRows(tmp_path / "catalog.db")
    assert poll() == 0  # no namespace yet
    catalog.create_namespace(NAMESPACE)
    rows = pa.table({"n": pa.array([1, 2, 3], pa.int64())})
    tables = [catalog.create_table(f"{NAMESPACE}.t{i}", rows.schema) for i in range(3)]
    assert poll() == 0  # created, nothing committed
    for i, table in enumerate(tables):
        for _ in range(i + 1):
            table.append(rows)
    assert poll() == committed_rows(catalog) == 18
    tables[0].append(rows)
    assert poll() == committed_rows(catalog) == 21
    # When the rows were reached: the write of the metadata file whose commit added them, not of
    # a later one that added none (a property set, an expiry).
    import os
    import time

    added = catalog.load_table(f"{NAMESPACE}.t0").metadata_location.removeprefix("file://")
    assert poll.reached_wall == os.stat(added).st_mtime
    time.sleep(0.05)
    with catalog.load_table(f"{NAMESPACE}.t0").transaction() as tx:
        tx.set_properties({"k": "v"})
    assert catalog.load_table(f"{NAMESPACE}.t0").metadata_location.removeprefix("file://") != added
    assert poll() == 21 and poll.reached_wall == os.stat(added).st_mtime


@pytest.mark.parametrize("fmt", ["avro", "protobuf", "json-schema"])
def test_pizza_events_framed_for_a_registry_decode_to_the_json_events(fmt: str) -> None:
    """bench/ingest_bench.py --format: the same events in each format (bench/pizza_formats.py)."""
    import asyncio
    import json

    from agents.formats.registry_values import RegistryValues
    from bench.pizza_formats import SCHEMAS, framed
    from icesink.app.pizzas import pizza_values

    class Registered:
        type, text, references = SCHEMAS[fmt][1], SCHEMAS[fmt][0], ()

    async def schema_of(schema_id: int) -> Registered | None:
        return Registered() if schema_id == 12 else None

    values = pizza_values(50, seed=3)
    frames = framed(values, fmt, 12)
    decoder = RegistryValues(schema_of, {"json-schema": "json"}.get(fmt, fmt))
    asyncio.run(decoder.prepare(frames))
    schema = decoder.table_schema(frames)
    assert schema is not None
    from pyiceberg.io.pyarrow import schema_to_pyarrow

    out = decoder.convert(frames, schema_to_pyarrow(schema, include_field_ids=False))
    assert not out.rejects and out.table.to_pylist() == [json.loads(v) for v in values]


def test_a_jvms_threads_are_told_apart_by_their_names():
    from bench.benchlib import jvm_thread_part

    # the names as /proc shows them: 15 characters at most
    assert jvm_thread_part("Executor task l") == "write tasks"
    assert jvm_thread_part("C2 CompilerThre") == "C2 compiler"
    assert jvm_thread_part("C1 CompilerThre") == "C1 compiler"
    assert jvm_thread_part("VM Thread") == "VM thread (serial collector)"
    assert jvm_thread_part("GC Thread#0") == jvm_thread_part("G1 Refine#0") == "collector threads"
    assert jvm_thread_part("Thread-3") == "py4j calls"
    assert jvm_thread_part("java") == "main thread"
    assert jvm_thread_part("dispatcher-even") == "other threads"


def test_the_sampler_reads_each_thread_of_a_java_process_and_sums_them_by_part():
    """A process named ``java`` (a copy of this interpreter under that name) with a busy thread:
    its threads are read from /proc and summed by part."""
    import os
    import subprocess
    import sys
    import tempfile
    import time

    from bench.benchlib import RssSampler

    with tempfile.TemporaryDirectory() as directory:
        java = os.path.join(directory, "java")
        os.symlink(sys.executable, java)
        busy = ("import threading, time\n"
                "def spin():\n"
                "    while time.thread_time() < 0.6: pass\n"
                "t = threading.Thread(target=spin); t.start(); t.join(); time.sleep(30)\n")
        child = subprocess.Popen([java, "-c", busy])
        try:
            sampler = RssSampler(os.getpid())
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                sampler.sample(threads=True)
                if sum(sampler.jvm_parts().values()) >= 0.4:
                    break
                time.sleep(0.1)
            threads = {tid for pid, tid in sampler.jvm_threads if pid == child.pid}
            assert child.pid in threads and len(threads) == 2  # its main thread and the busy one
            parts = sampler.jvm_parts()
            assert set(parts) == {"main thread"}  # both are named "java": Python names no thread
            assert parts["main thread"] >= 0.4
        finally:
            child.kill()
            child.wait()


def test_the_floor_is_the_cpu_used_over_the_cores_against_when_the_run_ended_and_the_target_line():
    assert cpu_floor(13.4, 2, 8.1) == [
        "  The floor on these 2 CPUs: 13.4 CPU-s of worker and broker / 2 = 6.7 s; the last row came at 8.1 s "
        "(the cores 83% busy with them)."]
    # 2M records against a baseline of 171,167 records/s: 0.8 of it ends by 14.6 s
    floor_later = cpu_floor(30.0, 2, 16.7, baseline_rate=171_167, n=2_000_000)[1]
    room = cpu_floor(26.0, 2, 16.7, baseline_rate=171_167, n=2_000_000)[1]
    assert floor_later == ("  0.8 of the baseline's rate from process start asks for the last row by 14.6 s: "
                           "the floor alone is later.")
    assert room.endswith("by 14.6 s: 1.6 s above the floor.")


def test_the_floor_after_the_first_record_bounds_the_rate_from_first_record_to_last_row():
    lines = cpu_floor(30.0, 2, 16.0, startup=(4.0, 10.0), n=600_000)
    assert lines[1] == ("    after the first record (4.0 s): 20.0 CPU-s / 2 = 10.0 s of the 12.0 s it took; at most "
                        "60,000 records/s from first record to last row with this work.")
    assert len(cpu_floor(30.0, 2, 16.0, startup=(16.0, 30.0), n=600_000)) == 1  # every row came at once
