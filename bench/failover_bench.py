"""Failover time (issue 42 target 5): kill -9 of the coordinator's replica to the next committed
snapshot, against the session timeout plus one commit interval.

Two real replicas (Faust + Spark workers, a SQLite catalog) of one group on the embedded Tansu
broker or a real Apache Kafka broker (tests/support/kafka_broker.py), a producer at a steady
rate into a 6-partition topic, ``--interval-ms`` rounds and ``--session-ms`` sessions (not
given: the replicas' own default, 6 s on Tansu and 10 s on Kafka, read from their /status). Once
both replicas share the partitions and rounds commit, the replica running the coordinator (its
/status) is killed with SIGKILL, and the bench prints the survivor's timeline from the kill:
its source and control group rebalances (its log), the coordinator started on it and its
recovery done (its log), each round started after the kill (StartCommit on the control topic,
broker timestamps) and the next committed snapshot (the catalog's snapshot timestamps). After
the producer ends, every row is checked exact by key (DuckDB).

On Tansu a JoinGroup waits half the session timeout for other members before it answers (the
group's rebalance delay), so its rebalances after the kill cost about ``session / 2`` more than
on Kafka (hence the shorter default there: agents/faust_app.py)::

    .venv/bin/python bench/failover_bench.py [--broker tansu|kafka] [--interval-ms 5000] [--session-ms MS]
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import re
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from icesink.app.pizzas import pizza_values, produce
from icesink.app.replicas import ReplicaSet
from icesink.shared.catalogs import sqlite_catalog_properties
from icesink.shared.kafka_admin import ensure_topic
from tests.support.sinkrun import assert_exact, coordinator_status, wait_rows, wait_up, write_config

TOPIC, TABLE, GROUP = "fo-orders", "fo.orders", "fo-sink"
PARTITIONS = 6
#: Survivor log lines of the timeline, in the order they are looked for after the kill.
MARKS = (
    ("source group rebalance", re.compile(r"rebalanc|assignment|partitions assigned", re.I)),
    ("coordinator started", re.compile(r"coordinator started")),
    ("coordinator recovered", re.compile(r"coordinator epoch \d+ recovered")),
    ("partition resumed", re.compile(r"resumed \S+ at offset")),
)
_STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--broker", choices=("tansu", "kafka"), default="tansu")
    ap.add_argument("--interval-ms", type=int, default=5000)
    ap.add_argument("--session-ms", type=int, default=None,
                    help="consumer.session-timeout-ms (default: not set, the replicas' own for the broker)")
    ap.add_argument("--rate", type=int, default=300, help="records per second")
    ap.add_argument("--records", type=int, default=30_000)
    ap.add_argument("--keep", action="store_true", help="keep the run's directory (logs)")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="failover-bench-"))
    if args.broker == "kafka":
        from tests.support.kafka_broker import KafkaBroker

        broker: Any = KafkaBroker(tmp / "kafka")
    else:
        from icesink.app.embedded import EmbeddedBroker

        broker = EmbeddedBroker(tmp / "broker")
    broker.start()
    try:
        run(args, broker.bootstrap, tmp)
    finally:
        broker.stop()
        if not args.keep:
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)
        else:
            print(f"run directory kept: {tmp}")


def run(args: argparse.Namespace, bootstrap: str, tmp: Path) -> None:
    from pyiceberg.catalog import load_catalog

    props = sqlite_catalog_properties(tmp / "catalog")
    catalog = load_catalog("it", **props)
    catalog.create_namespace("fo")
    asyncio.run(ensure_topic(bootstrap, TOPIC, PARTITIONS))
    cfg = write_config(tmp / "sink.json", topics=TOPIC, tables=TABLE, bootstrap=bootstrap, catalog_props=props,
                       state_dir=tmp / "state", group=GROUP,
                       **{"iceberg.control.commit.interval-ms": args.interval_ms,
                          "consumer.session-timeout-ms": args.session_ms,
                          "iceberg.control.topic.replication-factor": 1})  # one broker (Kafka's default is 3)
    if args.session_ms is None:  # not set: the replicas choose
        config = json.loads(cfg.read_text())
        del config["consumer.session-timeout-ms"]
        cfg.write_text(json.dumps(config))
    values = pizza_values(args.records, seed=42)
    keys = {json.loads(v)["order_id"] for v in values}
    replicas = ReplicaSet(cfg, tmp / "logs")
    sender = threading.Thread(target=lambda: asyncio.run(
        produce(bootstrap, TOPIC, values, partitions=PARTITIONS, rate_per_s=args.rate)), daemon=True)
    try:
        replicas.start()
        replicas.start()
        wait_up(replicas, timeout_s=180)
        sender.start()
        coord = _settle(catalog, replicas, args)
        from tests.support.sinkrun import http_json

        sessions = {http_json(r.metrics_port).get("session_timeout_ms") for r in replicas.replicas.values()}
        if None in sessions or len(sessions) != 1:
            raise SystemExit(f"expected one session timeout in the replicas' /status, found {sessions}")
        session_ms = sessions.pop()
        print(f"{args.broker}: 2 replicas, {args.interval_ms} ms rounds, {session_ms} ms session "
              f"({'set' if args.session_ms is not None else 'not set: the replicas default'}), "
              f"{args.rate} records/s, {args.records:,} records")
        victim, survivor = coord.name, next(n for n in replicas.replicas if n != coord.name)
        survivor_log = replicas.replicas[survivor].log_path
        log_from = survivor_log.stat().st_size
        killed_at = time.time()
        replicas.kill(victim)
        print(f"killed {victim} (kill -9, it ran the coordinator); {survivor} survives")
        snap_at = _next_snapshot(catalog, killed_at, replicas, timeout_s=session_ms / 1000 * 6 + 120)
        target = session_ms / 1000 + args.interval_ms / 1000
        _timeline(survivor_log, log_from, killed_at, bootstrap, snap_at)
        print(f"kill -9 to the next committed snapshot: {snap_at - killed_at:.1f} s "
              f"(target: session + one interval = {target:.1f} s: {'met' if snap_at - killed_at <= target else 'NOT met'})")
        sender.join()
        wait_rows(catalog, replicas, (TABLE,), len(values), timeout_s=600)
    finally:
        replicas.stop_all()
    assert_exact(catalog, TABLE, keys)
    print(f"table exact: {len(keys):,} rows, no duplicate, no missing key")


def _settle(catalog: Any, replicas: ReplicaSet, args: argparse.Namespace) -> Any:
    """The coordinator's replica, once both replicas own partitions and rounds commit (three
    snapshots after the last rebalance settled)."""
    deadline = time.monotonic() + 300
    while True:
        replicas.check_alive()
        found = coordinator_status(replicas)
        owned = [_owned(r) for r in replicas.replicas.values()]
        if found is not None and all(owned):
            break
        assert time.monotonic() < deadline, f"no coordinator with both replicas owning partitions ({owned})"
        time.sleep(0.5)
    since = time.time()
    while len([s for s in _snapshots(catalog) if s > since]) < 3:
        replicas.check_alive()
        assert time.monotonic() < deadline, "rounds do not commit"
        time.sleep(0.5)
    found = coordinator_status(replicas)
    assert found is not None
    return found[0]


def _owned(replica: Any) -> int:
    from tests.support.sinkrun import http_json

    try:
        st = http_json(replica.metrics_port)
    except OSError:
        return 0
    return sum(1 for p in (st.get("partitions") or {}).values() if p.get("active"))


def _snapshots(catalog: Any) -> list[float]:
    """The table's snapshot timestamps (s), none if it is not created yet."""
    try:
        table = catalog.load_table(TABLE)
    except Exception:  # noqa: BLE001 - not created yet
        return []
    return [s.timestamp_ms / 1000 for s in table.metadata.snapshots]


