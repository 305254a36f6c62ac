"""Per-partition consumption state and bounded Arrow buffers of one worker. No I/O.

A partition is ``claiming`` from assignment until the coordinator's Resume, then ``active``.
Only records of active partitions are buffered, and only in offset order from the resumed
position: a record below the next expected offset is a duplicate; one above it is taken only
when it was fetched after the partition was (re)activated (a real gap, e.g. compaction or
transaction markers), never when it is a stale prefetch from before a seek.

Early writes: buffered rows may be written to data files before their round (:meth:`Buffers.stage`,
then :meth:`Buffers.land`). Such files (:class:`Written`) are only a form of buffered data:
they are reported, like chunks, by the response that covers their offsets, and one file holds
rows of several partitions, so a response reports a :class:`Written` only together with every
partition it covers. A partition's data is always ``[range_start, written end)`` in files, then
``[written end, next_offset)`` in chunks. Whatever drops a partition's data (release, rewind, a
Resume elsewhere) voids its written files, and the partitions sharing them go back to read from
where those files began (:meth:`Buffers.take_voided`).
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from icesink.shared.protocol import OffsetRange, TopicPartition


@dataclass(frozen=True, eq=False)
class FanoutRows:
    """The rows of one fetch of a fan-out (a topic routed to many tables of one schema), kept
    as decoded: row ``i`` goes to table ``names[owner[i]]``, and every name has rows. Split
    per table once per round (:meth:`Snapshot.tables`), not per fetch: at 200 tables a fetch
    gives each table a row or two, and splitting each fetch, then joining each table's 300
    pieces again, was a seventh of a worker's Python time (py-spy)."""

    table: pa.Table
    owner: npt.NDArray[np.int32]
    names: tuple[str, ...]


def split_fanouts(runs: Sequence[FanoutRows]) -> list[tuple[str, pa.Table]]:
    """Each table's rows of ``runs`` (all of one Arrow schema), in order: one stable sort of
    all rows by table and a slice per table."""
    ids: dict[str, int] = {}
    codes = []
    for f in runs:
        local = np.fromiter((ids.setdefault(n, len(ids)) for n in f.names), dtype=np.int32, count=len(f.names))
        codes.append(local[f.owner])
    code = np.concatenate(codes) if codes else np.zeros(0, dtype=np.int32)
    order = np.argsort(code, kind="stable")
    whole = pa.concat_tables([f.table for f in runs]).take(pa.array(order, pa.int64()))
    counts = np.bincount(code, minlength=len(ids))
    starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
    return [(name, whole.slice(int(starts[k]), int(counts[k]))) for name, k in ids.items() if counts[k]]


@dataclass
class Chunk:
    tp: TopicPartition
    end: int  # offset after the last record in this chunk
    tables: dict[str, pa.Table]  # target table -> rows (empty when ``fanout`` holds them)
    nbytes: int
    rows: int
    fanout: FanoutRows | None = None
    at: float = 0.0  # wall time it was buffered (Buffers.add): icesink_uncommitted_age_seconds

    def names(self) -> Iterable[str]:
        """The tables it has rows for (a fan-out's may have dead letters in ``tables`` too)."""
        return self.tables.keys() if self.fanout is None else (*self.fanout.names, *self.tables)

    def by_table(self) -> dict[str, pa.Table]:
        """Its rows per table."""
        return self.tables if self.fanout is None else {**dict(split_fanouts([self.fanout])), **self.tables}


