"""Where Spark's files go: on this machine or in an object store, and the scheme Hadoop knows it by.

Plain functions of a URI, apart from spark_bridge/files.py so that spark_bridge/session.py,
which a worker imports to ask for its JVM before its other imports (icesink/app/cli.py), does
not import pyiceberg's pyarrow IO, ``pyarrow.dataset`` and pandas with files.py (about 0.5 s of a
2-core machine's start-up: bench/README.md, "The JVM asked for before the heavy imports").
"""

from __future__ import annotations

__all__ = ["is_local", "spark_uri"]


def is_local(uri: str) -> bool:
    """A path on this machine's filesystem (plain path or file://), not an object store."""
    scheme = uri.split("://", 1)[0] if "://" in uri else ""
    return scheme in ("", "file")


def spark_uri(uri: str) -> str:
    """Hadoop's S3 connector is s3a; Iceberg's files keep their s3:// URIs."""
    if uri.startswith("s3://"):
        return "s3a://" + uri[len("s3://") :]
    return uri
