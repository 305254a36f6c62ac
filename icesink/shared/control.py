"""Control-topic I/O: one producer per process, and readers positioned by offset.

The control topic has one partition, so its offsets give every event of a sink group one
total order. Events are keyed by the group id; readers skip other groups' events.

The topic is input, not trust: a record whose key is not UTF-8, whose value is null, not
JSON, too large or not a valid event (icesink/shared/protocol/codec.py) is logged once with its control
offset, counted in ``icesink_control_events_invalid_total`` and skipped by every reader.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition as KafkaTP
from aiokafka.structs import OffsetAndMetadata

from icesink.shared import protocol, signing
from icesink.shared.errors import ControlLogError, ProtocolError
from icesink.shared.kafka_admin import TopicError, ensure_topic, topic_configs
from icesink.shared.metrics import Metrics

log = logging.getLogger(__name__)

#: The control topic is the commit log: never deleted by time or size, never compacted (every
#: event of a group has the same key, so compaction would keep one event per group).
CONTROL_TOPIC_CONFIGS = {"cleanup.policy": "delete", "retention.ms": "-1", "retention.bytes": "-1"}
#: The control producer's max_request_size: the largest event plus key and batch framing;
#: responses split their events well below it (agents/respond.py).
MAX_REQUEST_BYTES = protocol.MAX_EVENT_BYTES + 1024 * 1024
#: The control producer's record batches: under a broker's default message.max.bytes (1 MiB),
#: which bounds a whole batch; a larger single event goes alone in its batch.
MAX_BATCH_BYTES = 512 * 1024
# How long a control reader's fetch may wait on the broker (fetch.max.wait.ms, 500 by default).
# Kafka answers a waiting fetch as soon as an event arrives; the embedded Tansu looks again every
# half of this wait, so an event reached its reader up to 0.25 s late at 500 ms: twice a round
# (StartCommit, the responses), in every row's freshness. An idle control partition costs a few
# more empty fetches a second.
CONTROL_FETCH_WAIT_MS = 100



async def ensure_control_topic(
    bootstrap: str, topic: str, client_kwargs: dict[str, Any], replication_factor: int = 3
) -> None:
    """Create the control topic (one partition, :data:`CONTROL_TOPIC_CONFIGS`) unless it exists;
    refuse an existing one with more than one partition (ensure_topic) or a compacting cleanup
    policy, and warn about a time or size retention."""
    await ensure_topic(
        bootstrap, topic, 1, replication_factor=replication_factor, configs=CONTROL_TOPIC_CONFIGS,
        client_kwargs=client_kwargs, setting="iceberg.control.topic.replication-factor",
    )
    try:
        configs = await topic_configs(bootstrap, topic, client_kwargs=client_kwargs)
    except TopicError as exc:  # e.g. no DescribeConfigs permission: the check is lost, not the sink
        log.warning("control topic %r: its cleanup policy could not be checked (%s); it must be "
                    "cleanup.policy=delete", topic, exc)
        return
    check_control_configs(topic, configs)


def check_control_configs(topic: str, configs: dict[str, str]) -> None:
    policy = configs.get("cleanup.policy", "delete")
    if "compact" in policy:
        raise ControlLogError(
            f"control topic {topic!r}: expected cleanup.policy=delete, found {policy!r}. Compaction keeps one "
            "event per key (per sink group) and loses the commit log. Set cleanup.policy=delete and "
            "retention.ms=-1 on the topic (kafka-configs --alter), or use a new iceberg.control.topic."
        )
    for key in ("retention.ms", "retention.bytes"):
        value = configs.get(key)
        if value is not None and value != "-1":
            log.warning(
                "control topic %r has %s=%s: events may be deleted before a coordinator reads them; "
                "icesink detects it and recovers from the tables' state where that is safe, "
                "but -1 (keep for ever) is recommended", topic, key, value,
            )


def keyring_of(secret: bytes | signing.Keyring | None) -> signing.Keyring | None:
    return signing.Keyring(secret) if isinstance(secret, bytes) else secret


class ControlProducer:
    """Sends this group's events; with ``secret`` (the group's key, or its keyring: icesink/shared/signing.py)
    each is signed."""

    def __init__(
        self, bootstrap: str, topic: str, group: str, client_kwargs: dict[str, Any],
        secret: bytes | signing.Keyring | None = None,
    ) -> None:
        self.topic = topic
        self.group = group
        self.keyring = keyring_of(secret)
        self._producer = AIOKafkaProducer(
            bootstrap_servers=bootstrap,
            enable_idempotence=False,  # brokers without InitProducerId must work
            acks="all",
            linger_ms=0,
            # a worker's response is many events sent at once (agents/respond.py): a few
            # batches, each under a broker's default message.max.bytes (1 MiB), which bounds a
            # record batch
            max_batch_size=MAX_BATCH_BYTES,
            max_request_size=MAX_REQUEST_BYTES,
            **client_kwargs,
        )

    async def start(self) -> None:
        await self._producer.start()

    async def stop(self) -> None:
        await self._producer.stop()

    async def send(self, event: protocol.Event) -> int:
        """Send one event and wait until the broker has it; returns its control offset."""
        key, value = self.group.encode(), protocol.encode(event)
        headers = [(signing.HEADER, self.keyring.sign(key, value))] if self.keyring is not None else None
        meta = await self._producer.send_and_wait(self.topic, value, key=key, partition=0, headers=headers)
        return int(meta.offset)


class ControlReader:
    """Reads the control partition from a given offset. With ``commit_group`` it can also
    store and fetch a committed offset (the coordinator's checkpoint pointer); it never joins
    a consumer group (manual assignment), so readers never rebalance each other.

    ``reader`` names it in the invalid-event metric and log (``worker``, ``coordinator``). With
    ``secret`` (the group's key, or its keyring), an event without a valid signature is invalid."""

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        group: str,
        client_kwargs: dict[str, Any],
        commit_group: str | None = None,
        metrics: Metrics | None = None,
        reader: str = "tool",
        secret: bytes | signing.Keyring | None = None,
    ) -> None:
        self.group = group
        self._keyring = keyring_of(secret)
        self.reader = reader
        self._invalid = metrics.control_events_invalid.labels(reader=reader) if metrics is not None else None
        self._reported: dict[int, None] = {}  # offsets of invalid events already logged and counted
        self.tp = KafkaTP(topic, 0)
        self._consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap,
            group_id=commit_group,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            isolation_level="read_uncommitted",
            max_partition_fetch_bytes=protocol.MAX_EVENT_BYTES + 1024 * 1024,
            fetch_max_bytes=64 * 1024 * 1024,
            fetch_max_wait_ms=CONTROL_FETCH_WAIT_MS,
            **client_kwargs,
        )

    @property
    def consumer(self) -> AIOKafkaConsumer:
        """The reader's aiokafka consumer: once it has read, its connections tell which broker
        answers (agents/kafka ``holds_joins``)."""
        return self._consumer

    async def start(self) -> None:
        await self._consumer.start()
        self._consumer.assign([self.tp])

    async def stop(self) -> None:
        await self._consumer.stop()

    async def seek(self, offset: int) -> None:
        self._consumer.seek(self.tp, offset)

    async def seek_to_end(self) -> int:
        await self._consumer.seek_to_end(self.tp)
        position: int = await self._consumer.position(self.tp)
        return position

    async def seek_to_beginning(self) -> int:
        await self._consumer.seek_to_beginning(self.tp)
        position: int = await self._consumer.position(self.tp)
        return position

    async def position(self) -> int:
        """The offset of the next event this reader will return."""
        return int(await self._consumer.position(self.tp))

    async def end_offset(self) -> int:
        return int((await self._consumer.end_offsets([self.tp]))[self.tp])

    async def committed(self) -> int | None:
        committed: int | None = await self._consumer.committed(self.tp)
        return committed

    async def commit(self, offset: int) -> None:
        await self._consumer.commit({self.tp: OffsetAndMetadata(offset, "")})

    async def read(self, timeout_s: float) -> list[tuple[int, protocol.Event]]:
        """The next batch of this group's events (possibly empty after ``timeout_s``); invalid
        records are skipped (see the module docstring)."""
        batches = await self._consumer.getmany(self.tp, timeout_ms=int(timeout_s * 1000), max_records=5000)
        out: list[tuple[int, protocol.Event]] = []
        for record in batches.get(self.tp, []):
            try:
                event = decode_record(record.key, record.value, record.offset, self.group,
                                      headers=record.headers, secret=self._keyring)
            except ProtocolError as exc:
                self._skip(record.offset, exc)
                continue
            if event is not None:
                out.append((record.offset, event))
        return out

    def _skip(self, offset: int, exc: ProtocolError) -> None:
        """Log and count an invalid event once per reader, however often it is read again."""
        if offset in self._reported:
            return
        self._reported[offset] = None
        if len(self._reported) > 10_000:
            del self._reported[next(iter(self._reported))]
        if self._invalid is not None:
            self._invalid.inc()
        log.error("invalid control event skipped by the %s reader: %s", self.reader, exc)

    async def read_one(self, offset: int, timeout_s: float = 10.0) -> protocol.Event | None:
        await self.seek(offset)
        deadline = asyncio.get_running_loop().time() + timeout_s
        while asyncio.get_running_loop().time() < deadline:
            for off, ev in await self.read(1.0):
                if off == offset:
                    return ev
                if off > offset:
                    return None
        return None