@dataclass(eq=False)
class Written:
    """Rows of several partitions written to data files ahead of their round: ``ranges`` the
    offsets ``[start, end)`` of each partition, ``files`` the data files of each table."""

    ranges: dict[TopicPartition, tuple[int, int]]
    files: dict[str, tuple[Any, ...]]
    rows: int
    sent: bool = False  # taken for a response: a partial one may name the files, never delete them
    nbytes: int = 0  # Arrow bytes of its rows when buffered (iceberg.control.commit.max-bytes)
    at: float = 0.0  # when its oldest row was buffered


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
    written: list[Written] = field(default_factory=list)  # in files, before the chunks
    resets: int = 0  # times its data was dropped (an early write in flight is then void)

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

    @property
    def written_end(self) -> int:
        """Where the chunks begin: the end of the written files, or the range start."""
        return self.written[-1].ranges[self.tp][1] if self.written else self.range_start

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
    written: list[Written] = field(default_factory=list)  # files written early, reported with it

    def tables(self, cast: Callable[[str, pa.Table], pa.Table] | None = None) -> dict[str, pa.Table]:
        """Rows per table, in buffer order, one Arrow chunk per column. ``cast(table, rows)``
        brings rows to the table's schema (chunks decoded against an evolved schema differ from
        it): once per run of chunks of one schema, not per chunk. A table a round routes to
        gets a small chunk from every fetch (hundreds of small chunks per table and round with
        many tables); cast one by one, that dominated a round (see bench/README.md,
        fanout_bench)."""
        parts: dict[str, list[list[pa.Table]]] = {}

        def add(name: str, t: pa.Table) -> None:
            runs = parts.setdefault(name, [])
            if runs and runs[-1][-1].schema.equals(t.schema, check_metadata=True):
                runs[-1].append(t)
            else:
                runs.append([t])

        fanouts: list[FanoutRows] = []  # consecutive fan-out fetches of one schema: split at once

        def flush() -> None:
            for name, t in split_fanouts(fanouts) if fanouts else ():
                add(name, t)
            fanouts.clear()

        for c in self.chunks:
            if c.fanout is not None:
                if fanouts and not fanouts[-1].table.schema.equals(c.fanout.table.schema, check_metadata=True):
                    flush()
                fanouts.append(c.fanout)
                for name, t in c.tables.items():  # dead letters of a fan-out's fetch (their own table)
                    add(name, t)
                continue
            flush()
            for name, t in c.tables.items():
                if t.num_rows:
                    add(name, t)
        flush()
        out: dict[str, pa.Table] = {}
        for name, runs in parts.items():
            merged = [pa.concat_tables(run) for run in runs]
            if cast is not None:
                merged = [cast(name, m) for m in merged]
            out[name] = pa.concat_tables(merged).combine_chunks()
        return out

    @property
    def rows(self) -> int:
        return sum(c.rows for c in self.chunks) + sum(w.rows for w in self.written)

    def written_files(self) -> dict[str, tuple[Any, ...]]:
        """The early-written files it reports, by table."""
        out: dict[str, tuple[Any, ...]] = {}
        for w in self.written:
            for name, files in w.files.items():
                out[name] = out.get(name, ()) + files
        return out


