"""Early and idle rounds with real processes (Kafka broker fixture, one Faust + Spark worker,
SQLite catalog; docs/commits.md, "When a round starts").

- ``iceberg.control.commit.max-records``: with a ten-minute interval, a burst of 20k records
  makes rounds long before the interval, each after the worker's CommitRequest, with no
  partition paused (the buffers stay far below ``buffer.max-bytes``). The worker is killed
  (kill -9) after the first early rounds and started again; the tail (below the threshold) lands
  on one request of the test; the table then holds every key exactly once.
- ``iceberg.control.commit.idle-interval-ms``: with 2 s rounds and a ten-minute idle interval,
  an idle sink starts at most one round after the round that committed its data (the idle one)
  instead of one every 2 s; records produced later land at once, in a round that the worker's
  own request (after the idle round) started, not the idle interval's.
- ``iceberg.control.commit.catch-up`` (on by default): a backlog larger than the buffers, read
  by a fresh worker with a ten-minute interval: rounds of full buffers answered behind the
  backlog, then the tail (below the buffer bound, which alone would wait the interval) in a
  round the worker asked for once it had read every partition to its end.
"""

from __future__ import annotations

import asyncio
import json
import time

import pytest

pytestmark = pytest.mark.integration

PARTITIONS = 3
TEN_MINUTES_MS = 600_000


def _running(replicas, r, partitions: int) -> None:
    from tests.support.sinkrun import http_json

    deadline = time.monotonic() + 180
    while True:
        replicas.check_alive()
        try:
            st = http_json(r.metrics_port)
        except OSError:
            st = None
        if st and st.get("phase") == "running" and len(st["partitions"]) == partitions \
                and all(p["active"] for p in st["partitions"].values()):
            return
        assert time.monotonic() < deadline, f"replica not running with active partitions: {st}"
        time.sleep(0.5)


def _ask_round(bootstrap: str, catalog, group: str) -> None:
    from icesink.shared.control import ControlProducer
    from icesink.shared.protocol import CommitRequest
    from tests.support.sinkrun import group_key

    async def ask() -> None:
        p = ControlProducer(bootstrap, f"{group}-control", group, {}, group_key(catalog, group))
        await p.start()
        try:
            await p.send(CommitRequest("test-flush", 0))
        finally:
            await p.stop()

    asyncio.run(ask())


def _rounds_after_requests(log, worker: str) -> tuple[int, int]:
    """(rounds, rounds started right after a request of ``worker``) in the control log."""
    from icesink.shared.protocol import CommitRequest, StartCommit

    rounds = asked_rounds = 0
    asked = False
    for ev in log:
        if isinstance(ev, CommitRequest) and ev.worker == worker:
            asked = True
        elif isinstance(ev, StartCommit):
            rounds += 1
            asked_rounds += asked
            asked = False
    return rounds, asked_rounds


@pytest.mark.timeout(600)
def test_max_records_makes_early_rounds_and_the_table_exact_through_a_kill(broker, catalog_props, tmp_path):
    from pyiceberg.catalog import load_catalog

    from icesink.app.pizzas import pizza_values, produce
    from icesink.app.replicas import ReplicaSet
    from icesink.shared.kafka_admin import ensure_topic
    from tests.support.sinkrun import assert_exact, control_events, metric, total_rows, write_config

    topic, table, group = "mr-pizzas", "mr.pizzas", "mr-sink"
    records, max_records = 20_000, 3_000
    catalog = load_catalog("it", **catalog_props)
    catalog.create_namespace("mr")
    asyncio.run(ensure_topic(broker.bootstrap, topic, PARTITIONS))
    cfg = write_config(
        tmp_path / "sink.json", topics=topic, tables=table, bootstrap=broker.bootstrap,
        catalog_props=catalog_props, state_dir=tmp_path / "state", group=group,
        **{"iceberg.control.commit.max-records": max_records, "consumer.max-batch": 1000,
           "iceberg.control.commit.interval-ms": TEN_MINUTES_MS, "iceberg.control.commit.timeout-ms": 120_000,
           "maintenance.enabled": "false"},  # it counts the rounds' snapshots
    )
    values = pizza_values(records, seed=23)
    keys = {json.loads(v)["order_id"] for v in values}
    replicas = ReplicaSet(cfg, tmp_path / "logs")
    try:
        r = replicas.start("mr")
        _running(replicas, r, PARTITIONS)
        # Two early rounds for sure: a part past max-records, then another. (All at once, the first
        # round could take everything: a round takes what is buffered when it starts, and a CI run
        # once read the whole burst while the first one waited for Spark.)
        for part in (values[:5000], values[5000:10000]):
            before = total_rows(catalog, table)
            asyncio.run(produce(broker.bootstrap, topic, part, partitions=PARTITIONS))
            deadline = time.monotonic() + 240
            while total_rows(catalog, table) < before + max_records:
                replicas.check_alive()
                assert time.monotonic() < deadline, f"no early round: {total_rows(catalog, table)} rows committed"
                time.sleep(0.5)
        assert metric(r.metrics_port, "icesink_paused_partitions") == 0  # early rounds, not backpressure
        asyncio.run(produce(broker.bootstrap, topic, values[10000:], partitions=PARTITIONS))
        replicas.kill("mr")  # kill -9 mid-burst: what was not committed is read again
        r = replicas.start("mr")
        _running(replicas, r, PARTITIONS)
        # Everything committed or buffered below the threshold: only a round moves it on.
        deadline = time.monotonic() + 240
        while True:
            replicas.check_alive()
            committed = total_rows(catalog, table)
            buffered = metric(r.metrics_port, "icesink_buffered_rows") + metric(r.metrics_port, "icesink_written_ahead_rows")
            if committed + buffered >= records and buffered < max_records:
                break
            assert time.monotonic() < deadline, f"stalled: {committed} committed, {buffered} buffered of {records}"
            time.sleep(0.5)
        early_snapshots = len(catalog.load_table(table).snapshots())
        _ask_round(broker.bootstrap, catalog, group)  # the tail
        deadline = time.monotonic() + 120
        while total_rows(catalog, table) < records:
            replicas.check_alive()
            assert time.monotonic() < deadline, f"tail not committed: {total_rows(catalog, table)} of {records}"
            time.sleep(0.5)
        requests = metric(r.metrics_port, "icesink_early_commit_requests_total")
        full = "buffers full" in r.log_path.read_text(errors="replace")
    finally:
        replicas.stop_all()

    assert_exact(catalog, table, keys)  # every key once, through the kill
    log = [ev for _, ev in control_events(broker.bootstrap, f"{group}-control", group)]
    rounds, asked = _rounds_after_requests(log, "mr")
    # Each early round after a request of the worker (no round of the ten-minute interval came).
    assert early_snapshots >= 2, early_snapshots
    assert asked >= early_snapshots - 1, (rounds, asked, early_snapshots)  # the first worker's rounds too
    assert requests >= 1 and not full
    print(f"max-records {max_records}: {records} records, {early_snapshots} snapshots before the tail, "
          f"{rounds} rounds ({asked} after a worker's request)")


