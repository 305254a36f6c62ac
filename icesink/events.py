"""Control-topic events: the commit log of a sink group.

Leaf module shared by ``agents/`` and ``coordinator/``; it imports nothing with I/O.
Events are frozen, tagged models. On the wire each is one JSON object
``{"v": 1, "type": "<tag>", ...fields}`` with sorted keys, so bytes are stable and old
events stay readable (golden bytes in tests/unit/test_events.py). A reader refuses a newer
version or an unknown type with a :class:`ProtocolError`.

The protocol (design/exactly-once.md, docs/commits.md):
  Claim -> Resume                                 partition ownership
  StartCommit -> DataWritten* -> DataComplete     one worker response per round
  CommitToTable* -> CommitComplete                the coordinator's commit, CommitComplete
                                                  doubles as a checkpoint of its state
  Rewind                                          a rejected response: drop and re-claim
  CommitRequest                                   a worker whose buffer is full asks for a round
  SchemaProposal                                  a worker's data needs table schema changes;
                                                  the coordinator applies them before a round
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, fields
from typing import Any, ClassVar, Union, assert_never

from icesink.errors import ProtocolError

VERSION = 1


@dataclass(frozen=True, order=True)
class TopicPartition:
    topic: str
    partition: int

    def __str__(self) -> str:
        return f"{self.topic}[{self.partition}]"


@dataclass(frozen=True)
class OffsetRange:
    """Consumed source offsets ``[start, end)`` of one partition; ``start == end`` when idle."""

    tp: TopicPartition
    start: int
    end: int

    def validate(self) -> None:
        if not 0 <= self.start <= self.end:
            raise ProtocolError(f"bad range {self}: expected 0 <= start <= end")


@dataclass(frozen=True)
class Position:
    tp: TopicPartition
    offset: int


@dataclass(frozen=True)
class Owner:
    tp: TopicPartition
    worker: str
    generation: int
    member: str | None = None  # the consumer-group member id of the claim (see Claim)


@dataclass(frozen=True)
class FileInfo:
    """Everything the coordinator needs to commit one Parquet data file with pyiceberg.

    Column statistics are keyed by Iceberg field id; bounds are the Iceberg single-value
    binary serialisation (base64 on the wire). Partition values are JSON scalars as Iceberg
    stores them (days since epoch for day(), bucket numbers, strings, ...).
    """

    path: str
    record_count: int
    size_bytes: int
    spec_id: int
    partition: tuple[Any, ...] = ()
    column_sizes: tuple[tuple[int, int], ...] = ()
    value_counts: tuple[tuple[int, int], ...] = ()
    null_value_counts: tuple[tuple[int, int], ...] = ()
    nan_value_counts: tuple[tuple[int, int], ...] = ()
    lower_bounds: tuple[tuple[int, bytes], ...] = ()
    upper_bounds: tuple[tuple[int, bytes], ...] = ()
    split_offsets: tuple[int, ...] = ()


@dataclass(frozen=True)
class Claim:
    """A worker was assigned ``partitions`` in consumer-group ``generation``. ``member`` is its
    group member id: generations restart when the group is deleted and created again, and a
    member id never seen before with a generation below the group's newest tells the coordinator
    so (coordinator/state.py)."""

    TYPE: ClassVar[str] = "claim"
    worker: str
    generation: int
    partitions: tuple[TopicPartition, ...]
    member: str | None = None


@dataclass(frozen=True)
class Resume:
    """Answer to a Claim: seek each partition to its accepted position and start reading."""

    TYPE: ClassVar[str] = "resume"
    epoch: int
    worker: str
    generation: int
    positions: tuple[Position, ...]


@dataclass(frozen=True)
class StartCommit:
    TYPE: ClassVar[str] = "start-commit"
    epoch: int
    commit_id: str


@dataclass(frozen=True)
class DataWritten:
    TYPE: ClassVar[str] = "data-written"
    commit_id: str
    response_id: str
    worker: str
    table: str
    files: tuple[FileInfo, ...]


@dataclass(frozen=True)
class DataComplete:
    """Closes one worker response; counts only if ``events_sent`` DataWritten preceded it."""

    TYPE: ClassVar[str] = "data-complete"
    commit_id: str
    response_id: str
    worker: str
    generation: int
    ranges: tuple[OffsetRange, ...]
    events_sent: int
    valid_through_ms: int | None = None


@dataclass(frozen=True)
class CommitToTable:
    TYPE: ClassVar[str] = "commit-to-table"
    epoch: int
    commit_id: str
    table: str
    snapshot_id: int | None
    files: int
    records: int
    watermark: int


@dataclass(frozen=True)
class CommitComplete:
    """End of a round. ``through`` is the control offset whose accepted responses are all
    committed; ``positions`` and ``owners`` are the coordinator state as of ``through``."""

    TYPE: ClassVar[str] = "commit-complete"
    epoch: int
    commit_id: str
    through: int
    positions: tuple[Position, ...]
    owners: tuple[Owner, ...] = ()
    valid_through_ms: int | None = None
    replay_from: int | None = None  # where a recovering coordinator resumes reading


@dataclass(frozen=True)
class Rewind:
    TYPE: ClassVar[str] = "rewind"
    epoch: int
    worker: str
    partitions: tuple[TopicPartition, ...]
    reason: str


@dataclass(frozen=True)
class CommitRequest:
    TYPE: ClassVar[str] = "commit-request"
    worker: str
    buffered_bytes: int


@dataclass(frozen=True)
class SchemaProposal:
    """The schema a worker's buffered data needs for ``table`` (schema evolution): an Iceberg
    schema JSON whose fields are matched to the table's by name (its field ids mean nothing).
    The coordinator applies what the table lacks (new fields, widenings, optionality) in one
    schema update before its next StartCommit (docs/commits.md)."""

    TYPE: ClassVar[str] = "schema-proposal"
    worker: str
    table: str
    schema_json: str


Event = Union[
    Claim, Resume, StartCommit, DataWritten, DataComplete, CommitToTable, CommitComplete,
    Rewind, CommitRequest, SchemaProposal,
]
EVENT_TYPES: dict[str, type] = {
    cls.TYPE: cls
    for cls in (
        Claim, Resume, StartCommit, DataWritten, DataComplete, CommitToTable, CommitComplete,
        Rewind, CommitRequest, SchemaProposal,
    )
}

# Nested value types by (event class, field name), for decoding.
_NESTED: dict[str, type] = {
    "partitions": TopicPartition,
    "positions": Position,
    "owners": Owner,
    "ranges": OffsetRange,
    "files": FileInfo,
}
_PAIR_INT = {"column_sizes", "value_counts", "null_value_counts", "nan_value_counts"}
_PAIR_BYTES = {"lower_bounds", "upper_bounds"}


def _to_json(value: Any) -> Any:
    if isinstance(value, TopicPartition):
        return {"topic": value.topic, "partition": value.partition}
    if isinstance(value, (Position, Owner, OffsetRange, FileInfo)):
        out: dict[str, Any] = {}
        for f in fields(value):
            v = getattr(value, f.name)
            if f.name in _PAIR_BYTES:
                out[f.name] = [[k, base64.b64encode(b).decode("ascii")] for k, b in v]
            else:
                out[f.name] = _to_json(v)
        return out
    if isinstance(value, tuple):
        return [_to_json(v) for v in value]
    return value


def encode(event: Event) -> bytes:
    """Stable bytes for one event: sorted keys, no spaces."""
    body: dict[str, Any] = {"v": VERSION, "type": event.TYPE}
    for f in fields(event):
        body[f.name] = _to_json(getattr(event, f.name))
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode("utf-8")


def _tp(raw: dict[str, Any]) -> TopicPartition:
    return TopicPartition(str(raw["topic"]), int(raw["partition"]))


def _from_json(cls: type, raw: dict[str, Any]) -> Any:
    kwargs: dict[str, Any] = {}
    for f in fields(cls):
        if f.name not in raw:
            continue  # optional field with a default (added in a later minor change)
        v = raw[f.name]
        if f.name == "tp":
            kwargs["tp"] = _tp(v)
        elif f.name in _NESTED and isinstance(v, list) and cls is not FileInfo:
            inner = _NESTED[f.name]
            kwargs[f.name] = tuple(
                _tp(x) if inner is TopicPartition else _from_json(inner, x) for x in v
            )
        elif f.name in _PAIR_INT:
            kwargs[f.name] = tuple((int(k), int(n)) for k, n in v)
        elif f.name in _PAIR_BYTES:
            kwargs[f.name] = tuple((int(k), base64.b64decode(b)) for k, b in v)
        elif f.name in ("partition", "split_offsets") and cls is FileInfo:
            kwargs[f.name] = tuple(v)
        else:
            kwargs[f.name] = v
    return cls(**kwargs)


def decode(data: bytes) -> Event:
    try:
        raw = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ProtocolError(f"control event is not JSON: {exc}") from exc
    if not isinstance(raw, dict):
        raise ProtocolError(f"control event: expected a JSON object, found {type(raw).__name__}")
    version = raw.get("v")
    if not isinstance(version, int) or version > VERSION or version < 1:
        raise ProtocolError(
            f"control event version: expected 1..{VERSION}, found {version!r} "
            "(upgrade icesink to read events written by a newer version)"
        )
    cls = EVENT_TYPES.get(raw.get("type", ""))
    if cls is None:
        raise ProtocolError(
            f"control event type: expected one of {sorted(EVENT_TYPES)}, found {raw.get('type')!r}"
        )
    try:
        return _from_json(cls, raw)  # type: ignore[no-any-return]
    except (KeyError, TypeError, ValueError) as exc:
        raise ProtocolError(f"malformed {cls.TYPE} event: {exc}") from exc


def describe(event: Event) -> str:
    """One readable line per event, for ``icesink control tail`` and logs."""
    match event:
        case Claim(worker=w, generation=g, partitions=ps):
            return f"claim      worker={w} gen={g} partitions={' '.join(map(str, ps))}"
        case Resume(epoch=e, worker=w, generation=g, positions=ps):
            pos = " ".join(f"{p.tp}@{p.offset}" for p in ps)
            return f"resume     epoch={e} worker={w} gen={g} {pos}"
        case StartCommit(epoch=e, commit_id=c):
            return f"start      epoch={e} round={c}"
        case DataWritten(commit_id=c, worker=w, table=t, files=fs):
            rows = sum(f.record_count for f in fs)
            names = " ".join(f.path.rsplit("/", 1)[-1] for f in fs[:3])
            more = f" (+{len(fs) - 3} more)" if len(fs) > 3 else ""
            return f"written    round={c} worker={w} table={t} files={len(fs)} rows={rows} {names}{more}"
        case DataComplete(commit_id=c, worker=w, generation=g, ranges=rs, events_sent=n):
            rng = " ".join(f"{r.tp}[{r.start},{r.end})" for r in rs)
            return f"complete   round={c} worker={w} gen={g} events={n} {rng}"
        case CommitToTable(epoch=e, commit_id=c, table=t, snapshot_id=s, files=nf, records=nr, watermark=wm):
            return f"committed  round={c} epoch={e} table={t} snapshot={s} files={nf} rows={nr} watermark={wm}"
        case CommitComplete(epoch=e, commit_id=c, through=th, positions=ps):
            pos = " ".join(f"{p.tp}@{p.offset}" for p in ps)
            return f"done       round={c} epoch={e} through={th} {pos}"
        case Rewind(epoch=e, worker=w, partitions=ps, reason=r):
            return f"rewind     epoch={e} worker={w} partitions={' '.join(map(str, ps))} reason={r}"
        case CommitRequest(worker=w, buffered_bytes=b):
            return f"request    worker={w} buffered_bytes={b}"
        case SchemaProposal(worker=w, table=t, schema_json=sj):
            return f"schema     worker={w} table={t} {_schema_brief(sj)}"
        case _:
            assert_never(event)


def _schema_brief(schema_json: str) -> str:
    """``name:type`` of the top-level fields of an Iceberg schema JSON (nested types abridged)."""
    try:
        body = json.loads(schema_json)
        return " ".join(
            f"{f['name']}:{f['type'] if isinstance(f['type'], str) else f['type'].get('type', '?')}"
            for f in body.get("fields", [])
        )
    except (ValueError, TypeError, KeyError, AttributeError):
        return f"(unreadable schema: {schema_json[:60]!r})"


__all__ = [
    "VERSION", "TopicPartition", "OffsetRange", "Position", "Owner", "FileInfo",
    "Claim", "Resume", "StartCommit", "DataWritten", "DataComplete", "CommitToTable",
    "CommitComplete", "Rewind", "CommitRequest", "SchemaProposal", "Event", "EVENT_TYPES",
    "encode", "decode", "describe",
]
