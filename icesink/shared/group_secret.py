"""The group's control secret, kept in the Iceberg catalog (issue 40, docs/commits.md).

Without ``iceberg.control.secret`` (the default) a group still signs its control events
(icesink/shared/signing.py), with a random secret of its own: 32 bytes from :mod:`secrets`, made by the
first replica that finds none and kept in the catalog, which every replica of the group reaches
with credentials and someone who can only write the control topic does not. A check alone
cannot make a forged event harmless: an empty ``DataComplete`` for a partition's owner, from its
accepted position on, looks like a real range without rows (tombstones, dead letters, records
routed nowhere, transaction markers) and would skip records.

Where: the property ``icesink.control-secret.<group>`` of the namespace
``iceberg.control.secret-namespace`` (default ``icesink``, created if missing); its value is
JSON ``{"v": 1, "key": <64 hex digits>, "log": <control topic id>, "from": <control offset>}``.
``from`` is where the group's signing began. For a group that already ran unsigned (an upgrade
from a version that did not sign) it is the end of the control log when the secret was made:
offsets only grow, so an outsider can write nothing below it later, and an unsigned event below
it was the group's, accepted on that log (``log``) only. For a group that never ran it is 0:
unsigned events in the log then are an outsider's (written before the group's first start),
and none is trusted. "Ran" is what only the group can leave: a committed offset of its
``<group>-coordinator`` consumer group (its checkpoint pointer) or its sink state in one of its
tables (the replica's ``has_run``); events keyed with the group in the log are not, since
anyone who writes the topic can write them.

Provisioning races (replicas of a new group starting at once) converge: the secret is written
only if absent, atomically where the catalog can (a new namespace created with it, or the SQL
catalogs' insert of the property row); else written and read back after ``SETTLE_S``, so a
replica that wrote meanwhile is seen, and a replica that still holds another secret reads it
again when events of its group fail its signature check (agents/worker.py).

Blocking catalog calls; callers run them off the event loop.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import re
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import NamespaceAlreadyExistsError, NoSuchNamespaceError

from icesink.shared.config import Settings
from icesink.shared.errors import ControlSecretError, is_retriable
from icesink.shared.kafka_admin import end_offsets, topic_id
from icesink.shared.metrics import Metrics
from icesink.shared.offload import Offload
from icesink.shared.retry import Backoff
from icesink.shared.secrets import learn_secret
from icesink.shared.signing import Keyring

log = logging.getLogger(__name__)

PREFIX = "icesink.control-secret."
#: How long a replica that wrote the secret waits before reading it back, where the catalog
#: cannot write it atomically: another replica's write that raced its own lands within it.
SETTLE_S = 2.0
_MAX_KEY_LEN = 255  # the SQL catalog's property_key column
_HEX = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True)
class GroupSecret:
    """The stored secret: ``key`` (64 hex digits; the HMAC key is their ASCII bytes), the control
    log it was made on (``log_id``, a topic id, None on a broker without ids) and the control
    offset where signing began on it (``signed_from``)."""

    key: str
    log_id: str | None
    signed_from: int

    def unsigned_below(self, log_id: str | None) -> int:
        """Below which control offset unsigned events are accepted, reading log ``log_id``: the
        group's own from before it signed; on any other log, none."""
        return self.signed_from if log_id == self.log_id else 0

    def text(self) -> str:
        return json.dumps({"v": 1, "key": self.key, "log": self.log_id, "from": self.signed_from}, sort_keys=True)

    @classmethod
    def parse(cls, text: str, where: str) -> GroupSecret:
        """The stored value; :class:`ControlSecretError` naming ``where`` for anything else (the
        text itself is never quoted: it holds the secret)."""
        try:
            body = json.loads(text)
            key, log_id, start = body["key"], body.get("log"), body["from"]
            if body.get("v") != 1 or not isinstance(key, str) or not _HEX.match(key):
                raise ValueError
            if (log_id is not None and not isinstance(log_id, str)) or type(start) is not int or start < 0:
                raise ValueError
        except (ValueError, TypeError, KeyError):
            raise ControlSecretError(
                f"{where}: expected JSON {{\"v\": 1, \"key\": <64 hex digits>, \"log\": ..., \"from\": <offset>}}, "
                "found something else (not shown). Remove the property with every replica stopped: the next "
                "start makes a new secret (docs/commits.md, \"Signed control events\")"
            ) from None
        return cls(key, log_id, start)


