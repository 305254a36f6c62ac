"""Tables changed by other writers, at the coordinator's commit (coordinator/committer.py) on a
real SQLite catalog with real Parquet files, read back by DuckDB and pyiceberg:

- partition values of decimal, binary, fixed and uuid columns travel through the control
  event (JSON) and are committed exactly;
- a spec changed by another writer after the files were written: they are committed under
  the spec they were written with, never relabelled with the new one;
- a dropped table, or one recreated with other partitioning: a clear TableChangedError.
"""

from __future__ import annotations

import uuid
from decimal import Decimal

import pyarrow as pa
import pytest

pytestmark = pytest.mark.integration

GROUP = "tc"


def _schema():
    from pyiceberg.schema import Schema
    from pyiceberg.types import BinaryType, DecimalType, FixedType, LongType, NestedField, UUIDType

    return Schema(
        NestedField(1, "id", LongType(), required=True),
        NestedField(2, "dec", DecimalType(10, 2)),
        NestedField(3, "bin", BinaryType()),
        NestedField(4, "fx", FixedType(4)),
        NestedField(5, "u", UUIDType()),
    )


ROWS = [
    {"id": 1, "dec": Decimal("12.34"), "bin": b"\x00\x01\x02", "fx": b"\x00\x01\x02\x03",
     "u": uuid.UUID("0f8fad5b-d9cb-469f-a165-70867728950e")},
    {"id": 2, "dec": Decimal("-9999.99"), "bin": b"", "fx": b"\xff" * 4,
     "u": uuid.UUID("7c9e6679-7425-40de-944b-e07fc1f90ae7")},
    {"id": 3, "dec": None, "bin": None, "fx": None, "u": None},
]
# One decimal partition field per table: DuckDB 1.5 aborts reading a manifest whose partition
# struct has two fields of one decimal type ("Cannot save fixed schema").
SPEC = "dec, bin, bucket(bin, 4), truncate(bin, 2), fx, bucket(fx, 4), u, bucket(u, 4)"


def _arrow(table, rows):
    from pyiceberg.io.pyarrow import schema_to_pyarrow

    arrow_schema = schema_to_pyarrow(table.schema())
    cols = {f.name: [r[f.name] for r in rows] for f in arrow_schema}
    cols["u"] = [None if v is None else v.bytes for v in cols["u"]]
    return pa.Table.from_pydict(cols, schema=arrow_schema)


def _file_infos(table, rows):
    """Parquet files of ``rows`` written for the table's current spec, as a worker reports
    them: FileInfo, through the control event's JSON encoding and back."""
    from icesink.shared import protocol
    from icesink.shared.iceberg import to_file_info
    from spark_bridge.session import SparkSettings
    from spark_bridge.writer import SparkFileWriter

    # uuid and fixed columns: the worker's writer writes the table with pyarrow (no Spark session)
    writer = SparkFileWriter(SparkSettings(master="local[1]"))
    files = writer.write(table, _arrow(table, rows), file_prefix=f"p{uuid.uuid4().hex[:8]}")
    ev = protocol.DataWritten("c1", "r1", "w1", ".".join(table.name()),
                            tuple(to_file_info(f, table.metadata.default_spec_id) for f in files))
    decoded = protocol.decode(protocol.encode(ev))
    assert decoded == ev
    return decoded.files


def _commit(catalog, name, infos, offset=10):
    from coordinator.committer import RoundCommit, commit_table
    from coordinator.state import Accepted

    accepted = Accepted(offset, "c1", "w1", (), {name: tuple(infos)}, None)
    return commit_table(catalog, name, [accepted], RoundCommit(group=GROUP, epoch=1, commit_id=f"c{offset}",
                        positions={}, valid_through_ms=None))


def _duck_rows(table):
    from tests.support import duck

    con = duck.connect()
    return con.execute(
        "SELECT id, CAST(dec AS VARCHAR), bin, fx, CAST(u AS VARCHAR) "
        f"FROM iceberg_scan('{duck.plain_path(table.metadata_location)}') ORDER BY id"
    ).fetchall()


def _expected(rows):
    return [(r["id"], None if r["dec"] is None else str(r["dec"]), r["bin"], r["fx"],
             None if r["u"] is None else str(r["u"])) for r in rows]


@pytest.fixture
def catalog(catalog_props):
    from pyiceberg.catalog import load_catalog

    cat = load_catalog("it", **catalog_props)
    cat.create_namespace("tc")
    return cat


