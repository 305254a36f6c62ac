"""The schema registry of a replica whose ``value.converter`` is a registry converter: the
client (agents/registry_client.py) built from the settings (icesink/shared/registry_settings.py)
and its health in metrics, /status (``schema_registry``) and the log (:func:`registry_values`)."""

from __future__ import annotations

import logging
from typing import Any, Literal

from agents.formats.apicurio_proto import ApicurioProtobufKeys, ApicurioProtobufValues
from agents.formats.registry_keys import RegistryKeys
from agents.formats.registry_values import RegistryValues, SchemaById
from agents.registry_client import RegisteredSchema, RegistryAuth, RegistryClient, RegistryUnavailable, shown
from icesink.shared.config import Settings
from icesink.shared.metrics import Metrics
from icesink.shared.registry_settings import ApicurioFrame, RegistrySettings, registry_settings

log = logging.getLogger(__name__)


class RegistryHealth:
    """Whether the registry answers: failures (each retried by the client) turn it unavailable
    in /status and metrics; the next answer turns it available again."""

    def __init__(self, client: RegistryClient, metrics: Metrics, status: dict[str, Any],
                 entry: str = "schema_registry") -> None:
        self.entry = entry  # the /status entry
        self.client = client
        self.metrics = metrics
        self.status = status
        self.down_since_attempts = 0
        status[self.entry] = {"state": "not asked yet", "urls": [shown(u) for u in client.urls]}

    def gave_up(self, exc: BaseException) -> None:
        """The client gave up: the replica stops (agents/faust_app.py ``ingest_failed``)."""
        self.status[self.entry] = {
            **self.status.get(self.entry, {}), "state": "gave up", "error": str(exc)[:300],
            "effect": f"the replica stops (exit code 3) after {self.client.give_up_s:g} s without an answer, "
                      "before its consumer would leave the group (consumer.max-poll-interval-ms); "
                      "nothing of the waiting fetch was taken",
        }

    def failed(self, exc: BaseException, attempts: int) -> None:
        self.metrics.schema_registry_failures.inc()
        self.metrics.schema_registry_waiting.set(1)
        self.down_since_attempts = attempts
        self.status[self.entry] = {
            "state": "unavailable", "attempts": attempts, "error": f"{type(exc).__name__}: {exc}"[:300],
            "urls": [shown(u) for u in self.client.urls],
            "effect": "fetches with schema ids not seen yet wait; offsets do not move",
        }

    async def schema(self, schema_id: int) -> RegisteredSchema | None:
        try:
            found = await self.client.schema(schema_id)
        except RegistryUnavailable as exc:
            self.gave_up(exc)
            raise
        state = self.status.get(self.entry, {}).get("state")
        if state != "available":
            if state == "unavailable":
                log.info("schema registry answers again (after %d failed attempts)", self.down_since_attempts)
            self.metrics.schema_registry_waiting.set(0)
            self.status[self.entry] = {"state": "available", "urls": [shown(u) for u in self.client.urls]}
        return found


#: Seconds one request to the registry may take before it is retried (``RegistryClient.timeout_s``).
REQUEST_TIMEOUT_S = 10.0


def give_up_s(settings: Settings) -> float:
    """How long a fetch waits for the registry before the replica stops: three quarters of the
    consumer's max poll interval, less a request's timeout (the last attempt may start just before the
    give-up). A fetch waiting holds the agent and with it the consumer's polls; past the
    interval the consumer would leave its group, its partitions moving while the replica,
    still up, waits on. At least a second (the interval is at least 10 s)."""
    return max(1.0, 0.75 * settings.consumer_max_poll_interval_ms / 1000 - REQUEST_TIMEOUT_S)


def registry_values(settings: Settings, metrics: Metrics,
                    status: dict[str, Any]) -> tuple[RegistryValues, RegistryClient] | None:
    """The registry values' decoder and its client (None: the converter reads no registry)."""
    rs = registry_settings(settings)
    if rs is None:
        return None
    health = _health(settings, "value", metrics, status)
    return values_decoder(rs, health.schema), health.client


def values_decoder(rs: RegistrySettings, schema_of: SchemaById) -> RegistryValues:
    """The values' decoder for these settings, asking ``schema_of`` for schemas."""
    h = rs.apicurio_headers
    if h is not None and rs.format == "protobuf":  # headers framed as Apicurio's 8-byte-id frame with its Ref
        return ApicurioProtobufValues(schema_of, ApicurioFrame(8, h.global_ids), rs.options, h)
    if rs.apicurio_frame is not None:
        return ApicurioProtobufValues(schema_of, rs.apicurio_frame, rs.options)
    return RegistryValues(schema_of, rs.format, rs.options, h)


def registry_keys(settings: Settings, metrics: Metrics,
                  status: dict[str, Any]) -> tuple[RegistryKeys, RegistryClient] | None:
    """The registry keys' decoder and its client, for a key column of a registry key converter
    (None: no key column, or the key converter reads no registry). Its health shows in /status as
    ``schema_registry_keys``."""
    rs = registry_settings(settings, "key")
    if rs is None or settings.key_column is None:
        return None
    health = _health(settings, "key", metrics, status)
    return keys_decoder(rs, health.schema, settings.key_column), health.client


def keys_decoder(rs: RegistrySettings, schema_of: SchemaById, column: str) -> RegistryKeys:
    """The keys' decoder for these settings (the key column ``column``), as :func:`values_decoder`."""
    h = rs.apicurio_headers
    if h is not None and rs.format == "protobuf":
        return ApicurioProtobufKeys(schema_of, column, ApicurioFrame(8, h.global_ids), rs.options, h)
    if rs.apicurio_frame is not None:
        return ApicurioProtobufKeys(schema_of, column, rs.apicurio_frame, rs.options)
    return RegistryKeys(schema_of, column, rs.format, rs.options, h)


def _health(settings: Settings, side: Literal["value", "key"], metrics: Metrics,
            status: dict[str, Any]) -> RegistryHealth:
    rs = registry_settings(settings, side)
    assert rs is not None
    auth = RegistryAuth(rs.user_info, rs.cafile, rs.certfile, None, rs.key_password,
                        setting=f"{side}.converter.basic.auth.user.info" if rs.user_info is not None else rs.url_key)
    client = RegistryClient(rs.urls, auth, timeout_s=REQUEST_TIMEOUT_S, give_up_s=give_up_s(settings),
                            global_ids=rs.global_ids)
    health = RegistryHealth(client, metrics, status, "schema_registry" if side == "value" else "schema_registry_keys")
    client.on_failure = health.failed
    return health
