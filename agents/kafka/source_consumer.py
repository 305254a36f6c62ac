"""The source consumer (Faust's, over aiokafka): read committed records only, and a consumer
that can no longer consume stops the replica.
The small pieces of Faust glue about the consumer live here too: its credentials, this
replica's group member id (for claims), and read offsets Faust must not keep.

Faust builds its AIOKafkaConsumer with ``isolation_level=read_uncommitted`` unless the app runs
Faust's own transactions (``processing_guarantee=exactly_once``, which needs InitProducerId and
transactional producers icesink does not use). :func:`use_read_committed` makes the consumer
read committed records only, so records of aborted transactions never land.

A fatal error of the fetch path (say ``UnsupportedCodecError`` for a batch compressed with a
codec whose library is missing) ends Faust's drain loop: the Fetcher crashes and takes the
consumer's thread with it, and nothing restarts them. Faust also never consumes the errors
aiokafka's group coordinator keeps for the user (``check_errors``: authorization, a dead
coordination task), which stalls the group membership. The replica went on answering empty
rounds for ever. :class:`ConsumerGuard` names the failing partition and offset, hands the error
to the worker (which stops the replica with a non-zero exit code) and counts it.

Faust hands a stream one event per record: its drain loop builds a Message per record, tracks
it, and awaits the conductor's callback for each (``Service.wait_first``: several futures per
record). That per-record layer cost about three quarters of a worker's Python time.
:func:`install_batch_drain` replaces the drain loop: every fetch the consumer returns goes to
the ingest agent as one :class:`Fetched` (aiokafka's records, per partition), through a Faust
channel. Faust still owns the app, the agent, the group membership, rebalances and the
consumer thread.

Pinned to faust-streaming 0.15.3 and aiokafka 0.14 internals (pyproject.toml).
"""

from __future__ import annotations

import asyncio
import logging
import operator
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import aiokafka.codec
import faust
from aiokafka.consumer.fetcher import FetchResult
from aiokafka.errors import ConsumerStoppedError

from agents.kafka import record_batches
from icesink.shared.config import Settings
from icesink.shared.errors import ConsumerError
from icesink.shared.protocol import TopicPartition
from icesink.shared.faults import should_crash
from icesink.shared.metrics import Metrics

if TYPE_CHECKING:
    from faust.transport.drivers.aiokafka import Consumer as AIOKafkaDriver

log = logging.getLogger(__name__)

READ_COMMITTED = "read_committed"
IDLE_POLL_S = 0.05  # while no partition is active, how often the drain looks again
# While no partition is active, how often the drain tells aiokafka it still polls (keep_polling).
KEEP_POLLING_S = 1.0
# How long a fetch may wait on the broker for consumer.fetch-min-bytes (fetch.max.wait.ms).
# aiokafka sends a broker no fetch while one is in flight, so a fetch waiting on an empty
# partition (Faust's leader topic, a quiet source partition) held the first records of a
# partition just resumed at its accepted position; Faust's 1.5 s made start-up 1.4 s longer.
# Kafka answers once the minimum is there, so the wait only bounds a quiet topic's; the embedded
# Tansu looks again every half of the wait, so at Kafka's default 500 ms every record waited up
# to 0.25 s there (bench/README.md, freshness; the smaller fetches cost the worker 1.5-2.5 us
# more CPU per record at 30k records/s on Tansu).
FETCH_MAX_WAIT_MS = 200


def use_read_committed(thread: Any, fetch_min_bytes: int) -> None:
    """Make Faust's consumer thread build its AIOKafkaConsumer with read_committed (a setting
    Faust does not expose) and fetches that wait at most FETCH_MAX_WAIT_MS on the broker (Faust
    fixes 1.5 s) for ``fetch_min_bytes`` (``consumer.fetch-min-bytes``; Faust passes none, so
    aiokafka's 1: with many tables at a modest rate, fetches of a few records each cost the
    worker's Python and the broker much CPU; see bench/README.md, ingest_bench). Call before
    the consumer starts: aiokafka hands these to its fetcher in ``start()``."""
    create = thread._create_worker_consumer

    def create_read_committed(transport: Any) -> Any:
        consumer = create(transport)
        consumer._isolation_level = READ_COMMITTED
        consumer._fetch_max_wait_ms = FETCH_MAX_WAIT_MS
        consumer._fetch_min_bytes = fetch_min_bytes
        return consumer

    thread._create_worker_consumer = create_read_committed


def isolation_level(app: Any) -> str | None:
    """The isolation level of the running source consumer's fetcher (None before it starts)."""
    from aiokafka.consumer.fetcher import READ_COMMITTED as COMMITTED

    consumer = getattr(app.consumer._thread, "_consumer", None)
    fetcher = getattr(consumer, "_fetcher", None)
    if fetcher is None:
        return None
    return READ_COMMITTED if fetcher._isolation_level == COMMITTED else "read_uncommitted"


def group_session_timeout_ms(app: Any) -> int | None:
    """The session timeout the running source consumer joined its group with (None before it
    starts)."""
    consumer = getattr(app.consumer._thread, "_consumer", None)
    timeout = getattr(consumer, "_session_timeout_ms", None)
    return timeout if isinstance(timeout, int) else None


