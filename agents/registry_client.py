"""A client of a schema registry's Confluent REST API, for the schemas the values name by id
(:class:`RegistryClient`; issue 36 point 1).

A schema is fetched once per id (``GET /schemas/ids/{id}``) and cached for the life of the
replica (an id's schema never changes); concurrent asks for one id share one request. Protobuf
and JSON Schema references (``references``: name, subject, version) are fetched too, by
``GET /subjects/{subject}/versions/{version}``, and cached the same way. :meth:`RegistryClient.serialized`
asks for a Protobuf schema and its references with ``?format=serialized`` (a base64
FileDescriptorProto each, what agents/formats/protobuf.py builds from). With ``global_ids``
(Apicurio's Protobuf frame naming global ids, docs/schema-registry.md) the URLs are Apicurio's own
API and a schema is ``GET /ids/globalIds/{id}`` (the raw text) with ``/ids/globalIds/{id}/references``,
each reference's text by group, artifact and version, cached the same way.

Errors, as a sink must treat them:

- an id the registry does not know (404 with error code 40403) is ``None``: the records naming
  it go to the dead letters with the id, the rest keep flowing;
- a refusal of the credentials (401, 403) is a :class:`ConfigError` naming the setting;
- anything else (the registry down, 5xx, a timeout) is retried with capped backoff, each failure
  logged (never with the credentials) and handed to ``on_failure`` for metrics and /status; once
  ``give_up_s`` has passed without an answer it raises :class:`RegistryUnavailable`, which is not
  retriable: the replica stops loudly and, restarted, reads the same records again.

Several URLs (``schema.registry.url`` is a comma-separated list, as in Confluent's client) are
tried in turn. Basic auth comes from ``basic.auth.user.info`` (``USER_INFO``) or from the URL's
own ``user:password@`` (``URL``); TLS from PEM files (a CA bundle, a client certificate and key).
"""

from __future__ import annotations

import asyncio
import base64
import functools
import json
import logging
import ssl
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, cast
from urllib.parse import quote, unquote, urlsplit, urlunsplit

import aiohttp
from pydantic import SecretStr

from icesink.shared.errors import ConfigError, IcesinkError
from icesink.shared.retry import Backoff

log = logging.getLogger(__name__)

SchemaType = Literal["AVRO", "PROTOBUF", "JSON"]


class RegistryUnavailable(IcesinkError):
    """The schema registry gave no answer for longer than the sink waits: stop the replica."""


@dataclass(frozen=True)
class Reference:
    name: str  # as the schema imports it (a .proto path, a JSON Schema $ref)
    subject: str
    version: int
    schema: RegisteredSchema


@dataclass(frozen=True)
class RegisteredSchema:
    id: int | None  # None for a reference fetched by subject and version, if the registry left it out
    type: SchemaType
    text: str
    references: tuple[Reference, ...] = ()


@dataclass(frozen=True)
class RegistryAuth:
    """Where the credentials come from: ``user_info`` ("user:password") or the URLs' own."""

    user_info: SecretStr | None = None
    cafile: str | None = None
    certfile: str | None = None
    keyfile: str | None = None
    key_password: SecretStr | None = None
    setting: str = "value.converter.basic.auth.user.info"  # named when the registry refuses them