def property_key(group: str) -> str:
    """The namespace property holding ``group``'s secret."""
    key = PREFIX + group
    return key if len(key) <= _MAX_KEY_LEN else PREFIX + "sha256-" + hashlib.sha256(group.encode()).hexdigest()


def read_secret(catalog: Catalog, namespace: str, group: str) -> GroupSecret | None:
    """The group's stored secret, None if there is none (nor the namespace)."""
    key = property_key(group)
    text = (_properties(catalog, namespace) or {}).get(key)
    return None if text is None else GroupSecret.parse(text, f"namespace {namespace} property {key}")


def _properties(catalog: Catalog, namespace: str) -> dict[str, str] | None:
    try:
        return dict(catalog.load_namespace_properties(namespace))
    except NoSuchNamespaceError:
        return None


def provision(
    catalog: Catalog, namespace: str, group: str, log_id: str | None, log_end: int,
    *, settle_s: float = SETTLE_S, sleep: Callable[[float], None] = time.sleep,
) -> tuple[GroupSecret, bool]:
    """The group's secret, made and stored first if there is none: (the secret, whether this
    call stored it). Every replica of a group starting at once ends with the same one (module
    docstring). ``log_id`` and ``log_end``: the control log and its end offset now."""
    key = property_key(group)
    where = f"namespace {namespace} property {key}"
    props = _properties(catalog, namespace)
    if props is not None and key in props:
        return GroupSecret.parse(props[key], where), False
    mine = GroupSecret(secrets.token_hex(32), log_id, log_end)
    learn_secret(mine.key)  # masked from now on, in whatever error writing it raises
    if not _write_if_absent(catalog, namespace, key, mine.text(), exists=props is not None):
        sleep(settle_s)
    stored = read_secret(catalog, namespace, group)
    if stored is None:
        raise ControlSecretError(
            f"{where}: written, then not found when read back (the catalog keeps no namespace properties?); "
            "set iceberg.control.secret on every replica instead"
        )
    if stored != mine:
        log.info("another replica stored the group's control secret first: using it")
    return stored, stored == mine


def _write_if_absent(catalog: Catalog, namespace: str, key: str, value: str, *, exists: bool) -> bool:
    """Store ``key`` unless the namespace has it; True if that was atomic (the value now stored
    is the one of whoever wrote first), False if a racing writer may have replaced it."""
    if not exists:
        try:
            catalog.create_namespace(namespace, {key: value})
            return True
        except NamespaceAlreadyExistsError:
            pass  # created meanwhile by another replica
        except Exception as exc:  # a SQL catalog's racing insert of the same row: it is stored
            if not _duplicate_row(exc):
                raise
            return True
    if _is_sql(catalog):
        return _sql_insert_if_absent(catalog, namespace, key, value)
    if key not in (_properties(catalog, namespace) or {}):
        catalog.update_namespace_properties(namespace, updates={key: value})
    return False


def _duplicate_row(exc: Exception) -> bool:
    from sqlalchemy.exc import IntegrityError

    return isinstance(exc, IntegrityError)


def _is_sql(catalog: Catalog) -> bool:
    from pyiceberg.catalog.sql import SqlCatalog

    return isinstance(catalog, SqlCatalog)