class ConsumerGuard:
    """Installed on a Faust app before it starts; ``on_fatal`` is called once, on the event loop
    that installed the guard, with the first fatal error of the source consumer."""

    def __init__(self, app: Any, metrics: Metrics, on_fatal: Callable[[ConsumerError], None],
                 stopping: Callable[[], bool], fetch_min_bytes: int) -> None:
        self.app = app
        self.fetch_min_bytes = fetch_min_bytes
        self.metrics = metrics
        self.on_fatal = on_fatal
        self.stopping = stopping  # errors while the replica stops are not failures
        self.error: ConsumerError | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def install(self) -> None:
        self._loop = asyncio.get_running_loop()
        consumer = self.app.consumer
        thread = consumer._thread
        use_read_committed(thread, self.fetch_min_bytes)
        fetch = thread._fetch_records

        async def guarded_fetch(aio: Any, active: Any, timeout: float | None = None,
                                max_records: int | None = None) -> Any:
            # In the consumer's thread. aiokafka's own getmany checks the coordinator first.
            try:
                if aio._coordinator is not None:
                    aio._coordinator.check_errors()
                fetcher = getattr(aio, "_fetcher", None)
                if fetcher is not None and not getattr(fetcher, "_icesink_batches", False):
                    record_batches.install(fetcher)  # before its first fetch (agents/kafka/record_batches.py)
                return await fetch(aio, active, timeout=timeout, max_records=max_records)
            except (asyncio.CancelledError, ConsumerStoppedError):
                raise
            except Exception as exc:
                raise _located(exc, aio, active) from exc

        thread._fetch_records = guarded_fetch
        # The service where a failure starts calls its own crash(): the Fetcher (drain loop),
        # the consumer (its background tasks) or the consumer's thread (its event loop).
        for service in (self.app._fetcher, consumer, thread):
            self._hook_crash(service)

    def _hook_crash(self, service: Any) -> None:
        crash = service.crash

        async def crash_and_report(reason: BaseException) -> None:
            if not isinstance(reason, asyncio.CancelledError):  # Faust restarts it on rebalance
                assert self._loop is not None
                self._loop.call_soon_threadsafe(self._report, service, reason)
            await crash(reason)

        service.crash = crash_and_report

    def _report(self, service: Any, reason: BaseException) -> None:
        if self.error is not None or self.stopping():
            return
        error = reason if isinstance(reason, ConsumerError) else ConsumerError(
            f"source consumer failed: {_describe(reason)}", service=type(service).__name__)
        self.error = error
        self.metrics.consumer_failures.labels(error=type(reason.__cause__ or reason).__name__).inc()
        self.on_fatal(error)


def _located(exc: Exception, aio: Any, active: Any) -> ConsumerError:
    """``exc`` raised by aiokafka's ``fetched_records``, with the partition and offset it failed
    at: the first partition (in its order) still holding fetched records not handed out. A
    failing batch leaves its records there, and the partitions before it were drained."""
    where: tuple[str, int, int] | None = None
    fetcher = getattr(aio, "_fetcher", None)
    records = getattr(fetcher, "_records", {})
    for tp, result in list(records.items()):
        if active and tp not in active:
            continue
        if type(result) is FetchResult and result.has_more():
            where = (tp.topic, tp.partition, result._partition_records.next_fetch_offset)
            break
    reason = f"source consumer failed: {_describe(exc)}"
    if where is None:
        return ConsumerError(reason)
    return ConsumerError(reason, topic=where[0], partition=where[1], offset=where[2])


def _describe(exc: BaseException) -> str:
    text = str(exc)  # aiokafka's errors start with their class name already
    return text if text.startswith(type(exc).__name__) else f"{type(exc).__name__}: {text}"


def inject_faults(settings: Settings) -> None:
    """Fault tests: ``fault.crash-at=worker.lz4-unavailable`` makes lz4 unavailable to aiokafka in
    this process (once per state dir, like every fault point): an lz4 batch then cannot be
    decoded, as when the codec library is not installed."""
    if should_crash(settings, "worker.lz4-unavailable"):
        log.warning("fault injection: the lz4 codec is unavailable in this replica")
        aiokafka.codec.has_lz4 = lambda: False


def driver(app: faust.App) -> AIOKafkaDriver:
    """The app's consumer as what it is, Faust's aiokafka driver (the kafka:// transport): the
    internals used here and in the worker are not in Faust's ConsumerT."""
    return cast("AIOKafkaDriver", app.consumer)


def group_member_id(app: faust.App) -> str | None:
    """This replica's consumer-group member id (Claim.member: tells a group reset from a zombie)."""
    try:
        return str(driver(app)._thread._ensure_consumer()._coordinator.member_id) or None
    except AttributeError:
        return None


