"""Bad records and tombstones: screened before conversion, dead-lettered or fatal after it.

A bad record is one that cannot become a row: malformed JSON, a value that cannot be coerced to
the table's type, a value larger than ``errors.max-record-bytes``, or (routing) one no rule
sends anywhere. As in Kafka Connect:

- ``errors.tolerance=all``: it is counted, logged, and sent to the dead-letter topic
  (``errors.deadletterqueue.topic.name``) with its original key, value and headers plus
  ``__connect.errors.*`` context headers and ours (``icesink.errors.*``); the good records of
  the same batch go on. Without a topic it is appended to ``<state.dir>/deadletter/<topic>.jsonl``
  on the replica's host (a fallback: local, lost with the host).
- ``errors.tolerance=none``: a :class:`DataError` naming topic, partition, offset and field;
  the worker stops the replica (exit code 2) before anything from that batch is buffered.

With ``deadletter.table`` each letter is also a row of that Iceberg table, buffered with the good
rows of its batch (agents/ingest.py) and so committed exactly once, by the round that passes
its offset (docs/deadletters.md); with the table and no topic, no local file is written.

The dead-letter topic is at-least-once: sends are awaited (:meth:`DeadLetters.flush`) before the
worker reports the offsets of a round, so an offset is never accepted before its dead letter is
acknowledged; a record re-read after a crash or rewind is dead-lettered again.

Tombstones (null values) are not records to convert: they are skipped, counted, and their
offsets count as consumed like any other.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from agents.convert import Reject
from icesink.shared.config import Settings
from icesink.shared.errors import DataError, IcesinkError
from icesink.shared.metrics import Metrics

log = logging.getLogger(__name__)

# Kafka Connect's context headers (DeadLetterQueueReporter); values are UTF-8 strings.
H_TOPIC = "__connect.errors.topic"
H_PARTITION = "__connect.errors.partition"
H_OFFSET = "__connect.errors.offset"
H_CONNECTOR = "__connect.errors.connector.name"
H_TASK = "__connect.errors.task.id"
H_STAGE = "__connect.errors.stage"
H_EXECUTING_CLASS = "__connect.errors.class.name"
H_EXCEPTION = "__connect.errors.exception.class.name"
H_MESSAGE = "__connect.errors.exception.message"
# Ours.
# The kind: malformed, uncoercible, missing-required, missing-key, no-operation, too-large, no-route.
H_REASON = "icesink.errors.reason"
H_FIELD = "icesink.errors.field"  # dotted path of the field at fault, when there is one
H_TABLE = "icesink.errors.table"  # the target table(s) that rejected it, comma-separated
H_VALUE_OMITTED = "icesink.errors.value-omitted"  # set when the value was too large for the DLQ topic

EXCEPTION_CLASS = f"{DataError.__module__}.{DataError.__qualname__}"
# kind -> (Kafka Connect stage, the code that found the error)
_WHERE = {
    "too-large": ("VALUE_CONVERTER", "agents.deadletter.screen"),
    "no-route": ("TASK_PUT", "agents.routing"),
}
_CONVERTER = ("VALUE_CONVERTER", "agents.convert.decode_json")
DLQ_PARTITIONS = 1  # as Kafka Connect creates it
DLQ_MAX_REQUEST_BYTES = 64 * 1024 * 1024
PRUNE_EVERY = 1024  # letters sent between two sweeps of the acknowledged ones


def kind_of(reason: str, field: str | None) -> str:
    """The bounded label of a reject reason, for metrics and the ``icesink.errors.reason`` header."""
    if reason.startswith("record of "):
        return "too-large"
    if reason.startswith("no route"):
        return "no-route"
    if field is None:
        return "malformed"
    if reason.startswith("change without a value for key column"):  # mirror tables (agents/mirror.py)
        return "missing-key"
    if reason.startswith("operation field"):
        return "no-operation"
    if reason.startswith("required field"):
        return "missing-required"
    return "uncoercible"


@dataclass(frozen=True)
class Screened:
    """One partition batch after screening: what to convert, and what never gets converted."""

    values: list[bytes]  # the values to convert, in offset order
    positions: list[int]  # for each value, the index of its message in the batch
    nbytes: int  # value bytes of the batch, tombstones excepted
    tombstones: int
    rejects: tuple[Reject, ...]  # too large; indexes are message indexes
    filtered: int = 0  # dropped by a transform (Filter)

    @property
    def whole(self) -> bool:
        """Every message's value is in ``values``: ``positions`` is 0, 1, 2 ..."""
        return not self.tombstones and not self.rejects and not self.filtered

    def at_messages(self, rejects: Iterable[Reject]) -> list[Reject]:
        """Rejects of ``decode_json(self.values)`` re-indexed to the batch's messages."""
        return [replace(r, index=self.positions[r.index]) for r in rejects]

    def messages_of(self, messages: Sequence[Any]) -> Sequence[Any]:
        """The messages of ``values``, in their order."""
        return messages if self.whole else [messages[p] for p in self.positions]