def decode_record(
    key: bytes | None, value: bytes | None, offset: int, group: str,
    headers: Any = None, secret: bytes | signing.Keyring | None = None,
) -> protocol.Event | None:
    """The event of one control record, None if it belongs to another group; ProtocolError
    (naming the offset) if it is not a valid event, or with ``secret`` not signed with it.
    Records without a key count as ours."""
    keyring = keyring_of(secret)
    if key is not None:
        try:
            name = key.decode("utf-8")
        except UnicodeDecodeError:
            raise ProtocolError(
                f"control offset {offset}: key: expected UTF-8 text (a sink group id), found {key[:40]!r}"
            ) from None
        if name != group:
            return None
    if keyring is not None:
        wrong = keyring.problem(offset, key, value, headers)
        if wrong is not None:
            raise ProtocolError(
                f"control offset {offset}: signature: expected an HMAC-SHA256 under the group's secret "
                f"(iceberg.control.secret, or the group's own in the catalog), found {wrong} (written from "
                "outside the group, or by a replica with another secret)"
            )
    return protocol.decode(value, offset=offset)


#: Times in a row the broker closes the connection at DeleteRecords before it is taken as unsupported.
UNSUPPORTED_AFTER = 3
#: A group with no checkpoint and no event this recent holds the control log no more (Kafka's default
#: offsets.retention.minutes: its group offsets expire as long after it went idle).
GONE_AFTER_S = 7 * 24 * 3600.0


