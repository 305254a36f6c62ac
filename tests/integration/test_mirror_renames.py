"""Mirror tables whose key and operation fields are renamed by ReplaceField (issue 39 point 3), in a
real worker (Tansu, Faust, Spark, a SQL catalog): ``iceberg.table.<t>.id-columns`` and
``iceberg.tables.cdc-field`` name the columns as the transforms leave them (the reference applies
its keys to the sink record, after every SMT), and the table mirrors the changes exactly."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest

from tests.integration.test_mirror import _produce

pytestmark = pytest.mark.integration

RENAME = {"transforms": "names", "transforms.names.type": "org.apache.kafka.connect.transforms.ReplaceField$Value",
          "transforms.names.renames": "pk:id,kind:op,val:v"}


def test_renamed_key_and_operation_fields_mirror_the_changes_exactly(broker, catalog_props, tmp_path):
    from pyiceberg.catalog import load_catalog

    from icesink.app.replicas import ReplicaSet
    from icesink.shared.kafka_admin import ensure_topic
    from tests.support import duck
    from tests.support.sinkrun import write_config

    topic, table = "mirror-renamed", "mirror.renamed"
    asyncio.run(ensure_topic(broker.bootstrap, topic, 1))
    changes = [{"pk": 1, "val": "a", "kind": "c"}, {"pk": 2, "val": "b", "kind": "c"}, {"pk": 3, "val": "c", "kind": "c"},
               {"pk": 1, "val": "a2", "kind": "u"}, {"pk": 2, "val": None, "kind": "d"}, {"pk": 4, "val": "d", "kind": "c"},
               {"pk": 3, "val": "c3", "kind": "u"}, {"pk": 2, "val": "b5", "kind": "c"}]
    asyncio.run(_produce(broker.bootstrap, topic, [{"key": str(c["pk"]), "value": json.dumps(c)} for c in changes]))
    cfg = write_config(tmp_path / "sink.json", topics=topic, tables=table, bootstrap=broker.bootstrap,
                       catalog_props=catalog_props, state_dir=tmp_path / "state", group="mirror-renamed",
                       **RENAME, **{"iceberg.tables.cdc-field": "op", f"iceberg.table.{table}.id-columns": "id"})
    catalog = load_catalog("it", **catalog_props)
    replicas = ReplicaSet(cfg, tmp_path / "logs")
    want = {1: "a2", 2: "b5", 3: "c3", 4: "d"}
    got: Any = None
    try:
        replica = replicas.start()
        deadline = time.monotonic() + 150
        while time.monotonic() < deadline:
            replicas.check_alive()
            if catalog.table_exists(table):
                rows = duck.scan_rows(catalog.load_table(table).metadata_location)
                got = {r["id"]: r["v"] for r in rows}
                if got == want and len(rows) == len(want):
                    break
            time.sleep(1)
    finally:
        replicas.stop_all()
    assert got == want, replica.log_path.read_text()[-3000:]
    loaded = catalog.load_table(table)
    assert [f.name for f in loaded.schema().fields][:3] == ["id", "v", "op"]
    assert [loaded.schema().find_column_name(i) for i in loaded.schema().identifier_field_ids] == ["id"]