@dataclass(frozen=True, eq=False)
class Fetched:
    """One fetch of the source consumer, as it came: record lists (``SourceRecord`` s,
    agents/kafka/record_batches.py; offset order, ``timestamp`` in ms) of the partitions that were
    active when it was asked for.
    Compared and hashed by identity: the buffers hold it in a weak set until it is converted."""

    records: Mapping[TopicPartition, Sequence[Any]]
    fetched_at: float  # monotonic time the fetch returned to the event loop (stale-prefetch check)
    nbytes: int = 0  # serialized key and value bytes: counted against buffer.max-bytes until converted

    def __len__(self) -> int:
        return sum(len(r) for r in self.records.values())


_VALUE = operator.attrgetter("value")
_KEY = operator.attrgetter("key")


def serialized_bytes(records: Sequence[Any]) -> int:
    """The key and value bytes of fetched records (a null counts nothing), in C loops: a
    generator over the records took a large share of the event loop's busy time while a
    worker read a backlog (see bench/README.md, fetch_bench)."""
    values: int = sum(map(len, filter(None, map(_VALUE, records))))
    keys: int = sum(map(len, filter(None, map(_KEY, records))))
    return values + keys


def install_batch_drain(app: faust.App, deliver: Callable[[Fetched], Awaitable[Any]]) -> None:
    """Replace Faust's per-record drain loop (``Consumer._drain_messages``, run by its Fetcher
    service and restarted by it after every rebalance) with one that hands whole fetches to
    ``deliver``. Records of a fetch that spans a rebalance (the flow stopped or the generation
    changed after the fetch returned) are dropped like Faust drops them: the new owner seeks to
    the accepted position."""
    consumer = driver(app)

    async def drain_batches(fetcher: Any) -> None:
        stopped = consumer._stopped.is_set
        fetcher_stopped = fetcher._stopped.is_set
        polled = time.monotonic()
        try:
            while not (stopped() or fetcher_stopped()):
                if consumer.flow_active and consumer._active_partitions == set():
                    # Every partition paused (claimed, waiting for its Resume; or full buffers):
                    # Faust's _wait_next_records would sleep a whole second, and a partition
                    # resumed meanwhile waited for it (at start-up, every time).
                    if time.monotonic() - polled >= KEEP_POLLING_S:
                        await keep_polling(consumer)
                        polled = time.monotonic()
                    await asyncio.sleep(IDLE_POLL_S)
                    continue
                records, active = await consumer._wait_next_records(1.0)
                # As Faust's getmany: the generation the records were handed out in, read after
                # the wait (which waits for the flow a rebalance stopped), so a fetch of the new
                # assignment is never taken for one that spans the rebalance.
                generation = app.consumer_generation_id
                fetched_at = time.monotonic()
                await asyncio.sleep(0)  # an empty fetch must not starve the loop
                if (not records or consumer.should_stop or not consumer.flow_active
                        or app.consumer_generation_id != generation):
                    continue
                batch = {TopicPartition(tp.topic, tp.partition): recs for tp, recs in records.items()
                         if recs and (active is None or tp in active)}
                if batch:
                    nbytes = sum(serialized_bytes(recs) for recs in batch.values())
                    delivery = asyncio.ensure_future(deliver(Fetched(batch, fetched_at, nbytes)))
                    try:
                        await consumer.wait_first(delivery, consumer.suspend_flow.wait())
                    except asyncio.CancelledError:
                        # Faust's revoke handler clears the full channel, which cancels the put
                        # this delivery waits in: the fetch spans the rebalance and is dropped.
                        # Only the drain's own cancellation ends the drain.
                        if not delivery.cancelled() or _cancelling():
                            raise
        except consumer.consumer_stopped_errors:
            if app.should_stop:
                return
            raise
        except asyncio.CancelledError:
            if app.should_stop:
                return
            raise

    consumer._drain_messages = drain_batches  # type: ignore[method-assign]  # patches Faust (pinned internals)


async def keep_polling(consumer: Any) -> None:
    """Tell aiokafka the application still polls while every partition is paused, as a poll of
    Kafka's own consumer does. Faust fetches nothing while no partition is active, and aiokafka
    counts a member that fetched nothing for ``consumer.max-poll-interval-ms`` as stuck: it
    left the group, and never joined again before a fetch, which needed a partition resumed
    (a replica without the leader topic's partition, whose partitions all waited for a Resume
    or for full buffers to drain). Its poll timer is reset on the consumer's own thread, as a
    fetch that returned nothing would reset it; no position moves (aiokafka 0.14 internals:
    ``SubscriptionState.fetch_context``; faust-streaming 0.15.3: ``Consumer._thread``, its
    ``call_thread``)."""
    thread = consumer._thread
    aio = thread._consumer
    if aio is None:  # not started yet, or stopped
        return

    async def polled() -> None:
        with aio._subscription.fetch_context():
            pass

    await thread.call_thread(polled)


def _cancelling() -> bool:
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


def faust_credentials(s: Settings) -> Any:
    if s.sasl_mechanism:
        return faust.SASLCredentials(
            username=s.sasl_username,
            password=s.sasl_password.get_secret_value() if s.sasl_password else None,
            mechanism=s.sasl_mechanism,
            ssl_context=s.kafka_client_kwargs().get("ssl_context"),
        )
    if s.security_protocol == "SSL":
        return faust.SSLCredentials(s.kafka_client_kwargs()["ssl_context"])
    return None
