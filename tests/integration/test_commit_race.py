"""Two coordinators commit the same accepted response to one table at the same instant (a
zombie coordinator and its successor). pyiceberg retries a conflicting commit by itself; the
older one must be fenced on that retry, and the files land once."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

pytestmark = pytest.mark.integration


def test_zombie_coordinator_racing_its_successor_is_fenced_not_duplicated(catalog_props):
    from pyiceberg.catalog import load_catalog
    from pyiceberg.io.pyarrow import parquet_file_to_data_file

    from coordinator.committer import RoundCommit, commit_table
    from coordinator.state import Accepted
    from icesink.shared.errors import FencedError
    from icesink.shared.protocol import OffsetRange, TopicPartition
    from icesink.shared.iceberg import local_path, to_file_info

    catalog = load_catalog("race", **catalog_props)
    catalog.create_namespace("db")
    table = catalog.create_table("db.t", schema=pa.schema([pa.field("id", pa.int64())]))
    path = f"{table.location()}/data/r1-w1-1.parquet"
    local_path(path).parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"id": pa.array(range(10), pa.int64())}), local_path(path))
    info = to_file_info(parquet_file_to_data_file(table.io, table.metadata, path), 0)
    tp = TopicPartition("src", 0)
    batch = [Accepted(7, "r1", "w1", (OffsetRange(tp, 0, 10),), {"db.t": (info,)}, None)]

    def commit(epoch: int, cat):  # type: ignore[no-untyped-def]
        return commit_table(cat, "db.t", batch, RoundCommit(group="g", epoch=epoch, commit_id="r1",
                            positions={tp: 10}, valid_through_ms=None))

    # The zombie (epoch 1) has checked its preconditions; before its first attempt reaches the
    # catalog, the successor (epoch 2) commits the same response.
    zombie_catalog = load_catalog("race", **catalog_props)
    real_load = zombie_catalog.load_table
    hooked = []

    def load_and_race(name):  # type: ignore[no-untyped-def]
        t = real_load(name)
        do_commit = t._do_commit

        def racing_commit(*args, **kwargs):  # type: ignore[no-untyped-def]
            if not hooked:
                hooked.append(commit(2, load_catalog("race", **catalog_props)))
            return do_commit(*args, **kwargs)

        t._do_commit = racing_commit
        return t

    zombie_catalog.load_table = load_and_race
    with pytest.raises(FencedError, match="epoch"):
        commit(1, zombie_catalog)
    assert hooked and hooked[0].snapshot_id is not None
    table = catalog.load_table("db.t")
    assert int(table.current_snapshot().summary["total-records"]) == 10
    assert len(table.snapshots()) == 1

    # Same epoch, later watermark moved (a restarted coordinator re-planning): nothing twice.
    again = commit(2, catalog)
    assert again.snapshot_id is None and len(catalog.load_table("db.t").snapshots()) == 1