def _next_snapshot(catalog: Any, after: float, replicas: ReplicaSet, timeout_s: float) -> float:
    deadline = time.monotonic() + timeout_s
    while True:
        later = [s for s in _snapshots(catalog) if s > after]
        if later:
            return min(later)
        replicas.check_alive()
        assert time.monotonic() < deadline, f"no snapshot committed {timeout_s:.0f} s after the kill"
        time.sleep(0.2)


def _timeline(log_path: Path, log_from: int, killed_at: float, bootstrap: str, snap_at: float) -> None:
    events: list[tuple[float, str]] = [(killed_at, "kill -9 of the coordinator's replica")]
    with log_path.open("rb") as handle:
        handle.seek(log_from)
        text = handle.read().decode(errors="replace")
    seen: dict[str, int] = {}
    for line in text.splitlines():
        m = _STAMP.match(line)
        if not m:
            continue
        at = dt.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
        if at < killed_at or at > snap_at + 1:
            continue
        for label, pattern in MARKS:
            if pattern.search(line) and seen.get(label, 0) < (3 if label.startswith("source") else 1):
                seen[label] = seen.get(label, 0) + 1
                events.append((at, f"{label}: {line[m.end():][:110]}"))
    for at, what in _control_timeline(bootstrap, killed_at):
        if at <= snap_at + 1:
            events.append((at, what))
    events.append((snap_at, "next committed snapshot (catalog)"))
    print("timeline (s after the kill):")
    for at, what in sorted(events):
        print(f"  {at - killed_at:>6.1f}  {what}")


def _control_timeline(bootstrap: str, after: float) -> list[tuple[float, str]]:
    """StartCommit and CommitComplete events on the control topic after ``after``, with the
    broker's record timestamps."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    from icesink.shared.protocol import CommitComplete, StartCommit, decode

    async def read() -> list[tuple[float, str]]:
        tp = TopicPartition(f"{GROUP}-control", 0)
        consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
        await consumer.start()
        out: list[tuple[float, str]] = []
        later = 0
        try:
            consumer.assign([tp])
            end = (await consumer.end_offsets([tp]))[tp]
            await consumer.seek_to_beginning(tp)
            while await consumer.position(tp) < end:
                for records in (await consumer.getmany(tp, timeout_ms=1000)).values():
                    for rec in records:
                        if rec.timestamp / 1000 < after:
                            continue
                        later += 1
                        try:
                            ev = decode(rec.value, offset=rec.offset)
                        except Exception:  # noqa: BLE001 - not an event of ours
                            continue
                        if isinstance(ev, StartCommit):
                            out.append((rec.timestamp / 1000, f"round started (StartCommit, epoch {ev.epoch})"))
                        elif isinstance(ev, CommitComplete):
                            out.append((rec.timestamp / 1000, f"round complete (CommitComplete, epoch {ev.epoch})"))
        finally:
            await consumer.stop()
        if not out:
            print(f"  (control topic: {later} records after the kill, no StartCommit or CommitComplete among them)")
        return out

    return asyncio.run(read())


if __name__ == "__main__":
    main()
