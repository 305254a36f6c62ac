"""The control topic is input, not trust (docs/commits.md): bad control records written by
someone else (a key that is not UTF-8, a value that is not JSON, a null value, a data-complete
whose range start is a string) are logged, counted and skipped by every reader. With real
processes (Tansu, 2 Faust + Spark workers, SQLite catalog): the coordinator does not restart,
the workers keep answering, and every record lands exactly once (DuckDB)."""

from __future__ import annotations

import asyncio
import json

import pytest

pytestmark = pytest.mark.integration

TOPIC = "cv-pizzas"
TABLE = "cv.pizzas"
GROUP = "cv-sink"
CONTROL = f"{GROUP}-control"
BAD = [
    (b"\xff\xfe", b'{"type":"commit-request","v":1,"worker":"x","buffered_bytes":1}'),  # key not UTF-8
    (GROUP.encode(), b"not json"),
    (GROUP.encode(), None),
    (GROUP.encode(), json.dumps({  # would pass the owner checks if its start were an int
        "v": 1, "type": "data-complete", "commit_id": "r", "response_id": "bad", "worker": "x",
        "generation": 1, "events_sent": 0, "ranges": [{"tp": {"topic": TOPIC, "partition": 0}, "start": "x", "end": 5}],
    }).encode()),
]


@pytest.mark.timeout(600)
def test_bad_control_records_are_skipped_and_counted_without_a_coordinator_restart(broker, catalog_props, tmp_path):
    from pyiceberg.catalog import load_catalog

    from icesink.shared.protocol import StartCommit
    from icesink.shared.kafka_admin import ensure_topic
    from icesink.app.pizzas import pizza_values, produce
    from icesink.app.replicas import ReplicaSet
    from tests.support.sinkrun import (
        assert_exact, control_events, group_key, metric, wait_rows, write_config, write_control,
    )

    catalog = load_catalog("it", **catalog_props)
    catalog.create_namespace("cv")  # two replicas creating it at once can race in the SQL catalog
    asyncio.run(ensure_topic(broker.bootstrap, TOPIC, 4))
    cfg = write_config(tmp_path / "sink.json", topics=TOPIC, tables=TABLE, bootstrap=broker.bootstrap,
                       catalog_props=catalog_props, state_dir=tmp_path / "state", group=GROUP)
    values = pizza_values(8_000, seed=11)
    keys = {json.loads(v)["order_id"] for v in values}
    replicas = ReplicaSet(cfg, tmp_path / "logs")
    try:
        replicas.start("c1")
        replicas.start("c2")
        asyncio.run(produce(broker.bootstrap, TOPIC, values[:4_000], partitions=4))
        wait_rows(catalog, replicas, (TABLE,), 4_000, timeout_s=300)
        # Sent one by one: the replicas' own events may fall between them.
        # Signed with the group's own secret (a replica's bug): the fields are what is judged.
        bad_offsets = write_control(broker.bootstrap, CONTROL, BAD, secret=group_key(catalog, GROUP))
        first_bad = bad_offsets[0]
        asyncio.run(produce(broker.bootstrap, TOPIC, values[4_000:], partitions=4))
        wait_rows(catalog, replicas, (TABLE,), 8_000, timeout_s=120)
        ports = [r.metrics_port for r in replicas.replicas.values()]
        by_worker = [metric(p, 'icesink_control_events_invalid_total{reader="worker"}') for p in ports]
        by_coordinator = sum(metric(p, 'icesink_control_events_invalid_total{reader="coordinator"}') for p in ports)
        restarts = sum(metric(p, "icesink_coordinator_restarts_total") for p in ports)
    finally:
        replicas.stop_all()
    assert by_worker == [len(BAD), len(BAD)]
    assert by_coordinator == len(BAD)
    assert restarts == 0
    log = control_events(broker.bootstrap, CONTROL, GROUP)
    # The round that lands the second half may have started before the bad records; either
    # way no round after them may run under a new epoch (a restarted coordinator's).
    before = [ev.epoch for off, ev in log if isinstance(ev, StartCommit) and off < first_bad]
    after = {ev.epoch for off, ev in log if isinstance(ev, StartCommit) and off > first_bad}
    assert before, "no round started before the bad records"
    assert after <= {before[-1]}, f"the coordinator restarted: epochs {sorted(after)} after {before[-1]}"
    text = "".join(r.read_text(errors="replace") for r in (tmp_path / "logs").glob("*.log"))
    assert "coordinator failed" not in text
    for offset in bad_offsets:
        assert f"control offset {offset}:" in text
    assert "data-complete field ranges[0].start: expected int >= 0, found 'x'" in text
    assert_exact(catalog, TABLE, keys)


