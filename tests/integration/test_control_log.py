"""The control log's identity, recovery from the tables, snapshot expiry by another tool, and two
sink groups on one table, with real processes (Tansu, Faust + Spark workers, SQLite catalog),
checked with DuckDB and pyiceberg: exact row count and key set.

- A control topic deleted and created again while the sink is stopped: the coordinator refuses
  to commit (log, /status, metric); the table keeps exactly what it had (design "the log's
  identity is part of the state").
- The coordinator's checkpoint cannot be read: Tansu implements neither DeleteRecords (it closes
  the connection) nor time retention in memory storage, so the early log cannot be deleted here;
  the test deletes the coordinator group (its committed offset, the checkpoint pointer: what an
  expired offset retention does) and the source group (the hint), and checks that recovery takes
  the positions from the tables. The truncated-log rules are unit tests (tests/unit/test_recovery.py).
- Commit, foreign append, expiry of the sink's snapshot, coordinator failover mid-round: exact.
- Two sink groups writing one table: exact each.
- On a real Kafka broker (marker ``kafka``): the coordinator's DeleteRecords truncates the log, and a
  restart replays what is left.
"""

from __future__ import annotations

import asyncio
import json
import time

import pyarrow as pa
import pytest

pytestmark = pytest.mark.integration


def _setup(broker, catalog_props, tmp_path, name: str, tables: tuple[str, ...], partitions: int = 2, **extra):  # type: ignore[no-untyped-def]
    from pyiceberg.catalog import load_catalog

    from icesink.shared.kafka_admin import ensure_topic
    from icesink.app.pizzas import PIZZA_SCHEMA
    from icesink.app.replicas import ReplicaSet
    from tests.support.sinkrun import write_config

    catalog = load_catalog("it", **catalog_props)
    for ns in {t.split(".")[0] for t in tables}:
        catalog.create_namespace_if_not_exists(ns)
    for t in tables:
        if not catalog.table_exists(t):
            catalog.create_table(t, schema=PIZZA_SCHEMA)
    asyncio.run(ensure_topic(broker.bootstrap, f"{name}-src", partitions))
    cfg = write_config(tmp_path / f"{name}.json", topics=f"{name}-src", tables=",".join(tables),
                       bootstrap=broker.bootstrap, catalog_props=catalog_props, state_dir=tmp_path / f"{name}-state",
                       group=name, **extra)
    return catalog, ReplicaSet(cfg, tmp_path / f"{name}-logs")


def _send(bootstrap: str, topic: str, values: list[bytes], partitions: int = 2) -> set[str]:
    from icesink.app.pizzas import produce

    asyncio.run(produce(bootstrap, topic, values, partitions=partitions))
    return {json.loads(v)["order_id"] for v in values}


def _exact(catalog, table: str, keys: set[str]) -> None:  # type: ignore[no-untyped-def]
    """DuckDB (assert_exact) and pyiceberg agree: every key once, nothing else."""
    from tests.support.sinkrun import assert_exact

    assert_exact(catalog, table, keys)
    got = catalog.load_table(table).scan(selected_fields=("order_id",)).to_arrow()["order_id"].to_pylist()
    assert len(got) == len(keys) and set(got) == keys, f"{table}: pyiceberg read {len(got)} rows for {len(keys)} keys"


def _wait(what: str, check, replicas, timeout_s: float = 180):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        replicas.check_alive()
        found = check()
        if found:
            return found
        time.sleep(0.5)
    logs = "\n".join(f"--- {r.name}\n" + r.log_path.read_text(errors="replace")[-4000:] for r in replicas.replicas.values())
    raise AssertionError(f"expected {what} within {timeout_s} s\n{logs}")


def _coordinator_status(replicas):  # type: ignore[no-untyped-def]
    from tests.support.sinkrun import coordinator_status

    return coordinator_status(replicas)


def _delete_groups(bootstrap: str, groups: list[str]) -> None:
    from aiokafka.admin import AIOKafkaAdminClient
    from aiokafka.protocol.admin import DeleteGroupsRequest

    async def go() -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            resp = await admin._client.send(admin._client.get_random_node(), DeleteGroupsRequest(groups))
            assert all(code == 0 for _, code in resp.results), resp
        finally:
            await admin.close()

    asyncio.run(go())


