"""agents/registry_client.py against a real schema registry (AxonOps, the session's ``schema_registry``,
basic auth on): schemas by id with their type and resolved references, cached; an unknown id is
None; refused credentials stop with the setting named; an unreachable registry is retried with
backoff, reported, then given up loudly (issue 36 point 1)."""

from __future__ import annotations

import asyncio
import json
import socket

import pytest
from pydantic import SecretStr

from agents.registry_client import RegistryAuth, RegistryClient, RegistryUnavailable, shown
from icesink.shared.errors import ConfigError
from tests.support.schema_registry import SchemaRegistry

pytestmark = pytest.mark.integration

AVRO = {"type": "record", "name": "Order", "namespace": "rc", "fields": [{"name": "id", "type": "long"}]}
BASE_PROTO = 'syntax = "proto3";\npackage rc;\nmessage Money {\n  int64 cents = 1;\n}\n'
ORDER_PROTO = ('syntax = "proto3";\npackage rc;\nimport "rc/money.proto";\n'
               'message Order {\n  int64 id = 1;\n  rc.Money total = 2;\n}\n')


def client(server: SchemaRegistry, **kw: object) -> RegistryClient:
    return RegistryClient([server.url], RegistryAuth(user_info=SecretStr(server.user_info)), **kw)  # type: ignore[arg-type]


def register(server: SchemaRegistry) -> dict[str, int]:
    from confluent_kafka.schema_registry import Schema, SchemaReference, SchemaRegistryClient

    c = SchemaRegistryClient(server.client_config())
    money = c.register_schema("rc-money", Schema(BASE_PROTO, "PROTOBUF"))
    return {
        "avro": c.register_schema("rc-avro-value", Schema(json.dumps(AVRO), "AVRO")),
        "json": c.register_schema("rc-json-value", Schema(json.dumps({"type": "object"}), "JSON")),
        "money": money,
        "order": c.register_schema("rc-order-value", Schema(ORDER_PROTO, "PROTOBUF", [
            SchemaReference("rc/money.proto", "rc-money", 1)])),
    }


def test_schemas_by_id_with_types_and_references_cached(schema_registry: SchemaRegistry) -> None:
    ids = register(schema_registry)

    async def run() -> None:
        c = client(schema_registry)
        try:
            avro, js, order = await asyncio.gather(c.schema(ids["avro"]), c.schema(ids["json"]), c.schema(ids["order"]))
            assert avro is not None and avro.type == "AVRO" and json.loads(avro.text) == AVRO and avro.id == ids["avro"]
            assert js is not None and js.type == "JSON"
            assert order is not None and order.type == "PROTOBUF" and "message Order" in order.text
            [ref] = order.references
            assert (ref.name, ref.subject, ref.version) == ("rc/money.proto", "rc-money", 1)
            assert ref.schema.type == "PROTOBUF" and "message Money" in ref.schema.text
            made = c.requests
            again = await asyncio.gather(*(c.schema(ids["avro"]) for _ in range(20)))
            assert all(a == avro for a in again) and c.requests == made  # cached: no request
            assert await c.schema(987654) is None  # unknown to the registry
        finally:
            await c.close()

    asyncio.run(run())


def test_refused_credentials_name_the_setting_and_hide_the_password(schema_registry: SchemaRegistry) -> None:
    ids = register(schema_registry)

    async def run() -> None:
        c = RegistryClient([schema_registry.url], RegistryAuth(user_info=SecretStr("icesink:wrong-password")))
        try:
            with pytest.raises(ConfigError, match="value.converter.basic.auth.user.info") as err:
                await c.schema(ids["avro"])
            assert "wrong-password" not in str(err.value)
        finally:
            await c.close()
        # The URL's own user:password@ (basic.auth.credentials.source=URL) works, and is never shown.
        user, password = schema_registry.user_info.split(":", 1)
        with_user = schema_registry.url.replace("://", f"://{user}:{password}@")
        assert password not in shown(with_user) and shown(with_user) == schema_registry.url
        c = RegistryClient([with_user])
        try:
            assert (await c.schema(ids["avro"])) is not None
        finally:
            await c.close()

    asyncio.run(run())


def test_an_unreachable_registry_is_retried_reported_then_given_up_loudly(schema_registry: SchemaRegistry) -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    failures: list[int] = []
    ids = register(schema_registry)

    async def run() -> None:
        c = RegistryClient([dead], give_up_s=1.5, backoff_first_s=0.1, backoff_cap_s=0.4,
                           on_failure=lambda exc, n: failures.append(n))
        try:
            with pytest.raises(RegistryUnavailable, match="gave no answer for 1.5 s") as err:
                await c.schema(1)
            assert dead in str(err.value)
        finally:
            await c.close()
        assert len(failures) >= 3 and failures == list(range(1, len(failures) + 1))
        # A second URL that answers: the client moves on to it.
        c = RegistryClient([dead, schema_registry.url], RegistryAuth(user_info=SecretStr(schema_registry.user_info)),
                           backoff_first_s=0.05)
        try:
            assert (await c.schema(ids["avro"])) is not None
        finally:
            await c.close()

    asyncio.run(run())
