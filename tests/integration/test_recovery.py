"""Exactly-once holes found by review, each produced with real processes (Tansu, Faust + Spark
workers, a SQLite catalog) on the schedule that hits it, then checked with DuckDB: exact rows and
keys, and every file the table references present on storage.

- A response accepted and committed while a dead worker's response stayed open (so the checkpoint's
  replay start lies below its ``through``) must not come back as an open response after a
  coordinator failover: it used to be expired and its committed files deleted.
- A control send that fails after one table of a round committed (the broker unreachable for
  longer than the producer's request timeout) must not drop the round for the other table.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
import time
import urllib.request

import pytest

pytestmark = pytest.mark.integration


def referenced_paths_exist(catalog, table: str) -> list[str]:
    """Paths the table's snapshots reference that are missing on storage."""
    from coordinator.gc import referenced_files

    return sorted(p for p in referenced_files(catalog.load_table(table)) if not os.path.exists(p))


def active_partitions(replica, http_json) -> list[str]:
    """The source partitions ``replica`` reads (resumed after its claim), by its /status."""
    try:
        parts = http_json(replica.metrics_port)["partitions"]
    except OSError:  # still starting
        return []
    return [tp for tp, st in parts.items() if st["active"]]


def leader(replicas, http_json):
    for r in replicas.replicas.values():
        try:
            if http_json(r.metrics_port)["coordinator"] is not None:
                return r
        except OSError:
            pass
    return None


@pytest.mark.chaos
@pytest.mark.timeout(600)
def test_failover_while_a_dead_workers_response_is_open_deletes_no_committed_file(broker, catalog_props, tmp_path):
    from pyiceberg.catalog import load_catalog

    from icesink.shared.protocol import CommitComplete
    from icesink.shared.kafka_admin import ensure_topic
    from icesink.app.pizzas import pizza_values, produce
    from icesink.app.replicas import ReplicaSet
    from tests.support.sinkrun import assert_exact, control_events, http_json, wait_rows, write_config

    topic, table, group = "rc-orders", "rc.orders", "rc-sink"
    catalog = load_catalog("it", **catalog_props)
    catalog.create_namespace("rc")
    asyncio.run(ensure_topic(broker.bootstrap, topic, 6))
    state = tmp_path / "state"
    # Rounds close on a short timeout while the dead worker's response stays open; its
    # partitions move only when its (long) session expires.
    cfg = write_config(tmp_path / "sink.json", topics=topic, tables=table, bootstrap=broker.bootstrap,
                       catalog_props=catalog_props, state_dir=state, group=group,
                       **{"iceberg.control.commit.timeout-ms": 3000, "consumer.session-timeout-ms": 25000})
    values = pizza_values(12_000, seed=11)
    keys = {json.loads(v)["order_id"] for v in values}
    replicas = ReplicaSet(cfg, tmp_path / "logs")
    sender = None
    try:
        replicas.start()
        deadline = time.monotonic() + 120
        while leader(replicas, http_json) is None:
            assert time.monotonic() < deadline, "no coordinator"
            replicas.check_alive()
            time.sleep(0.5)
        replicas.start()
        doomed = replicas.start(extra_env={"ICESINK_FAULT_CRASH_AT": "worker.mid-response"})
        # Produce once the doomed replica reads partitions of its own: begun with its start, the
        # 20 s of records could all be committed by the others before its (held) join ended,
        # leaving it no rows to answer a round with, so its crash never came (seen in CI).
        deadline = time.monotonic() + 180
        while not active_partitions(doomed, http_json):
            assert time.monotonic() < deadline, "the doomed replica was given no partition"
            replicas.check_alive()
            time.sleep(0.5)
        sender = threading.Thread(target=lambda: asyncio.run(
            produce(broker.bootstrap, topic, values[:8000], partitions=6, rate_per_s=400)))
        sender.start()
        marker = state / "fault-worker.mid-response.fired"
        deadline = time.monotonic() + 180
        while not marker.exists():
            assert time.monotonic() < deadline, "the mid-response crash did not fire"
            time.sleep(0.5)
        died_at = time.monotonic()
        doomed.proc.wait(30)
        replicas.replicas.pop(doomed.name).log_handle.close()
        coord = leader(replicas, http_json)  # `first`, unless leadership moved when the others joined
        assert coord is not None, "no live replica runs the coordinator"
        # Rounds go on without the dead worker (closed on the timeout); wait for two
        # checkpoints whose replay start is pinned below their `through` by its open response.
        deadline = time.monotonic() + 60
        while True:
            pinned = [ev for _, ev in control_events(broker.bootstrap, f"{group}-control", group)
                      if isinstance(ev, CommitComplete) and ev.replay_from is not None and ev.replay_from < ev.through]
            if len(pinned) >= 2:
                break
            assert time.monotonic() < deadline, "no checkpoint with replay_from < through"
            time.sleep(1)
        assert time.monotonic() - died_at < 25, "the dead worker's session expired before the failover"
        replicas.kill(coord.name)  # kill -9 the coordinator's replica
        sender.join()
        sender = threading.Thread(target=lambda: asyncio.run(
            produce(broker.bootstrap, topic, values[8000:], partitions=6, rate_per_s=1000)))
        sender.start()
        sender.join()
        wait_rows(catalog, replicas, (table,), len(values), timeout_s=300)
        time.sleep(5)  # a few more rounds: expiry of open responses would happen here
    finally:
        if sender is not None:
            sender.join()
        replicas.stop_all()
    assert referenced_paths_exist(catalog, table) == [], "committed files were deleted"
    # The deletion safety net (coordinator/files.py) must not even be needed: recovery itself
    # knows the committed responses as decided.
    logs = "".join(p.read_text(errors="replace") for p in (tmp_path / "logs").glob("*.log"))
    assert "references it (a committed file)" not in logs
    assert_exact(catalog, table, keys)
    scan = catalog.load_table(table).scan().to_arrow()
    assert scan.num_rows == len(keys) and set(scan.column("order_id").to_pylist()) == keys


