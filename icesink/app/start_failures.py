"""Failures a user causes at start as one line naming what and where: a broker that is down, a
catalog that cannot be reached, a file or directory icesink may not use. Leaf module: it reads
exceptions (by their class names, not importing the libraries that raise them) and settings."""

from __future__ import annotations

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
             catalog_uri: str | None = None) -> str | None:
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
            return (f"no permission to use {e.filename or 'a file'}: {e.strerror or e} (run as a user that may, "
                    "or change state.dir)")
    return None
