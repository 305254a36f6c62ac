"""The replica's file writing, Spark-backed: the composition root hands :func:`spark_files` to
:class:`agents.worker.Worker`, which never imports spark_bridge/ (agents/file_writer.py)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from agents.file_writer import FileWriting
from icesink.shared.config import Settings
from spark_bridge.rewrite import rewrite_files
from spark_bridge.session import SparkSettings
from spark_bridge.writer import SparkFileWriter

if TYPE_CHECKING:
    from pyiceberg.manifest import DataFile
    from pyiceberg.table import Table

__all__ = ["spark_files"]


def spark_files(settings: Settings, worker_id: str) -> FileWriting:
    """Replica ``worker_id``'s Spark file writer (not started) and compaction's rewrite with it."""
    writer = SparkFileWriter(SparkSettings(
        master=settings.spark_master,
        remote=settings.spark_remote,
        conf=dict(settings.spark_conf),
        app_name=f"icesink-{worker_id}",
        stage=settings.write_staging,
        staging_dir=str(settings.state_dir / "staging" / worker_id),
        warm_up_rows=settings.write_warm_up_rows,
        class_archive=settings.write_class_archive,
    ))

    def rewrite(table: Table, data_files: Sequence[DataFile], delete_files: Sequence[DataFile] = (), *,
                file_prefix: str, target_file_size_bytes: int) -> list[DataFile]:
        return rewrite_files(writer, table, data_files, delete_files, file_prefix=file_prefix,
                             target_file_size_bytes=target_file_size_bytes)

    return FileWriting(writer, rewrite)
