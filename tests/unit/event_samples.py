"""One sample of every control event type, shared by the golden-bytes tests."""

from icesink.shared.protocol import (
    AlterPositions, Claim, CommitComplete, CommitRequest, CommitToTable, DataComplete, DataWritten, FileInfo,
    OffsetRange, Owner, Position, Resume, Rewind, SchemaProposal, StartCommit, TopicPartition,
)

TP0 = TopicPartition("completed-pizzas", 0)
TP1 = TopicPartition("completed-pizzas", 1)
FILE = FileInfo(
    path="file:///wh/rpc.db/pizzas/data/r1-w1-1/date_ordered_day=2024-01-04/part-0.parquet",
    record_count=10, size_bytes=2048, spec_id=0, partition=(19726, 3),
    column_sizes=((1, 100), (2, 40)), value_counts=((1, 10), (2, 10)),
    null_value_counts=((1, 0), (2, 0)), nan_value_counts=(),
    lower_bounds=((2, b"\x01\x00\x00\x00\x00\x00\x00\x00"),),
    upper_bounds=((2, b"\x78\x00\x00\x00\x00\x00\x00\x00"),),
    split_offsets=(4,),
)

SAMPLES = {
    "claim": Claim("w1", 3, (TP0, TP1)),
    "resume": Resume(2, "w1", 3, (Position(TP0, 100), Position(TP1, 0))),
    "start-commit": StartCommit(2, "r1"),
    "data-written": DataWritten("r1", "resp-1", "w1", "rpc.pizzas", (FILE,)),
    "data-complete": DataComplete(
        "r1", "resp-1", "w1", 3, (OffsetRange(TP0, 100, 110), OffsetRange(TP1, 0, 0)), 1, 1700000000000,
    ),
    "commit-to-table": CommitToTable(2, "r1", "rpc.pizzas", 123456789, 1, 10, 42),
    "commit-complete": CommitComplete(
        2, "r1", 42, (Position(TP0, 110), Position(TP1, 0)), (Owner(TP0, "w1", 3),), 1700000000000, 40,
    ),
    "rewind": Rewind(2, "w2", (TP1,), "range start of completed-pizzas[1]: expected 0, found 5"),
    "commit-request": CommitRequest("w1", 268435456),
    "schema-proposal": SchemaProposal(
        "w1", "rpc.pizzas",
        '{"fields":[{"id":1,"name":"order_id","required":false,"type":"string"},'
        '{"id":2,"name":"customer","required":false,"type":{"fields":[{"id":3,"name":"vip","required":false,'
        '"type":"boolean"}],"type":"struct"}}],"identifier-field-ids":[],"schema-id":0,"type":"struct"}',
    ),
    "alter-positions": AlterPositions((Position(TP0, 50), Position(TP1, 0)), "PATCH /connectors/pizzas/offsets"),
}
