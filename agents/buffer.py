"""Per-partition consumption state and bounded Arrow buffers of one worker. No I/O.

A partition is ``claiming`` from assignment until the coordinator's Resume, then ``active``.
Only records of active partitions are buffered, and only in offset order from the resumed
position: a record below the next expected offset is a duplicate; one above it is taken only
when it was fetched after the partition was (re)activated (a real gap, e.g. compaction or
transaction markers), never when it is a stale prefetch from before a seek.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from icesink.protocol import OffsetRange, TopicPartition


@dataclass
class Chunk:
    tp: TopicPartition
    end: int  # offset after the last record in this chunk
    tables: dict[str, pa.Table]  # target table -> rows
    nbytes: int
    rows: int


@dataclass
class PartitionState:
    tp: TopicPartition
    generation: int
    active: bool = False
    next_offset: int = 0  # next offset to take
    range_start: int = 0  # start of the range not yet reported
    activated_at: float = 0.0  # monotonic time of the last (re)activation
    last_record_ms: int | None = None
    chunks: list[Chunk] = field(default_factory=list)

    seeks: int = 0  # seeks done for this partition
    reseeking: bool = False
    gap_probe: tuple[int, int] | None = None  # (offset, seeks when seen) of a suspected gap
    confirmed_gap: int | None = None  # an offset seen first after two separate seeks

    def select(self, records: Sequence[Any], fetched_at: float) -> tuple[Sequence[Any], int | None]:
        """The records of one fetch to take, in order (each has .offset), and the offset of a
        suspected gap if a fresh fetch (``fetched_at``, after the last activation) skipped the
        expected offset.

        A record above the expected offset is never taken on one sight: a stale prefetch
        looks the same. The worker seeks again; only when the same first offset comes back
        after two separate seeks is it a real gap (compaction, transaction markers)."""
        if not self.active or not records:
            return [], None
        expected = self.next_offset
        first = records[0].offset
        if first == expected and records[-1].offset - first == len(records) - 1:
            self.confirmed_gap = None  # the common case: the whole fetch follows on, no gap
            return records, None
        taken = []
        suspect = None
        fresh = fetched_at > self.activated_at
        for m in records:
            off = m.offset
            if off == expected or (off > expected and off == self.confirmed_gap):
                taken.append(m)
                expected = off + 1
                self.confirmed_gap = None
            elif off > expected and suspect is None and fresh:
                suspect = off
        return taken, suspect

    def suspect_gap(self, offset: int) -> None:
        """Record a suspected gap at ``offset``; confirm it if it was seen before an earlier seek."""
        if self.gap_probe is not None and self.gap_probe[0] == offset and self.gap_probe[1] < self.seeks:
            self.confirmed_gap = offset
            self.gap_probe = None
        else:
            self.gap_probe = (offset, self.seeks)


@dataclass
class Snapshot:
    """Buffers taken for one response; given back with :meth:`Buffers.restore` if the write
    fails, or confirmed with :meth:`Buffers.confirm` once the response is sent."""

    generation: int
    ranges: tuple[OffsetRange, ...]
    chunks: list[Chunk]

    def tables(self, cast: Callable[[str, pa.Table], pa.Table] | None = None) -> dict[str, pa.Table]:
        """Rows per table, in buffer order, one Arrow chunk per column. ``cast(table, rows)``
        brings rows to the table's schema (chunks decoded against an evolved schema differ from
        it): once per run of chunks of one schema, not per chunk. A table a round routes to
        gets a small chunk from every fetch (200 tables at 6k records/s: 300 chunks of two rows
        each, per table and round); cast one by one, that was 3.8 CPU-s a round."""
        parts: dict[str, list[list[pa.Table]]] = {}
        for c in self.chunks:
            for name, t in c.tables.items():
                if t.num_rows:
                    runs = parts.setdefault(name, [])
                    if runs and runs[-1][-1].schema.equals(t.schema, check_metadata=True):
                        runs[-1].append(t)
                    else:
                        runs.append([t])
        out: dict[str, pa.Table] = {}
        for name, runs in parts.items():
            merged = [pa.concat_tables(run) for run in runs]
            if cast is not None:
                merged = [cast(name, m) for m in merged]
            out[name] = pa.concat_tables(merged).combine_chunks()
        return out

    @property
    def rows(self) -> int:
        return sum(c.rows for c in self.chunks)


class Buffers:
    """Every partition's state and chunks. The bound (``buffer.max-bytes``) counts the Arrow
    bytes of the chunks and the raw bytes of fetches handed to the worker and not yet converted
    (:meth:`hold`): a fetch dropped before conversion (a rebalance clears Faust's queue) stops
    counting once nothing references it."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.partitions: dict[TopicPartition, PartitionState] = {}
        self.nbytes = 0
        self.rows = 0
        self._fetches: weakref.WeakSet[Any] = weakref.WeakSet()  # each with .nbytes

    @property
    def full(self) -> bool:
        return self.nbytes + self.fetched_bytes >= self.max_bytes

    @property
    def fetched_bytes(self) -> int:
        """Raw bytes of the fetches held, not yet converted."""
        return sum(f.nbytes for f in list(self._fetches))

    def hold(self, fetch: Any) -> None:
        """Count a fetch's raw bytes against the bound until :meth:`converted` (or until it is dropped)."""
        self._fetches.add(fetch)

    def converted(self, fetch: Any) -> None:
        self._fetches.discard(fetch)

    def claim(self, tp: TopicPartition, generation: int) -> PartitionState:
        """Assignment (or re-claim): keep buffered chunks until the Resume says where to go."""
        st = self.partitions.get(tp)
        if st is None:
            st = self.partitions[tp] = PartitionState(tp, generation)
        st.generation = generation
        st.active = False
        return st

    def resume(self, tp: TopicPartition, position: int, now: float) -> int:
        """Activate at the coordinator's accepted position; returns the offset to seek to.
        Buffered data is kept only if it continues exactly from that position."""
        st = self.partitions[tp]
        if st.range_start != position:  # chunks always cover [range_start, next_offset)
            self._drop_chunks(st)
            st.range_start = st.next_offset = position
        st.active = True
        st.activated_at = now
        return st.next_offset

    def release(self, tp: TopicPartition) -> None:
        st = self.partitions.pop(tp, None)
        if st is not None:
            self._drop_chunks(st)

    def rewind(self, tp: TopicPartition) -> None:
        """A rejected response: forget everything not accepted and wait for a new Resume."""
        st = self.partitions.get(tp)
        if st is not None:
            self._drop_chunks(st)
            st.active = False
            st.next_offset = st.range_start = -1  # unknown until the Resume

    def _drop_chunks(self, st: PartitionState) -> None:
        for c in st.chunks:
            self.nbytes -= c.nbytes
            self.rows -= c.rows
        st.chunks.clear()

    def add(self, chunk: Chunk, last_offset: int, last_record_ms: int | None) -> None:
        st = self.partitions[chunk.tp]
        st.chunks.append(chunk)
        st.next_offset = last_offset + 1
        st.last_record_ms = last_record_ms
        self.nbytes += chunk.nbytes
        self.rows += chunk.rows

    def take(self, generation: int, ready: Callable[[Chunk], bool] | None = None) -> Snapshot:
        """Everything buffered for active partitions, with one range per active partition
        (empty ranges for idle ones, so they never stall a round).

        With ``ready``, a partition's range stops before its first chunk that is not ready
        (data whose table schema change is not applied yet): that chunk and the ones after it
        stay buffered, so ranges stay contiguous."""
        ranges = []
        chunks: list[Chunk] = []
        for tp in sorted(self.partitions):
            st = self.partitions[tp]
            if not st.active or st.generation != generation:
                continue
            n = len(st.chunks)
            if ready is not None:
                n = next((i for i, c in enumerate(st.chunks) if not ready(c)), n)
            end = st.chunks[n - 1].end if n < len(st.chunks) and n else (
                st.range_start if n < len(st.chunks) else st.next_offset)
            ranges.append(OffsetRange(tp, st.range_start, end))
            chunks.extend(st.chunks[:n])
            st.chunks = st.chunks[n:]
            st.range_start = end
        for c in chunks:
            self.nbytes -= c.nbytes
            self.rows -= c.rows
        return Snapshot(generation, tuple(ranges), chunks)

    def restore(self, snap: Snapshot) -> None:
        """Give a snapshot back after a failed write: its chunks go first again."""
        for r in snap.ranges:
            st = self.partitions.get(r.tp)
            if st is None or st.generation != snap.generation or st.range_start != r.end:
                continue  # the partition moved on meanwhile; its data will be re-read
            st.range_start = r.start
            mine = [c for c in snap.chunks if c.tp == r.tp]
            st.chunks[:0] = mine
            for c in mine:
                self.nbytes += c.nbytes
                self.rows += c.rows
