"""The control protocol both sides speak: a leaf package that ``agents/`` (the worker) and
``coordinator/`` import, and that imports nothing with I/O.

- :mod:`icesink.shared.protocol.events`: the events of the control topic and :class:`FileInfo`, the
  description of a written data file that travels from the writer to the committer;
- :mod:`icesink.shared.protocol.codec`: their bytes on the wire (checked field by field on the way in);
- :mod:`icesink.shared.protocol.summary`: the keys icesink writes into Iceberg snapshot summaries and
  table properties, and the sink state they hold.
"""

from icesink.shared.protocol.codec import MAX_EVENT_BYTES, VERSION, decode, describe, encode
from icesink.shared.protocol.events import (
    EVENT_TYPES, AlterPositions, Claim, CommitComplete, CommitRequest, CommitToTable, DataComplete, DataWritten, Event, FileInfo,
    OffsetRange, Owner, Position, Resume, Rewind, SchemaProposal, StartCommit, TopicPartition,
)
from icesink.shared.protocol.summary import (
    COMMIT_ID, EPOCH, GROUP, LOG_ID, POSITIONS, STATE_VERSION, VALID_THROUGH, WATERMARK, SinkState, state_property,
    summary_properties,
)

__all__ = [
    "VERSION", "MAX_EVENT_BYTES", "encode", "decode", "describe",
    "TopicPartition", "OffsetRange", "Position", "Owner", "FileInfo",
    "Claim", "Resume", "StartCommit", "DataWritten", "DataComplete", "CommitToTable",
    "CommitComplete", "Rewind", "CommitRequest", "SchemaProposal", "AlterPositions", "Event",
    "EVENT_TYPES",
    "COMMIT_ID", "WATERMARK", "POSITIONS", "EPOCH", "VALID_THROUGH", "GROUP", "LOG_ID", "STATE_VERSION",
    "state_property", "SinkState", "summary_properties",
]
