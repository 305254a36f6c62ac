"""Helpers for fault tests that run real worker processes: a config, waiting for rows, the
exact check through DuckDB, and reading a replica's /metrics and /status."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from icesink.shared.iceberg import total_rows  # the tests import it from here too
from icesink.app.replicas import ReplicaSet, write_fast_config




def write_config(path: Path, **kwargs: Any) -> Path:
    """The fast local-group config (icesink.app.replicas.write_fast_config), catalog named "it"."""
    return write_fast_config(path, catalog_name="it", **kwargs)


def wait_rows(catalog: Any, replicas: ReplicaSet, tables: tuple[str, ...], expected: int | dict[str, int],
              timeout_s: float = 600) -> None:
    """Until every table holds ``expected`` rows (a count per table if a dict)."""
    want = expected if isinstance(expected, dict) else dict.fromkeys(tables, expected)
    deadline = time.monotonic() + timeout_s
    seen: dict[str, int] = {}
    while time.monotonic() < deadline:
        replicas.check_alive()
        seen = {t: total_rows(catalog, t) for t in tables}
        if all(v >= want[t] for t, v in seen.items()):
            return
        time.sleep(1)
    logs = "\n".join(f"--- {r.name}\n" + r.log_path.read_text(errors="replace")[-3000:] for r in replicas.replicas.values())
    raise AssertionError(f"expected {expected} rows, found {seen}\n{logs}")


def sink_until(cfg: Path, logs: Path, catalog: Any, tables: tuple[str, ...], expected: int | dict[str, int],
               timeout_s: float = 150) -> None:
    """One replica (w1) of ``cfg`` runs until the tables hold ``expected`` rows, then all stop."""
    replicas = ReplicaSet(cfg, logs)
    try:
        replicas.start("w1")
        wait_rows(catalog, replicas, tables, expected, timeout_s=timeout_s)
    finally:
        replicas.stop_all()


def nested_record(i: int) -> dict[str, object]:
    """Value ``i`` of the file-format tests: scalars, a struct and a list column."""
    return {"id": i, "note": f"note {i % 97}", "score": i * 0.5, "inner": {"a": i % 7, "b": f"b{i}"},
            "tags": [f"t{i % 3}", f"u{i % 5}"]}


async def send_json(bootstrap: str, topic: str, values: Iterable[dict[str, object]], partition: int = 0) -> None:
    """Each value as JSON to one partition of ``topic``, every one acknowledged."""
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=False, acks="all", linger_ms=20)
    await producer.start()
    try:
        futures = [await producer.send(topic, json.dumps(v).encode(), partition=partition) for v in values]
        await asyncio.gather(*futures)
    finally:
        await producer.stop()


def key_counts(catalog: Any, table: str, key: str = "order_id") -> Counter[str]:
    from tests.support.duck import connect, plain_path

    loaded = catalog.load_table(table)
    location = plain_path(loaded.metadata_location)
    with connect(loaded.io.properties) as con:
        return Counter(r[0] for r in con.execute(f"SELECT {key} FROM iceberg_scan('{location}')").fetchall())


def assert_exact(catalog: Any, table: str, keys: set[str], key: str = "order_id") -> None:
    """Read with DuckDB's iceberg extension: every key exactly once, nothing else."""
    got = key_counts(catalog, table, key)
    dups = {k: c for k, c in got.items() if c > 1}
    missing = keys - got.keys()
    unexpected = got.keys() - keys
    assert not dups and not missing and not unexpected, (
        f"{table}: {sum(got.values())} rows for {len(keys)} keys; {len(dups)} duplicated, "
        f"{len(missing)} missing, {len(unexpected)} unexpected (e.g. {list(dups)[:3]} {list(missing)[:3]})"
    )


def http_json(port: int, path: str = "/status") -> Any:
    return json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5).read())


