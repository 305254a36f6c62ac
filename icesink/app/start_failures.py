"""Failures a user causes at start as one line naming what and where: a broker that is down, a
catalog that cannot be reached, a file or directory icesink may not use. Leaf module: it reads
exceptions (by their class names, not importing the libraries that raise them) and settings."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from urllib.parse import urlsplit, urlunsplit

#: Exception classes (module prefix, class name) of a catalog that cannot be reached: the REST
#: catalog's HTTP client, the SQL catalog's database driver, Glue's and Hive's clients.
_CATALOG_UNREACHABLE = (
    ("requests.", "ConnectionError"), ("requests.", "ConnectTimeout"), ("sqlalchemy.", "OperationalError"),
    ("botocore.", "EndpointConnectionError"), ("thrift.", "TTransportException"),
)
_ERRNO = re.compile(r"\[Errno -?\d+\] [^'\")\]]+")


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        e = todo.pop(0)
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        todo += [e.__cause__, e.__context__]


def _is(e: BaseException, module: str, name: str) -> bool:
    return any(c.__module__.startswith(module) and c.__name__ == name for c in type(e).__mro__)


def _reason(e: BaseException) -> str:
    text = str(e)
    found = _ERRNO.search(text)
    if found:
        return found.group(0).strip()
    return " ".join(text.split())[:200] or type(e).__name__


def _without_password(uri: str) -> str:
    parts = urlsplit(uri)
    if parts.password is None:
        return uri
    host = parts.hostname or ""
    netloc = f"{parts.username}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


def describe(exc: BaseException, *, bootstrap: str, catalog: str | None = None,
             catalog_uri: str | None = None, catalog_warehouse: str | None = None) -> str | None:
    """The one line for ``exc`` if it is a start failure a user fixes, else None (then it is a
    defect of ours, logged with its traceback)."""
    for e in _chain(exc):
        if _is(e, "aiokafka.", "KafkaConnectionError"):
            return (f"cannot reach the Kafka brokers of bootstrap.servers={bootstrap}: none answered; is the "
                    "broker up and the address right?")
        if catalog is not None and any(_is(e, m, n) for m, n in _CATALOG_UNREACHABLE):
            where = f" at iceberg.catalog.uri={_without_password(catalog_uri)}" if catalog_uri else ""
            return f"cannot reach the catalog {catalog!r}{where}: {_reason(e)}"
        if isinstance(e, PermissionError):
            return _no_permission(e, catalog, catalog_uri, catalog_warehouse)
    return None


def _no_permission(e: PermissionError, catalog: str | None, uri: str | None, warehouse: str | None) -> str:
    """The path, the setting it comes from and what to do: a catalog's database file or warehouse
    (iceberg.catalog.uri / .warehouse), else a file under state.dir."""
    path = str(e.filename or "")
    why = e.strerror or str(e)
    for key, value in (("uri", uri), ("warehouse", warehouse)):
        local = _local_path(value)
        if catalog is not None and path and local and (path.startswith(local) or local.startswith(path)
                                                          or path.startswith(local.rsplit("/", 1)[0] + "/")):
            return (f"no permission to use {path} of the catalog {catalog!r} (iceberg.catalog.{key}="
                    f"{_without_password(value or '')}): {why}; let this user write it, or set iceberg.catalog.{key} "
                    "to a place it may")
    return f"no permission to use {path or 'a file'}: {why} (run as a user that may, or change state.dir)"


def _local_path(value: str | None) -> str | None:
    """The file path of a ``sqlite:///...`` or ``file://...`` setting, else None."""
    if not value:
        return None
    for prefix in ("sqlite:///", "file://"):
        if value.startswith(prefix):
            rest = value[len(prefix):].split("?", 1)[0]
            return "/" + rest.lstrip("/") if prefix == "sqlite:///" else rest
    return None


_TEXT_ERROR = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ (?:ERROR|CRITICAL)\s+(?:icesink|agents|coordinator|"
                         r"spark_bridge)[\w.]*: (.+)$")


def cause_in_log(text: str) -> str | None:
    """The last ERROR line icesink logged in a replica's log (text or JSON lines), its message
    only: a replica that ends at start logs its cause as one such line (icesink.app.cli), where
    Spark's and the JVM's own lines and a library's traceback may come before or after it."""
    found: str | None = None
    for line in text.splitlines():
        m = _TEXT_ERROR.match(line)
        if m:
            found = m.group(1).strip()
        elif line.startswith("{") and '"level"' in line:
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and record.get("level") in ("ERROR", "CRITICAL") and \
                    str(record.get("logger", "")).split(".")[0] in ("icesink", "agents", "coordinator", "spark_bridge"):
                found = " ".join(str(record.get("message", "")).split()) or found
    return found
