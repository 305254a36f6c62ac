"""A worker's Spark session, made from its settings with light imports only: icesink/app/cli.py
asks for the session's JVM with it before importing the rest of the worker (pyiceberg, pandas,
the writer: about 0.5 s of a 2-core machine's start-up; bench/README.md, "The JVM asked for before the
heavy imports"). Its file writing around that session: icesink/app/files.py."""

from __future__ import annotations

from pathlib import Path

from icesink.shared.config import Settings
from icesink.shared.errors import ConfigError
from icesink.shared.reference_keys import hadoop_spark_conf
from spark_bridge.session import SparkSessionOwner, SparkSettings

__all__ = ["SITE_FILES", "hadoop_site_conf", "spark_conf", "spark_session"]


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


def spark_session(settings: Settings, worker_id: str) -> SparkSessionOwner:
    """Replica ``worker_id``'s Spark session (not started)."""
    return SparkSessionOwner(SparkSettings(
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