def _committed(bootstrap: str, group: str, topic: str) -> int | None:
    from aiokafka import AIOKafkaConsumer, TopicPartition

    async def go() -> int | None:
        c = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
        await c.start()
        try:
            return await c.committed(TopicPartition(topic, 0))
        finally:
            await c.stop()

    return asyncio.run(go())


@pytest.mark.timeout(600)
def test_recreated_control_topic_is_refused(broker, catalog_props, tmp_path):
    from aiokafka.admin import AIOKafkaAdminClient

    from icesink.app.pizzas import pizza_values
    from tests.support.sinkrun import metric, total_rows

    table = "cl.recreated"
    catalog, replicas = _setup(broker, catalog_props, tmp_path, "clr", (table,))
    first = pizza_values(2000, seed=41)
    try:
        replicas.start("w1")
        keys = _send(broker.bootstrap, "clr-src", first)
        _wait("2000 rows", lambda: total_rows(catalog, table) >= 2000, replicas)
        replicas.stop_all()

        async def recreate() -> None:
            admin = AIOKafkaAdminClient(bootstrap_servers=broker.bootstrap)
            await admin.start()
            try:
                await admin.delete_topics(["clr-control"])
            finally:
                await admin.close()

        asyncio.run(recreate())  # the worker creates it again at start-up
        r = replicas.start("w2")
        second = pizza_values(500, seed=42)
        _send(broker.bootstrap, "clr-src", second)
        found = _wait("the coordinator to refuse", lambda: (s := _coordinator_status(replicas)) and
                      s[1].get("phase") == "refused" and s, replicas)
        assert "deleted and created again" in found[1]["error"], found[1]
        assert metric(r.metrics_port, "icesink_control_log_refused") == 1
        assert "coordinator refuses to commit" in r.log_path.read_text(errors="replace")
        _exact(catalog, table, keys)  # nothing committed on the new log, nothing lost from the first
        # What the message says to do: adopt the new log; the group goes on from the tables' positions.
        new_id = found[1]["control_log_id"]
        replicas.stop_all()
        replicas.start("w3", extra_env={"ICESINK_ICEBERG_CONTROL_ADOPT_LOG_ID": new_id})
        keys |= {json.loads(v)["order_id"] for v in second}
        _wait("2500 rows", lambda: total_rows(catalog, table) >= 2500, replicas)
        time.sleep(5)  # two more rounds
        _exact(catalog, table, keys)
    finally:
        replicas.stop_all()


@pytest.mark.timeout(600)
def test_unreadable_checkpoint_recovers_positions_from_the_tables(broker, catalog_props, tmp_path):
    from icesink.app.pizzas import pizza_values
    from tests.support.sinkrun import metric, total_rows

    table = "cl.nockpt"
    catalog, replicas = _setup(broker, catalog_props, tmp_path, "clc", (table,))
    first, second = pizza_values(2000, seed=51), pizza_values(1000, seed=52)
    try:
        replicas.start("w1")
        keys = _send(broker.bootstrap, "clc-src", first)
        _wait("2000 rows", lambda: total_rows(catalog, table) >= 2000, replicas)
        replicas.stop_all()
        assert _committed(broker.bootstrap, "clc-coordinator", "clc-control") is not None
        # The checkpoint pointer and the source group's hint are gone (expired group offsets).
        _delete_groups(broker.bootstrap, ["clc-coordinator", "clc"])
        assert _committed(broker.bootstrap, "clc-coordinator", "clc-control") is None
        r = replicas.start("w2")
        keys |= _send(broker.bootstrap, "clc-src", second)
        _wait("3000 rows", lambda: total_rows(catalog, table) >= 3000, replicas)
        assert metric(r.metrics_port, "icesink_recovered_from_tables_total") == 1
        assert "state of table cl.nockpt" in r.log_path.read_text(errors="replace")
        _exact(catalog, table, keys)
    finally:
        replicas.stop_all()