@pytest.mark.chaos
@pytest.mark.timeout(600)
def test_a_control_send_failing_after_one_table_committed_keeps_the_round_for_the_other(catalog_props, tmp_path):
    from pyiceberg.catalog import load_catalog

    from icesink.app.embedded import EmbeddedBroker
    from icesink.shared.kafka_admin import ensure_topic
    from icesink.app.pizzas import pizza_values, produce
    from icesink.app.replicas import ReplicaSet
    from tests.integration.test_round_commits import announced_snapshots
    from tests.support.sinkrun import assert_exact, metric, wait_rows, write_config

    topic, tables, group = "rs-orders", ("rs.a", "rs.b"), "rs-sink"
    broker = EmbeddedBroker(tmp_path / "broker")  # its own: it is frozen for a minute
    broker.start()
    catalog = load_catalog("it", **catalog_props)
    catalog.create_namespace("rs")
    asyncio.run(ensure_topic(broker.bootstrap, topic, 2))
    state = tmp_path / "state"
    cfg = write_config(tmp_path / "sink.json", topics=topic, tables=",".join(tables), bootstrap=broker.bootstrap,
                       catalog_props=catalog_props, state_dir=state, group=group,
                       **{"fault.hold-at": "coordinator.after-table-commit", "consumer.session-timeout-ms": 30000})
    values = pizza_values(3000, seed=12)
    keys = {json.loads(v)["order_id"] for v in values}
    replicas = ReplicaSet(cfg, tmp_path / "logs")
    try:
        w = replicas.start()
        asyncio.run(produce(broker.bootstrap, topic, values[:2000], partitions=2))
        reached = state / "hold-coordinator.after-table-commit.reached"
        deadline = time.monotonic() + 180
        while not reached.exists():
            assert time.monotonic() < deadline, "the round never reached its first table commit"
            replicas.check_alive()
            time.sleep(0.5)
        # The first table of the round is committed; the broker becomes unreachable for longer
        # than the control producer's request timeout (aiokafka's 40 s) before CommitToTable.
        os.kill(broker.pid, signal.SIGSTOP)
        (state / "hold-coordinator.after-table-commit.release").touch()
        time.sleep(55)
        os.kill(broker.pid, signal.SIGCONT)
        asyncio.run(produce(broker.bootstrap, topic, values[2000:], partitions=2))
        wait_rows(catalog, replicas, tables, len(values), timeout_s=240)
        time.sleep(5)
        assert metric(w.metrics_port, "icesink_round_failures_total") >= 1
        replicas.stop_all()
        # The table whose CommitToTable could not be sent is announced by the retry that finds it
        # holding the round (the retry used to skip it by its watermark and announce nothing).
        announced_snapshots(catalog, broker.bootstrap, group, tables)
    finally:
        replicas.stop_all()
        broker.stop()
    for t in tables:
        assert_exact(catalog, t, keys)
        assert referenced_paths_exist(catalog, t) == []


