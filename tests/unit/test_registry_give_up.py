"""The schema registry's give-up comes before the consumer's max poll interval (issue 36 point
1): a fetch waiting on the registry holds the Faust agent, and with it the consumer's polls; a
wait longer than ``max.poll.interval.ms`` would make the consumer leave the group first, and
its partitions move with the replica still up. On giving up the replica stops, saying the
registry, in /status and its exit code."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import pytest

from agents.faust_app import faust_settings
from agents.registry_client import RegistryUnavailable
from agents.registry_source import registry_values
from icesink.shared.config import Settings, build
from icesink.shared.metrics import Metrics

AVRO = "io.confluent.connect.avro.AvroConverter"


def settings(**extra: str) -> Settings:
    return build({"topics": "t", "iceberg.tables": "db.t", "value.converter": AVRO, **extra})


@pytest.mark.parametrize("extra", [
    {},
    {"consumer.override.max.poll.interval.ms": "120000"},
    {"consumer.max-poll-interval-ms": "20000"},
])
def test_the_registry_gives_up_before_the_consumer_would_leave_its_group(extra: dict[str, str]) -> None:
    s = settings(**{"value.converter.schema.registry.url": "http://127.0.0.1:1", **extra})
    found = registry_values(s, Metrics(), {})
    assert found is not None
    client = found[1]
    poll_interval_s = faust_settings(s)["broker_max_poll_interval"]  # what the consumer is given
    assert poll_interval_s == s.consumer_max_poll_interval_ms / 1000
    # the last attempt may take its whole timeout after the give-up's last check
    assert client.give_up_s + client.timeout_s < poll_interval_s, (client.give_up_s, poll_interval_s)


def test_connects_consumer_override_is_read_as_the_poll_interval() -> None:
    s = settings(**{"value.converter.schema.registry.url": "http://r:8081",
                    "consumer.override.max.poll.interval.ms": "120000"})
    assert s.consumer_max_poll_interval_ms == 120_000


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_giving_up_says_so_in_status_and_raises_registry_unavailable() -> None:
    s = settings(**{"value.converter.schema.registry.url": f"http://127.0.0.1:{_closed_port()}"})
    status: dict[str, Any] = {}
    found = registry_values(s, Metrics(), status)
    assert found is not None
    values, client = found
    client.give_up_s, client.backoff = 0.3, (0.01, 0.05)

    async def ask() -> None:
        try:
            await values.prepare([b"\x00\x00\x00\x00\x07rest"])
        finally:
            await client.close()

    with pytest.raises(RegistryUnavailable, match="schema registry gave no answer"):
        asyncio.run(ask())
    assert status["schema_registry"]["state"] == "gave up"
    assert "replica stops" in status["schema_registry"]["effect"]


class Worker:
    def __init__(self) -> None:
        self.failed: list[tuple[Exception, int]] = []

    def fail(self, exc: Exception, exit_code: int = 2) -> None:
        self.failed.append((exc, exit_code))


def test_a_registry_give_up_stops_the_replica_with_its_own_exit_code(caplog: pytest.LogCaptureFixture) -> None:
    from agents.faust_app import REGISTRY_EXIT_CODE, ingest_failed

    worker = Worker()
    exc = RegistryUnavailable("schema registry gave no answer for 30 s (9 attempts)")
    ingest_failed(worker, exc, 10)
    assert worker.failed == [(exc, REGISTRY_EXIT_CODE)]
    assert REGISTRY_EXIT_CODE not in (0, 1, 2)  # 1: a bug, 2: a setting or a record no retry mends
    assert "Traceback" not in caplog.text  # not logged as a bug: the registry is named, once
