"""The embedded default stack for a worker started with nothing external configured.

Without ``bootstrap.servers`` a worker uses the embedded Tansu broker recorded in
``<state.dir>/broker.json`` if it still answers, else starts one (as its own child process)
and records it there, so further replicas on the same host with the same state dir join it.
Without ``iceberg.catalog.type`` the catalog is a SQLite SQL catalog under ``<state.dir>``
(icesink.shared.iceberg.catalog_properties).
"""

from __future__ import annotations

import json
import logging
import socket
from pathlib import Path

from icesink.shared.config import Settings
from icesink.app.embedded import EmbeddedBroker

log = logging.getLogger(__name__)


def _answers(bootstrap: str) -> bool:
    host, _, port = bootstrap.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=0.5):
            return True
    except OSError:
        return False


def resolve_bootstrap(settings: Settings) -> tuple[str, EmbeddedBroker | None]:
    """The bootstrap servers to use, and the broker this process started (if any)."""
    if settings.bootstrap_servers:
        return settings.bootstrap_servers, None
    state = settings.state_dir.resolve()
    record = state / "broker.json"
    if record.exists():
        bootstrap = json.loads(record.read_text())["bootstrap"]
        if _answers(bootstrap):
            log.info("using the embedded broker at %s (%s)", bootstrap, record)
            return bootstrap, None
    broker = EmbeddedBroker(state / "broker")
    broker.start()
    record.parent.mkdir(parents=True, exist_ok=True)
    record.write_text(json.dumps({"bootstrap": broker.bootstrap, "pid": broker.pid}))
    log.info("started an embedded broker at %s (recorded in %s)", broker.bootstrap, record)
    return broker.bootstrap, broker


def forget_broker(state_dir: Path) -> None:
    (state_dir.resolve() / "broker.json").unlink(missing_ok=True)
