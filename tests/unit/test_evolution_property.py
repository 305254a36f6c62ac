"""Property: any sequence of record batches whose fields appear, nest and widen over time is
decoded without loss, and the table, evolved by the coordinator's logic and written with the
worker's cast, reads back every value as written. SQLite pyiceberg catalog in a temp dir; files
are written with pyarrow (field ids from the table's schema) and committed with a fast append,
as the Spark writer's files are; rounds come at random points, as StartCommits do."""

from __future__ import annotations

import json
import tempfile
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyiceberg.catalog import load_catalog
from pyiceberg.io.pyarrow import compute_statistics_plan, data_file_statistics_from_parquet_metadata, parquet_path_to_id_mapping
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.schema import Schema
from pyiceberg.typedef import Record
from pyiceberg.types import FloatType, IntegerType, LongType, NestedField, StringType, StructType

from agents.buffer import Buffers, Chunk
from agents.evolution import Evolver
from icesink.shared.schema_changes import identifier_paths
from agents.tables import target_of
from coordinator.evolution import apply_proposals
from icesink.shared.protocol import TopicPartition

TP = TopicPartition("src", 0)
INT32_MAX = 2**31 - 1

# Field name -> value strategy. Each name keeps one kind, so no record is a type conflict.
FIELDS = {
    "n": st.one_of(st.integers(-100, 100), st.integers(INT32_MAX + 1, 2**62)),  # int column, widened to long
    "f": st.one_of(st.sampled_from([0.5, -2.25, 1024.0]), st.sampled_from([1e300, -3e200])),  # float -> double
    "label": st.text(alphabet="abcxyz", max_size=5),  # new top-level string
    "count": st.integers(-(2**40), 2**40),  # new top-level long
    "flag": st.booleans(),
    "tags": st.lists(st.integers(0, 9), max_size=3),  # new list
    "s.a": st.text(alphabet="pq", max_size=3),  # existing nested field
    "s.b": st.integers(0, 1000),  # new nested field in an existing struct
    "s.c": st.sampled_from(["u", "v"]),
    "extra.k": st.integers(0, 5),  # new struct with a nested field
}


@st.composite
def batches(draw):
    # Fields become available over time: batch i can use the first `available` names.
    order = draw(st.permutations(sorted(FIELDS)))
    out, rid = [], 0
    for i in range(draw(st.integers(1, 6))):
        available = order[: min(len(order), 2 + 2 * i)]
        batch = []
        for _ in range(draw(st.integers(1, 6))):
            rec: dict = {"id": rid}
            rid += 1
            for name in draw(st.lists(st.sampled_from(available), unique=True, max_size=len(available))):
                value = draw(FIELDS[name])
                top, _, inner = name.partition(".")
                if inner:
                    rec.setdefault(top, {})[inner] = value
                else:
                    rec[top] = value
            batch.append(rec)
        rounds_after = draw(st.booleans())
        out.append((batch, rounds_after))
    return out


def append_parquet(table, data: pa.Table) -> None:
    path = Path(table.location().removeprefix("file://")) / "data" / f"{uuid.uuid4().hex}.parquet"
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(data, path)
    schema = table.schema()
    stats = data_file_statistics_from_parquet_metadata(
        parquet_metadata=pq.read_metadata(path),
        stats_columns=compute_statistics_plan(schema, table.metadata.properties),
        parquet_column_mapping=parquet_path_to_id_mapping(schema),
    )
    df = DataFile.from_args(
        content=DataFileContent.DATA, file_path=path.as_uri(), file_format=FileFormat.PARQUET, partition=Record(),
        file_size_in_bytes=path.stat().st_size, sort_order_id=None, equality_ids=None, key_metadata=None,
        **stats.to_serialized_dict(),
    )
    df.spec_id = table.metadata.default_spec_id
    with table.transaction() as tx, tx.update_snapshot().fast_append() as append:
        append.append_data_file(df)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches())