def screen(messages: Sequence[Any], max_bytes: int, dropped: npt.NDArray[np.bool_] | None = None) -> Screened:
    """Drop tombstones and reject values larger than ``max_bytes`` before any parsing;
    ``dropped``: records a transform filtered out (agents/transforms/), never converted."""
    values: list[bytes] = []
    positions: list[int] = []
    rejects: list[Reject] = []
    nbytes = tombstones = filtered = 0
    for i, m in enumerate(messages):
        if dropped is not None and dropped[i]:
            filtered += 1
            continue
        v = m.value
        if v is None:
            tombstones += 1
            continue
        nbytes += len(v)
        if len(v) > max_bytes:
            rejects.append(Reject(i, f"record of {len(v)} bytes exceeds errors.max-record-bytes={max_bytes}", None))
            continue
        values.append(v)
        positions.append(i)
    return Screened(values, positions, nbytes, tombstones, tuple(rejects), filtered)


@dataclass(frozen=True)
class Letter:
    """One dead-letter record: what is sent, and what it is counted as."""

    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...]
    topic: str  # source
    partition: int
    offset: int
    kind: str
    # For a row of the dead-letter table (icesink/shared/deadletter_table.py):
    error: str = ""
    field: str | None = None
    tables: str | None = None  # the target tables that rejected it, comma-separated
    timestamp_ms: int | None = None
    original_headers: tuple[tuple[str, bytes], ...] = ()  # ``headers`` without the context headers


def context_headers(
    m: Any, error: DataError, kind: str, tables: Sequence[str], *, connector: str, task: str
) -> list[tuple[str, bytes]]:
    stage, executing = _WHERE.get(kind, _CONVERTER)
    out = [
        (H_TOPIC, m.topic), (H_PARTITION, str(m.partition)), (H_OFFSET, str(m.offset)),
        (H_CONNECTOR, connector), (H_TASK, task), (H_STAGE, stage), (H_EXECUTING_CLASS, executing),
        (H_EXCEPTION, EXCEPTION_CLASS), (H_MESSAGE, str(error)), (H_REASON, kind),
    ]
    if error.field is not None:
        out.append((H_FIELD, error.field))
    if tables:
        out.append((H_TABLE, ",".join(tables)))
    return [(k, v.encode()) for k, v in out]


def original_headers(m: Any) -> list[tuple[str, bytes]]:
    h = getattr(m, "headers", None) or ()
    items = h.items() if isinstance(h, dict) else h
    return [(str(k), bytes(v) if v is not None else b"") for k, v in items]


class DeadLetterSendError(IcesinkError):
    """Dead letters not acknowledged by the dead-letter topic: the round's response is held
    back (its data kept) and the letters are sent again at the next round."""

    retriable = True


