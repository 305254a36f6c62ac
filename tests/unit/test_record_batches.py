"""agents/kafka/record_batches.py takes a partition's fetched records a batch at a time: what it hands
out, and where it leaves the fetch position, must be what aiokafka's per-record generator
(``PartitionRecords``, aiokafka 0.14) gives for the same bytes, call by call, whatever
``max_records`` each call brings. Record batches are built with aiokafka's own builder."""

from __future__ import annotations

import random
import struct

import pytest
from aiokafka import errors
from aiokafka.consumer.fetcher import READ_COMMITTED, READ_UNCOMMITTED, PartitionRecords
from aiokafka.record.default_records import DefaultRecordBatchBuilder
from aiokafka.record.memory_records import MemoryRecords
from aiokafka.record.util import calc_crc32c
from aiokafka.structs import TopicPartition

from agents.kafka.record_batches import SourceRecord, take

TP = TopicPartition("pizzas", 3)
# A v2 record batch's header (the Kafka protocol; aiokafka's pure-Python DefaultRecordBatch):
CRC_OFFSET = 17  # the CRC-32C of everything from the attributes on
ATTRIBUTES_OFFSET = 21
CONTROL_MASK = 0x20
PRODUCER = 7


def batch(base: int, n: int, *, producer_id: int = -1, transactional: bool = False, compression: int = 0,
          deltas: list[int] | None = None, nulls: bool = False) -> bytes:
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=compression, is_transactional=int(transactional),
                                        producer_id=producer_id, producer_epoch=0 if producer_id >= 0 else -1,
                                        base_sequence=0 if producer_id >= 0 else -1, batch_size=1 << 30)
    for i, delta in enumerate(deltas if deltas is not None else range(n)):
        value = None if nulls and i % 3 == 1 else b'{"order_id":"%d"}' % (base + delta)
        key = None if i % 2 else b"k%d" % (base + delta)
        headers = [("trace", b"t%d" % i)] if i % 4 == 0 else []
        builder.append(delta, timestamp=1_700_000_000_000 + base + delta, key=key, value=value, headers=headers)
    data = builder.build()
    struct.pack_into(">q", data, 0, base)
    return bytes(data)


def control(base: int, *, abort: bool) -> bytes:
    """A transaction marker of PRODUCER: a control batch of one record."""
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=1, producer_id=PRODUCER,
                                        producer_epoch=0, base_sequence=-1, batch_size=1 << 30)
    builder.append(0, timestamp=1_700_000_000_000, key=struct.pack(">HH", 0, 0 if abort else 1), value=b"\0" * 6,
                   headers=[])
    data = builder.build()
    struct.pack_into(">q", data, 0, base)
    attributes = struct.unpack_from(">h", data, ATTRIBUTES_OFFSET)[0]
    struct.pack_into(">h", data, ATTRIBUTES_OFFSET, attributes | CONTROL_MASK)
    struct.pack_into(">I", data, CRC_OFFSET, calc_crc32c(bytes(data[ATTRIBUTES_OFFSET:])))
    return bytes(data)


def theirs_take(pr: PartitionRecords, max_records: int | None) -> tuple[list[tuple], bool]:
    """What ``FetchResult.getall`` takes of aiokafka's generator."""
    out = []
    for msg in pr:
        out.append(tuple(getattr(msg, f) for f in SourceRecord._fields))  # the fields icesink reads
        if max_records is not None and len(out) >= max_records:
            return out, False
    return out, True


def assert_same(raw: bytes, schedule: list[int | None], *, aborted: list[tuple[int, int]] = (),
                fetch_offset: int = 0, isolation: int = READ_COMMITTED) -> list[int]:
    """Call by call, the records, the position and the end are aiokafka's. The offsets handed out."""
    def records() -> PartitionRecords:
        return PartitionRecords(TP, MemoryRecords(raw), list(aborted), fetch_offset, None, None, True, isolation)

    ours, theirs = records(), records()
    handed: list[int] = []
    for max_records in schedule:
        got, done = take(ours, max_records)
        want, want_done = theirs_take(theirs, max_records)
        assert [(*r[:-1], tuple(r.headers)) for r in got] == want, max_records
        assert (ours.next_fetch_offset, done) == (theirs.next_fetch_offset, want_done), max_records
        assert all(type(r) is SourceRecord for r in got)
        handed += [r.offset for r in got]
        if done:
            break
    else:
        raise AssertionError("the schedule ended before the records")
    return handed


