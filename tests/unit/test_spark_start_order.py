"""A worker launches its Spark JVM, then asks to join its group, before its heavy imports (issue 42
target 1).

The JVM's start (seconds) runs in a thread of its own beside the worker's imports and set-up
(icesink/app/cli.py). It used to begin only after ``spark_bridge.session`` was imported, which
imported ``spark_bridge.files`` and with it pyiceberg's pyarrow IO, ``pyarrow.dataset`` and pandas:
about 0.5 s of a 2-core machine's start-up before the JVM was asked for (bench/README.md, "The JVM
asked for before the heavy imports"). The group join, in turn, waited for every import (pyiceberg's
catalogs, SQLAlchemy, pandas, the converters: about 1.5 s there); those are now imported while the
broker answers the join (agents/assembly.py; bench/README.md, "The group join asked for before the
heavy imports"). Run in a fresh interpreter: ``sys.modules`` shows what had been imported when each
was asked for. The control topic's clients are stubbed (no broker here); the rest is the worker's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("pyiceberg.io.pyarrow", "pyiceberg.catalog", "pyarrow.dataset", "pyarrow.parquet", "pandas", "sqlalchemy",
         "spark_bridge.writer", "agents.assembly")


def test_the_worker_asks_for_its_spark_session_and_its_group_join_before_its_heavy_imports(tmp_path):
    config = tmp_path / "worker.json"
    config.write_text(json.dumps({
        "topics": "t", "iceberg.tables": "db.t", "state.dir": str(tmp_path / "var"),
        "iceberg.catalog.type": "sql", "iceberg.catalog.uri": f"sqlite:///{tmp_path}/catalog.db",
        "iceberg.catalog.warehouse": str(tmp_path / "wh"), "bootstrap.servers": "127.0.0.1:9",
        "metrics.port": 0,
    }))
    script = textwrap.dedent(f"""
        import json, os, sys
        from spark_bridge import session

        seen = {{}}

        def heavy():
            return sorted(m for m in {HEAVY!r} if m in sys.modules)

        def start_soon(self, before=None):
            import pyspark.sql  # what the real start_soon imports first
            seen["at_spark"] = heavy()
            seen["app_name"] = self.settings.app_name
            seen["session"] = self

        session.SparkSessionOwner.start_soon = start_soon

        from agents import worker
        from agents.faust_app import FaustApp
        from icesink.shared import control

        async def nothing(*args, **kwargs):
            return None

        worker.ensure_control_topic = nothing
        control.ControlProducer.start = control.ControlReader.start = control.ControlReader.seek_to_end = nothing
        worker.holds_joins = lambda consumer: False

        async def join(self):
            seen["at_join"] = heavy()

        FaustApp.start = join
        build_parts = worker.Worker.build_parts

        def built(self):
            seen["built_after_join"] = "at_join" in seen
            build_parts(self)
            seen["handed_over"] = self.spark.session is seen["session"]
            print(json.dumps({{k: v for k, v in seen.items() if k != "session"}}))
            sys.stdout.flush()
            os._exit(0)

        worker.Worker.build_parts = built
        from icesink.app import cli
        cli.main(["worker", "--config", {str(config)!r}])
    """)
    env = {k: v for k, v in os.environ.items() if not k.startswith("ICESINK_")}  # the config file alone
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=ROOT,
                         env=env)
    assert run.returncode == 0, run.stderr[-2000:]
    seen = json.loads(run.stdout.strip().splitlines()[-1])
    assert seen["app_name"].startswith("icesink-")  # the worker's own session, asked for
    assert seen["at_spark"] == [], f"imported before the Spark session was asked for: {seen['at_spark']}"
    assert seen["at_join"] == [], f"imported before the group join was asked for: {seen['at_join']}"
    assert seen["built_after_join"], "the parts must be built once the join is asked for, not before"
    assert seen["handed_over"], "the writer must write with the session asked for first, not a new one"
