"""What the worker writes data files with and compaction rewrites them with: small Protocols
the composition root (icesink/app/files.py) fills with the Spark-backed parts
(spark_bridge/writer.py, spark_bridge/rewrite.py), so agents/ never imports spark_bridge/
(tests/unit/test_layout.py) and loads no pyspark of its own.

Every call here is blocking: the worker runs them off the event loop (icesink/shared/offload.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import pyarrow as pa
    from pyiceberg.manifest import DataFile
    from pyiceberg.table import Table

    from icesink.shared.config import Settings

__all__ = ["FileWriter", "FileWriting", "FileWritingFactory", "RewriteFiles"]


class FileWriter(Protocol):
    """One replica's long-lived file writer (``spark_bridge.writer.SparkFileWriter``)."""

    def start(self) -> None:
        """Start the engine (seconds for a local Spark session), or wait for the start the process's
        entry point began before its imports (icesink/app/cli.py), raising what it raised."""

    def warm_up(self, idle: Callable[[], bool]) -> None:
        """Throw-away writes that warm the engine up; :meth:`stop` ends them, and ``idle()``
        False (rows wait for a real write, or one runs) skips or ends them."""

    def stop(self) -> None: ...

    def write_many(
        self, writes: Sequence[tuple[Table, pa.Table, str]], *, target_file_size_bytes: int,
    ) -> list[list[DataFile]]:
        """The DataFiles of each ``(table, rows, file prefix)``, in order; on failure none stay."""
        ...


class RewriteFiles(Protocol):
    """Compaction's rewrite (``spark_bridge.rewrite.rewrite_files`` bound to the replica's writer):
    the live rows of ``data_files`` (``delete_files`` applied) as new files of the target size."""

    def __call__(
        self, table: Table, data_files: Sequence[DataFile], delete_files: Sequence[DataFile] = (), *,
        file_prefix: str, target_file_size_bytes: int,
    ) -> list[DataFile]: ...


@dataclass(frozen=True)
class FileWriting:
    """A replica's writer and the rewrite that uses it."""

    writer: FileWriter
    rewrite: RewriteFiles


class FileWritingFactory(Protocol):
    """Makes a replica's :class:`FileWriting` once its id is known (it names the writer's
    scratch directories and Spark application)."""

    def __call__(self, settings: Settings, worker_id: str) -> FileWriting: ...
