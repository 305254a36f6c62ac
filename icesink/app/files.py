"""The replica's file writing, Spark-backed: the composition root hands :func:`spark_files` to
:class:`agents.worker.Worker`, which never imports spark_bridge/ (agents/file_writer.py)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from agents.file_writer import FileWriting
from icesink.app.spark_session import hadoop_site_conf, spark_conf, spark_session
from icesink.shared.config import Settings
from spark_bridge.rewrite import rewrite_files
from spark_bridge.session import SparkSessionOwner
from spark_bridge.writer import SparkFileWriter

if TYPE_CHECKING:
    from pyiceberg.manifest import DataFile
    from pyiceberg.table import Table

__all__ = ["hadoop_site_conf", "spark_conf", "spark_files"]


def spark_files(settings: Settings, worker_id: str, session: SparkSessionOwner | None = None) -> FileWriting:
    """Replica ``worker_id``'s Spark file writer and compaction's rewrite with it; ``session``: its
    session if the caller made it already (:func:`icesink.app.spark_session.spark_session`, perhaps
    starting), else a new one, not started."""
    session = spark_session(settings, worker_id) if session is None else session
    writer = SparkFileWriter(session.settings, session)

    def rewrite(table: Table, data_files: Sequence[DataFile], delete_files: Sequence[DataFile] = (), *,
                file_prefix: str, target_file_size_bytes: int) -> list[DataFile]:
        return rewrite_files(writer, table, data_files, delete_files, file_prefix=file_prefix,
                             target_file_size_bytes=target_file_size_bytes)

    return FileWriting(writer, rewrite)