class DeadLetters:
    """The worker's dead-letter sink. ``producer`` is for tests; by default :meth:`start`
    opens an aiokafka producer when a dead-letter topic is configured."""

    def __init__(self, settings: Settings, metrics: Metrics, worker_id: str, producer: Any = None) -> None:
        self.settings = settings
        self.metrics = metrics
        self.worker_id = worker_id
        self.topic = settings.dlq_topic
        self.table = settings.deadletter_table  # rows too, committed with the data (agents/ingest.py)
        self.tolerate = settings.tolerate_errors
        self.directory = settings.state_dir / "deadletter"
        self._producer = producer
        self._inflight: list[tuple[Letter, asyncio.Future[Any] | BaseException]] = []
        self._failed: list[Letter] = []
        self.delivered = 0  # letters acknowledged (or written to the file) since start

    async def start(self, bootstrap: str) -> None:
        s = self.settings
        if not self.tolerate:
            if self.topic:
                log.warning("errors.deadletterqueue.topic.name is set but errors.tolerance=none: "
                            "a bad record stops the replica, nothing is dead-lettered")
            return
        if not self.topic and self.table:
            log.info("bad records go to dead-letter table %s (no dead-letter topic)", self.table)
            return
        if not self.topic:
            log.info("errors.tolerance=all without errors.deadletterqueue.topic.name: bad records "
                     "go to %s/<topic>.jsonl on this host", self.directory)
            return
        if self._producer is None:
            from aiokafka import AIOKafkaProducer

            from icesink.shared.kafka_admin import ensure_topic, topic_exists

            client = s.kafka_client_kwargs()
            if not await topic_exists(bootstrap, self.topic, client_kwargs=client):
                # An existing topic is used with whatever partition count it has.
                await ensure_topic(bootstrap, self.topic, DLQ_PARTITIONS, replication_factor=s.dlq_replication_factor,
                                   client_kwargs=client, setting="errors.deadletterqueue.topic.replication.factor")
            self._producer = AIOKafkaProducer(
                bootstrap_servers=bootstrap,
                enable_idempotence=False,  # brokers without InitProducerId (Tansu) must work
                acks="all",
                linger_ms=5,
                max_request_size=DLQ_MAX_REQUEST_BYTES,
                **client,
            )
        await self._producer.start()
        log.info("bad records go to dead-letter topic %s", self.topic)

    async def stop(self) -> None:
        """Unacknowledged letters are not lost: their offsets were never reported, so the next
        owner re-reads and dead-letters them again."""
        if self._producer is not None:
            await self._producer.stop()

    # Taking bad records ----------------------------------------------------------------------

    async def dead_letter(
        self, messages: Sequence[Any], indices: Iterable[int], reason: str,
        field: str | None = None, table: str | None = None, *, kind: str | None = None,
    ) -> None:
        """Dead-letter ``messages[i]`` for each ``i`` in ``indices`` with one reason (e.g. routing:
        ``reason="no routing rule matches", kind="no-route"``). Raises :class:`DataError` under
        ``errors.tolerance=none``."""
        await self.reject(messages, [(Reject(i, reason, field), table) for i in indices], kind=kind)

    async def reject(
        self, messages: Sequence[Any], rejects: Iterable[tuple[Reject, str | None]], *, kind: str | None = None,
    ) -> list[Letter]:
        """Rejects of one partition batch, each with the table that rejected it (None: before
        any table). The same record rejected for the same reason by several tables is one
        dead letter naming them all. Raises :class:`DataError` for the first bad record under
        ``errors.tolerance=none``. Returns the letters (rows of ``deadletter.table``)."""
        merged: dict[tuple[int, str, str | None], list[str]] = {}
        for r, table in rejects:
            tables = merged.setdefault((r.index, r.reason, r.field), [])
            if table is not None and table not in tables:
                tables.append(table)
        first: DataError | None = None
        count = 0
        letters: list[Letter] = []
        for (index, reason, field), tables in sorted(merged.items(), key=lambda kv: kv[0][0]):
            m = messages[index]
            k = kind or kind_of(reason, field)
            where = f" for table {','.join(tables)}" if tables else ""
            err = DataError(f"{reason}{where}", topic=m.topic, partition=m.partition, offset=m.offset, field=field)
            self.metrics.records_rejected.labels(topic=m.topic, reason=k).inc()
            if not self.tolerate:
                raise DataError(
                    f"errors.tolerance=none: record rejected: {reason}{where}; set errors.tolerance=all "
                    "(with errors.deadletterqueue.topic.name) to dead-letter bad records and go on",
                    topic=m.topic, partition=m.partition, offset=m.offset, field=field,
                )
            first, count = first or err, count + 1
            own = tuple(original_headers(m))
            headers = list(own)
            if self.settings.dlq_context_headers:
                headers += context_headers(m, err, k, tables, connector=self.settings.group_id, task=self.worker_id)
            ts = getattr(m, "timestamp", None)
            letter = Letter(m.key, m.value, tuple(headers), m.topic, m.partition, m.offset, k, str(err), field,
                            ",".join(tables) or None, ts if isinstance(ts, int) and ts >= 0 else None, own)
            letters.append(letter)
            if self.topic:
                await self._send(letter)
            elif self.table:  # a row of the table, committed with its batch (agents/ingest.py)
                self._delivered(letter)
            else:
                self._append_file(letter, err, tables)
        if first is not None:  # one line per batch, not per record
            log.warning("%d bad records dead-lettered, the first: %s", count, first)
        return letters

    def tombstones(self, topic: str, count: int) -> None:
        if count:
            self.metrics.tombstones.labels(topic=topic).inc(count)

    # Sending ---------------------------------------------------------------------------------

    async def _send(self, letter: Letter) -> None:
        try:
            fut = await self._producer.send(self.topic, letter.value, key=letter.key, headers=list(letter.headers))
        except Exception as exc:  # raised before the send: too large, no metadata
            self._inflight.append((letter, exc))
        else:
            self._inflight.append((letter, fut))
        if len(self._inflight) % PRUNE_EVERY == 0:  # keep only unacknowledged letters in memory
            kept = []
            for letter, f in self._inflight:
                if isinstance(f, asyncio.Future) and f.done() and not f.cancelled() and f.exception() is None:
                    self._delivered(letter)
                else:
                    kept.append((letter, f))
            self._inflight = kept

    async def flush(self) -> None:
        """Wait until every dead letter sent so far is acknowledged. Called by the worker before
        it reports consumed offsets; raises :class:`DeadLetterSendError` (the letters are kept
        and sent again at the next flush)."""
        failed, self._failed = self._failed, []
        for letter in failed:
            await self._send(letter)
        errors: list[BaseException] = []
        while self._inflight:
            batch, self._inflight = self._inflight, []
            for letter, fut in batch:
                exc = fut if isinstance(fut, BaseException) else await _outcome(fut)
                if exc is None:
                    self._delivered(letter)
                    continue
                self.metrics.deadletter_send_failures.inc()
                if _too_large(exc) and letter.value is not None:
                    # The DLQ topic will not take a record this size: keep the headers, omit the value.
                    log.error("dead letter %s-%d@%d too large for %s (%s): sending it without its value",
                              letter.topic, letter.partition, letter.offset, self.topic, exc)
                    note = (H_VALUE_OMITTED, f"{len(letter.value)} bytes: {exc}".encode())
                    await self._send(replace(letter, value=None, headers=letter.headers + (note,)))
                    continue
                errors.append(exc)
                self._failed.append(letter)
        if self._failed:
            raise DeadLetterSendError(
                f"{len(self._failed)} dead letters not acknowledged by topic {self.topic!r} "
                f"(first: {errors[0]!r}); they are sent again at the next round"
            )

    def _append_file(self, letter: Letter, err: DataError, tables: Sequence[str]) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        with (self.directory / f"{letter.topic}.jsonl").open("a", encoding="utf-8") as out:
            out.write(json.dumps({
                "table": ",".join(tables) or None, "topic": letter.topic, "partition": letter.partition,
                "offset": letter.offset, "error": err.reason, "reason": letter.kind, "field": err.field,
                "key": _b64(letter.key), "value": _b64(letter.value),
                "headers": [[k, _b64(v)] for k, v in letter.headers],
            }) + "\n")
        self._delivered(letter)

    def _delivered(self, letter: Letter) -> None:
        self.delivered += 1
        self.metrics.records_deadlettered.labels(topic=letter.topic, reason=letter.kind).inc()


async def _outcome(fut: asyncio.Future[Any]) -> BaseException | None:
    try:
        await fut
    except Exception as exc:
        return exc
    return None


def _too_large(exc: BaseException) -> bool:
    return type(exc).__name__ in ("MessageSizeTooLargeError", "RecordTooLargeError")


def _b64(b: bytes | None) -> str | None:
    return base64.b64encode(b).decode() if b is not None else None