@pytest.mark.timeout(600)
def test_foreign_append_and_expiry_of_the_sink_snapshot_then_failover(broker, catalog_props, tmp_path):
    """The coordinator's replica is killed between the two table commits of a round; meanwhile
    another writer appends to the committed table and expires the sink's snapshot. The next
    coordinator rolls the round forward: the first table must not get it twice."""
    from icesink.app.pizzas import PIZZA_SCHEMA, pizza_values
    from tests.support.sinkrun import total_rows

    t1, t2 = "cl.exp_a", "cl.exp_b"
    catalog, replicas = _setup(broker, catalog_props, tmp_path, "cle", (t1, t2),
                               **{"fault.crash-at": "coordinator.between-table-commits"})
    fired = tmp_path / "cle-state" / "fault-coordinator.between-table-commits.fired"
    try:
        replicas.start("w1")
        keys = _send(broker.bootstrap, "cle-src", pizza_values(2000, seed=61))
        _wait("the crash between table commits", lambda: fired.exists() and not replicas.replicas["w1"].alive,
              type("NoCheck", (), {"check_alive": staticmethod(lambda: None), "replicas": replicas.replicas})())
        replicas.kill("w1")
        first = next(t for t in (t1, t2) if total_rows(catalog, t) > 0)  # the table committed before the crash
        table = catalog.load_table(first)
        sink_snapshot = table.current_snapshot().snapshot_id
        table.append(pa.Table.from_pylist([{"order_id": "ext-1", "store_id": 0}], schema=PIZZA_SCHEMA.as_arrow()))
        catalog.load_table(first).maintenance.expire_snapshots().by_id(sink_snapshot).commit()
        assert catalog.load_table(first).snapshot_by_id(sink_snapshot) is None
        replicas.start("w2")
        _wait("every row", lambda: total_rows(catalog, t1) >= 2000 + (first == t1)
              and total_rows(catalog, t2) >= 2000 + (first == t2), replicas)
        time.sleep(5)  # two more rounds: a duplicate roll-forward would land by then
        for t in (t1, t2):
            _exact(catalog, t, keys | ({"ext-1"} if t == first else set()))
    finally:
        replicas.stop_all()


@pytest.mark.timeout(600)
def test_two_sink_groups_write_one_table(broker, catalog_props, tmp_path):
    from icesink.shared.iceberg import latest_sink_summary
    from icesink.app.pizzas import pizza_values
    from tests.support.sinkrun import total_rows

    table = "cl.shared"
    catalog, one = _setup(broker, catalog_props, tmp_path, "clg1", (table,))
    _, two = _setup(broker, catalog_props, tmp_path, "clg2", (table,))
    v1, v2 = pizza_values(1500, seed=71), pizza_values(1500, seed=72)
    try:
        one.start("a1")
        two.start("b1")
        k1 = _send(broker.bootstrap, "clg1-src", v1[:1000])
        k2 = _send(broker.bootstrap, "clg2-src", v2[:1000])
        assert not k1 & k2
        _wait("2000 rows", lambda: total_rows(catalog, table) >= 2000, one)
        two.kill("b1")  # group 2's coordinator fails over to a new replica
        two.start("b2")
        k1 |= _send(broker.bootstrap, "clg1-src", v1[1000:])
        k2 |= _send(broker.bootstrap, "clg2-src", v2[1000:])
        _wait("3000 rows", lambda: total_rows(catalog, table) >= 3000, two)
        time.sleep(5)
        _exact(catalog, table, k1 | k2)
        loaded = catalog.load_table(table)
        s1, s2 = latest_sink_summary(loaded, "clg1"), latest_sink_summary(loaded, "clg2")
        assert s1 is not None and s2 is not None and s1.log_id != s2.log_id
        assert sum(s1.positions.values()) == 1500 and sum(s2.positions.values()) == 1500
    finally:
        one.stop_all()
        two.stop_all()


