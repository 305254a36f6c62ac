"""Backpressure with real processes (Tansu, one Faust + Spark worker, SQLite catalog).

The worker's buffers are bounded (``buffer.max-bytes`` 1.5 MB) and the commit interval is ten
minutes, so only the worker's own early-commit requests can make rounds happen: when its
buffers are full it pauses its partitions and sends ``CommitRequest``; the coordinator starts a
round at once; the response releases the buffers and the partitions resume. 60k records
(about 6x the bound in Arrow bytes) are produced at once. Checked:
- several snapshots are committed within seconds, each preceded by the worker's request;
- /metrics, sampled while ingesting: buffered bytes never pass the bound by more than one
  consumer batch; partitions are paused for backpressure at some point; requests are counted;
- the tail (less than the bound) waits for a round: one more request (sent by the test) makes
  it land, and DuckDB reads every record exactly once.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
import urllib.request

import pytest

pytestmark = pytest.mark.integration

TOPIC = "bp-pizzas"
TABLE = "bp.pizzas"
GROUP = "bp-sink"
PARTITIONS = 3
RECORDS = 60_000
BOUND = 1_500_000  # buffer.max-bytes
BATCH = 2_000  # consumer.max-batch
INTERVAL_MS = 600_000  # a scheduled round never comes during the test


def _status(port: int) -> dict | None:
    from tests.support.sinkrun import http_json

    try:
        return http_json(port)
    except OSError:
        return None


def _scrape(port: int, names: tuple[str, ...]) -> dict[str, float]:
    """Several unlabelled metrics from one /metrics read (so they are from the same instant)."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    values = dict(line.rsplit(" ", 1) for line in text.splitlines() if line and not line.startswith("#"))
    return {n: float(values[n]) for n in names}


class Sampler(threading.Thread):
    """Polls the replica's /metrics and /status while it ingests."""

    def __init__(self, port: int) -> None:
        super().__init__(daemon=True)
        self.port = port
        self.halt = threading.Event()
        self.samples: list[dict[str, float]] = []

    def run(self) -> None:
        while not self.halt.is_set():
            try:
                m = _scrape(self.port, ("icesink_buffered_bytes", "icesink_buffered_rows", "icesink_paused_partitions"))
                s = {"t": time.monotonic(), "bytes": m["icesink_buffered_bytes"],
                     "rows": m["icesink_buffered_rows"], "paused": m["icesink_paused_partitions"]}
                st = _status(self.port)
                s["backpressure"] = float(bool(st and st["buffered"]["backpressure"]))
                self.samples.append(s)
            except OSError:
                pass
            self.halt.wait(0.1)


