"""Start failures as one line: the no-permission line by the setting the path belongs to, and the
cause a connect task's trace begins with: icesink's last ERROR line in a replica's log
(icesink.app.start_failures.cause_in_log), whatever Spark and the JVM printed around it."""

from __future__ import annotations

import json

from icesink.app.start_failures import cause_in_log

NOISE = """Using Spark's default log4j profile: org/apache/spark/log4j2-defaults.properties
Setting default log level to "WARN".
To adjust logging level use sc.setLogLevel(newLevel). For SparkR, use setLogLevel(newLevel).
26/11/29 13:45:41 WARN NativeCodeLoader: Unable to load native-hadoop library for your platform
"""


def test_the_last_icesink_error_line_of_a_text_log_is_the_cause():
    log = (NOISE + "2026-11-29 13:45:42,001 INFO    icesink.app.cli: settings given: {...}\n"
           "2026-11-29 13:45:43,002 ERROR   aiokafka.conn: Unable connect to node\n"
           "2026-11-29 13:45:44,003 ERROR   icesink: cannot reach the catalog 'it' at iceberg.catalog.uri=sqlite:///x: "
           "unable to open database file\n" + NOISE)
    assert cause_in_log(log) == "cannot reach the catalog 'it' at iceberg.catalog.uri=sqlite:///x: unable to open database file"


def test_a_json_log_gives_its_error_message():
    lines = [json.dumps({"time": "t", "level": "INFO", "logger": "icesink.app.cli", "message": "start"}),
             json.dumps({"time": "t", "level": "ERROR", "logger": "icesink", "message": "no permission to use /w"})]
    assert cause_in_log(NOISE + "\n".join(lines) + "\n{not json") == "no permission to use /w"


def test_a_log_without_an_icesink_error_has_no_cause():
    assert cause_in_log(NOISE + "2026-11-29 13:45:43,002 ERROR   aiokafka.conn: Unable connect\n") is None


def test_no_permission_on_a_catalogs_file_names_the_catalog_key_not_state_dir():
    from icesink.app.start_failures import describe

    err = PermissionError(13, "Permission denied", "/srv/cat/catalog.db-journal")
    line = describe(err, bootstrap="b:9092", catalog="it", catalog_uri="sqlite:////srv/cat/catalog.db?timeout=30",
                    catalog_warehouse="file:///srv/wh")
    assert line == ("no permission to use /srv/cat/catalog.db-journal of the catalog 'it' (iceberg.catalog.uri="
                    "sqlite:////srv/cat/catalog.db?timeout=30): Permission denied; let this user write it, or set "
                    "iceberg.catalog.uri to a place it may")
    err = PermissionError(13, "Permission denied", "/srv/wh/db/t/data")
    assert "(iceberg.catalog.warehouse=file:///srv/wh)" in describe(
        err, bootstrap="b", catalog="it", catalog_uri="http://rest:8181", catalog_warehouse="file:///srv/wh")
    err = PermissionError(13, "Permission denied", "/var/lib/icesink/broker.json")
    assert describe(err, bootstrap="b", catalog="it", catalog_uri="sqlite:////srv/cat/catalog.db").endswith(
        "(run as a user that may, or change state.dir)")