def _sql_insert_if_absent(catalog: Any, namespace: str, key: str, value: str) -> bool:
    """The property row inserted unless it exists (its primary key): the first writer wins."""
    from pyiceberg.catalog.sql import IcebergNamespaceProperties
    from sqlalchemy.exc import IntegrityError
    from sqlalchemy.orm import Session

    with Session(catalog.engine) as session:
        session.add(IcebergNamespaceProperties(
            catalog_name=catalog.name, namespace=Catalog.namespace_to_string(namespace),
            property_key=key, property_value=value,
        ))
        try:
            session.commit()
        except IntegrityError:
            session.rollback()
    return True


async def stored_keyring(settings: Settings, bootstrap: str, catalog: Catalog) -> Keyring | None:
    """What a tool reading the group's control log (``icesink control tail``, ``icesink gc``)
    checks signatures with, as the group's replicas check: iceberg.control.secret, else the
    group's own secret from the catalog (never made here). None (nothing checked, said in the
    log) if the group has neither: it never ran with signing, so its log holds only unsigned
    events of its own or of a version that did not sign."""
    configured = settings.control_signing_key()
    if configured is not None:
        return Keyring(configured)
    try:
        stored = read_secret(catalog, settings.control_secret_namespace, settings.group_id)
    except Exception as exc:
        raise ControlSecretError(
            f"the group's control secret could not be read from the catalog (namespace "
            f"{settings.control_secret_namespace}, property {property_key(settings.group_id)}): "
            f"{_describe(exc)}; the control log is not read unchecked"
        ) from None
    if stored is None:
        log.warning("signatures not checked: the group has no secret in the catalog yet (it never signed)")
        return None
    learn_secret(stored.key)
    log_id = await topic_id(bootstrap, settings.control_topic, client_kwargs=settings.kafka_client_kwargs())
    return Keyring(stored.key.encode("ascii"), stored.unsigned_below(log_id))


def _transient(exc: BaseException) -> bool:
    """Whether trying again may succeed: not a refusal (no permission, a catalog without the call)."""
    from pyiceberg.exceptions import ForbiddenError, UnauthorizedError

    return is_retriable(exc) and not isinstance(exc, (ForbiddenError, UnauthorizedError, NotImplementedError))


def _describe(exc: BaseException) -> str:
    """An error's type and message with no SQL parameters (a SQL catalog's errors quote the
    statement's values, among them the secret being written)."""
    from sqlalchemy.exc import StatementError

    if isinstance(exc, StatementError) and exc.orig is not None:
        return f"{type(exc).__name__} ({type(exc.orig).__name__}: {exc.orig})"
    return f"{type(exc).__name__}: {exc}"