def test_control_topic_shape_and_identity_on_the_broker(broker):
    """Created with delete policy and no retention; a compacted or multi-partition one is refused;
    the topic id (Metadata v10) changes when the topic is deleted and created again."""
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    from icesink.shared.control import ensure_control_topic
    from icesink.shared.errors import ControlLogError
    from icesink.shared.kafka_admin import TopicError, ensure_topic, topic_configs, topic_id

    bs = broker.bootstrap

    async def go() -> None:
        await ensure_control_topic(bs, "shape-ctl", {}, replication_factor=3)
        configs = await topic_configs(bs, "shape-ctl")
        assert configs["cleanup.policy"] == "delete" and configs["retention.ms"] == "-1", configs
        first = await topic_id(bs, "shape-ctl")
        assert first is not None and first == await topic_id(bs, "shape-ctl")
        admin = AIOKafkaAdminClient(bootstrap_servers=bs)
        await admin.start()
        try:
            await admin.create_topics([NewTopic("shape-compacted", 1, 1, topic_configs={"cleanup.policy": "compact"})])
            await admin.delete_topics(["shape-ctl"])
        finally:
            await admin.close()
        with pytest.raises(ControlLogError, match="expected cleanup.policy=delete, found 'compact'"):
            await ensure_control_topic(bs, "shape-compacted", {})
        await ensure_topic(bs, "shape-two", 2)
        with pytest.raises(TopicError, match="expected 1 partitions, found 2"):
            await ensure_control_topic(bs, "shape-two", {})
        await ensure_control_topic(bs, "shape-ctl", {})
        second = await topic_id(bs, "shape-ctl")
        assert second is not None and second != first

    asyncio.run(go())


def _commit_offset(bootstrap: str, group: str, topic: str, offset: int) -> None:
    """Commit ``group``'s offset of the control partition (as a coordinator does to its checkpoint)."""
    from aiokafka import AIOKafkaConsumer, TopicPartition
    from aiokafka.structs import OffsetAndMetadata

    async def go() -> None:
        c = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
        await c.start()
        try:
            c.assign([TopicPartition(topic, 0)])
            await c.commit({TopicPartition(topic, 0): OffsetAndMetadata(offset, "")})
        finally:
            await c.stop()

    asyncio.run(go())


def test_truncation_keeps_what_any_group_on_the_shared_control_topic_still_needs(broker):
    """Three groups share one control topic (events keyed by group). Group A's checkpoint
    replays from offset 12, B's from 5, C has none (its offsets expired) and its first event is
    at 3: the log may go below 3 only, held by C. A checkpoint C claims beyond its own offset
    counts up to that offset; then B holds the log at 5, and once B's checkpoint moves on, A's
    own replay start. On Tansu, DeleteRecords is said to be unsupported, once (after it closed the
    connection at the request three times in a row)."""
    from icesink.shared.control import GONE_AFTER_S, UNSUPPORTED_AFTER, ControlLogTruncator, ControlProducer, ensure_control_topic
    from icesink.shared.protocol import CommitComplete, CommitRequest

    topic = "shared-control"

    async def write(script: list[str]) -> list[int]:
        await ensure_control_topic(broker.bootstrap, topic, {}, replication_factor=1)
        producers = {g: ControlProducer(broker.bootstrap, topic, g, {}) for g in "ABC"}
        for p in producers.values():
            await p.start()
        try:
            offsets = []
            # offsets 0-2: A and B; 3: C; 4-9: A and B; 10: B's checkpoint; 11-13: A; 14: A's checkpoint
            script = script or ["A", "B", "A", "C", "A", "B", "A", "B", "A", "B", "B:cp5", "A", "A", "A", "A:cp12"]
            for step in script:
                group, _, cp = step.partition(":")
                ev = (CommitComplete(1, "r", int(cp[2:]) - 1, (), (), None, replay_from=int(cp[2:])) if cp
                      else CommitRequest("w", 0))
                offsets.append(await producers[group].send(ev))
            return offsets
        finally:
            for p in producers.values():
                await p.stop()

    offsets = asyncio.run(write([]))
    assert offsets == list(range(15)), offsets
    _commit_offset(broker.bootstrap, "A-coordinator", topic, 14)
    _commit_offset(broker.bootstrap, "B-coordinator", topic, 10)

    def plan(group: str = "A") -> dict:
        return asyncio.run(ControlLogTruncator(broker.bootstrap, topic, group, {}).plan())

    assert plan() == {"log_start": 0, "held_by": "C", "before": 3}
    later = time.time() + GONE_AFTER_S + 3600  # C, with no checkpoint, wrote nothing for longer: gone
    gone = ControlLogTruncator(broker.bootstrap, topic, "A", {}, wall=lambda: later)
    assert asyncio.run(gone.plan()) == {"log_start": 0, "held_by": "B", "before": 5}
    assert plan("C") == {"log_start": 0, "held_by": "C", "why": "no readable checkpoint"}
    truncator = ControlLogTruncator(broker.bootstrap, topic, "A", {})
    for _ in range(UNSUPPORTED_AFTER - 1):  # a closed connection may be chance: asked again first
        assert "does not implement it" in asyncio.run(truncator.truncate())["error"] and truncator.unsupported is None
    first = asyncio.run(truncator.truncate())
    assert "does not implement it" in first["unsupported"] and first["before"] == 3
    assert asyncio.run(truncator.truncate()) == {"unsupported": first["unsupported"]}  # then never again
    _commit_offset(broker.bootstrap, "C-coordinator", topic, 10)  # B's event: no checkpoint of C
    assert plan()["held_by"] == "C"
    assert asyncio.run(write(["C:cp20", "B:cp13"])) == [15, 16]
    _commit_offset(broker.bootstrap, "C-coordinator", topic, 15)  # "replay from 20" counts as 15
    assert plan() == {"log_start": 0, "held_by": "B", "before": 5}
    _commit_offset(broker.bootstrap, "B-coordinator", topic, 16)
    assert plan() == {"log_start": 0, "held_by": "A", "before": 12}


