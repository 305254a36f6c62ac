"""The source consumer's fetched records, taken a record batch at a time.

aiokafka hands a fetch out record by record: a generator over each partition's record batches
(``PartitionRecords._unpack_records``) yields a ``ConsumerRecord`` dataclass per record, built
by a method call with eleven arguments. In Faust's consumer thread that was 1.2 us of a
worker's Python per record, where iterating the batches' records alone costs 0.2 us
(bench/fetch_bench.py). :func:`install` gives the source consumer's fetcher a
``fetched_records`` that takes each partition's records a batch at a time, in one list
comprehension per batch, as :class:`SourceRecord` tuples: the fields of ``ConsumerRecord``
that icesink reads, with its names.

Everything aiokafka's generator does per batch is done here too, in its order and with its own
helpers: the CRC check (``CorruptRecordException``); under read_committed, the aborted
transactions up to the batch, an abort marker ending its producer's abort, a transactional batch
of an aborted producer skipped; control batches skipped; records before the fetch position
skipped; the position moved past each record handed out, and past the batch (its
``next_offset``) once the next one is read or the partition's records are done. A call that
reaches ``max_records`` within a batch leaves the rest of the batch for the next call.

``fetched_records`` itself is aiokafka's (0.14, pinned in pyproject.toml), with the partition's
records taken by :func:`take` instead of ``FetchResult.getall``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable, Sequence
from functools import partial
from typing import Any, NamedTuple

from aiokafka import errors
from aiokafka.consumer.fetcher import READ_COMMITTED, FetchResult, PartitionRecords

log = logging.getLogger(__name__)

_PENDING = "_icesink_pending"  # on a PartitionRecords: (the batch's next_offset, its records left)
_FAILED = "_icesink_failed"  # on a PartitionRecords: a batch of it raised


class SourceRecord(NamedTuple):
    """A fetched record: the fields of ``aiokafka.structs.ConsumerRecord`` that icesink reads,
    in its order (not its checksum nor its serialized sizes, each a cost per record)."""

    topic: str
    partition: int
    offset: int
    timestamp: int
    timestamp_type: int
    key: bytes | None
    value: bytes | None
    headers: Sequence[tuple[str, bytes]]


_new = partial(tuple.__new__, SourceRecord)


def _source_records(topic: str, partition: int, batch: Iterable[Any]) -> list[SourceRecord]:
    return [_new((topic, partition, r.offset, r.timestamp, r.timestamp_type, r.key, r.value, r.headers)) for r in batch]


def _open(pr: PartitionRecords, batch: Any) -> tuple[int, list[SourceRecord]] | None:
    """A batch's records at or past the position (and its next offset), or None for a batch
    that hands out nothing (the position then moved past it)."""
    tp = pr._tp
    if pr._check_crcs and not batch.validate_crc():
        raise errors.CorruptRecordException(f"Invalid CRC - {tp}")
    if pr._isolation_level == READ_COMMITTED and batch.producer_id is not None:
        pr._consume_aborted_up_to(batch.base_offset)
        if batch.is_control_batch and pr._contains_abort_marker(batch):
            pr._aborted_producers.discard(batch.producer_id)
        if batch.is_transactional and batch.producer_id in pr._aborted_producers:
            pr.next_fetch_offset = batch.next_offset
            return None
    if batch.is_control_batch:
        pr.next_fetch_offset = batch.next_offset
        return None
    records = _source_records(tp.topic, tp.partition, batch)
    if records and records[0].offset < pr.next_fetch_offset:  # a batch that starts before the fetch position
        start = pr.next_fetch_offset
        records = [r for r in records if r.offset >= start]
    return batch.next_offset, records


def take(pr: PartitionRecords, max_records: int | None) -> tuple[list[SourceRecord], bool]:
    """Up to ``max_records`` (None: all) of the partition's records, and whether none is left."""
    out: list[SourceRecord] = []
    pending: tuple[int, list[SourceRecord]] | None = getattr(pr, _PENDING, None)
    while True:
        if pending is None:
            if getattr(pr, _FAILED, False) or not pr._records.has_next():
                return out, True
            try:
                pending = _open(pr, pr._records.next_batch())
            except BaseException:
                # As aiokafka's generator, which is done once it raised: the partition's other
                # records are not handed out, and the position stays before the failing batch.
                setattr(pr, _FAILED, True)
                setattr(pr, _PENDING, None)
                raise
            if pending is None:
                continue
        next_offset, records = pending
        if max_records is not None and records and len(out) + len(records) >= max_records:
            room = max_records - len(out)  # at least 1: a full call has returned
            out += records[:room]
            pr.next_fetch_offset = out[-1].offset + 1
            setattr(pr, _PENDING, (next_offset, records[room:]))
            return out, False
        out += records
        pr.next_fetch_offset = next_offset  # past the batch, as aiokafka once it reads on
        pending = None
        setattr(pr, _PENDING, None)


def _getall(result: FetchResult, max_records: int | None) -> list[SourceRecord]:
    """``FetchResult.getall`` with :func:`take`."""
    tp = result._topic_partition
    if not result.check_assignment(tp) or not result.has_more():
        return []
    records, done = take(result._partition_records, max_records)
    result._update_position()
    if done:
        result._partition_records = None
    return records


async def _fetched_records(self: Any, partitions: Any, timeout: float = 0, max_records: int | None = None) -> Any:
    """aiokafka 0.14's ``Fetcher.fetched_records``, with :func:`_getall` for ``getall``."""
    while True:
        if self._subscriptions.reassignment_in_progress:
            await self._subscriptions.wait_for_assignment()
        start_time = time.monotonic()
        drained = {}
        for tp in list(self._records.keys()):
            if partitions and tp not in partitions:
                if not self._subscriptions.is_assigned(tp):
                    del self._records[tp]
                continue
            res_or_error = self._records[tp]
            if type(res_or_error) is FetchResult:
                records = _getall(res_or_error, max_records)
                if not res_or_error.has_more():
                    del self._records[tp]
                    self._notify(self._wait_consume_future)
                if not records:
                    continue
                drained[tp] = records
                if max_records is not None:
                    max_records -= len(drained[tp])
                    assert max_records >= 0
                    if max_records == 0:
                        break
            elif drained:
                return drained
            else:
                del self._records[tp]
                self._notify(self._wait_consume_future)
                res_or_error.check_raise()
        if drained or not timeout:
            return drained
        waiter = self._create_fetch_waiter()
        done, pending = await asyncio.wait([waiter], timeout=timeout)
        if not done or self._closed:
            if pending:
                fut = pending.pop()
                fut.cancel()
            return {}
        if waiter.done():
            waiter.result()  # raises a fetch error, if any
        timeout -= time.monotonic() - start_time
        timeout = max(0, timeout)


def install(fetcher: Any) -> None:
    """Give the source consumer's aiokafka ``Fetcher`` the batch-wise ``fetched_records``
    (before its first call: a partition's records are taken by one reader only)."""
    fetcher.fetched_records = partial(_fetched_records, fetcher)
    fetcher._icesink_batches = True
    log.info("source consumer: fetched records are taken a record batch at a time")