def shown(url: str) -> str:
    """``url`` without its ``user:password@`` part, for logs and errors."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    return urlunsplit(parts._replace(netloc=f"{host}:{parts.port}" if parts.port else host))


class RegistryClient:
    """Schemas by id from one registry (several URLs of it), cached; see the module docstring."""

    def __init__(self, urls: Sequence[str], auth: RegistryAuth = RegistryAuth(), *, timeout_s: float = 10.0,
                 give_up_s: float = 300.0, backoff_first_s: float = 0.5, backoff_cap_s: float = 30.0,
                 on_failure: Callable[[BaseException, int], None] | None = None, global_ids: bool = False) -> None:
        if not urls:
            raise ConfigError("value.converter.schema.registry.url", "", "one or more registry URLs")
        self.urls = [u.rstrip("/") for u in urls]
        self.auth = auth
        self.timeout_s = timeout_s
        self.give_up_s = give_up_s
        self.backoff = (backoff_first_s, backoff_cap_s)
        self.on_failure = on_failure
        self._schemas: dict[int, asyncio.Future[RegisteredSchema | None]] = {}
        self._serialized: dict[int, asyncio.Future[RegisteredSchema | None]] = {}
        self._versions: dict[tuple[str, int, bool], asyncio.Future[RegisteredSchema | None]] = {}
        self._artifacts: dict[str, asyncio.Future[RegisteredSchema | None]] = {}  # Apicurio's, by version path
        self._session: aiohttp.ClientSession | None = None
        self._next_url = 0
        self.requests = 0  # HTTP requests made (each attempt), for tests and metrics
        #: The ids are Apicurio global ids and ``urls`` Apicurio's own API (``.../apis/registry/v2`` or ``v3``)
        self.global_ids = global_ids

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def schema(self, schema_id: int) -> RegisteredSchema | None:
        """The schema registered under ``schema_id``, or None if the registry has no such id."""
        if self.global_ids:
            return await self._once(self._schemas, schema_id, lambda: self._global(schema_id))
        return await self._once(self._schemas, schema_id, lambda: self._fetch(f"/schemas/ids/{schema_id}", schema_id))

    async def serialized(self, schema_id: int) -> RegisteredSchema | None:
        """As :meth:`schema`, the Protobuf text and its references' as base64 FileDescriptorProtos."""
        return await self._once(self._serialized, schema_id, lambda: self._fetch(
            f"/schemas/ids/{schema_id}?format=serialized", schema_id, serialized=True))

    async def version(self, subject: str, version: int, *, serialized: bool = False) -> RegisteredSchema | None:
        key = (subject, version, serialized)
        path = f"/subjects/{quote(subject, safe='')}/versions/{version}" + ("?format=serialized" if serialized else "")
        return await self._once(self._versions, key, lambda: self._fetch(path, None, serialized=serialized))

    async def _once(self, cache: dict[Any, asyncio.Future[RegisteredSchema | None]], key: Any,
                    fetch: Callable[[], Any]) -> RegisteredSchema | None:
        pending = cache.get(key)
        if pending is None:
            pending = cache[key] = asyncio.ensure_future(fetch())
            pending.add_done_callback(lambda f: cache.pop(key, None) if f.cancelled() or f.exception() else None)
        return await asyncio.shield(pending)

    async def _fetch(self, path: str, schema_id: int | None, *, serialized: bool = False) -> RegisteredSchema | None:
        body = await self._get(path)
        if body is None:
            return None
        kind = body.get("schemaType", "AVRO")  # Confluent leaves the type out for Avro
        if kind not in ("AVRO", "PROTOBUF", "JSON") or not isinstance(body.get("schema"), str):
            raise RegistryUnavailable(f"schema registry: GET {path} answered a schema of type {kind!r} "
                                      "without its text; expected AVRO, PROTOBUF or JSON")
        refs = []
        for ref in body.get("references") or ():
            target = await self.version(str(ref["subject"]), int(ref["version"]), serialized=serialized)
            if target is None:
                raise RegistryUnavailable(f"schema registry: schema {schema_id or path} references subject "
                                          f"{ref['subject']!r} version {ref['version']}, which it does not hold")
            refs.append(Reference(str(ref["name"]), str(ref["subject"]), int(ref["version"]), target))
        found = body.get("id", schema_id)
        return RegisteredSchema(None if found is None else int(found), kind, body["schema"], tuple(refs))

    async def _global(self, global_id: int) -> RegisteredSchema | None:
        """Apicurio's own API: ``GET /ids/globalIds/{id}`` (the text; its type in the
        ``X-Registry-ArtifactType`` header) and ``/ids/globalIds/{id}/references``."""
        return await self._native(f"/ids/globalIds/{global_id}", f"/ids/globalIds/{global_id}/references", global_id)

    async def _native(self, path: str, refs_path: str, schema_id: int | None) -> RegisteredSchema | None:
        body = await self._get(path, raw=True)
        if body is None:
            return None
        kind = _artifact_type(body)
        listed = await self._get(refs_path, raw=False, listed=True)
        refs = []
        for ref in (listed or {}).get("items", ()):
            group = ref.get("groupId") or "default"
            base = f"/groups/{quote(group, safe='')}/artifacts/{quote(str(ref['artifactId']), safe='')}" \
                   f"/versions/{quote(str(ref['version']), safe='')}"
            content = base + ("/content" if self.urls[0].endswith("/v3") else "")
            target = await self._once(self._artifacts, base,
                                      functools.partial(self._native, content, base + "/references", None))
            if target is None:
                raise RegistryUnavailable(f"schema registry: global id {schema_id or path} references artifact "
                                          f"{group}/{ref['artifactId']} version {ref['version']}, which it does not hold")
            version = str(ref["version"])
            refs.append(Reference(str(ref["name"]), f"{group}/{ref['artifactId']}",
                                  int(version) if version.isdigit() else 0, target))
        return RegisteredSchema(schema_id, kind, body["text"], tuple(refs))

    async def _get(self, path: str, *, raw: bool = False, listed: bool = False) -> dict[str, Any] | None:
        backoff = Backoff(first_s=self.backoff[0], cap_s=self.backoff[1], deadline_s=self.give_up_s)
        while True:
            url = self.urls[self._next_url % len(self.urls)]
            try:
                return await self._attempt(url, path, raw=raw, listed=listed)
            except (aiohttp.ClientError, TimeoutError, OSError, _Retry) as exc:
                self._next_url += 1  # the next URL of the list, if there are several
                delay = backoff.next()
                reason = f"GET {shown(url)}{path}: {type(exc).__name__}: {exc}"
                if self.on_failure is not None:
                    self.on_failure(exc, backoff.attempts)
                if not backoff.allows(delay):
                    raise RegistryUnavailable(f"schema registry gave no answer for {self.give_up_s:g} s "
                                              f"({backoff.attempts} attempts); last: {reason}") from None
                log.warning("schema registry: %s; attempt %d, again in %.1f s", reason, backoff.attempts, delay)
                await asyncio.sleep(delay)

    async def _attempt(self, url: str, path: str, *, raw: bool = False, listed: bool = False) -> dict[str, Any] | None:
        """The JSON object answered (``listed``: a JSON list, as ``{"items": [...]}``; ``raw``: the
        text and its ``X-Registry-ArtifactType`` as ``{"text", "type"}``); None for not found."""
        session = self._session or self._open()
        self.requests += 1
        parts = urlsplit(url)
        headers = {"Accept": "*/*" if raw else "application/json" if listed else "application/vnd.schemaregistry.v1+json"}
        if self.auth.user_info is not None:
            headers["Authorization"] = _basic(self.auth.user_info.get_secret_value())
        elif parts.username is not None:
            headers["Authorization"] = _basic(f"{unquote(parts.username)}:{unquote(parts.password or '')}")
        async with session.get(shown(url) + path, headers=headers) as resp:
            text = await resp.text()
            if resp.status in (401, 403):
                raise ConfigError(self.auth.setting, "(hidden)",
                                  f"credentials the schema registry at {shown(url)} accepts (it answered "
                                  f"{resp.status} to GET {path})")
            if (raw or listed) and resp.status == 404:
                return None
            if raw and resp.status == 200:
                return {"text": text, "type": resp.headers.get("X-Registry-ArtifactType"),
                        "content_type": resp.headers.get("Content-Type", "")}
            body = _json(text)
            if listed and resp.status == 200 and isinstance(body, list):
                return {"items": body}
            if resp.status == 404 and isinstance(body, dict) and body.get("error_code") in (40403, 40401, 40402):
                return None
            if resp.status != 200 or not isinstance(body, dict):
                raise _Retry(f"HTTP {resp.status}: {text[:200]}")
            return body

    def _open(self) -> aiohttp.ClientSession:
        ctx: ssl.SSLContext | None = None
        if self.auth.cafile or self.auth.certfile:
            ctx = ssl.create_default_context(cafile=self.auth.cafile)
            if self.auth.certfile:
                password = self.auth.key_password.get_secret_value() if self.auth.key_password else None
                ctx.load_cert_chain(self.auth.certfile, self.auth.keyfile, password)
        connector = aiohttp.TCPConnector(ssl=ctx) if ctx is not None else aiohttp.TCPConnector()
        self._session = aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=self.timeout_s))
        return self._session


def _basic(user_info: str) -> str:
    return "Basic " + base64.b64encode(user_info.encode()).decode("ascii")


class _Retry(Exception):
    """An answer that is not one (5xx, not JSON): try again."""


def _artifact_type(body: dict[str, Any]) -> SchemaType:
    """An artifact's type from Apicurio's answer: its ``X-Registry-ArtifactType`` header when sent,
    else its content type (2.4 answers ``/ids/globalIds/{id}`` with ``application/x-protobuf`` for
    Protobuf and ``application/json`` for Avro and JSON Schema alike: told apart by the text). Any
    other artifact (XML, GraphQL, ...) is named by its content type, so its records are rejects."""
    given = body.get("type")
    if given:
        return cast(SchemaType, str(given).upper())
    content_type = str(body.get("content_type", "")).lower()
    if "protobuf" in content_type:
        return "PROTOBUF"
    if "json" in content_type:
        doc = _json(body["text"])
        avro = isinstance(doc, str | list) or (isinstance(doc, dict) and "$schema" not in doc
                                               and doc.get("type") in ("record", "enum", "fixed"))
        return "AVRO" if avro else "JSON"
    return cast(SchemaType, content_type or "unknown")


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None
