"""The HTTP endpoint of a replica, on ``metrics.host``:``metrics.port``: ``/metrics``
(Prometheus text format; ``?name[]=...`` keeps only the samples named, as prometheus_client's
own handler does) and ``/status`` (JSON: this worker's phase and partitions, and the
coordinator's phase, last commit and any failing commit with its error and attempt count, when
this replica runs it). Both bodies pass through the settings' :class:`Redactor`: an error that
quotes a secret setting shows it masked."""

from __future__ import annotations

import json
import logging
import socket
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

log = logging.getLogger(__name__)


def serve(
    host: str,
    port: int,
    registry: CollectorRegistry,
    status: Callable[[], dict[str, Any]],
    redact: Callable[[str], str] = str,
) -> ThreadingHTTPServer:
    """Serve on ``host`` (``0.0.0.0``: every IPv4 interface; ``::``: every interface) and
    ``port`` from a daemon thread."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            path, _, query = self.path.partition("?")
            if path == "/metrics":
                names = parse_qs(query).get("name[]")  # a scraper's filter: one sample of 200 tables' thousands
                shown = registry.restricted_registry(names) if names else registry
                body, ctype = redact(generate_latest(shown).decode()).encode(), CONTENT_TYPE_LATEST
            elif path == "/status":
                text = json.dumps(_snapshot(status), indent=2, default=str)
                body, ctype = redact(text).encode(), "application/json"
            else:
                self.send_error(404, "try /metrics or /status")
                return
            self.send_response(200)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: Any) -> None:
            pass

    class Server(ThreadingHTTPServer):
        address_family = socket.AF_INET6 if ":" in host else socket.AF_INET

    server = Server((host, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="icesink-http", daemon=True).start()
    shown = f"[{host}]" if ":" in host else host
    log.info("metrics on http://%s:%d/metrics, status on /status", shown, server.server_address[1])
    return server


def _snapshot(status: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    for _ in range(3):  # the event loop may change the dicts while we copy them
        try:
            return status()
        except RuntimeError:
            continue
    return {"error": "status busy, retry"}
