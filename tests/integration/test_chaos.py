"""The CI-sized chaos run: 3 worker replicas, SIGKILL (and some SIGTERM) at random instants every
few seconds with restarts, 200,000 records; both tables must hold exactly what was produced
(tests/support/chaos.py; the long version is bench/chaos.py). Marked chaos: `./dev chaos` runs
them, the default suite leaves them out, CI runs both."""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.chaos]


@pytest.mark.timeout(900)
def test_chaos_200k_records_three_replicas_random_kills(broker, catalog_props, tmp_path):
    from tests.support.chaos import run_chaos

    report = run_chaos(
        tmp_path, bootstrap=broker.bootstrap, catalog_props=catalog_props, records=200_000,
        replicas=3, fault_s=100, kill_every_s=(4, 9), settle_timeout_s=420, seed=11,
    )
    print("\n".join(report.lines()))
    assert report.faults["SIGKILL"] >= 5, report.faults
    assert report.exact, "\n".join(report.lines())
    # SIGTERM: a replica hands its work back within shutdown.timeout-ms (15 s) plus process exit.
    assert all(s < 25 for s in report.shutdown_s), report.shutdown_s


@pytest.mark.timeout(900)
def test_chaos_mirror_tables_random_kills_and_fault_points(broker, catalog_props, tmp_path):
    """Issue 12 item 5: change events (inserts, updates, deletes, re-inserts, upserts) into two
    mirror tables, one bucketed on the key, while replicas are SIGKILLed at random and crash
    themselves at the fault points (between two table commits, mid-response, during the Spark
    write). Both tables must then equal the state the events leave: no key twice, no deleted
    key back, every value the latest."""
    from tests.support.chaos import run_mirror_chaos

    report = run_mirror_chaos(
        tmp_path, bootstrap=broker.bootstrap, catalog_props=catalog_props, events=30_000, keys=3_000,
        replicas=3, fault_s=60, kill_every_s=(5, 10), settle_timeout_s=420, seed=12,
        extra={"fault.crash-at": "coordinator.between-table-commits,worker.mid-response,worker.during-write"},
    )
    print("\n".join(report.lines()))
    assert report.faults["SIGKILL"] >= 3, report.faults
    assert report.exact, "\n".join(report.lines())
