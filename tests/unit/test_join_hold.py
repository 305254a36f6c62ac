"""A broker that holds each JoinGroup until half the group's session timeout has passed (Tansu,
``coordinator/group/administrator.rs``) gives a replica whose ``consumer.session-timeout-ms`` is
not set a session of 6 s instead of 10: a new group then joins in 3 s, not 5, and a replica
that died is replaced sooner. A session a user set is kept, and on Kafka nothing changes."""

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from prometheus_client import CollectorRegistry

from agents import kafka
from agents.buffer import Buffers
from agents.faust_app import FaustApp
from agents.parts import Replica
from icesink.shared.config import build
from icesink.shared.metrics import Metrics


class Hooks:
    async def on_fetch(self, fetched: Any) -> None: ...

    def fail(self, exc: Exception, exit_code: int = 2) -> None: ...

    def hold_paused_partitions(self) -> None: ...


def faust_app(tmp_path: Path, **given: Any) -> FaustApp:
    settings = build({"topics": "src", "iceberg.tables": "db.a", "state.dir": str(tmp_path), "group.id": "g", **given})
    return FaustApp(settings, "127.0.0.1:9", Replica("w1", {}), Buffers(1 << 20), Metrics(CollectorRegistry()),
                    hooks=Hooks())


def consumer(*answers: dict[int, tuple[int, int]] | None) -> Any:
    """A consumer whose connections got these ApiVersions answers (None: not answered yet)."""
    conns = {(i, 0): SimpleNamespace(_versions=a) for i, a in enumerate(answers)}
    return SimpleNamespace(_client=SimpleNamespace(_conns=conns))


def timing(app: FaustApp) -> tuple[float, float, float]:
    conf = app.app.conf
    return conf.broker_session_timeout, conf.broker_heartbeat_interval, conf.broker_rebalance_timeout


def test_a_broker_without_offset_for_leader_epoch_holds_joins() -> None:
    tansu = {kafka.OFFSET_FOR_LEADER_EPOCH - 1: (0, 3), 11: (0, 7)}
    assert kafka.holds_joins(consumer(tansu))
    assert kafka.holds_joins(consumer(tansu, None))
    assert not kafka.holds_joins(consumer({**tansu, kafka.OFFSET_FOR_LEADER_EPOCH: (0, 4)}))
    assert not kafka.holds_joins(consumer())  # no broker answered yet: nothing is assumed
    assert not kafka.holds_joins(consumer(None))


def test_an_unset_session_timeout_is_six_seconds_where_joins_are_held(tmp_path: Path) -> None:
    assert timing(faust_app(tmp_path)) == (10.0, 1.0, 20.0)
    app = faust_app(tmp_path)  # its timing not read before: Faust warns of a value changed after a read
    settings = app.fit_session(holds_joins=True)
    assert settings.session_timeout_ms == 6000
    assert app.settings is settings
    assert timing(app) == (6.0, 0.6, 20.0)  # what the consumer is made with, as it starts


def test_a_session_timeout_that_was_set_is_kept_and_kafka_changes_nothing(tmp_path: Path) -> None:
    given = faust_app(tmp_path, **{"consumer.session-timeout-ms": 10000})
    assert given.fit_session(holds_joins=True).session_timeout_ms == 10000
    assert timing(given) == (10.0, 1.0, 20.0)
    on_kafka = faust_app(tmp_path)
    assert on_kafka.fit_session(holds_joins=False).session_timeout_ms == 10000
    assert timing(on_kafka) == (10.0, 1.0, 20.0)
