"""The replica's file writing, Spark-backed: the composition root hands :func:`spark_files` to
:class:`agents.worker.Worker`, which never imports spark_bridge/ (agents/file_writer.py)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from agents.file_writer import FileWriting
from icesink.shared.config import Settings
from icesink.shared.errors import ConfigError
from icesink.shared.reference_keys import hadoop_spark_conf
from spark_bridge.rewrite import rewrite_files
from spark_bridge.session import SparkSettings
from spark_bridge.writer import SparkFileWriter

if TYPE_CHECKING:
    from pyiceberg.manifest import DataFile
    from pyiceberg.table import Table

__all__ = ["hadoop_site_conf", "spark_conf", "spark_files"]


def spark_conf(settings: Settings) -> dict[str, str]:
    """Spark's conf: Hadoop's from iceberg.hadoop-conf-dir's files, then iceberg.hadoop.* (as the
    reference: sink config over the directory), then the spark.* keys, which win."""
    site = {} if settings.hadoop_conf_dir is None else hadoop_site_conf(settings.hadoop_conf_dir)
    return {**hadoop_spark_conf(site), **hadoop_spark_conf(settings.hadoop_props), **settings.spark_conf}


#: The files of iceberg.hadoop-conf-dir the reference loads (Iceberg's CatalogUtils.loadHadoopConfig).
SITE_FILES = ("core-site.xml", "hdfs-site.xml", "hive-site.xml")


def hadoop_site_conf(directory: str) -> dict[str, str]:
    """The properties of a Hadoop conf directory's site files, later files winning."""
    import xml.etree.ElementTree as ET

    root = Path(directory)
    if not root.is_dir():
        raise ConfigError("iceberg.hadoop-conf-dir", directory, "a directory holding Hadoop's *-site.xml files")
    out: dict[str, str] = {}
    for name in SITE_FILES:
        path = root / name
        if not path.is_file():
            continue
        try:
            doc = ET.parse(path)
        except ET.ParseError as exc:
            raise ConfigError("iceberg.hadoop-conf-dir", str(path), f"Hadoop configuration XML ({exc})") from None
        for prop in doc.getroot().iter("property"):
            key, value = prop.findtext("name"), prop.findtext("value")
            if key:
                out[key.strip()] = (value or "").strip()
    return out


def spark_files(settings: Settings, worker_id: str) -> FileWriting:
    """Replica ``worker_id``'s Spark file writer (not started) and compaction's rewrite with it."""
    writer = SparkFileWriter(SparkSettings(
        master=settings.spark_master,
        remote=settings.spark_remote,
        conf=spark_conf(settings),
        write_props=dict(settings.write_props),
        app_name=f"icesink-{worker_id}",
        stage=settings.write_staging,
        staging_dir=str(settings.state_dir / "staging" / worker_id),
        warm_up_rows=settings.write_warm_up_rows,
        warm_up_files=settings.write_warm_up_files,
        class_archive=settings.write_class_archive,
    ))

    def rewrite(table: Table, data_files: Sequence[DataFile], delete_files: Sequence[DataFile] = (), *,
                file_prefix: str, target_file_size_bytes: int) -> list[DataFile]:
        return rewrite_files(writer, table, data_files, delete_files, file_prefix=file_prefix,
                             target_file_size_bytes=target_file_size_bytes)

    return FileWriting(writer, rewrite)