class SecretLoader:
    """A replica's part: loads the group's key into its keyring before anything is sent or read
    (:meth:`load`), and reads the stored secret again when events of its group fail the
    signature check (:meth:`refused`, then :meth:`maybe_reload` from the replica's housekeeping,
    at most every ``RELOAD_S``): a replica that lost a provisioning race the catalog could not
    settle atomically then signs and checks with the stored secret, and everyone agrees."""

    RELOAD_S = 10.0
    #: How long a start retries a catalog (or broker) that fails, and its backoff (first, cap).
    START_TIMEOUT_S = 300.0
    BACKOFF_S = (1.0, 30.0)

    def __init__(self, settings: Settings, bootstrap: str, keyring: Keyring, metrics: Metrics,
                 status: dict[str, Any] | None = None) -> None:
        self.settings = settings
        self.status = status  # the replica's /status: a start that retries says so there
        self.bootstrap = bootstrap
        self.keyring = keyring
        self.metrics = metrics
        self.log_id: str | None = None
        self._stale = False
        self._last = 0.0
        keyring.on_refused = self.refused

    async def load(self, catalog: Catalog, offload: Offload,
                   has_run: Callable[[], Awaitable[bool]] | None = None) -> None:
        """``has_run``: whether the group ran before (its checkpoint pointer or a table's sink
        state; module docstring); asked only if no secret is stored. None: a group that never ran."""
        configured = self.settings.control_signing_key()
        if configured is not None:  # iceberg.control.secret wins
            self.keyring.load(configured)
            return
        namespace, group = self.settings.control_secret_namespace, self.settings.group_id
        backoff = Backoff(*self.BACKOFF_S, deadline_s=self.START_TIMEOUT_S)
        while True:
            try:
                stored, made = await self._fetch(catalog, offload, has_run)
                break
            except ControlSecretError:  # a stored value that is no secret: no retry mends it
                raise
            except Exception as exc:
                error, transient = ControlSecretError(
                    f"the group's control secret could not be read or stored in the catalog (namespace {namespace}, "
                    f"property {property_key(group)}): {_describe(exc)}. The sink reads and writes that "
                    "namespace's properties: allow it, set iceberg.control.secret-namespace to a namespace it may "
                    "change, or set iceberg.control.secret on every replica"), _transient(exc)
            # raised here, outside the handler: no chained error (a SQL error's text quotes the secret written)
            delay = backoff.next()
            if not transient or not backoff.allows(delay):
                raise error
            self.metrics.control_secret_load_failures.inc()
            if self.status is not None:
                self.status["control_secret"] = f"retrying: {error}"
            log.warning("%s; retrying in %.0f s (the start gives up %.0f s after it began)",
                        error, delay, self.START_TIMEOUT_S)
            await asyncio.sleep(delay)
        if self.status is not None:
            self.status.pop("control_secret", None)
        self._use(stored)
        below = self.keyring.unsigned_below
        log.info("control events signed with the group's own secret (namespace %s, property %s%s)%s", namespace,
                 property_key(group), ", made now" if made else "",
                 f"; unsigned events below control offset {below} are the group's from before it signed" if below else "")

    async def _fetch(self, catalog: Catalog, offload: Offload,
                     has_run: Callable[[], Awaitable[bool]] | None) -> tuple[GroupSecret, bool]:
        namespace, group = self.settings.control_secret_namespace, self.settings.group_id
        client, topic = self.settings.kafka_client_kwargs(), self.settings.control_topic
        self.log_id = await topic_id(self.bootstrap, topic, client_kwargs=client)
        stored = await offload.run(read_secret, catalog, namespace, group)
        if stored is not None:
            return stored, False
        # an upgrade: the group's own unsigned events end where the log ends now; a new group:
        # every unsigned event in the log is an outsider's
        ran = has_run is not None and await has_run()
        start = (await end_offsets(self.bootstrap, topic, client_kwargs=client)).get(0, 0) if ran else 0
        return await offload.run(provision, catalog, namespace, group, self.log_id, start)

    def _use(self, stored: GroupSecret) -> None:
        learn_secret(stored.key)  # never in a log line, /status or /metrics
        self.keyring.load(stored.key.encode("ascii"), stored.unsigned_below(self.log_id))

    def refused(self) -> None:
        self._stale = True

    async def maybe_reload(self, catalog: Catalog, offload: Offload) -> None:
        if not self._stale or self.settings.control_secret is not None:
            return
        now = time.monotonic()
        if now - self._last < self.RELOAD_S:
            return
        self._stale, self._last = False, now
        namespace, group = self.settings.control_secret_namespace, self.settings.group_id
        try:
            stored = await offload.run(read_secret, catalog, namespace, group)
        except Exception as exc:  # tried again on the next refused event
            log.warning("reading the group's control secret again failed: %s: %s", type(exc).__name__, exc)
            return
        if stored is None or stored.key.encode("ascii") == self.keyring.key:
            return  # events from outside the group, or from a replica with another secret: skipped
        self._use(stored)
        self.metrics.control_secret_reloads.inc()
        log.warning("the group's control secret in the catalog (namespace %s, property %s) is not the one this "
                    "replica signed with (replicas of a new group made one at once): using the stored one",
                    namespace, property_key(group))


__all__ = ["GroupSecret", "PREFIX", "SETTLE_S", "SecretLoader", "property_key", "provision", "read_secret", "stored_keyring"]