class ControlLogTruncator:
    """Deletes the control log's records that no sink group needs any more (DeleteRecords),
    where the broker allows it; run by the coordinator every ``maintenance.control-log.interval-ms``.

    A group needs the log from its replay start: the ``replay_from`` of the CommitComplete its
    ``<group>-coordinator`` offset points to (never past that event's own offset: the control
    topic is input, not trust). Several groups may share the topic (events keyed by group), so
    the records below ``before`` are deleted only if every group with an event there needs
    none of them: the keys of the records about to go are read first (each record once per
    coordinator: what was read is remembered), and a group whose checkpoint cannot be read
    holds the log at its first event while it is alive: while its newest event read is younger
    than :data:`GONE_AFTER_S` (Kafka expires an idle group's offsets after as long by default).
    Else (a connector deleted, its group's offsets expired, keys of no group at all) it would hold
    the log for ever. A broker that does not delete records is said once and
    never asked again: one that answers so at once, or one that closes the connection at the
    request (Tansu) :data:`UNSUPPORTED_AFTER` times in a row (a connection lost by chance, or
    any other failure, is reported and tried again at the next interval)."""

    def __init__(self, bootstrap: str, topic: str, group: str, client_kwargs: dict[str, Any],
                 secret: bytes | signing.Keyring | None = None, wall: Callable[[], float] = time.time,
                 coordinator_group: str | None = None) -> None:
        self.bootstrap, self.topic, self.group = bootstrap, topic, group
        # This group's coordinator offsets (Settings.coordinator_group); another group's: <group>-coordinator.
        self._own_commit_group = coordinator_group or f"{group}-coordinator"
        self._kwargs = client_kwargs
        self._secret = secret
        self._wall = wall
        self._first: dict[str, int] = {}  # every group's first event seen in the log's prefix
        self._newest_ms: dict[str, int] = {}  # and the newest timestamp of its events there
        self._scanned = 0  # the prefix read so far ends here
        self.unsupported: str | None = None
        self._closed = 0  # DeleteRecords requests in a row at which the broker closed the connection

    async def plan(self, floor: tuple[int, str] | None = None) -> dict[str, Any]:
        """Where the log may be truncated: ``before`` (every record below it is needed by no
        group; absent when nothing may go), the log's start, and the group that holds it there.
        ``floor``: this group's tables need the log from there too (offset, table: a parked
        table's replay start, coordinator/log_floor.py)."""
        consumer = AIOKafkaConsumer(bootstrap_servers=self.bootstrap, group_id=None, enable_auto_commit=False,
                                    max_partition_fetch_bytes=protocol.MAX_EVENT_BYTES + 1024 * 1024,
                                    **self._kwargs)
        await consumer.start()
        try:
            tp = KafkaTP(self.topic, 0)
            consumer.assign([tp])
            start = int((await consumer.beginning_offsets([tp]))[tp])
            mine = await self._needs(consumer, tp, self.group)
            if mine is None:
                return {"log_start": start, "held_by": self.group, "why": "no readable checkpoint"}
            await self._scan(consumer, tp, max(start, self._scanned), mine)
            before, held_by = min(mine, max(start, self._scanned)), self.group  # only below what was read
            if floor is not None and floor[0] < before:
                before, held_by = floor[0], f"{self.group} (table {floor[1]})"
            for group, first in sorted(self._first.items()):
                if group == self.group or max(first, start) >= before:
                    continue
                need = await self._needs(consumer, tp, group)
                if need is None and self._wall() * 1000 - self._newest_ms.get(group, 0) > GONE_AFTER_S * 1000:
                    continue  # no checkpoint and nothing new for long: gone, it holds nothing
                need = max(first, start) if need is None else need
                if need < before:
                    before, held_by = need, group
        finally:
            await consumer.stop()
        out: dict[str, Any] = {"log_start": start, "held_by": held_by}
        if before > start:
            out["before"] = before
        return out

    async def truncate(self, floor: tuple[int, str] | None = None) -> dict[str, Any]:
        """One truncation (:meth:`plan`, then DeleteRecords); returns what happened (/status)."""
        from icesink.shared.kafka_admin import DeleteRecordsUnsupported, delete_records

        if self.unsupported is not None:
            return {"unsupported": self.unsupported}
        plan = await self.plan(floor)
        if "before" not in plan:
            return plan
        try:
            low = await delete_records(self.bootstrap, self.topic, 0, plan["before"], client_kwargs=self._kwargs)
        except DeleteRecordsUnsupported as exc:
            self._closed = 0 if exc.definite else self._closed + 1
            if not exc.definite and self._closed < UNSUPPORTED_AFTER:
                log.warning("control topic %r not truncated this time (%d of %d before it is taken as unsupported): "
                            "%s", self.topic, self._closed, UNSUPPORTED_AFTER, exc)
                return {**plan, "error": str(exc)}
            self.unsupported = str(exc)
            log.warning("control topic %r is not truncated: %s. Its records stay until the topic's retention (if "
                        "any) removes them; icesink reads it from the checkpoint either way", self.topic, exc)
            return {"unsupported": self.unsupported, **plan}
        except Exception:
            self._closed = 0
            raise
        self._closed = 0
        held_by = plan["held_by"]
        log.info("control topic %r truncated below offset %d (the replay start of %s)", self.topic, low,
                 "this group" if held_by == self.group else f"group {held_by}")
        return {"log_start": low, "held_by": held_by}

    async def _needs(self, consumer: AIOKafkaConsumer, tp: KafkaTP, group: str) -> int | None:
        """Where ``group`` needs the log from: its checkpoint's replay start; None if unknown."""
        from icesink.shared.kafka_admin import group_offset

        commit_group = self._own_commit_group if group == self.group else f"{group}-coordinator"
        at = await group_offset(self.bootstrap, commit_group, self.topic, 0, client_kwargs=self._kwargs)
        if at is None:
            return None
        consumer.seek(tp, at)
        batch = await consumer.getmany(tp, timeout_ms=5000, max_records=1)
        for record in batch.get(tp, []):
            if record.offset != at:
                return None  # the checkpoint is gone (deleted by retention)
            try:
                ev = decode_record(record.key, record.value, record.offset, group, headers=record.headers,
                                   secret=self._secret if group == self.group else None)
            except ProtocolError:
                return None
            if isinstance(ev, protocol.CommitComplete):
                start = ev.replay_from if ev.replay_from is not None else ev.through + 1
                return min(start, at)
            return None
        # Not read (a slow broker): no answer, not "no checkpoint", which may let the log go
        raise TopicError(f"control topic {self.topic!r}: the checkpoint of group {group!r} at offset {at} was not "
                         "read within 5 s; not truncated this time", retriable=True)

    async def _scan(self, consumer: AIOKafkaConsumer, tp: KafkaTP, start: int, end: int) -> None:
        """Note the first offset of every group's events in ``[start, end)``."""
        if start >= end:
            return
        consumer.seek(tp, start)
        position = start
        while position < end:
            batch = await consumer.getmany(tp, timeout_ms=2000, max_records=5000)
            records = batch.get(tp, [])
            if not records:
                break
            for record in records:
                if record.offset >= end:
                    break
                if record.key is not None:
                    group = record.key.decode("utf-8", "replace")
                    self._first.setdefault(group, record.offset)
                    self._newest_ms[group] = max(self._newest_ms.get(group, 0), int(record.timestamp or 0))
            position = records[-1].offset + 1
        self._scanned = max(self._scanned, min(position, end))
