"""A replica whose partitions all stay paused keeps its place in the group, on a real Apache
Kafka broker with real processes (a Faust + Spark worker replica, a SQLite catalog, the table
read back by DuckDB, exact by key set).

A replica pauses every partition while its buffers are full (backpressure, for as long as its
Spark session has not started or its writes fail) and while its claims wait for the
coordinator's Resume. Faust fetches nothing while no partition is active, so aiokafka saw no
poll for ``consumer.max-poll-interval-ms``: the member left the group, and aiokafka then never
joined again until a fetch came, which needs a partition resumed. Without a coordinator (the
leader topic missing from the first assignment) nothing ever resumed one and the replica sat
idle for good (found in a benchmark run: 10 minutes, no member in the group). Kafka's own
consumers poll while paused; the replica now does too.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.kafka]

MAX_POLL_MS = 10_000  # the setting's floor


def _members(bootstrap: str, group: str) -> tuple[str, list[str]]:
    """The group's state and its members' ids, as the broker has them."""
    from aiokafka.admin import AIOKafkaAdminClient

    async def go() -> tuple[str, list[str]]:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            (response,) = await admin.describe_consumer_groups([group])
            (found,) = response.groups
            _, _, state, _, _, members = found[:6]
            return state, sorted(m[0] for m in members)
        finally:
            await admin.close()

    return asyncio.run(go())


@pytest.mark.timeout(600)
def test_a_follower_paused_longer_than_its_max_poll_interval_stays_in_its_group(kafka, catalog_props, tmp_path):
    """The follower holds no partition of Faust's leader topic, which the leader's fetches keep
    polling: its source partitions paused, it fetched nothing at all."""
    from pyiceberg.catalog import load_catalog

    from icesink.app.pizzas import pizza_values, produce
    from icesink.app.replicas import ReplicaSet
    from icesink.shared.kafka_admin import ensure_topic
    from tests.integration.test_round_commits import wait_for
    from tests.support.sinkrun import assert_exact, http_json, wait_rows, wait_up, write_config

    topic, table, group = "pm-orders", "pm.orders", "pm-sink"
    catalog = load_catalog("it", **catalog_props)
    catalog.create_namespace("pm")
    asyncio.run(ensure_topic(kafka.bootstrap, topic, 4))

    def config(name: str, **extra: Any) -> Path:
        return write_config(tmp_path / f"{name}.json", topics=topic, tables=table, bootstrap=kafka.bootstrap,
                            catalog_props=catalog_props, state_dir=tmp_path / f"state-{name}", group=group,
                            **{"iceberg.control.topic.replication-factor": 1,
                               "consumer.max-poll-interval-ms": MAX_POLL_MS, **extra})

    replicas = ReplicaSet(config("leader"), tmp_path / "logs")
    values = pizza_values(40_000, seed=47)
    try:
        replicas.start("leader")
        wait_up(replicas)
        # Full buffers while its Spark session is held: every source partition of it paused.
        held = tmp_path / "state-follower" / "hold-worker.spark-start.release"
        replicas.start("follower", config=config("follower", **{"buffer.max-bytes": 1024 * 1024,
                                                                  "fault.hold-at": "worker.spark-start"}))
        wait_up(replicas)
        wait_for("two members", lambda: len(_members(kafka.bootstrap, group)[1]) == 2, 120, replicas)
        port = replicas.replicas["follower"].metrics_port
        wait_for("the follower's partitions", lambda: len(http_json(port)["partitions"]) == 2, 120, replicas)
        asyncio.run(produce(kafka.bootstrap, topic, values, partitions=4))
        wait_for("the follower's buffers full", lambda: http_json(port)["buffered"]["backpressure"], 120, replicas)
        state, members = _members(kafka.bootstrap, group)
        assert state == "Stable" and len(members) == 2, (state, members)
        time.sleep(MAX_POLL_MS / 1000 * 1.8)  # aiokafka left the group after 10 s without a poll
        assert http_json(port)["buffered"]["backpressure"], "the buffers drained: the test paused nothing"
        assert _members(kafka.bootstrap, group) == ("Stable", members), "the paused follower left its group"

        held.touch()
        wait_rows(catalog, replicas, (table,), len(values), timeout_s=240)
        replicas.check_alive()
        assert _members(kafka.bootstrap, group) == ("Stable", members)
    finally:
        replicas.stop_all()
    assert_exact(catalog, table, {json.loads(v)["order_id"] for v in values})


# Run in the replica's process (sitecustomize): the group's first assignment is made as if Faust's
# leader topic were not in the metadata yet (a fresh Apache Kafka broker answered so for the topic
# Faust had just created, in a benchmark run, and no replica led the group again).
_NO_LEADER_TOPIC_AT_FIRST = '''
import faust.assignor.partition_assignor as partition_assignor

_assign = partition_assignor.PartitionAssignor.assign
_first = [True]


class _Without:
    def __init__(self, cluster, topic):
        self._cluster, self._topic = cluster, topic

    def partitions_for_topic(self, topic):
        return None if topic == self._topic else self._cluster.partitions_for_topic(topic)

    def __getattr__(self, name):
        return getattr(self._cluster, name)


def assign(self, cluster, member_metadata):
    if _first[0]:
        _first[0] = False
        cluster = _Without(cluster, self.app.conf.id + "-__assignor-__leader")
    return _assign(self, cluster, member_metadata)


partition_assignor.PartitionAssignor.assign = assign
'''


@pytest.mark.timeout(600)
def test_a_group_assigned_without_its_leader_topic_assigns_again_and_gets_a_leader(kafka, catalog_props, tmp_path):
    """Faust's leader is the member holding its leader topic's partition: a first assignment
    made while that topic was not in the metadata gave it to no one, so no replica ran the
    coordinator, no partition was resumed, and the group never assigned again (aiokafka assigns
    again only when its metadata differs from what it assigned with). The assigner now looks for
    the topic and has the group assign again."""
    from pyiceberg.catalog import load_catalog

    from icesink.app.pizzas import pizza_values, produce
    from icesink.app.replicas import ReplicaSet
    from icesink.shared.kafka_admin import ensure_topic
    from tests.support.sinkrun import assert_exact, http_json, wait_rows, wait_up, write_config

    topic, table, group = "lt-orders", "lt.orders", "lt-sink"
    catalog = load_catalog("it", **catalog_props)
    catalog.create_namespace("lt")
    asyncio.run(ensure_topic(kafka.bootstrap, topic, 2))
    patch = tmp_path / "patch"
    patch.mkdir()
    (patch / "sitecustomize.py").write_text(_NO_LEADER_TOPIC_AT_FIRST)
    cfg = write_config(tmp_path / "sink.json", topics=topic, tables=table, bootstrap=kafka.bootstrap,
                       catalog_props=catalog_props, state_dir=tmp_path / "state", group=group,
                       **{"iceberg.control.topic.replication-factor": 1})
    replicas = ReplicaSet(cfg, tmp_path / "logs", env={"PYTHONPATH": str(patch)})
    values = pizza_values(2_000, seed=53)
    try:
        replicas.start("r1")
        wait_up(replicas)
        port = replicas.replicas["r1"].metrics_port
        asyncio.run(produce(kafka.bootstrap, topic, values, partitions=2))
        wait_rows(catalog, replicas, (table,), len(values), timeout_s=90)
        assert http_json(port)["coordinator"] is not None
    finally:
        replicas.stop_all()
    log = replicas.directory.joinpath("r1.log").read_text()
    assert "gave Faust's leader topic lt-sink-__assignor-__leader to no member" in log, log[-3000:]
    assert "the group assigns again" in log
    assert_exact(catalog, table, {json.loads(v)["order_id"] for v in values})
