"""The control protocol's events: the commit log of a sink group, and the file description
that travels from the writer (agents/) to the committer (coordinator/).

Leaf module of the protocol package (icesink/shared/protocol/): frozen, tagged dataclasses, nothing
with I/O. How they go on the wire is :mod:`icesink.shared.protocol.codec`.

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

from dataclasses import dataclass
from typing import Any, ClassVar

from icesink.shared.errors import ProtocolError
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
    """Everything the coordinator needs to commit one data file with pyiceberg: Parquet, or ORC
    when ``path`` ends in ``.orc`` (icesink.shared.iceberg.file_format_of; ORC files carry counts only).

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
    # Mirror tables (docs/mirror-tables.md): Parquet files of the key columns whose committed
    # rows this response replaces or deletes (record_count keys each). Version 2: a reader
    # that would ignore them must refuse the event instead.
    deleted_keys: tuple[FileInfo, ...] = ()


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

    def idle_after(self, before: CommitComplete | None) -> bool:
        """This round moved no position from ``before`` (the CommitComplete before it): nothing
        arrived for the group to commit (iceberg.control.commit.idle-interval-ms). None: unknown,
        False."""
        return before is not None and before.positions == self.positions


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


@dataclass(frozen=True)
class AlterPositions:
    """An operator moved where partitions are read from (``PATCH``/``DELETE
    /connectors/{name}/offsets`` of ``icesink connect`` while the connector is stopped). Applied
    in log order: each partition's accepted position becomes ``positions``' offset and its owner
    is void, so it is read from there once claimed again; responses accepted before it stay
    binding (docs/commits.md, "Altering and resetting offsets")."""

    TYPE: ClassVar[str] = "alter-positions"
    positions: tuple[Position, ...]
    reason: str


Event = (
    Claim | Resume | StartCommit | DataWritten | DataComplete | CommitToTable | CommitComplete
    | Rewind | CommitRequest | SchemaProposal | AlterPositions
)
EVENT_TYPES: dict[str, type[Event]] = {
    cls.TYPE: cls
    for cls in (
        Claim, Resume, StartCommit, DataWritten, DataComplete, CommitToTable, CommitComplete,
        Rewind, CommitRequest, SchemaProposal, AlterPositions,
    )
}


__all__ = [
    "TopicPartition", "OffsetRange", "Position", "Owner", "FileInfo",
    "Claim", "Resume", "StartCommit", "DataWritten", "DataComplete", "CommitToTable",
    "CommitComplete", "Rewind", "CommitRequest", "SchemaProposal", "AlterPositions", "Event", "EVENT_TYPES",
]