def test_any_sequence_of_batches_reads_back_as_written(plan):
    from icesink.shared.catalogs import sqlite_catalog_properties

    with tempfile.TemporaryDirectory() as tmp:
        catalog = load_catalog("p", **sqlite_catalog_properties(Path(tmp)))
        catalog.create_namespace("db")
        catalog.create_table("db.t", Schema(
            NestedField(1, "id", LongType(), required=True),
            NestedField(2, "n", IntegerType(), required=False),
            NestedField(3, "f", FloatType(), required=False),
            NestedField(4, "s", StructType(NestedField(5, "a", StringType(), required=False)), required=False),
            identifier_field_ids=[1],
        ))
        target = target_of("db.t", catalog.load_table("db.t"))
        worker = Evolver("w1", evolve=True, case_insensitive=False)
        buffers = Buffers(10**12)
        buffers.claim(TP, 1)
        buffers.resume(TP, 0, now=0.0)
        proposals, offset, schema_updates, files = [], 0, 0, 0

        def run_round() -> None:
            nonlocal target, proposals, schema_updates, files
            # Coordinator: one schema update for the pending proposals, before the round.
            if proposals:
                if apply_proposals(catalog, "db.t", proposals, case_insensitive=False, group="g", epoch=1):
                    schema_updates += 1
                proposals = []
            # Worker at StartCommit: reload, re-propose what still waits, write the ready prefix.
            targets = {"db.t": target}
            if worker.tables_to_reload(buffers, targets):
                target = target_of("db.t", catalog.load_table("db.t"))
                targets["db.t"] = target
                worker.refreshed("db.t", target.arrow_schema)
            if (again := worker.pending_proposal("db.t", target.arrow_schema)) is not None:
                proposals.append(again)
            snap = buffers.take(1, worker.ready(targets))
            for data in snap.tables(worker.conformer(targets)).values():
                assert data.schema.equals(target.arrow_schema)  # real field ids, table order
                append_parquet(target.table, data)
                files += 1

        records, early_empty_lists = [], set()
        for batch, round_after in plan:
            values = [json.dumps(r).encode() for r in batch]
            out = worker.decode("db.t", target.arrow_schema, values, identifier_paths(target.table))
            assert out.converted.rejects == ()  # nothing here is a conflict: nothing is rejected
            assert out.converted.table.num_rows == len(batch)
            if out.proposal is not None:
                proposals.append(out.proposal)
            t = out.converted.table
            if "tags" not in t.column_names:  # an empty list adds no column (no element type yet)
                early_empty_lists.update(r["id"] for r in batch if r.get("tags") == [])
            offset += len(batch)
            buffers.add(Chunk(TP, offset, {"db.t": t}, t.nbytes, t.num_rows), offset - 1, None)
            records.extend(batch)
            if round_after:
                run_round()
        for _ in range(3):  # proposals sent at a round are applied before the next
            run_round()
        assert buffers.rows == 0 and files <= len(plan)  # every chunk written; evolution adds no file
        table = catalog.load_table("db.t")
        assert len(table.metadata.schemas) == 1 + schema_updates
        assert all(s.summary["added-data-files"] != "0" for s in table.snapshots())  # schema changes: no snapshot
        rows = {r["id"]: r for r in table.scan().to_arrow().to_pylist()}
        assert sorted(rows) == [r["id"] for r in records]
        for rec in records:
            got = rows[rec["id"]]
            for name, value in rec.items():
                if isinstance(value, dict):
                    for inner, v in value.items():
                        assert got[name][inner] == v, (rec, got)
                elif rec["id"] in early_empty_lists and name == "tags":
                    assert got.get(name) is None, (rec, got)  # [] before the column existed reads as null
                else:
                    assert got[name] == value, (rec, got)
            for name in got:  # fields the record lacks read as null
                if name not in rec:
                    assert got[name] is None, (rec, got)