PLAIN = batch(0, 5) + batch(5, 5, compression=1) + batch(10, 5, nulls=True)


@pytest.mark.parametrize("schedule", [[None], [1] * 16, [5, 5, 5, 1], [3, 4, 7, 2, 9], [7, 100], [15, 1], [14, 1, 1]])
def test_plain_batches_in_any_slices_are_aiokafkas_records_and_positions(schedule):
    assert assert_same(PLAIN, schedule) == list(range(15))


def test_random_slices_of_many_batches():
    raw = b"".join(batch(base, 10, compression=base % 2) for base in range(0, 200, 10))
    rng = random.Random(5)
    for _ in range(40):
        schedule = [rng.choice([None, 1, 2, 9, 10, 11, 37]) for _ in range(220)]
        assert assert_same(raw, schedule) == list(range(200))


def test_a_fetch_from_the_middle_of_a_batch_skips_the_records_before_it():
    """A broker answers a fetch from the batch that holds its offset."""
    raw = batch(5, 5, compression=1) + batch(10, 5, nulls=True)
    assert assert_same(raw, [2, 2, 100], fetch_offset=7) == list(range(7, 15))
    assert assert_same(raw, [3, 100], fetch_offset=9) == list(range(9, 15))


def test_gaps_in_offsets_as_compaction_leaves_them():
    raw = batch(0, 3, deltas=[0, 2, 5]) + batch(6, 2, deltas=[1, 3])
    assert assert_same(raw, [1, 1, 1, 1, 1, 1]) == [0, 2, 5, 7, 9]
    assert assert_same(raw, [3, 3]) == [0, 2, 5, 7, 9]


@pytest.mark.parametrize("isolation", [READ_COMMITTED, READ_UNCOMMITTED])
def test_transactions_aborted_and_committed_and_their_markers(isolation):
    raw = (batch(0, 3) + batch(3, 3, producer_id=PRODUCER, transactional=True) + control(6, abort=True)
           + batch(7, 2, producer_id=PRODUCER, transactional=True) + control(9, abort=False) + batch(10, 2))
    for schedule in ([None], [1] * 20, [2, 2, 2, 2, 2, 2, 2], [3, 3, 3, 3]):
        handed = assert_same(raw, schedule, aborted=[(PRODUCER, 3)], isolation=isolation)
        want = [0, 1, 2, 7, 8, 10, 11] if isolation == READ_COMMITTED else [0, 1, 2, 3, 4, 5, 7, 8, 10, 11]
        assert handed == want


def test_a_corrupt_batch_raises_and_ends_the_partitions_records_before_it_as_aiokafka_does():
    raw = bytearray(PLAIN)
    raw[len(batch(0, 5)) + 70] ^= 0xFF  # inside the second batch
    ours = PartitionRecords(TP, MemoryRecords(bytes(raw)), [], 0, None, None, True, READ_COMMITTED)
    theirs = PartitionRecords(TP, MemoryRecords(bytes(raw)), [], 0, None, None, True, READ_COMMITTED)
    assert [r.offset for r in take(ours, 3)[0]] == [r[2] for r in theirs_take(theirs, 3)[0]] == [0, 1, 2]
    with pytest.raises(errors.CorruptRecordException):
        take(ours, 10)
    with pytest.raises(errors.CorruptRecordException):
        theirs_take(theirs, 10)
    assert take(ours, 10) == ([], True) and theirs_take(theirs, 10) == ([], True)
    assert ours.next_fetch_offset == theirs.next_fetch_offset == 5  # the corrupt batch is fetched again