def _create(catalog, name, spec_text=SPEC):
    from icesink.shared.partitioning import build_partition_spec, parse_partition_by

    schema = _schema()
    return catalog.create_table(name, schema=schema,
                                partition_spec=build_partition_spec(parse_partition_by(spec_text), schema))


def _pruned_ids(table, column, value):
    from pyiceberg.expressions import EqualTo, IsNull

    flt = IsNull(column) if value is None else EqualTo(column, value)
    return sorted(table.scan(row_filter=flt, selected_fields=("id",)).to_arrow()["id"].to_pylist())


def test_decimal_binary_fixed_uuid_partitions_commit_exactly(catalog):
    table = _create(catalog, "tc.types")
    infos = _file_infos(table, ROWS)
    assert {type(v) for f in infos for v in f.partition} <= {int, str, type(None)}  # JSON scalars
    _commit(catalog, "tc.types", infos)
    table = catalog.load_table("tc.types")
    assert _duck_rows(table) == _expected(ROWS)
    # partition values as Iceberg holds them: pruning by each partitioned column finds its row
    for r in ROWS:
        assert _pruned_ids(table, "dec", r["dec"]) == [r["id"]]
        assert _pruned_ids(table, "bin", r["bin"]) == [r["id"]]
    parts = [tuple(e.data_file.partition) for m in table.current_snapshot().manifests(table.io)
             for e in m.fetch_manifest_entry(table.io)]
    # dec, bin, bin_bucket, bin_trunc, fx, fx_bucket, u, u_bucket, as Iceberg holds them
    assert sorted(((p[0], p[1], p[3], p[4], p[6]) for p in parts), key=repr) == sorted([
        (Decimal("12.34"), b"\x00\x01\x02", b"\x00\x01", b"\x00\x01\x02\x03", ROWS[0]["u"]),
        (Decimal("-9999.99"), b"", b"", b"\xff" * 4, ROWS[1]["u"]),
        (None, None, None, None, None),
    ], key=repr)


def test_files_of_an_old_spec_are_committed_under_it_after_another_writer_changes_the_spec(catalog):
    from pyiceberg.transforms import BucketTransform

    table = _create(catalog, "tc.respec", "truncate(dec, 100), bin")
    old = _file_infos(table, ROWS[:2])  # written for spec 0, not committed yet
    with table.update_spec() as update:  # another writer re-specs the table meanwhile
        update.add_field("id", BucketTransform(4), "id_bucket")
    table = catalog.load_table("tc.respec")
    assert table.metadata.default_spec_id == 1
    new = _file_infos(table, ROWS[2:])  # a later write sees the new spec
    _commit(catalog, "tc.respec", [*old, *new])
    table = catalog.load_table("tc.respec")
    by_spec: dict[int, list] = {}
    for manifest in table.current_snapshot().manifests(table.io):
        for entry in manifest.fetch_manifest_entry(table.io):
            by_spec.setdefault(manifest.partition_spec_id, []).append(entry.data_file.partition)
    assert sorted(len(p) for p in by_spec[0]) == [2, 2] and [len(p) for p in by_spec[1]] == [3]
    assert sorted((p[0], p[1]) for p in by_spec[0]) == [(Decimal("-10000.00"), b""), (Decimal("12.00"), b"\x00\x01\x02")]
    assert _duck_rows(table) == _expected(ROWS)
    for r in ROWS:
        assert _pruned_ids(table, "dec", r["dec"]) == [r["id"]]
    assert int(table.current_snapshot().summary["total-records"]) == len(ROWS)


def test_a_dropped_or_recreated_table_fails_the_commit_clearly(catalog):
    from icesink.shared.errors import TableChangedError

    table = _create(catalog, "tc.gone", "dec, bin")
    infos = _file_infos(table, ROWS)
    catalog.drop_table("tc.gone")
    with pytest.raises(TableChangedError, match=r"tc\.gone: expected it in catalog it, found none.*dropped"):
        _commit(catalog, "tc.gone", infos)
    _create(catalog, "tc.gone", "bucket(id, 4)")  # recreated with other partitioning, spec id 0 again
    with pytest.raises(TableChangedError, match=r"expected 1 partition values for spec id 0.*found 2"):
        _commit(catalog, "tc.gone", infos)
    assert catalog.load_table("tc.gone").current_snapshot() is None  # nothing was committed
