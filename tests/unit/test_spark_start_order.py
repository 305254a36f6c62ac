"""A worker launches its Spark JVM before its heavy imports (issue 42 target 1).

The JVM's start (seconds) runs in a thread of its own beside the worker's imports and set-up
(icesink/app/cli.py). It used to begin only after ``spark_bridge.session`` was imported, which
imported ``spark_bridge.files`` and with it pyiceberg's pyarrow IO, ``pyarrow.dataset`` and pandas:
about 0.5 s of a 2-core machine's start-up before the JVM was asked for (bench/README.md, "The JVM
asked for before the heavy imports"). Run in a fresh interpreter: ``sys.modules`` shows what had
been imported when the start was asked for.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("pyiceberg.io.pyarrow", "pyarrow.dataset", "pyarrow.parquet", "pandas", "sqlalchemy", "spark_bridge.writer")


def test_the_worker_asks_for_its_spark_session_before_importing_pyiceberg_pyarrow_io_and_pandas(tmp_path):
    config = tmp_path / "worker.json"
    config.write_text(json.dumps({
        "topics": "t", "iceberg.tables": "db.t", "state.dir": str(tmp_path / "var"),
        "iceberg.catalog.type": "sql", "iceberg.catalog.uri": f"sqlite:///{tmp_path}/catalog.db",
        "iceberg.catalog.warehouse": str(tmp_path / "wh"),
    }))
    script = textwrap.dedent(f"""
        import json, sys
        from spark_bridge import session

        def start_soon(self, before=None):
            import pyspark.sql  # what the real start_soon imports first
            loaded = sorted(m for m in {HEAVY!r} if m in sys.modules)
            from icesink.app import files  # the worker's next step: its writer around this session
            made = files.spark_files

            def spark_files(settings, worker_id, session=None):
                writing = made(settings, worker_id, session)
                print(json.dumps({{"loaded": loaded, "app_name": self.settings.app_name,
                                  "handed_over": writing.writer.session is self}}))
                sys.stdout.flush()
                raise SystemExit(0)

            files.spark_files = spark_files

        session.SparkSessionOwner.start_soon = start_soon
        from icesink.app import cli
        cli.main(["worker", "--config", {str(config)!r}])
    """)
    env = {k: v for k, v in os.environ.items() if not k.startswith("ICESINK_")}  # the config file alone
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=ROOT,
                         env=env)
    assert run.returncode == 0, run.stderr[-2000:]
    seen = json.loads(run.stdout.strip().splitlines()[-1])
    assert seen["app_name"].startswith("icesink-")  # the worker's own session, asked for
    assert seen["loaded"] == [], f"imported before the Spark session was asked for: {seen['loaded']}"
    assert seen["handed_over"], "the writer must write with the session asked for first, not a new one"
