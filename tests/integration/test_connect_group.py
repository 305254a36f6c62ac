"""``icesink connect``'s membership is Kafka's group protocol (icesink/app/connect_group.py):
real connect processes on the test broker, real worker replicas.

A process stopped with SIGTERM sends LeaveGroup after stopping its tasks, so the group's
leader places them on the others at once: with a 60 s session timeout, within 20 s, so only
the LeaveGroup can have moved them (a process killed -9 has its tasks moved after its session
expires: tests/integration/test_connect.py). On a real Kafka broker (`./dev chaos`, as CI runs
it): Tansu completes a rebalance only after a share of the session timeout (half of it for a
group's first join), so there the tasks of a process that left move later.
"""

from __future__ import annotations

import asyncio

import pytest

from tests.support.connect import ConnectProcess, call, process_config, start_connect, task_states, wait_exit, wait_status

pytestmark = pytest.mark.integration

PLACED = "placement from the group's leader"


def _last_placement(process: ConnectProcess) -> str:
    lines = [line for line in process.log.splitlines() if PLACED in line]
    return lines[-1] if lines else ""


@pytest.mark.kafka
@pytest.mark.chaos
def test_a_process_stopped_with_sigterm_has_its_tasks_moved_at_once(kafka, tmp_path):
    broker = kafka
    from icesink.shared.kafka_admin import ensure_topic


    asyncio.run(ensure_topic(broker.bootstrap, "group-leave-topic", 2))
    # a session far longer than the wait below: only LeaveGroup can move the tasks in time
    config = {"heartbeat.interval-ms": 1000, "session.timeout-ms": 60000}
    processes = [start_connect(tmp_path, name, process_config(tmp_path, broker.bootstrap, "group-leave", **config))
                 for name in ("c1", "c2")]
    ids = {f"127.0.0.1:{p.api}": p for p in processes}
    connector = {"connector.class": "org.apache.iceberg.connect.IcebergSinkConnector", "tasks.max": "2",
                 "topics": "group-leave-topic", "iceberg.tables": "leave.t", "iceberg.control.topic": "group-leave-ctl"}
    try:
        assert call(processes[0].api, "PUT", "/connectors/leave/config", connector)[0] == 201
        status = wait_status(processes[1].api, "leave", lambda s: task_states(s) == ["RUNNING", "RUNNING"] and len(
            {t["worker_id"] for t in s["tasks"]}) == 2, timeout_s=120)
        assert {t["worker_id"] for t in status["tasks"]} == set(ids)
        # the group's leader and follower, as each one's latest placement says; the follower is
        # stopped (the test asks a follower for it: on Tansu a leader stops without LeaveGroup)
        leader = [p for p in processes if _last_placement(p).endswith("(leader)")]
        assert len(leader) == 1, [_last_placement(p) for p in processes]
        follower = next(p for p in processes if p is not leader[0])
        follower.proc.terminate()
        assert wait_exit(follower, 60) == 0
        survivor = f"127.0.0.1:{leader[0].api}"
        try:
            moved = wait_status(leader[0].api, "leave", lambda s: task_states(s) == ["RUNNING", "RUNNING"] and {
                t["worker_id"] for t in s["tasks"]} == {survivor}, timeout_s=20)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\nstopped:\n{follower.log[-4000:]}\nsurvivor:\n{leader[0].log[-4000:]}") from None
        assert moved["connector"]["worker_id"] == survivor
        assert call(leader[0].api, "DELETE", "/connectors/leave")[0] == 204
    finally:
        for p in processes:
            p.stop()


def test_a_process_on_tansu_without_a_session_set_joins_with_six_seconds(broker, tmp_path):
    """Tansu holds each JoinGroup for half the session timeout: a process that does not set
    ``session.timeout-ms`` joins with 6 s there (icesink/app/connect_group.py fit_session)."""
    import time

    config = process_config(tmp_path, broker.bootstrap, "cg-tansu")
    del config["session.timeout-ms"]
    process = start_connect(tmp_path, "c1", config)
    try:
        deadline = time.monotonic() + 60
        while "joined cluster" not in process.log:
            assert time.monotonic() < deadline, process.log[-3000:]
            time.sleep(0.2)
        assert "session.timeout-ms is 6000 ms here" in process.log
    finally:
        process.stop()