@pytest.mark.timeout(600)
def test_an_idle_sink_makes_fewer_rounds_and_late_records_land_at_once(broker, catalog_props, tmp_path):
    from pyiceberg.catalog import load_catalog

    from icesink.app.pizzas import pizza_values, produce
    from icesink.app.replicas import ReplicaSet
    from icesink.shared.kafka_admin import ensure_topic
    from icesink.shared.protocol import CommitComplete, CommitRequest, StartCommit
    from tests.support.sinkrun import assert_exact, control_events, total_rows, wait_rows, write_config

    topic, table, group = "idle-pizzas", "idle.pizzas", "idle-sink"
    catalog = load_catalog("it", **catalog_props)
    catalog.create_namespace("idle")
    asyncio.run(ensure_topic(broker.bootstrap, topic, PARTITIONS))
    cfg = write_config(
        tmp_path / "sink.json", topics=topic, tables=table, bootstrap=broker.bootstrap,
        catalog_props=catalog_props, state_dir=tmp_path / "state", group=group,
        **{"iceberg.control.commit.interval-ms": 2000, "iceberg.control.commit.idle-interval-ms": TEN_MINUTES_MS,
           "maintenance.enabled": "false"},
    )
    first, later = pizza_values(500, seed=5), pizza_values(300, seed=6)
    keys = {json.loads(v)["order_id"] for v in first + later}
    assert len(keys) == 800
    replicas = ReplicaSet(cfg, tmp_path / "logs")
    try:
        r = replicas.start("idle")
        _running(replicas, r, PARTITIONS)
        asyncio.run(produce(broker.bootstrap, topic, first, partitions=PARTITIONS))
        wait_rows(catalog, replicas, (table,), 500, timeout_s=180)
        landed = len(control_events(broker.bootstrap, f"{group}-control", group))
        time.sleep(16)  # 8 rounds' worth of 2 s intervals, idle
        idle_log = [ev for _, ev in control_events(broker.bootstrap, f"{group}-control", group)][landed:]
        asyncio.run(produce(broker.bootstrap, topic, later, partitions=PARTITIONS))
        wait_rows(catalog, replicas, (table,), 800, timeout_s=180)  # well within the ten-minute idle wait
        log = [ev for _, ev in control_events(broker.bootstrap, f"{group}-control", group)]
    finally:
        replicas.stop_all()

    assert_exact(catalog, table, keys)
    assert total_rows(catalog, table) == 800
    idle_rounds = sum(isinstance(ev, StartCommit) for ev in idle_log)
    assert idle_rounds <= 2, f"{idle_rounds} rounds started while idle (2 s interval: about 8 without the idle interval)"
    # The later records' round: started after the worker asked (CommitRequest), once the group was idle.
    after = log[landed + len(idle_log):]
    starts = [i for i, ev in enumerate(after) if isinstance(ev, StartCommit)]
    assert starts, "no round after the later records"
    assert any(isinstance(ev, CommitRequest) and ev.worker == "idle" for ev in after[:starts[0]]), \
        [type(ev).__name__ for ev in after[:starts[0] + 1]]
    completes = [ev for ev in log if isinstance(ev, CommitComplete)]
    print(f"idle-interval: {idle_rounds} rounds in 16 s idle; {len(completes)} rounds in all")