def http_json_or_empty(port: int) -> dict:
    from tests.support.sinkrun import http_json

    try:
        return http_json(port)  # type: ignore[no-any-return]
    except OSError:
        return {}


def delete_consumer_group(bootstrap: str, group: str, timeout_s: float = 60) -> None:
    """DeleteGroups, retried while the group still has members (their sessions expire first)."""
    from aiokafka.admin import AIOKafkaAdminClient
    from aiokafka.protocol.admin import DeleteGroupsRequest

    async def go() -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            deadline = time.monotonic() + timeout_s
            while True:
                node = await admin.find_coordinator(group)
                resp = await admin._send_request_to_node(node, DeleteGroupsRequest([group]))
                [(_, code)] = resp.results
                if code == 0:
                    return
                assert time.monotonic() < deadline, f"DeleteGroups({group}) kept failing with error {code}"
                await asyncio.sleep(1)
        finally:
            await admin.close()

    asyncio.run(go())


@pytest.mark.timeout(600)
def test_ownership_survives_a_consumer_group_reset(broker, catalog_props, tmp_path):
    """The source consumer group is deleted while the sink is stopped: generations start again
    below the ones the coordinator recorded. The new members' claims must take their partitions."""
    from pyiceberg.catalog import load_catalog

    from icesink.shared.kafka_admin import ensure_topic
    from icesink.app.pizzas import pizza_values, produce
    from icesink.app.replicas import ReplicaSet
    from tests.support.sinkrun import assert_exact, metric, wait_rows, write_config

    topic, table, group = "gr-orders", "gr.orders", "gr-sink"
    catalog = load_catalog("it", **catalog_props)
    catalog.create_namespace("gr")
    asyncio.run(ensure_topic(broker.bootstrap, topic, 3))
    cfg = write_config(tmp_path / "sink.json", topics=topic, tables=table, bootstrap=broker.bootstrap,
                       catalog_props=catalog_props, state_dir=tmp_path / "state", group=group)
    values = pizza_values(3000, seed=13)
    keys = {json.loads(v)["order_id"] for v in values}
    replicas = ReplicaSet(cfg, tmp_path / "logs")
    try:
        replicas.start()
        asyncio.run(produce(broker.bootstrap, topic, values[:750], partitions=3))
        wait_rows(catalog, replicas, (table,), 750, timeout_s=240)
        second = replicas.start()  # a second member joins: the generation grows past the first one's
        deadline = time.monotonic() + 120
        while not any(p["active"] for p in http_json_or_empty(second.metrics_port).get("partitions", {}).values()):
            assert time.monotonic() < deadline, "the second replica never resumed a partition"
            replicas.check_alive()
            time.sleep(0.5)
        asyncio.run(produce(broker.bootstrap, topic, values[750:1500], partitions=3))
        wait_rows(catalog, replicas, (table,), 1500, timeout_s=240)
        replicas.stop_all()
        delete_consumer_group(broker.bootstrap, group)
        w = replicas.start()
        asyncio.run(produce(broker.bootstrap, topic, values[1500:], partitions=3))
        wait_rows(catalog, replicas, (table,), len(values), timeout_s=180)
        assert metric(w.metrics_port, "icesink_consumer_group_resets_total") == 1
        time.sleep(4)
    finally:
        replicas.stop_all()
    assert_exact(catalog, table, keys)