def _peak_rss_kib(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


@pytest.mark.timeout(300)
def test_full_buffers_pause_partitions_and_commit_early(broker, catalog_props, tmp_path):
    from pyiceberg.catalog import load_catalog

    from icesink.shared.control import ControlProducer
    from icesink.shared.protocol import CommitRequest, StartCommit
    from icesink.shared.kafka_admin import ensure_topic
    from icesink.app.pizzas import pizza_values, produce
    from icesink.app.replicas import ReplicaSet
    from tests.support.sinkrun import assert_exact, control_events, group_key, metric, total_rows, write_config

    began = time.monotonic()
    catalog = load_catalog("it", **catalog_props)
    catalog.create_namespace("bp")
    asyncio.run(ensure_topic(broker.bootstrap, TOPIC, PARTITIONS))
    cfg = write_config(
        tmp_path / "sink.json", topics=TOPIC, tables=TABLE, bootstrap=broker.bootstrap,
        catalog_props=catalog_props, state_dir=tmp_path / "state", group=GROUP,
        # A long round timeout: a slow Spark write on a loaded machine must not make a round
        # partial (that is legal, but this test counts rounds).
        **{"buffer.max-bytes": BOUND, "consumer.max-batch": BATCH,
           "iceberg.control.commit.interval-ms": INTERVAL_MS, "iceberg.control.commit.timeout-ms": 120000,
           "maintenance.enabled": "false",  # it counts the rounds' snapshots; compaction would add some
           # every request here is full buffers' (a backlog's catch-up request is test_commit_triggers')
           "iceberg.control.commit.catch-up": "false"},
    )
    values = pizza_values(RECORDS, seed=11)
    keys = {json.loads(v)["order_id"] for v in values}
    replicas = ReplicaSet(cfg, tmp_path / "logs")
    sampler: Sampler | None = None
    try:
        r = replicas.start("bp")
        # Running, and every partition resumed by the coordinator (no longer claiming).
        deadline = time.monotonic() + 120
        while True:
            replicas.check_alive()
            st = _status(r.metrics_port)
            if st and st.get("phase") == "running" and len(st["partitions"]) == PARTITIONS \
                    and all(p["active"] for p in st["partitions"].values()):
                break
            assert time.monotonic() < deadline, f"replica not running with active partitions: {st}"
            time.sleep(0.5)
        assert metric(r.metrics_port, "icesink_paused_partitions") == 0
        ready, ready_wall = time.monotonic(), time.time()

        sampler = Sampler(r.metrics_port)
        sampler.start()
        asyncio.run(produce(broker.bootstrap, TOPIC, values, partitions=PARTITIONS))
        produced = time.monotonic()

        # Everything is either committed or buffered (the tail, below the bound): then the
        # worker is idle and only a round can move data on. Rows and backpressure from one
        # /status read: the sampler's last sample can predate the fetch that filled the buffers.
        deadline = time.monotonic() + 120
        while True:
            replicas.check_alive()
            committed = total_rows(catalog, TABLE)
            st = _status(r.metrics_port)
            buffered = st["buffered"]["rows"] if st else -1
            if committed + buffered == RECORDS and st and not st["buffered"]["backpressure"]:
                break
            assert time.monotonic() - ready < INTERVAL_MS / 1000 / 4, "too slow to tell early rounds from scheduled ones"
            assert time.monotonic() < deadline, \
                f"stalled: {committed} committed, {buffered} buffered of {RECORDS}; /status: {st}"
            time.sleep(0.5)
        drained = time.monotonic()
        time.sleep(1.0)  # a few more samples of the idle state
        sampler.halt.set()
        sampler.join()

        requests = metric(r.metrics_port, "icesink_early_commit_requests_total")
        rounds = metric(r.metrics_port, "icesink_rounds_committed_total")
        tail_bytes = metric(r.metrics_port, "icesink_buffered_bytes")
        early_snapshots = catalog.load_table(TABLE).snapshots()

        # The tail: one more request makes the round that commits it.
        async def ask() -> None:
            p = ControlProducer(broker.bootstrap, f"{GROUP}-control", GROUP, {}, group_key(catalog, GROUP))
            await p.start()
            try:
                await p.send(CommitRequest("test-flush", 0))
            finally:
                await p.stop()

        asyncio.run(ask())
        deadline = time.monotonic() + 60
        while total_rows(catalog, TABLE) < RECORDS:
            replicas.check_alive()
            assert time.monotonic() < deadline, f"tail not committed: {total_rows(catalog, TABLE)} of {RECORDS}"
            time.sleep(0.5)
        time.sleep(2)
        assert total_rows(catalog, TABLE) == RECORDS
        peak_rss = _peak_rss_kib(r.proc.pid)
        assert metric(r.metrics_port, "icesink_rounds_partial_total") == 0
    finally:
        if sampler is not None:
            sampler.halt.set()
        replicas.stop_all()

    assert_exact(catalog, TABLE, keys)

    # Early rounds: several snapshots long before a scheduled round could come, each round
    # started after a request of the worker (nothing else asks; the interval is 10 minutes).
    assert len(early_snapshots) >= 3, f"{len(early_snapshots)} snapshots before the tail round"
    latest = max(s.timestamp_ms for s in early_snapshots) / 1000 - ready_wall
    assert latest < INTERVAL_MS / 1000 / 4, f"early snapshots took {latest:.0f}s"
    assert requests >= len(early_snapshots), (requests, len(early_snapshots))
    assert rounds >= len(early_snapshots)
    log = [ev for _, ev in control_events(broker.bootstrap, f"{GROUP}-control", GROUP)]
    asked = False
    for ev in log:
        if isinstance(ev, CommitRequest):
            asked = True
        elif isinstance(ev, StartCommit):
            assert asked, "a round started without a request"
            asked = False
    worker_requests = [ev for ev in log if isinstance(ev, CommitRequest) and ev.worker == "bp"]
    assert all(ev.buffered_bytes >= BOUND for ev in worker_requests)

    # Bounded buffers: never more than the bound plus one consumer batch; paused when full;
    # the tail left below the bound.
    samples = sampler.samples
    assert samples, "no /metrics samples"
    per_row = max(s["bytes"] / s["rows"] for s in samples if s["rows"])
    batch_bytes = BATCH * per_row
    peak = max(s["bytes"] for s in samples)
    assert peak <= BOUND + batch_bytes, f"buffered {peak:.0f} bytes; bound {BOUND} + one batch {batch_bytes:.0f}"
    # The exact level at each pause, from the worker's log (sampling could miss a peak).
    fills = [int(b) for b in re.findall(r"buffers full \((\d+) bytes\)", r.log_path.read_text(errors="replace"))]
    assert fills and max(fills) <= BOUND + batch_bytes, fills
    assert peak >= BOUND * 0.9, f"buffers never filled (peak {peak:.0f} bytes)"
    assert any(s["backpressure"] and s["paused"] >= PARTITIONS for s in samples), "partitions never paused for backpressure"
    assert tail_bytes < BOUND

    print(
        f"backpressure: {RECORDS} records, bound {BOUND} B, one batch ~{batch_bytes:.0f} B "
        f"({per_row:.0f} B/row); peak buffered {peak:.0f} B ({peak / BOUND:.2f}x bound); "
        f"max at a pause {max(fills)} B; {len(early_snapshots)} early snapshots within {latest:.1f}s, "
        f"{requests:.0f} requests, {rounds:.0f} rounds; "
        f"paused in {sum(1 for s in samples if s['backpressure'])}/{len(samples)} samples; "
        f"start {ready - began:.1f}s, produce {produced - ready:.1f}s, drain {drained - ready:.1f}s, "
        f"total {time.monotonic() - began:.1f}s; worker peak RSS {peak_rss} KiB"
    )
