"""The REST API of ``icesink connect``, shaped as Kafka Connect's (same paths, status codes and
JSON): what users of the reference sink's tutorial ``curl``. The cluster behind it
(:class:`icesink.app.connect.Cluster`) keeps connectors in the config topic and runs their tasks;
this module only maps requests to it and its answers to Kafka Connect's JSON.

Every path also answers with a trailing slash (``POST /connectors/``), as Kafka Connect's Jersey
does. Errors are ``{"error_code": N, "message": "..."}``; an invalid connector config is a 400
whose message names the key (``connector.class`` must name the Iceberg sink, the reference's or
Tabular's; :mod:`icesink.app.connect_admin`) (icesink's own settings check, the one ``icesink worker`` runs, and what a
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

from icesink.app import connect_admin
from icesink.app.connect_offsets import ALLOW_DUPLICATES, ALTERED, RESET, OffsetsRefused, parse_sink_offsets
from icesink.app.connect_policy import shown
from icesink.app.connect_security import check_basic
from icesink.app.connect_state import FAILED, STOPPED
from icesink.shared.errors import ConfigError
from icesink.shared.protocol import TopicPartition

log = logging.getLogger(__name__)

VERSION = "3.8.0-icesink-0.1.0"


class Backend(Protocol):
    worker_id: str
    kafka_cluster_id: str
    failure: BaseException | None

    async def sync(self) -> None: ...
    def names(self) -> list[str]: ...
    def config(self, name: str) -> dict[str, str] | None: ...
    def tasks(self, name: str) -> int: ...
    def status(self, name: str) -> dict[str, Any]: ...
    def check(self, name: str, config: dict[str, str]) -> dict[str, str]: ...
    async def put(self, name: str, config: dict[str, str]) -> bool: ...
    async def set_target(self, name: str, target: str) -> None: ...
    async def restart(self, name: str, tasks: tuple[int, ...]) -> None: ...
    async def delete(self, name: str) -> None: ...
    async def offsets(self, name: str) -> list[dict[str, Any]]: ...
    async def change_offsets(self, name: str, offsets: dict[TopicPartition, int | None] | None,
                             allow_duplicates: bool) -> None: ...


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
        if not request.path.startswith("/metrics"):  # /metrics, /metrics/targets: this process's own
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
            # 500, as Kafka Connect answers a body Jackson cannot parse (its exception mapper)
            raise ApiError(500, f"Request body is not JSON: {exc}") from None

    def checked(name: str, config: Any) -> dict[str, str]:
        if not isinstance(config, dict):
            raise ApiError(400, "Connector config must be a JSON object")
        if config.get("name", name) != name:
            raise ApiError(400, f"Connector name configuration ({config['name']}) doesn't match connector name in "
                                f"the URL ({name})")
        flat = {str(k): v if isinstance(v, str) else json.dumps(v) for k, v in config.items()}
        flat["name"] = name
        try:
            connect_admin.check_class(flat)
            return backend.check(name, flat)
        except ConfigError as exc:
            raise ApiError(400, f"Connector configuration is invalid: {exc}") from None

    @routes.get("/")
    async def root(request: web.Request) -> web.Response:
        return _json({"version": VERSION, "commit": "icesink", "kafka_cluster_id": backend.kafka_cluster_id})

    @routes.get("/health")
    async def health(request: web.Request) -> web.Response:
        if backend.failure is not None:
            return _json({"status": "unhealthy", "message": "Worker was unable to handle this request and may be "
                          f"unable to handle other requests. {backend.failure}"}, 500)
        return _json({"status": "healthy", "message": "Worker has completed startup and is ready to handle requests."})

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

    @routes.patch("/connectors/{name}/config")
    async def patch_config(request: web.Request) -> web.Response:
        """Connect's PATCH: the keys given replace the stored ones, a null removes one."""
        name = request.match_info["name"]
        stored = known(name)
        patch = await body(request)
        if not isinstance(patch, dict):
            raise ApiError(400, "Connector config must be a JSON object")
        merged: dict[str, Any] = {**stored, **patch}
        await backend.put(name, checked(name, {k: v for k, v in merged.items() if v is not None}))
        return _json(info(name))

    @routes.put("/connectors/{name}/stop")
    async def stop(request: web.Request) -> web.Response:
        name = request.match_info["name"]
        known(name)
        await backend.set_target(name, STOPPED)
        return web.Response(status=204)

    @routes.post("/connectors/{name}/restart")
    async def restart(request: web.Request) -> web.Response:
        """Connect's restart: without parameters the connector only (204); with
        ``includeTasks``/``onlyFailed`` what they select, answered 202 with the plan (the
        status, RESTARTING where a restart was asked)."""
        name = request.match_info["name"]
        known(name)
        include_tasks, only_failed = flag(request, "includeTasks"), flag(request, "onlyFailed")
        if not include_tasks and not only_failed:
            await backend.restart(name, ())
            return web.Response(status=204)
        plan = backend.status(name)
        if not only_failed or plan["connector"]["state"] == FAILED:
            plan["connector"] = {**plan["connector"], "state": "RESTARTING"}
        chosen = tuple(t["id"] for t in plan["tasks"] if include_tasks and (not only_failed or t["state"] == FAILED))
        plan["tasks"] = [{**t, "state": "RESTARTING"} if t["id"] in chosen else t for t in plan["tasks"]]
        await backend.restart(name, chosen)
        return _json(plan, 202)

    def flag(request: web.Request, key: str) -> bool:
        return request.query.get(key, "false").strip().lower() == "true"

    def task_of(request: web.Request) -> tuple[str, int]:
        name, raw = request.match_info["name"], request.match_info["task"]
        known(name)
        if not raw.isdigit() or int(raw) >= backend.tasks(name):
            raise ApiError(404, f"No status found for task {name}-{raw}")
        return name, int(raw)

    @routes.get("/connectors/{name}/tasks/{task}/status")
    async def task_status(request: web.Request) -> web.Response:
        name, task = task_of(request)
        return _json(backend.status(name)["tasks"][task])

    @routes.post("/connectors/{name}/tasks/{task}/restart")
    async def task_restart(request: web.Request) -> web.Response:
        name, task = task_of(request)
        await backend.restart(name, (task,))
        return web.Response(status=204)

    @routes.get("/connectors/{name}/topics")
    async def topics(request: web.Request) -> web.Response:
        """The connector's topics: the configured ones (icesink reads every configured topic
        from its start; a ``topics.regex`` connector shows the topics its tables hold offsets of)."""
        name = request.match_info["name"]
        config = known(name)
        listed = [t.strip() for t in config.get("topics", "").split(",") if t.strip()]
        if not listed and config.get("topics.regex"):
            listed = sorted({o["partition"]["kafka_topic"] for o in await backend.offsets(name)})
        return _json({name: {"topics": listed}})

    @routes.put("/connectors/{name}/topics/reset")
    async def topics_reset(request: web.Request) -> web.Response:
        known(request.match_info["name"])  # the topics shown are the configured ones: nothing to forget
        return web.Response(status=202)

    @routes.get("/connectors/{name}/offsets")
    async def offsets(request: web.Request) -> web.Response:
        name = request.match_info["name"]
        known(name)
        return _json({"offsets": await backend.offsets(name)})

    async def change_offsets(request: web.Request) -> web.Response:
        """KIP-875 for a sink: only while the connector is STOPPED; PATCH moves the given
        partitions, DELETE every partition to its beginning. icesink moves the positions its
        coordinator resumes from (docs/commits.md, "Altering and resetting offsets"); a move
        back below what the tables hold is refused unless ``?allow_duplicates=true``."""
        name = request.match_info["name"]
        known(name)
        wanted = None
        if request.method == "PATCH":
            try:
                wanted = parse_sink_offsets(await body(request))
            except OffsetsRefused as exc:
                raise ApiError(400, str(exc)) from None
        if backend.status(name)["connector"]["state"] != STOPPED:
            raise ApiError(400, "Connectors must be in the STOPPED state before their offsets can be modified. This "
                           "can be done for the specified connector by issuing a 'PUT' request to the "
                           f"'/connectors/{name}/stop' endpoint")
        try:
            await backend.change_offsets(name, wanted, flag(request, ALLOW_DUPLICATES))
        except OffsetsRefused as exc:
            raise ApiError(400, str(exc)) from None
        return _json({"message": ALTERED if wanted is not None else RESET})

    routes.patch("/connectors/{name}/offsets")(change_offsets)
    routes.delete("/connectors/{name}/offsets")(change_offsets)

    @routes.get("/connector-plugins")
    async def plugins(request: web.Request) -> web.Response:
        return _json(connect_admin.plugins())

    @routes.put("/connector-plugins/{plugin}/config/validate")
    async def validate(request: web.Request) -> web.Response:
        plugin, config = request.match_info["plugin"], await body(request)
        if not isinstance(config, dict):
            raise ApiError(400, "Connector config must be a JSON object")
        flat = {str(k): v if isinstance(v, str) else json.dumps(v) for k, v in config.items()}
        klass = flat.get("connector.class")
        if klass is not None and not connect_admin.plugin_matches(plugin, klass):
            raise ApiError(400, f"Included connector type {klass} does not match request type {plugin}")
        if klass is None:
            if not connect_admin.is_iceberg_sink(plugin):
                raise ApiError(400, f"Connector config {shown(flat)} contains no connector type")
            flat["connector.class"] = plugin
        name = flat.get("name") or "validate"
        return _json(connect_admin.validate(flat, lambda c: backend.check(name, {**c, "name": name})))

    @routes.get("/admin/loggers")
    async def loggers(request: web.Request) -> web.Response:
        return _json(connect_admin.loggers())

    @routes.get("/admin/loggers/{logger}")
    async def get_logger(request: web.Request) -> web.Response:
        name = request.match_info["logger"]
        found = connect_admin.logger(name)
        if found is None:
            raise ApiError(404, f"Logger {name} not found.")
        return _json(found)

    @routes.put("/admin/loggers/{logger}")
    async def set_logger(request: web.Request) -> web.Response:
        """This process's loggers (``scope=worker``, Connect's default). A task's replica is a
        process of its own: its log level is its config's."""
        name, data = request.match_info["logger"], await body(request)
        if not isinstance(data, dict) or not isinstance(data.get("level"), str):
            raise ApiError(400, "Desired 'level' parameter was not specified in request.")
        if request.query.get("scope", "worker").lower() == "cluster":
            raise ApiError(400, "scope=cluster is not supported by icesink connect: set the level on each process "
                           "(scope=worker)")
        changed = connect_admin.set_level(name, data["level"])
        if changed is None:
            raise ApiError(404, f"invalid log level '{data['level']}'.")
        return _json(changed)

    @routes.delete("/connectors/{name}")
    async def delete(request: web.Request) -> web.Response:
        name = request.match_info["name"]
        known(name)
        await backend.delete(name)
        return web.Response(status=204)

    application = web.Application(middlewares=[_errors, authenticated, synced])
    application.add_routes(routes)
    # Jersey matches a path with a trailing slash as the path (seed 003's ``POST /connectors/``).
    application.add_routes([web.route(r.method, r.path.rstrip("/") + "/", r.handler)
                            for r in routes if isinstance(r, web.RouteDef) and r.path != "/"])
    return application


def metrics_app(backend: Backend, metrics: Handler) -> web.Application:
    """The metrics-only port (``metrics.port``): ``/metrics`` for Prometheus, and ``/health`` for
    probes that cannot send the API's basic auth (Kubernetes liveness): the status alone, no
    detail of a failure (the authenticated API's ``/health`` gives it)."""

    async def health(_: web.Request) -> web.Response:
        if backend.failure is not None:
            return _json({"status": "unhealthy", "message": "Worker is unable to handle requests; the authenticated "
                          "/health of the REST API says why."}, 500)
        return _json({"status": "healthy", "message": "Worker has completed startup and is ready to handle requests."})

    application = web.Application()
    application.router.add_get("/metrics", metrics)
    application.router.add_get("/health", health)
    return application