@pytest.mark.timeout(600)
def test_the_coordinator_truncates_the_control_log_where_the_broker_allows_and_says_once_where_not(
        broker, catalog_props, tmp_path):
    """A sink group truncating its control log every second: Tansu does not implement
    DeleteRecords, which the coordinator says once (log, /status) and then leaves alone; the
    rounds go on, exact."""
    from icesink.app.pizzas import pizza_values
    from tests.support.sinkrun import total_rows

    table = "cl.truncated"
    catalog, replicas = _setup(broker, catalog_props, tmp_path, "cltr", (table,),
                               **{"maintenance.control-log.interval-ms": 1000})
    first, second = pizza_values(1000, seed=71), pizza_values(1000, seed=72)
    try:
        r = replicas.start("w1")
        keys = _send(broker.bootstrap, "cltr-src", first)
        _wait("1000 rows", lambda: total_rows(catalog, table) >= 1000, replicas)
        found = _wait("the truncation to be tried", lambda: (s := _coordinator_status(replicas)) and
                      "unsupported" in s[1].get("control_log", {}) and s, replicas)
        assert "does not implement it" in found[1]["control_log"]["unsupported"], found[1]["control_log"]
        keys |= _send(broker.bootstrap, "cltr-src", second)
        _wait("2000 rows", lambda: total_rows(catalog, table) >= 2000, replicas)
        time.sleep(5)  # five more truncation intervals
        said = r.log_path.read_text(errors="replace").count("is not truncated")
        assert said == 1, f"said {said} times"
        _exact(catalog, table, keys)
    finally:
        replicas.stop_all()


def test_the_coordinators_truncator_trusts_only_its_groups_signed_checkpoint(broker, tmp_path):
    """With the default setup (no iceberg.control.secret: the group's key comes from the catalog
    into the replica's keyring), an outsider's unsigned CommitComplete that the group's
    coordinator offset is made to point at must not move where the log may be truncated: the
    truncator the coordinator builds checks its own group's checkpoint with the replica's keyring."""
    from prometheus_client import CollectorRegistry

    from coordinator.service import Coordinator
    from icesink.shared.config import load_settings
    from icesink.shared.control import ControlProducer, ensure_control_topic
    from icesink.shared.metrics import Metrics
    from icesink.shared.offload import Offload
    from icesink.shared.protocol import CommitComplete, CommitRequest
    from icesink.shared.signing import Keyring

    topic, group = "signed-truncation", "sg"
    keyring = Keyring(b"k" * 32)

    async def write() -> list[int]:
        await ensure_control_topic(broker.bootstrap, topic, {}, replication_factor=1)
        ours, outsider = ControlProducer(broker.bootstrap, topic, group, {}, keyring), \
            ControlProducer(broker.bootstrap, topic, group, {})
        await ours.start()
        await outsider.start()
        try:
            offsets = [await ours.send(CommitRequest("w", 0)) for _ in range(3)]
            offsets.append(await outsider.send(CommitComplete(9, "forged", 8, (), (), None, replay_from=9)))
            return offsets
        finally:
            await ours.stop()
            await outsider.stop()

    offsets = asyncio.run(write())
    _commit_offset(broker.bootstrap, f"{group}-coordinator", topic, offsets[-1])
    settings = load_settings(None, None, {"topics": "src", "iceberg.tables": "db.a", "group.id": group,
                                          "iceberg.control.topic": topic, "state.dir": str(tmp_path / "state")})

    class Producer:
        def __init__(self) -> None:
            self.keyring = keyring

    async def plan() -> dict:
        coordinator = Coordinator(settings, broker.bootstrap, Producer(), None, Offload(1),  # type: ignore[arg-type]
                                  Metrics(CollectorRegistry()))
        truncate = coordinator._maintainer.truncate
        assert truncate is not None
        return await truncate.truncator.plan()  # type: ignore[attr-defined]

    found = asyncio.run(plan())
    assert found == {"log_start": 0, "held_by": group, "why": "no readable checkpoint"}, found


