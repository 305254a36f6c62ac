"""DuckDB as an independent reader of Iceberg tables (tests, chaos runs), loaded from the installed wheels only.

The ``duckdb-extension-{iceberg,avro,parquet,httpfs}`` wheels ship ``.duckdb_extension`` files;
this module loads those by path and switches off every kind of extension download, so tests never
touch the network. Parquet is usually compiled into DuckDB already; it is then left as is. Tables
on S3 are read with httpfs and a secret built from the table's pyiceberg S3 properties.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlparse

import duckdb

__all__ = ["connect", "count_and_distinct", "extension_path", "plain_path", "scan_rows", "snapshots"]

#: Load order matters: iceberg reads Avro manifests and Parquet data files.
_EXTENSIONS = ("parquet", "avro", "iceberg")


def extension_path(name: str) -> Path:
    """The ``.duckdb_extension`` file of wheel ``duckdb-extension-<name>`` for this DuckDB."""
    module = f"duckdb_extension_{name}"
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"extension {name!r}: expected the wheel duckdb-extension-{name} to be installed, "
            f"found no module {module}"
        )
    root = Path(next(iter(spec.submodule_search_locations)))
    wanted = root / "extensions" / f"v{duckdb.__version__}" / f"{name}.duckdb_extension"
    if wanted.is_file():
        return wanted
    found = sorted(root.glob(f"extensions/*/{name}.duckdb_extension"))
    raise FileNotFoundError(
        f"extension {name!r}: expected {wanted} (DuckDB {duckdb.__version__}), "
        f"found {[str(p) for p in found]}; install duckdb-extension-{name}=={duckdb.__version__}"
    )


def connect(io_props: Mapping[str, str] | None = None) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB connection with iceberg, avro and parquet loaded from the wheels.
    ``io_props`` (a table's ``io.properties``) with ``s3.*`` keys also load httpfs and make an
    S3 secret from them, so ``s3://`` tables can be read."""
    con = duckdb.connect(
        config={
            "allow_unsigned_extensions": True,
            "autoinstall_known_extensions": False,
            "autoload_known_extensions": False,
        }
    )
    try:
        s3 = {k: v for k, v in (io_props or {}).items() if k.startswith("s3.")}
        for name in (*_EXTENSIONS, "httpfs") if s3 else _EXTENSIONS:
            row = con.execute(
                "SELECT loaded FROM duckdb_extensions() WHERE extension_name = ?", [name]
            ).fetchone()
            if row is not None and row[0]:
                continue
            path = str(extension_path(name)).replace("'", "''")
            con.execute(f"LOAD '{path}'")
        if s3:
            con.execute(_s3_secret_sql(s3))
    except BaseException:
        con.close()
        raise
    return con


def _s3_secret_sql(props: Mapping[str, str]) -> str:
    """CREATE SECRET from pyiceberg's s3.* properties (endpoint, keys, region, path style)."""
    def lit(v: str) -> str:
        return "'" + v.replace("'", "''") + "'"

    parts = ["TYPE s3"]
    if key := props.get("s3.access-key-id"):
        parts.append(f"KEY_ID {lit(key)}")
    if secret := props.get("s3.secret-access-key"):
        parts.append(f"SECRET {lit(secret)}")
    parts.append(f"REGION {lit(props.get('s3.region', 'us-east-1'))}")
    if endpoint := props.get("s3.endpoint"):
        url = urlparse(endpoint)
        parts.append(f"ENDPOINT {lit(url.netloc or url.path)}")
        parts.append(f"USE_SSL {'true' if url.scheme == 'https' else 'false'}")
    if props.get("s3.path-style-access", "").lower() == "true":
        parts.append("URL_STYLE 'path'")
    return f"CREATE SECRET icesink_s3 ({', '.join(parts)})"


def plain_path(metadata_location: str) -> str:
    """``file:///x/y`` -> ``/x/y``; other locations unchanged."""
    if metadata_location.startswith("file://"):
        return metadata_location[len("file://") :]
    return metadata_location


def _quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _records(con: duckdb.DuckDBPyConnection, sql: str, params: list[Any]) -> list[dict[str, Any]]:
    cursor = con.execute(sql, params)
    columns = [d[0] for d in cursor.description or []]
    return [dict(zip(columns, row, strict=True)) for row in cursor.fetchall()]


def scan_rows(metadata_location: str, io_props: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    """Every row of the table's current snapshot (in no particular order)."""
    with connect(io_props) as con:
        return _records(con, "SELECT * FROM iceberg_scan(?)", [plain_path(metadata_location)])


def count_and_distinct(
    metadata_location: str, key: str, io_props: Mapping[str, str] | None = None
) -> tuple[int, int]:
    """(row count, distinct values of column ``key``) of the current snapshot."""
    with connect(io_props) as con:
        row = con.execute(
            f"SELECT count(*), count(DISTINCT {_quote_ident(key)}) FROM iceberg_scan(?)",
            [plain_path(metadata_location)],
        ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def snapshots(metadata_location: str, io_props: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    """The table's snapshots, oldest first (sequence_number, snapshot_id, timestamp_ms, ...)."""
    with connect(io_props) as con:
        return _records(
            con,
            "SELECT * FROM iceberg_snapshots(?) ORDER BY sequence_number",
            [plain_path(metadata_location)],
        )