@pytest.mark.timeout(600)
def test_numbers_out_of_range_are_skipped_and_counted_and_the_group_goes_on(broker, catalog_props, tmp_path):
    """Issue 40: a StartCommit with epoch 10**400 stalled the group for good (every recovering
    coordinator crashed converting it for a metric, workers ignored every real StartCommit below
    it). Every numeric field is now bounded when decoded: such events, even signed with the
    group's secret (a replica's bug), are skipped and counted by every reader, and rounds go on.
    A claim of a partition that does not exist is answered without it, and counted."""
    from pyiceberg.catalog import load_catalog

    from icesink.shared.kafka_admin import ensure_topic
    from icesink.app.pizzas import pizza_values, produce
    from icesink.app.replicas import ReplicaSet
    from tests.support.sinkrun import assert_exact, metric, wait_rows, write_config, write_control

    topic, table, group, secret = "or-pizzas", "or.pizzas", "or-sink", "or-group-secret"
    catalog = load_catalog("it", **catalog_props)
    asyncio.run(ensure_topic(broker.bootstrap, topic, 2))
    cfg = write_config(tmp_path / "sink.json", topics=topic, tables=table, bootstrap=broker.bootstrap,
                       catalog_props=catalog_props, state_dir=tmp_path / "state", group=group,
                       **{"iceberg.control.secret": secret})
    values = pizza_values(2000, seed=41)
    keys = {json.loads(v)["order_id"] for v in values}
    tp = {"topic": topic, "partition": 0}
    out_of_range = [
        {"type": "start-commit", "epoch": 10**400, "commit_id": "forged"},
        {"type": "start-commit", "epoch": 2**63, "commit_id": "forged"},
        {"type": "resume", "epoch": 2**62, "worker": "x", "generation": 1, "positions": []},
        {"type": "claim", "worker": "x", "generation": 2**31, "partitions": [tp]},
        {"type": "claim", "worker": "x", "generation": 1, "partitions": [{"topic": topic, "partition": 2**40}]},
        {"type": "data-complete", "commit_id": "r", "response_id": "x", "worker": "x", "generation": 1,
         "events_sent": 0, "ranges": [{"tp": tp, "start": 0, "end": 2**64}]},
        {"type": "commit-complete", "epoch": 1, "commit_id": "r", "through": 10**20, "positions": []},
        {"type": "commit-request", "worker": "x", "buffered_bytes": -(10**30)},
    ]
    records = [(group.encode(), json.dumps({"v": 1, **ev}).encode()) for ev in out_of_range]
    # In range but naming a partition that does not exist: answering it used to time out, and
    # restart the coordinator, which answered it again, for ever.
    no_such = json.dumps({"v": 1, "type": "claim", "worker": "x", "generation": 1,
                          "partitions": [{"topic": topic, "partition": 2**31 - 1}]}).encode()
    replicas = ReplicaSet(cfg, tmp_path / "logs")
    try:
        w = replicas.start()
        asyncio.run(produce(broker.bootstrap, topic, values[:1000], partitions=2))
        wait_rows(catalog, replicas, (table,), 1000, timeout_s=240)
        write_control(broker.bootstrap, f"{group}-control", [*records, (group.encode(), no_such)], secret=secret.encode())
        asyncio.run(produce(broker.bootstrap, topic, values[1000:], partitions=2))
        wait_rows(catalog, replicas, (table,), len(values), timeout_s=120)
        invalid = {r: metric(w.metrics_port, f'icesink_control_events_invalid_total{{reader="{r}"}}')
                   for r in ("worker", "coordinator")}
        restarts = metric(w.metrics_port, "icesink_coordinator_restarts_total")
        refused = metric(w.metrics_port, 'icesink_control_events_refused_total{reason="no-such-partition"}')
    finally:
        replicas.stop_all()
    assert invalid == {"worker": len(records), "coordinator": len(records)}
    assert restarts == 0
    assert refused == 1
    text = "".join(r.read_text(errors="replace") for r in (tmp_path / "logs").glob("*.log"))
    assert "start-commit field epoch: expected int <= " in text
    assert_exact(catalog, table, keys)