def _log_start(bootstrap: str, topic: str) -> int:
    from aiokafka import AIOKafkaConsumer, TopicPartition

    async def go() -> int:
        c = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False)
        await c.start()
        try:
            tp = TopicPartition(topic, 0)
            return int((await c.beginning_offsets([tp]))[tp])
        finally:
            await c.stop()

    return asyncio.run(go())


@pytest.mark.kafka
@pytest.mark.timeout(600)
def test_on_kafka_the_coordinator_truncates_the_control_log_and_a_restart_replays_what_is_left(
        kafka, catalog_props, tmp_path):
    """On a real Kafka broker DeleteRecords works: a group truncating its control log every second
    moves the log start past its first events (they are gone from the broker), a replica
    restarted on the truncated log recovers from the checkpoint; then the whole log is deleted
    (what retention does to an idle group) and the next replica recovers from the tables' state.
    Every record lands once."""
    from icesink.app.pizzas import pizza_values
    from icesink.shared.kafka_admin import delete_records, end_offsets
    from tests.support.sinkrun import total_rows

    table, control = "clk.truncated", "clk-control"
    catalog, replicas = _setup(kafka, catalog_props, tmp_path, "clk", (table,),
                               **{"maintenance.control-log.interval-ms": 1000, "iceberg.control.topic": control,
                                  "iceberg.control.topic.replication-factor": 1,
                                  "iceberg.tables.auto-create-enabled": "false"})
    batches = [pizza_values(1000, seed=s) for s in (73, 74, 75, 76)]
    keys: set[str] = set()
    try:
        replicas.start("w1")
        keys |= _send(kafka.bootstrap, "clk-src", batches[0])
        _wait("1000 rows", lambda: total_rows(catalog, table) >= 1000, replicas)
        keys |= _send(kafka.bootstrap, "clk-src", batches[1])
        _wait("2000 rows", lambda: total_rows(catalog, table) >= 2000, replicas)
        found = _wait("the control log truncated", lambda: (s := _coordinator_status(replicas)) and
                      s[1].get("control_log", {}).get("log_start", 0) > 0 and s, replicas)
        status = found[1]["control_log"]
        assert "unsupported" not in status and "error" not in status, status
        start = _log_start(kafka.bootstrap, control)
        assert start >= status["log_start"] > 0, (start, status)
        assert replicas.stop("w1") == 0
        replicas.start("w2")
        keys |= _send(kafka.bootstrap, "clk-src", batches[2])
        _wait("3000 rows", lambda: total_rows(catalog, table) >= 3000, replicas)
        time.sleep(4)  # more rounds: nothing may land twice
        assert replicas.stop("w2") == 0
        end = asyncio.run(end_offsets(kafka.bootstrap, control))[0]
        assert asyncio.run(delete_records(kafka.bootstrap, control, 0, end)) == end  # the whole log, checkpoint and all
        replicas.start("w3")
        keys |= _send(kafka.bootstrap, "clk-src", batches[3])
        _wait("4000 rows", lambda: total_rows(catalog, table) >= 4000, replicas)
        time.sleep(4)
        replicas.check_alive()
        said = replicas.replicas["w3"].log_path.read_text(errors="replace")
    finally:
        replicas.stop_all()
    _exact(catalog, table, keys)
    assert "recovered from control offset" in said and "the state of clk.truncated" in said, said[-3000:]