@dataclass
class Stage(Snapshot):
    """Chunks taken for an early write: ``ranges`` say where each partition's written files
    will begin and end, ``states`` each partition's state and its reset count then (a reset, or
    a new state, meanwhile voids the write)."""

    states: dict[TopicPartition, tuple[PartitionState, int]] = field(default_factory=dict)


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
        self._voided: list[Written] = []  # written files dropped, not yet taken (take_voided)
        self._reseek: set[TopicPartition] = set()
        self._staged: Stage | None = None  # an early write in flight
        self.takes = 0  # rounds that took data (agents/ingest.py asks for an early round once per take)
        self.in_round_at: float | None = None  # oldest buffering time of data taken, until a CommitComplete
        self.fresh_rows = 0  # rows buffered since the last take (agents/ingest.py: rows after an idle round)

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
            self._cut(st, 0)
            st.range_start = st.next_offset = position
        st.active = True
        st.activated_at = now
        return st.next_offset

    def release(self, tp: TopicPartition) -> None:
        st = self.partitions.pop(tp, None)
        if st is not None:
            self._cut(st, 0)

    def rewind(self, tp: TopicPartition) -> None:
        """A rejected response: forget everything not accepted and wait for a new Resume."""
        st = self.partitions.get(tp)
        if st is not None:
            self._cut(st, 0)
            st.active = False
            st.next_offset = st.range_start = -1  # unknown until the Resume

    def _drop_chunks(self, st: PartitionState) -> None:
        for c in st.chunks:
            self.nbytes -= c.nbytes
            self.rows -= c.rows
        st.chunks.clear()
        st.resets += 1

    def _cut(self, st: PartitionState, i: int) -> None:
        """Drop ``st``'s written files from its ``i``-th on and all its chunks: it reads again
        from where they began. Files dropped are void for every partition they cover: those
        partitions are cut at them too, and sought back if active (:meth:`take_voided`)."""
        start = st.written[i].ranges[st.tp][0] if i < len(st.written) else st.written_end
        dropped = st.written[i:]
        del st.written[i:]
        self._drop_chunks(st)
        st.next_offset = start
        for w in dropped:
            if w in self._voided:
                continue
            self._voided.append(w)
            for tp in w.ranges:
                other = self.partitions.get(tp)
                if other is None or other is st:
                    continue
                j = next((k for k, x in enumerate(other.written) if x is w), None)
                if j is not None:
                    self._cut(other, j)
                    self._moved_back(other)

    def _moved_back(self, st: PartitionState) -> None:
        if st.active:
            st.reseeking = True
            st.activated_at = float("inf")  # what is in flight is stale until the seek is done
            self._reseek.add(st.tp)

    def _written(self) -> list[Written]:
        """Files written early, each once (one may hold several partitions' rows); copies only:
        also read from /status's thread."""
        seen: list[Written] = []
        for st in list(self.partitions.values()):
            seen.extend(w for w in list(st.written) if w not in seen)
        return seen

    @property
    def written_rows(self) -> int:
        """Rows in files written early, waiting for their round."""
        return sum(w.rows for w in self._written())

    def uncommitted(self) -> tuple[int, int]:
        """Rows and Arrow bytes not yet taken by a round: buffered, in files written early, or
        in an early write in flight (iceberg.control.commit.max-records and max-bytes)."""
        seen = self._written()
        staged = self._staged.chunks if self._staged is not None else []
        return (self.rows + sum(w.rows for w in seen) + sum(c.rows for c in staged),
                self.nbytes + sum(w.nbytes for w in seen) + sum(c.nbytes for c in staged))

    def oldest_at(self) -> float | None:
        """When the oldest row not yet committed was buffered: of the data buffered, written early
        or in an early write, and of the data rounds took until the next CommitComplete
        (:meth:`committed`). None: nothing uncommitted."""
        times = [self.in_round_at] if self.in_round_at is not None else []
        for st in list(self.partitions.values()):
            first = st.written[0] if st.written else st.chunks[0] if st.chunks else None
            if first is not None:
                times.append(first.at)
        if self._staged is not None:
            times.extend(c.at for c in self._staged.chunks)
        return min(times, default=None)

    def committed(self) -> None:
        """A CommitComplete: what rounds took before it is committed (or rejected, then read
        and buffered again)."""
        self.in_round_at = None

    def take_voided(self) -> tuple[list[Written], list[TopicPartition]]:
        """Written files no response may report any more, and the active partitions that must
        seek back to their ``next_offset`` (it moved back to where dropped files began).
        Files with ``sent`` may be named by a response the coordinator saw: only the
        coordinator may delete those."""
        out, self._voided = self._voided, []
        tps = sorted(tp for tp in self._reseek if tp in self.partitions)
        self._reseek = set()
        return out, tps

    def add(self, chunk: Chunk, last_offset: int, last_record_ms: int | None) -> None:
        st = self.partitions[chunk.tp]
        chunk.at = chunk.at or time.time()
        self.fresh_rows += chunk.rows
        st.chunks.append(chunk)
        st.next_offset = last_offset + 1
        st.last_record_ms = last_record_ms
        self.nbytes += chunk.nbytes
        self.rows += chunk.rows

    def _taking(self, generation: int) -> list[PartitionState]:
        return [self.partitions[tp] for tp in sorted(self.partitions)
                if self.partitions[tp].active and self.partitions[tp].generation == generation]

    def take(self, generation: int, ready: Callable[[Chunk], bool] | None = None,
             hold: Callable[[PartitionState], bool] | None = None) -> Snapshot:
        """Everything buffered for active partitions, with one range per active partition
        (empty ranges for idle ones, so they never stall a round).

        With ``ready``, a partition's range stops before its first chunk that is not ready
        (data whose table schema change is not applied yet): that chunk and the ones after it
        stay buffered, so ranges stay contiguous. With ``hold``, a partition it names keeps
        all its data (an empty range; agents/rounds.py, a backlog's hold). Written files go
        only with every partition they cover: a partition's range stops before the first that
        cannot (one of its partitions is claiming after a rebalance, or held)."""
        if self._staged is not None:
            raise RuntimeError("a round's take while an early write is in flight (the worker holds one lock for both)")
        taking = self._taking(generation)
        self.fresh_rows = 0
        held = {st.tp for st in taking if hold(st)} if hold is not None else set()
        reportable = self._reportable([st for st in taking if st.tp not in held])
        ranges = []
        chunks: list[Chunk] = []
        written: list[Written] = []
        for st in taking:
            if st.tp in held:
                ranges.append(OffsetRange(st.tp, st.range_start, st.range_start))
                continue
            n_w = next((i for i, w in enumerate(st.written) if w not in reportable), len(st.written))
            for w in st.written[:n_w]:
                if w not in written:
                    w.sent = True
                    written.append(w)
            base = st.written[n_w - 1].ranges[st.tp][1] if n_w else st.range_start
            del st.written[:n_w]
            n = 0 if st.written else len(st.chunks)  # chunks wait behind files that cannot go
            if ready is not None:
                n = next((i for i, c in enumerate(st.chunks[:n]) if not ready(c)), n)
            end = st.chunks[n - 1].end if n else base
            ranges.append(OffsetRange(st.tp, st.range_start, end))
            chunks.extend(st.chunks[:n])
            st.chunks = st.chunks[n:]
            st.range_start = end
        for c in chunks:
            self.nbytes -= c.nbytes
            self.rows -= c.rows
        if chunks or written or held:
            self.takes += 1  # a round came: a request after it is a new one (agents/ingest.py)
        if chunks or written:
            oldest = min([c.at for c in chunks] + [w.at for w in written])
            self.in_round_at = oldest if self.in_round_at is None else min(self.in_round_at, oldest)
        return Snapshot(generation, tuple(ranges), chunks, written)

    @staticmethod
    def _reportable(taking: list[PartitionState]) -> list[Written]:
        """The written files a take may report: each covers only partitions taken, and comes
        after none that may not (in any partition)."""
        tps = {st.tp for st in taking}
        ok: list[Written] = []
        for st in taking:
            ok.extend(w for w in st.written if w not in ok and all(tp in tps for tp in w.ranges))
        changed = True
        while changed:
            changed = False
            for st in taking:
                blocked = False
                for w in st.written:
                    if w not in ok:
                        blocked = True
                    elif blocked:
                        ok.remove(w)
                        changed = True
        return ok

    def restore(self, snap: Snapshot) -> None:
        """Give a snapshot back after a failed write or send: its chunks go first again. A
        partition with written files in it reads again from its range start instead: a
        response that was partly sent may name those files, so they are never reported
        again (the coordinator deletes them as an abandoned response's)."""
        for r in snap.ranges:
            st = self.partitions.get(r.tp)
            if st is None or st.generation != snap.generation or st.range_start != r.end:
                continue  # the partition moved on meanwhile; its data will be re-read
            st.range_start = r.start
            if any(r.tp in w.ranges for w in snap.written):
                self._cut(st, 0)
                st.next_offset = r.start
                self._moved_back(st)
                continue
            self._put_back(st, snap.chunks)

    def give_back(self, snap: Snapshot) -> None:
        """Give back a snapshot no part of which was sent: its written files and chunks go first
        again, reported by the next take. If one of its partitions moved on meanwhile,
        :meth:`restore` (read again from the range start)."""
        if any((st := self.partitions.get(r.tp)) is None or st.generation != snap.generation or
               st.range_start != r.end for r in snap.ranges):
            self.restore(snap)
            return
        for w in snap.written:
            w.sent = False
        for r in snap.ranges:
            st = self.partitions[r.tp]
            st.range_start = r.start
            st.written[:0] = sorted((w for w in snap.written if r.tp in w.ranges), key=lambda w: w.ranges[r.tp][0])
            self._put_back(st, snap.chunks)

    def _put_back(self, st: PartitionState, chunks: list[Chunk]) -> None:
        """``st``'s chunks among ``chunks`` go back in front of its buffered ones."""
        mine = [c for c in chunks if c.tp == st.tp]
        st.chunks[:0] = mine
        for c in mine:
            self.nbytes += c.nbytes
            self.rows += c.rows

    # Early writes ----------------------------------------------------------------------------

    def stage(self, generation: int, ready: Callable[[Chunk], bool] | None = None) -> Stage:
        """Buffered chunks to write ahead of their round: of each active partition, those ready
        from the front. They leave the buffers (and the bound) now; :meth:`land` makes their
        files a :class:`Written`, :meth:`unstage` puts them back after a failed write."""
        ranges = []
        chunks: list[Chunk] = []
        states = {}
        for st in self._taking(generation):
            n = len(st.chunks)
            if ready is not None:
                n = next((i for i, c in enumerate(st.chunks) if not ready(c)), n)
            if not n:
                continue
            ranges.append(OffsetRange(st.tp, st.written_end, st.chunks[n - 1].end))
            states[st.tp] = (st, st.resets)
            chunks.extend(st.chunks[:n])
            st.chunks = st.chunks[n:]
        for c in chunks:
            self.nbytes -= c.nbytes
            self.rows -= c.rows
        stage = Stage(generation, tuple(ranges), chunks, states=states)
        if ranges:
            self._staged = stage
        return stage

    def _unchanged(self, stage: Stage, tp: TopicPartition) -> PartitionState | None:
        st, resets = stage.states[tp]
        return st if self.partitions.get(tp) is st and st.resets == resets else None

    def land(self, stage: Stage, files: dict[str, tuple[Any, ...]]) -> Written | None:
        """The staged rows are in ``files``: a :class:`Written` in front of each partition's
        chunks. None if any of its partitions dropped its data meanwhile: the files are void
        (unreported, the caller deletes them) and the other partitions get their chunks back."""
        if any(self._unchanged(stage, r.tp) is None for r in stage.ranges):
            self.unstage(stage)
            return None
        self._staged = None
        w = Written({r.tp: (r.start, r.end) for r in stage.ranges}, files, stage.rows,
                    nbytes=sum(c.nbytes for c in stage.chunks), at=min((c.at for c in stage.chunks), default=0.0))
        for r in stage.ranges:
            self.partitions[r.tp].written.append(w)
        return w

    def unstage(self, stage: Stage) -> None:
        """A failed (or void) early write: the chunks go back in front of each partition's
        chunks, unless the partition dropped its data meanwhile."""
        self._staged = None
        for r in stage.ranges:
            st = self._unchanged(stage, r.tp)
            if st is not None:
                self._put_back(st, stage.chunks)