def wait_up(replicas: ReplicaSet, timeout_s: float = 120.0) -> None:
    """Until every replica's /status answers (a replica just started is still importing)."""
    import time

    deadline = time.monotonic() + timeout_s
    for r in list(replicas.replicas.values()):
        while True:
            replicas.check_alive()
            try:
                http_json(r.metrics_port)
                break
            except OSError as exc:
                if time.monotonic() > deadline:
                    raise AssertionError(f"replica {r.name}: /status on port {r.metrics_port} not up in {timeout_s} s") from exc
                time.sleep(0.5)


def coordinator_status(replicas: ReplicaSet) -> tuple[Any, dict[str, Any]] | None:
    """The replica running the coordinator and the coordinator's part of its /status."""
    for r in list(replicas.replicas.values()):
        try:
            st = http_json(r.metrics_port)
        except OSError:
            continue
        if st.get("coordinator"):
            return r, st["coordinator"]
    return None


def metric(port: int, name: str) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name) and not line.startswith("#"))


def control_events(bootstrap: str, topic: str, group: str) -> list[tuple[int, Any]]:
    """Every event of the group's control log, with its offset."""
    import asyncio

    from icesink.shared.control import ControlReader

    async def read() -> list[tuple[int, Any]]:
        reader = ControlReader(bootstrap, topic, group, {})
        await reader.start()
        out: list[tuple[int, Any]] = []
        try:
            end = await reader.end_offset()
            await reader.seek(0)
            while True:
                batch = await reader.read(1.0)
                out += batch
                if not batch and await reader.position() >= end:
                    return out
        finally:
            await reader.stop()

    return asyncio.run(read())


def group_key(catalog: Any, group: str, namespace: str = "icesink") -> bytes:
    """The signing key of a group without iceberg.control.secret: its own, in the catalog
    (icesink/shared/group_secret.py), as a replica of the group (or a test playing one) signs with."""
    from icesink.shared.group_secret import read_secret

    stored = read_secret(catalog, namespace, group)
    assert stored is not None, f"group {group} has no secret in namespace {namespace} of the catalog"
    return stored.key.encode("ascii")


def write_control(bootstrap: str, topic: str, records: list[tuple[bytes | None, bytes | None]],
                  secret: bytes | None = None) -> list[int]:
    """Write raw (key, value) records to a control topic as someone outside the group would
    (no signature), or with ``secret`` as a replica of the group would (signed); their offsets."""
    import asyncio

    from aiokafka import AIOKafkaProducer

    from icesink.shared import signing

    def headers(key: bytes | None, value: bytes | None) -> list[tuple[str, bytes]] | None:
        return None if secret is None else [(signing.HEADER, signing.sign(secret, key, value))]

    async def go() -> list[int]:
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=False, acks="all")
        await producer.start()
        try:
            return [(await producer.send_and_wait(topic, value, key=key, partition=0, headers=headers(key, value))).offset
                    for key, value in records]
        finally:
            await producer.stop()

    return asyncio.run(go())


def read_topic(bootstrap: str, topic: str, want: int, timeout_s: float) -> list[Any]:
    """Every record of ``topic`` once at least ``want`` are there (or the timeout passed)."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    async def go() -> list[Any]:
        consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False)
        await consumer.start()
        try:
            parts = consumer.partitions_for_topic(topic) or set()
            deadline = time.monotonic() + timeout_s
            while not parts and time.monotonic() < deadline:
                await consumer._client.force_metadata_update()
                parts = consumer.partitions_for_topic(topic) or set()
                await asyncio.sleep(0.5)
            consumer.assign([TopicPartition(topic, p) for p in parts])
            await consumer.seek_to_beginning()
            out: list[Any] = []
            while time.monotonic() < deadline:
                for records in (await consumer.getmany(timeout_ms=500)).values():
                    out += records
                if len(out) >= want:
                    # one more poll: duplicates (at least once) may follow
                    for records in (await consumer.getmany(timeout_ms=1000)).values():
                        out += records
                    return out
            return out
        finally:
            await consumer.stop()

    return asyncio.run(go())
