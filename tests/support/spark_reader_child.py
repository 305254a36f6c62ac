"""The reader's own process (tests/support/spark_reader.py starts it): run by the Python of the
reader's environment (pyspark 4.1 and pyarrow, nothing of icesink), one Spark session for the
whole test session.

Requests come as JSON lines on stdin; each answer is one JSON line on the original stdout
(``{"id": n, "path": FILE}`` with the result as an Arrow IPC file, or ``{"id": n, "error":
TEXT}``). Everything else this process or its JVM prints goes to stderr (fd 1 is pointed at it
before the JVM starts), so nothing can garble an answer. A request names its catalog by the Spark
conf of one Iceberg catalog (``spark.sql.catalog.NAME...``); each distinct catalog gets a session
of its own (``newSession``: same JVM and SparkContext, own conf and catalog manager), since
Iceberg's JdbcCatalog keys its rows by the Spark catalog's name and tests reuse one name for
different catalogs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from typing import Any


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jars", required=True, help="comma-separated jars for spark.jars")
    parser.add_argument("--dir", required=True, help="where result files go")
    args = parser.parse_args()
    answers = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # the JVM and pyspark print to stderr from now on
    sys.stdout = sys.stderr

    began = time.monotonic()
    from pyspark.sql import SparkSession

    base = (
        SparkSession.builder.master("local[1]")
        .appName("icesink-tests-spark-reader")
        .config("spark.jars", args.jars)
        .config("spark.driver.memory", "1g")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "1")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    base.sparkContext.setLogLevel("WARN")
    answers.write(json.dumps({"ready": round(time.monotonic() - began, 2), "spark": base.version}) + "\n")

    sessions: dict[str, Any] = {}
    count = 0
    for line in sys.stdin:
        if not line.strip():
            continue
        request = json.loads(line)
        count += 1
        try:
            key = json.dumps(request["catalog"], sort_keys=True)
            session = sessions.get(key)
            if session is None:
                session = base.newSession()
                for k, v in request["catalog"].items():
                    session.conf.set(k, v)
                sessions[key] = session
            if "sql" in request:
                frame = session.sql(request["sql"])
            else:
                reader = session.read
                if request.get("snapshot_id") is not None:
                    reader = reader.option("versionAsOf", str(request["snapshot_id"]))
                frame = reader.table(request["table"])
                if request.get("group_by"):
                    frame = frame.groupBy(*request["group_by"]).count()
            path = os.path.join(args.dir, f"result-{count}.arrow")
            import pyarrow as pa

            result = frame.toArrow()
            with pa.OSFile(path, "wb") as sink, pa.ipc.new_file(sink, result.schema) as writer:
                writer.write_table(result)
            answers.write(json.dumps({"id": request["id"], "path": path}) + "\n")
        except Exception as exc:  # noqa: BLE001 - every failure goes back to the test that asked
            text = "".join(traceback.format_exception_only(type(exc), exc)).strip()
            answers.write(json.dumps({"id": request["id"], "error": text[:4000]}) + "\n")
    base.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