def _backlog(broker, catalog_props, tmp_path, name: str, records: int, seed: int, **settings):
    """A topic with ``records`` pizzas produced before the worker starts, and a replica set of
    one worker's config (group ``<name>-sink``, table ``<name>.pizzas``, state in tmp_path/state)
    that does not run yet: the catalog, the table's name, the records' keys and the set."""
    from pyiceberg.catalog import load_catalog

    from icesink.app.pizzas import pizza_values, produce
    from icesink.app.replicas import ReplicaSet
    from icesink.shared.kafka_admin import ensure_topic
    from tests.support.sinkrun import write_config

    topic, table = f"{name}-pizzas", f"{name}.pizzas"
    catalog = load_catalog("it", **catalog_props)
    catalog.create_namespace(name)
    asyncio.run(ensure_topic(broker.bootstrap, topic, PARTITIONS))
    values = pizza_values(records, seed=seed)
    keys = {json.loads(v)["order_id"] for v in values}
    asyncio.run(produce(broker.bootstrap, topic, values, partitions=PARTITIONS))
    cfg = write_config(tmp_path / "sink.json", topics=topic, tables=table, bootstrap=broker.bootstrap,
                       catalog_props=catalog_props, state_dir=tmp_path / "state", group=f"{name}-sink", **settings)
    return catalog, table, keys, ReplicaSet(cfg, tmp_path / "logs")


@pytest.mark.timeout(600)
def test_the_tail_of_a_backlog_lands_once_read_not_an_interval_later(broker, catalog_props, tmp_path):
    from tests.support.sinkrun import assert_exact, metric, total_rows

    records = 30_000
    catalog, table, keys, replicas = _backlog(
        broker, catalog_props, tmp_path, "cu", records, 29,
        **{"buffer.max-bytes": 1 << 20, "buffer.write-ahead-bytes": 0, "consumer.max-batch": 1000,
           "iceberg.control.commit.interval-ms": TEN_MINUTES_MS, "iceberg.control.commit.timeout-ms": 120_000},
    )
    try:
        r = replicas.start("cu")
        deadline = time.monotonic() + 300  # well within the ten-minute interval
        while total_rows(catalog, table) < records:
            replicas.check_alive()
            assert time.monotonic() < deadline, f"the tail waits: {total_rows(catalog, table)} of {records} committed"
            time.sleep(0.5)
        caught_up = metric(r.metrics_port, 'icesink_early_commit_requests_total{reason="caught-up"}')
        full = metric(r.metrics_port, 'icesink_early_commit_requests_total{reason="full"}')
    finally:
        replicas.stop_all()
    assert_exact(catalog, table, keys)
    assert full >= 1 and caught_up == 1, (full, caught_up)


@pytest.mark.timeout(600)
def test_a_round_during_a_backlog_leaves_its_rows_to_the_round_its_end_asks_for(broker, catalog_props, tmp_path):
    """A fresh worker reads a backlog; reading stops after its first fetch (``fault.hold-at=
    worker.after-fetch``) until the first round has come and held those rows (15 s rounds, the
    first one interval after launch). Once released, the backlog's end asks for a round, which
    commits every record in one snapshot: the held rows went with the rest, none was lost."""
    from tests.support.sinkrun import assert_exact, metric, total_rows

    records = 20_000
    catalog, table, keys, replicas = _backlog(
        broker, catalog_props, tmp_path, "hb", records, 31,
        **{"consumer.max-batch": 1000, "iceberg.control.commit.interval-ms": 15_000,
           "fault.hold-at": "worker.after-fetch"},
    )
    state = tmp_path / "state"
    try:
        r = replicas.start("hb")
        deadline = time.monotonic() + 120
        _running(replicas, r, PARTITIONS)
        while metric(r.metrics_port, "icesink_rounds_held_total") < 1:
            replicas.check_alive()
            assert time.monotonic() < deadline, "no round held the backlog's rows"
            time.sleep(0.5)
        assert (state / "hold-worker.after-fetch.reached").exists() and total_rows(catalog, table) == 0
        (state / "hold-worker.after-fetch.release").touch()
        while total_rows(catalog, table) < records:
            replicas.check_alive()
            assert time.monotonic() < deadline + 120, f"{total_rows(catalog, table)} of {records} committed"
            time.sleep(0.5)
        caught_up = metric(r.metrics_port, 'icesink_early_commit_requests_total{reason="caught-up"}')
    finally:
        replicas.stop_all()
    assert_exact(catalog, table, keys)
    snapshots = catalog.load_table(table).snapshots()
    assert len(snapshots) == 1 and caught_up == 1, (snapshots, caught_up)
