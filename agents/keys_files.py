"""A mirror table's keys file: the key columns of the keys whose committed rows a worker
response replaces or deletes (docs/mirror-tables.md), one small Parquet file per table and
response, written by pyarrow beside the data files and named in the response's
``DataWritten.deleted_keys``. The coordinator turns them into position deletes and deletes
the file once the round is committed; it is never part of a snapshot. Blocking: call through
Offload."""

from __future__ import annotations

import uuid

import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.table import Table

from icesink.shared.protocol import FileInfo

__all__ = ["write_keys_file"]


def write_keys_file(table: Table, keys: pa.Table, file_prefix: str) -> FileInfo:
    """Write ``keys`` under ``table``'s data location; its description for ``deleted_keys``."""
    path = table.location_provider().new_data_location(f"{file_prefix}-keys-{uuid.uuid4().hex[:12]}.parquet")
    with table.io.new_output(path).create() as stream:
        pq.write_table(keys, stream)
    size = len(table.io.new_input(path))
    return FileInfo(path=path, record_count=keys.num_rows, size_bytes=size, spec_id=table.metadata.default_spec_id)