@pytest.mark.timeout(600)
def test_forged_responses_naming_files_elsewhere_are_neither_committed_nor_deleted(broker, catalog_props, tmp_path):
    """Someone who is not a group member writes a complete response (DataWritten + DataComplete)
    and a half one (DataWritten only) naming Parquet files outside the table. Neither is committed,
    and neither file is deleted: not when the complete one is rejected, not when the half one's
    writer owns nothing at the next rebalance, not in the replay of a coordinator failover."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from pyiceberg.catalog import load_catalog

    from icesink.shared.protocol import DataComplete, DataWritten, FileInfo, OffsetRange, TopicPartition, encode
    from icesink.shared.kafka_admin import ensure_topic
    from icesink.app.pizzas import pizza_values, produce
    from icesink.app.replicas import ReplicaSet
    from tests.support.sinkrun import (
        assert_exact, group_key, http_json, metric, wait_rows, wait_up, write_config, write_control,
    )

    topic, table, group = "fg-orders", "fg.orders", "fg-sink"
    catalog = load_catalog("it", **catalog_props)
    catalog.create_namespace("fg")
    asyncio.run(ensure_topic(broker.bootstrap, topic, 2))
    cfg = write_config(tmp_path / "sink.json", topics=topic, tables=table, bootstrap=broker.bootstrap,
                       catalog_props=catalog_props, state_dir=tmp_path / "state", group=group)
    values = pizza_values(3000, seed=14)
    keys = {json.loads(v)["order_id"] for v in values}
    victims = []
    for name in ("complete", "half"):
        path = tmp_path / "elsewhere" / f"{name}.parquet"
        path.parent.mkdir(exist_ok=True)
        pq.write_table(pa.table({"order_id": ["forged-1", "forged-2"]}), path)
        victims.append(FileInfo(f"file://{path}", 2, path.stat().st_size, 0))
    tp = TopicPartition(topic, 0)
    forged = [
        DataWritten("r", "forged-1", "intruder", table, (victims[0],)),
        DataComplete("r", "forged-1", "intruder", 99, (OffsetRange(tp, 0, 0),), 1, None),
        DataWritten("r", "forged-2", "intruder", table, (victims[1],)),
    ]

    replicas = ReplicaSet(cfg, tmp_path / "logs")
    try:
        replicas.start()
        asyncio.run(produce(broker.bootstrap, topic, values[:1000], partitions=2))
        wait_rows(catalog, replicas, (table,), 1000, timeout_s=240)
        # Signed with the group's secret: a replica's bug, or someone holding the secret.
        write_control(broker.bootstrap, f"{group}-control", [(group.encode(), encode(ev)) for ev in forged],
                      secret=group_key(catalog, group))
        replicas.start()  # a rebalance: the intruder owns nothing
        wait_up(replicas)  # (CI on 6c20e01 read w2's metrics before it had finished importing)
        asyncio.run(produce(broker.bootstrap, topic, values[1000:2000], partitions=2))
        wait_rows(catalog, replicas, (table,), 2000, timeout_s=180)
        refused = sum(metric(r.metrics_port, "icesink_control_events_refused_total") for r in replicas.replicas.values())
        coord = leader(replicas, http_json)
        assert coord is not None
        replicas.kill(coord.name)  # the next coordinator replays the forged events
        replicas.start()
        asyncio.run(produce(broker.bootstrap, topic, values[2000:], partitions=2))
        wait_rows(catalog, replicas, (table,), len(values), timeout_s=240)
        time.sleep(4)
    finally:
        replicas.stop_all()
    assert refused >= 2  # each coordinator that reads them (a new leader replays them too)
    for v in victims:
        assert os.path.exists(v.path.removeprefix("file://")), f"{v.path} was deleted"
    assert_exact(catalog, table, keys)  # no forged row
    logs = "".join(p.read_text(errors="replace") for p in (tmp_path / "logs").glob("*.log"))
    assert "names 1 files outside the table's location" in logs


@pytest.mark.timeout(600)
def test_by_default_a_forged_empty_data_complete_from_outside_skips_no_record(broker, catalog_props, tmp_path):
    """Issue 40: without ``iceberg.control.secret`` (the default), an outsider who can write the
    control topic forged a ``DataComplete`` naming no files, for a partition's owner (read off the
    log) from its accepted position on: it passed every check and moved the position 500 records
    on, which were never written (1,500 rows of 2,000); a forged StartCommit of epoch 10**400
    stalled the group for good. The group now signs with a secret of its own, kept in the catalog:
    both are skipped and counted, every record lands, and the secret is shown nowhere."""
    from pyiceberg.catalog import load_catalog

    from icesink.shared.protocol import CommitComplete, DataComplete, OffsetRange, encode
    from icesink.shared.kafka_admin import ensure_topic
    from icesink.app.pizzas import pizza_values, produce
    from icesink.app.replicas import ReplicaSet
    from tests.support.sinkrun import (
        assert_exact, control_events, group_key, metric, wait_rows, write_config, write_control,
    )

    topic, table, group = "fd-orders", "fd.orders", "fd-sink"
    control = f"{group}-control"
    catalog = load_catalog("it", **catalog_props)
    asyncio.run(ensure_topic(broker.bootstrap, topic, 2))
    cfg = write_config(tmp_path / "sink.json", topics=topic, tables=table, bootstrap=broker.bootstrap,
                       catalog_props=catalog_props, state_dir=tmp_path / "state", group=group)
    values = pizza_values(2000, seed=40)
    keys = {json.loads(v)["order_id"] for v in values}

    replicas = ReplicaSet(cfg, tmp_path / "logs")
    try:
        w = replicas.start()
        asyncio.run(produce(broker.bootstrap, topic, values[:1000], partitions=2))
        wait_rows(catalog, replicas, (table,), 1000, timeout_s=240)
        # What an outsider reads off the log: the owner of partition 0 and its accepted position.
        cp = [ev for _, ev in control_events(broker.bootstrap, control, group) if isinstance(ev, CommitComplete)][-1]
        owner = next(o for o in cp.owners if o.tp.partition == 0)
        start = next(p.offset for p in cp.positions if p.tp == owner.tp)
        forged = DataComplete("forged", "forged", owner.worker, owner.generation,
                              (OffsetRange(owner.tp, start, start + 500),), 0)
        # and the epoch of 10**400 that stalled the group for good (every reader took it as the newest)
        huge = json.dumps({"v": 1, "type": "start-commit", "epoch": 10**400, "commit_id": "forged"}).encode()
        write_control(broker.bootstrap, control, [(group.encode(), encode(forged)), (group.encode(), huge)])
        asyncio.run(produce(broker.bootstrap, topic, values[1000:], partitions=2))
        wait_rows(catalog, replicas, (table,), len(values), timeout_s=120)
        invalid = {r: metric(w.metrics_port, f'icesink_control_events_invalid_total{{reader="{r}"}}')
                   for r in ("worker", "coordinator")}
        shown = [urllib.request.urlopen(f"http://127.0.0.1:{w.metrics_port}{path}", timeout=5).read().decode()
                 for path in ("/status", "/metrics")]
    finally:
        replicas.stop_all()
    assert invalid == {"worker": 2, "coordinator": 2}
    assert_exact(catalog, table, keys)
    # The group's secret: in the catalog, nowhere else.
    secret = group_key(catalog, group).decode()
    logs = "".join(p.read_text(errors="replace") for p in (tmp_path / "logs").glob("*.log"))
    assert "signed with the group's own secret (namespace icesink, property icesink.control-secret.fd-sink, made now)" in logs
    for text in (*shown, logs):
        assert secret not in text and secret[:16] not in text


@pytest.mark.timeout(600)
def test_with_a_group_secret_a_forged_start_commit_from_outside_is_ignored(broker, catalog_props, tmp_path):
    """``iceberg.control.secret``: a well-formed but unsigned StartCommit with a huge epoch, which
    would otherwise make every reader take it as the newest coordinator's and ignore the real one
    (no round would close again), is skipped and counted by every reader; data keeps landing."""
    from pyiceberg.catalog import load_catalog

    from icesink.shared.protocol import StartCommit, encode
    from icesink.shared.kafka_admin import ensure_topic
    from icesink.app.pizzas import pizza_values, produce
    from icesink.app.replicas import ReplicaSet
    from tests.support.sinkrun import assert_exact, metric, wait_rows, write_config, write_control

    topic, table, group = "sg-orders", "sg.orders", "sg-sink"
    catalog = load_catalog("it", **catalog_props)
    asyncio.run(ensure_topic(broker.bootstrap, topic, 2))
    cfg = write_config(tmp_path / "sink.json", topics=topic, tables=table, bootstrap=broker.bootstrap,
                       catalog_props=catalog_props, state_dir=tmp_path / "state", group=group,
                       **{"iceberg.control.secret": "it-group-secret"})
    values = pizza_values(2000, seed=15)
    keys = {json.loads(v)["order_id"] for v in values}

    replicas = ReplicaSet(cfg, tmp_path / "logs")
    try:
        w = replicas.start()
        asyncio.run(produce(broker.bootstrap, topic, values[:1000], partitions=2))
        wait_rows(catalog, replicas, (table,), 1000, timeout_s=240)
        write_control(broker.bootstrap, f"{group}-control", [(group.encode(), encode(StartCommit(10**6, "forged")))])
        asyncio.run(produce(broker.bootstrap, topic, values[1000:], partitions=2))
        wait_rows(catalog, replicas, (table,), len(values), timeout_s=120)
        invalid = {r: metric(w.metrics_port, f'icesink_control_events_invalid_total{{reader="{r}"}}')
                   for r in ("worker", "coordinator")}
        shown = [urllib.request.urlopen(f"http://127.0.0.1:{w.metrics_port}{path}", timeout=5).read().decode()
                 for path in ("/status", "/metrics")]
    finally:
        replicas.stop_all()
    assert invalid == {"worker": 1, "coordinator": 1}
    assert_exact(catalog, table, keys)
    logs = "".join(p.read_text(errors="replace") for p in (tmp_path / "logs").glob("*.log"))
    for text in (*shown, logs):
        assert "it-group-secret" not in text


@pytest.mark.timeout(600)
def test_unsigned_events_forged_before_a_new_groups_first_start_are_not_trusted(broker, catalog_props, tmp_path):
    """Issue 40 review: signing began (``unsigned_below``) at the control log's end even for a
    new group, so an outsider's unsigned StartCommit of a huge epoch written before the group's
    first start counted as the group's own pre-upgrade event and stalled it. A group that never
    ran trusts no unsigned event: the forged one is skipped and counted, every record lands."""
    from pyiceberg.catalog import load_catalog

    from icesink.shared.control import ensure_control_topic
    from icesink.shared.group_secret import read_secret
    from icesink.shared.kafka_admin import ensure_topic
    from icesink.shared.protocol import StartCommit, encode
    from icesink.app.pizzas import pizza_values, produce
    from icesink.app.replicas import ReplicaSet
    from tests.support.sinkrun import assert_exact, metric, wait_rows, write_config, write_control

    topic, table, group = "pre-orders", "pre.orders", "pre-sink"
    control = f"{group}-control"
    catalog = load_catalog("it", **catalog_props)
    asyncio.run(ensure_topic(broker.bootstrap, topic, 2))
    asyncio.run(ensure_control_topic(broker.bootstrap, control, {}, replication_factor=1))
    write_control(broker.bootstrap, control, [(group.encode(), encode(StartCommit(10**6, "forged")))])
    cfg = write_config(tmp_path / "sink.json", topics=topic, tables=table, bootstrap=broker.bootstrap,
                       catalog_props=catalog_props, state_dir=tmp_path / "state", group=group)
    values = pizza_values(1000, seed=41)
    replicas = ReplicaSet(cfg, tmp_path / "logs")
    try:
        w = replicas.start()
        asyncio.run(produce(broker.bootstrap, topic, values, partitions=2))
        wait_rows(catalog, replicas, (table,), len(values), timeout_s=240)
        invalid = metric(w.metrics_port, 'icesink_control_events_invalid_total{reader="coordinator"}')
    finally:
        replicas.stop_all()
    stored = read_secret(catalog, "icesink", group)
    assert stored is not None and stored.signed_from == 0
    assert invalid == 1
    assert_exact(catalog, table, {json.loads(v)["order_id"] for v in values})


@pytest.mark.timeout(600)
def test_a_forged_checkpoint_changes_nothing_the_group_commits(broker, catalog_props, tmp_path):
    """Issue 40: an outsider's unsigned CommitComplete that the coordinator group's offset was
    made to point at (positions none, replay from past the log's end: taken as the base, it would
    lose the log) is refused; the coordinator recovers from the tables' state, and every record
    lands once (exact keys, no duplicates)."""
    from pyiceberg.catalog import load_catalog

    from icesink.shared.kafka_admin import ensure_topic
    from icesink.shared.protocol import CommitComplete, encode
    from icesink.app.pizzas import pizza_values, produce
    from icesink.app.replicas import ReplicaSet
    from tests.integration.test_control_log import _commit_offset
    from tests.support.sinkrun import assert_exact, wait_rows, write_config, write_control

    topic, table, group = "fcp-orders", "fcp.orders", "fcp-sink"
    control = f"{group}-control"
    catalog = load_catalog("it", **catalog_props)
    asyncio.run(ensure_topic(broker.bootstrap, topic, 2))
    cfg = write_config(tmp_path / "sink.json", topics=topic, tables=table, bootstrap=broker.bootstrap,
                       catalog_props=catalog_props, state_dir=tmp_path / "state", group=group)
    values = pizza_values(2000, seed=43)
    replicas = ReplicaSet(cfg, tmp_path / "logs")
    try:
        replicas.start()
        asyncio.run(produce(broker.bootstrap, topic, values[:1000], partitions=2))
        wait_rows(catalog, replicas, (table,), 1000, timeout_s=240)
        replicas.stop_all()
        # positions none, replay from past the log's end: taken as the base, it would lose the log
        forged = CommitComplete(10**6, "forged", 10**9, (), (), None, replay_from=10**9)
        (at,) = write_control(broker.bootstrap, control, [(group.encode(), encode(forged))])
        _commit_offset(broker.bootstrap, f"{group}-coordinator", control, at)
        replicas.start()
        asyncio.run(produce(broker.bootstrap, topic, values[1000:], partitions=2))
        wait_rows(catalog, replicas, (table,), len(values), timeout_s=240)
    finally:
        replicas.stop_all()
    logs = "".join(p.read_text(errors="replace") for p in (tmp_path / "logs").glob("*.log"))
    assert f"coordinator checkpoint at control offset {at} is not readable (found nothing)" in logs, logs[-3000:]
    assert "of the state of fcp.orders" in logs or "(state of table fcp.orders" in logs, logs[-3000:]
    assert_exact(catalog, table, {json.loads(v)["order_id"] for v in values})
