"""The REST API of ``icesink connect``, shaped as Kafka Connect's (same paths, status codes and
JSON): what users of the reference sink's tutorial ``curl``. The cluster behind it
(:class:`icesink.app.connect.Cluster`) keeps connectors in the config topic and runs their tasks;
this module only maps requests to it and its answers to Kafka Connect's JSON.

Errors are ``{"error_code": N, "message": "..."}``; an invalid connector config is a 400 whose
message names the key (icesink's own settings check, the one ``icesink worker`` runs, and what a
connector may set: icesink/app/connect_policy.py). Configs are shown with their secrets masked;
with basic auth configured every request needs a known user's password (401 otherwise).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any, Protocol

from aiohttp import web
from aiohttp.typedefs import Handler

from icesink.app.connect_policy import shown
from icesink.app.connect_security import check_basic
from icesink.shared.errors import ConfigError

log = logging.getLogger(__name__)

VERSION = "3.8.0-icesink-0.1.0"


class Backend(Protocol):
    worker_id: str

    async def sync(self) -> None: ...
    def names(self) -> list[str]: ...
    def config(self, name: str) -> dict[str, str] | None: ...
    def tasks(self, name: str) -> int: ...
    def status(self, name: str) -> dict[str, Any]: ...
    def check(self, name: str, config: dict[str, str]) -> dict[str, str]: ...
    async def put(self, name: str, config: dict[str, str]) -> bool: ...
    async def set_target(self, name: str, target: str) -> None: ...
    async def restart(self, name: str) -> None: ...
    async def delete(self, name: str) -> None: ...


class ApiError(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


def _json(body: Any, status: int = 200) -> web.Response:
    return web.Response(status=status, text=json.dumps(body), content_type="application/json")


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except ApiError as exc:
        return _json({"error_code": exc.code, "message": exc.message}, exc.code)
    except web.HTTPException as exc:
        return _json({"error_code": exc.status, "message": exc.reason or str(exc)}, exc.status)
    except Exception as exc:  # noqa: BLE001 - answered like Kafka Connect's 500, and logged
        log.exception("connect API: %s %s failed", request.method, request.path)
        return _json({"error_code": 500, "message": f"{type(exc).__name__}: {exc}"}, 500)


def app(backend: Backend, users: Mapping[str, str] | None = None) -> web.Application:
    """The API on ``backend``. Every request first catches up with the cluster's config topic,
    so that whichever process a client asks, it sees every change made before it asked.
    ``users``: basic auth's users and passwords (none: no basic auth)."""
    routes = web.RouteTableDef()

    @web.middleware
    async def authenticated(request: web.Request, handler: Handler) -> web.StreamResponse:
        if users and not check_basic(users, request.headers.get("Authorization")):
            response = _json({"error_code": 401, "message": "User cannot access the resource."}, 401)
            response.headers["WWW-Authenticate"] = 'Basic realm="icesink connect"'
            return response
        return await handler(request)

    @web.middleware
    async def synced(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path != "/metrics":
            await backend.sync()
        return await handler(request)

    def known(name: str) -> dict[str, str]:
        config = backend.config(name)
        if config is None:
            raise ApiError(404, f"Connector {name} not found")
        return config

    def info(name: str) -> dict[str, Any]:
        config = shown(known(name))
        return {"name": name, "config": config, "type": "sink",
                "tasks": [{"connector": name, "task": i} for i in range(backend.tasks(name))]}

    async def body(request: web.Request) -> Any:
        try:
            return await request.json()
        except (ValueError, UnicodeDecodeError) as exc:
            raise ApiError(400, f"Request body is not JSON: {exc}") from None

    def checked(name: str, config: Any) -> dict[str, str]:
        if not isinstance(config, dict):
            raise ApiError(400, "Connector config must be a JSON object")
        if config.get("name", name) != name:
            raise ApiError(400, f"Connector name configuration ({config['name']}) doesn't match connector name in "
                                f"the URL ({name})")
        flat = {str(k): v if isinstance(v, str) else json.dumps(v) for k, v in config.items()}
        flat["name"] = name
        try:
            return backend.check(name, flat)
        except ConfigError as exc:
            raise ApiError(400, f"Connector configuration is invalid: {exc}") from None

    @routes.get("/")
    async def root(request: web.Request) -> web.Response:
        return _json({"version": VERSION, "commit": "icesink", "kafka_cluster_id": backend.worker_id})

    @routes.get("/connectors")
    async def listing(request: web.Request) -> web.Response:
        names = sorted(backend.names())
        if "expand" in request.query:
            expand = request.query.getall("expand")
            out: dict[str, Any] = {}
            for n in names:
                out[n] = {**({"status": backend.status(n)} if "status" in expand else {}),
                          **({"info": info(n)} if "info" in expand else {})}
            return _json(out)
        return _json(names)

    @routes.post("/connectors")
    async def create(request: web.Request) -> web.Response:
        data = await body(request)
        if not isinstance(data, dict) or not isinstance(data.get("name"), str) or not data["name"]:
            raise ApiError(400, "Connector name must be given as \"name\"")
        name = data["name"]
        if backend.config(name) is not None:
            raise ApiError(409, f"Connector {name} already exists")
        await backend.put(name, checked(name, data.get("config", {})))
        return _json(info(name), 201)

    @routes.get("/connectors/{name}")
    async def get(request: web.Request) -> web.Response:
        return _json(info(request.match_info["name"]))

    @routes.get("/connectors/{name}/config")
    async def get_config(request: web.Request) -> web.Response:
        return _json(shown(known(request.match_info["name"])))

    @routes.put("/connectors/{name}/config")
    async def put_config(request: web.Request) -> web.Response:
        name = request.match_info["name"]
        created = await backend.put(name, checked(name, await body(request)))
        return _json(info(name), 201 if created else 200)

    @routes.get("/connectors/{name}/status")
    async def status(request: web.Request) -> web.Response:
        name = request.match_info["name"]
        known(name)
        return _json(backend.status(name))

    @routes.get("/connectors/{name}/tasks")
    async def tasks(request: web.Request) -> web.Response:
        name = request.match_info["name"]
        config = shown(known(name))
        return _json([{"id": {"connector": name, "task": i}, "config": config} for i in range(backend.tasks(name))])

    async def set_target(request: web.Request, target: str) -> web.Response:
        name = request.match_info["name"]
        known(name)
        await backend.set_target(name, target)
        return web.Response(status=202)

    @routes.put("/connectors/{name}/pause")
    async def pause(request: web.Request) -> web.Response:
        return await set_target(request, "PAUSED")

    @routes.put("/connectors/{name}/resume")
    async def resume(request: web.Request) -> web.Response:
        return await set_target(request, "RUNNING")

    @routes.post("/connectors/{name}/restart")
    async def restart(request: web.Request) -> web.Response:
        name = request.match_info["name"]
        known(name)
        await backend.restart(name)
        return web.Response(status=204)

    @routes.delete("/connectors/{name}")
    async def delete(request: web.Request) -> web.Response:
        name = request.match_info["name"]
        known(name)
        await backend.delete(name)
        return web.Response(status=204)

    application = web.Application(middlewares=[_errors, authenticated, synced])
    application.add_routes(routes)
    return application
