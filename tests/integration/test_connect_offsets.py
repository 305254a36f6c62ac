"""``icesink connect``: a stopped connector's offsets altered (KIP-875's PATCH) and reset (DELETE).

A real ``icesink connect`` process on the embedded broker, a real SQLite catalog, the connector's
replica with its Spark. Records land; the connector is stopped; a PATCH moves partition 0 forward
(records skipped) and partition 1 back (records read again: refused without
``?allow_duplicates=true``, then done with it); after resume the table holds exactly what the
new positions imply, read by DuckDB and pyiceberg, and the offsets shown are the new ends. A
DELETE without the flag is refused, as it would read everything again; with it, after resume,
every record is in the table once more.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import time
from collections import Counter
from typing import Any

import pytest

from tests.integration.test_connect import _call, _start_connect, _wait_status
from tests.unit.test_config import TUTORIAL

pytestmark = pytest.mark.integration

TOPIC, TABLE = "connect-offsets-pizzas", "connect.offsets_pizzas"


def _wait_rows(catalog: Any, n: int, proc: subprocess.Popen[bytes], timeout_s: float = 120) -> None:
    from icesink.shared.iceberg import total_rows

    deadline, seen = time.monotonic() + timeout_s, 0
    while time.monotonic() < deadline:
        assert proc.poll() is None, "the connect process exited"
        seen = total_rows(catalog, TABLE)
        if seen >= n:
            return
        time.sleep(1)
    raise AssertionError(f"expected {n} rows, found {seen}")


def _offsets(port: int) -> dict[int, int]:
    code, body = _call(port, "GET", "/connectors/pizzas/offsets")
    assert code == 200, body
    return {o["partition"]["kafka_partition"]: o["offset"]["kafka_offset"] for o in body["offsets"]}


def _stop(port: int) -> None:
    assert _call(port, "PUT", "/connectors/pizzas/stop")[0] == 204
    deadline, status = time.monotonic() + 90, {}
    while time.monotonic() < deadline and not (status.get("connector", {}).get("state") == "STOPPED"
                                                and status["tasks"] == []):
        time.sleep(0.5)
        status = _call(port, "GET", "/connectors/pizzas/status")[1]
    assert status["connector"]["state"] == "STOPPED" and status["tasks"] == [], status


def test_offsets_of_a_stopped_connector_altered_and_reset(broker, catalog_props, tmp_path):
    from pyiceberg.catalog import load_catalog

    from icesink.app.pizzas import pizza_values, produce
    from icesink.shared.kafka_admin import ensure_topic
    from tests.support.sinkrun import key_counts

    asyncio.run(ensure_topic(broker.bootstrap, TOPIC, 2))
    values = pizza_values(160, seed=23)
    key = [json.loads(v)["order_id"] for v in values]
    # record i goes to partition i % 2: offset o of partition p holds values[2 * o + p]
    asyncio.run(produce(broker.bootstrap, TOPIC, values[:100], partitions=2))
    proc, port, _ = _start_connect(tmp_path, "c1", broker.bootstrap, tmp_path / "state")
    catalog = load_catalog("it", **catalog_props)
    connector = {**TUTORIAL, "tasks.max": "1", "topics": TOPIC, "iceberg.tables": TABLE, "iceberg.catalog": "it",
                 **{f"iceberg.catalog.{k}": v for k, v in catalog_props.items()},
                 "iceberg.control.topic": "connect-offsets-control", "iceberg.control.commit.interval-ms": 1000}
    for k in [k for k in connector if k.startswith("iceberg.catalog.") and k.split(".", 2)[2] not in catalog_props]:
        del connector[k]
    patch = {"offsets": [
        {"partition": {"kafka_topic": TOPIC, "kafka_partition": 0}, "offset": {"kafka_offset": 60}},
        {"partition": {"kafka_topic": TOPIC, "kafka_partition": 1}, "offset": {"kafka_offset": 40}},
    ]}
    try:
        assert _call(port, "PUT", "/connectors/pizzas/config", connector)[0] == 201
        _wait_rows(catalog, 100, proc)
        assert _offsets(port) == {0: 50, 1: 50}
        code, body = _call(port, "PATCH", "/connectors/pizzas/offsets", patch)
        assert code == 400 and "STOPPED" in body["message"], body

        _stop(port)
        asyncio.run(produce(broker.bootstrap, TOPIC, values[100:], partitions=2))  # offsets 50..79 of each

        # back below what the table holds (partition 1 to 40 < 50): duplicates, refused without the flag
        code, body = _call(port, "PATCH", "/connectors/pizzas/offsets", patch)
        assert code == 400 and "allow_duplicates=true" in body["message"] and f"{TOPIC}[1]" in body["message"], body
        code, body = _call(port, "DELETE", "/connectors/pizzas/offsets")
        assert code == 400 and "allow_duplicates=true" in body["message"], body
        code, body = _call(port, "PATCH", "/connectors/pizzas/offsets?allow_duplicates=true", patch)
        assert (code, body) == (200, {"message": "The offsets for this connector have been altered successfully"})
        # the table's sink state holds partition 1's lower position already (the sweep's fence keeps the files
        # read again); partition 0's higher one comes with the next commit
        assert _offsets(port) == {0: 50, 1: 40}

        assert _call(port, "PUT", "/connectors/pizzas/resume")[0] == 202
        _wait_status(port, "RUNNING")
        # partition 0: offsets 0..49, then 60..79 (50..59 skipped); partition 1: 0..49, 40..79 (40..49 twice)
        want = Counter([key[2 * o] for o in [*range(50), *range(60, 80)]]
                       + [key[2 * o + 1] for o in [*range(50), *range(40, 80)]])
        _wait_rows(catalog, sum(want.values()), proc)
        deadline = time.monotonic() + 30
        while _offsets(port) != {0: 80, 1: 80} and time.monotonic() < deadline:
            time.sleep(1)
        assert _offsets(port) == {0: 80, 1: 80}
        assert key_counts(catalog, TABLE, "order_id") == want  # DuckDB
        scanned = catalog.load_table(TABLE).scan(selected_fields=("order_id",)).to_arrow()["order_id"].to_pylist()
        assert Counter(scanned) == want  # pyiceberg

        # reset (with the flag): every partition from its beginning, so every record once more
        _stop(port)
        code, body = _call(port, "DELETE", "/connectors/pizzas/offsets?allow_duplicates=true")
        assert (code, body) == (200, {"message": "The offsets for this connector have been reset successfully"})
        assert _offsets(port) == {0: 0, 1: 0}
        assert _call(port, "PUT", "/connectors/pizzas/resume")[0] == 202
        want += Counter(key)
        _wait_rows(catalog, sum(want.values()), proc)
        assert key_counts(catalog, TABLE, "order_id") == want
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
