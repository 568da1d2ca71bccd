"""The dashboard's routes: pages (server-rendered from templates/), their JSON, event streams, actions.

Why starlette (with uvicorn, server.py): a small, well-kept ASGI toolkit — routing, static files, streaming
responses for server-sent events, Jinja2 templates — and uvicorn is already how ngcx-runtime serves. Pages are
rendered on the server, so the first paint needs no script and no API round trip (issue 23: < 1 s, < 500 KB
with 200 deployments and 500 images); the one script (static/dashboard.js) swaps the parts marked data-live
when the page's event stream says something changed, and draws the deployment page's charts with uPlot.

Every page renders from one `Context` (the scrapers, the watcher, the jobs): nothing lives at module level.
A store that cannot be read is a banner on the page (events.describe), never a traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.middleware.gzip import GZipMiddleware
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from ..core.errors import UserError
from . import actions, events, views
from .guard import Guard, csrf_of
from .scrape import Scrapers
from .trust import TrustChecks

HERE = Path(__file__).parent
LOGS_TIMEOUT_S = 20.0       # a cloud's command channel (Cloud Assistant, SSM) may take this long for a log tail
ORPHANS_EVERY_S = 120.0     # `deployments gc`'s search calls every cloud's API: not on every page view


@dataclass
class Context:
    """What the routes share for one dashboard: the token, the scrapers, the store watcher, the jobs."""

    token: str
    scrapers: Scrapers
    jobs: actions.Jobs = field(default_factory=actions.Jobs)
    orphans: dict[str, Any] = field(default_factory=dict)
    watcher: events.Watcher | None = None
    trust: TrustChecks = field(default_factory=TrustChecks)

    def health(self, record_id: int) -> dict[str, Any]:
        return self.scrapers.health(record_id)


def create(ctx: Context, port: int, hosts: set[str] | None) -> Any:
    """The ASGI app: routes behind the token guard, gzip for pages and JSON."""
    templates = Jinja2Templates(directory=str(HERE / "templates"))
    templates.env.filters.update(_FILTERS)
    pages = Pages(ctx, templates)
    routes = [
        Route("/", pages.overview),
        Route("/deployments/{ref}", pages.deployment),
        Route("/images/{ref:path}", pages.image),
        Route("/catalog", pages.catalog),
        Route("/api/overview", pages.overview_json),
        Route("/api/deployments/{ref}/points", pages.points),
        Route("/api/deployments/{ref}/logs", pages.logs),
        Route("/api/deployments/{ref}/{verb}", pages.act, methods=["POST"]),
        Route("/api/jobs/{job:int}", pages.job),
        Route("/api/pushes/{push:int}/sbom.cdx.json", pages.sbom),
        Route("/events", pages.events),
        Route("/events/deployments/{ref}", pages.deployment_events),
        Route("/favicon.ico", _favicon),
        Mount("/static", StaticFiles(directory=str(HERE / "static")), name="static"),
    ]
    app = Starlette(routes=routes, lifespan=pages.lifespan,
                    exception_handlers={NotFound: _not_found, BadQuery: _bad_query})
    app.add_middleware(GZipMiddleware, minimum_size=1024)
    return Guard(app, ctx.token, port, hosts)


class Pages:
    def __init__(self, ctx: Context, templates: Jinja2Templates) -> None:
        self.ctx, self.templates = ctx, templates
        self._logs: dict[int, asyncio.Task] = {}

    @contextlib.asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        """Start the store watcher and the orphan search with the server; stop the scrapers with it."""
        from ..state import db

        self.ctx.watcher = events.Watcher(db.db_path(), self._moving_parts, self._sync_scrapers)
        tasks = [asyncio.create_task(self.ctx.watcher.run()), asyncio.create_task(self._watch_orphans()),
                 asyncio.create_task(asyncio.to_thread(self._warm))]
        try:
            yield
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.to_thread(self.ctx.scrapers.close)
            self.ctx.trust.close()

    def _warm(self) -> None:
        """Build the overview once while nobody waits: the first build loads the offers tables and the templates'
        modules (about 0.4 s here, bench/results/dashboard.json), later ones take about 40 ms."""
        with contextlib.suppress(UserError):
            self.templates.env.get_template("overview.html.j2")
            self._overview_data()

    def _moving_parts(self) -> tuple:
        """What changes besides the store: the actions' output, the endpoints' health, the pushes' checks."""
        return self.ctx.jobs.version, self.ctx.scrapers.states(), self.ctx.trust.version()

    # ------------------------------------------------------------------ pages

    async def overview(self, request: Request) -> Response:
        return await self._page(request, "overview.html.j2", self._overview_data)

    async def overview_json(self, request: Request) -> Response:
        return await self._json(self._overview_data)

    async def deployment(self, request: Request) -> Response:
        ref = request.path_params["ref"]
        if ref.startswith("s") and ref[1:].isdigit():
            return await self._page(request, "service.html.j2",
                                    lambda: dict(views.service(int(ref[1:]), self.ctx.health), ref=ref))
        return await self._page(request, "deployment.html.j2",
                                lambda: dict(views.deployment(_record_id(ref), self.ctx.health),
                                             jobs=self.ctx.jobs.of(ref)))

    async def image(self, request: Request) -> Response:
        from .images import image_detail

        def data() -> dict[str, Any]:
            detail = image_detail(request.path_params["ref"])
            self.ctx.trust.annotate(detail["pushes"])      # verified off this thread; waits PAGE_WAIT_S at most
            return {"image": detail}

        return await self._page(request, "image.html.j2", data)

    async def sbom(self, request: Request) -> Response:
        """The CycloneDX JSON of a recorded push, from its verified attestation only (409 with the reason if the
        push does not verify; 404 for a push id the store does not hold)."""
        from .images import push_by_id

        push = await asyncio.to_thread(push_by_id, request.path_params["push"])
        if push is None:
            raise NotFound(f"no push {request.path_params['push']} in the state store")
        body, why = await asyncio.to_thread(self.ctx.trust.sbom, push.remote_ref, push.digest)
        if body is None:
            return PlainTextResponse(f"no verified SBOM: {why}\n", status_code=409)
        name = push.remote_ref.rsplit("/", 1)[-1].replace(":", "-")
        return Response(body, media_type="application/vnd.cyclonedx+json", headers={
            "Content-Disposition": f'attachment; filename="{name}-{push.digest[7:19]}.cdx.json"'})

    async def catalog(self, request: Request) -> Response:
        from .images import catalog_matrix

        return await self._page(request, "catalog.html.j2", lambda: {"catalog": catalog_matrix()})

    # ------------------------------------------------------------------ data for scripts

    async def points(self, request: Request) -> Response:
        record_id = _record_id(request.path_params["ref"])
        try:
            since = float(request.query_params.get("since", "0") or 0)
        except ValueError:
            raise BadQuery("since= takes unix seconds, e.g. since=1795668302.5") from None
        return JSONResponse({"points": self.ctx.scrapers.points(record_id, since),
                             "health": self.ctx.health(record_id)})

    async def logs(self, request: Request) -> Response:
        """The tail of the deployment's logs; one fetch per deployment at a time (a slow cloud never piles up)."""
        record_id = _record_id(request.path_params["ref"])
        task = self._logs.get(record_id)
        if task is None or task.done():
            task = self._logs[record_id] = asyncio.ensure_future(asyncio.to_thread(_logs_of, record_id))
        try:
            text = await asyncio.wait_for(asyncio.shield(task), LOGS_TIMEOUT_S)
        except TimeoutError:
            text = f"(the logs did not come within {LOGS_TIMEOUT_S:.0f} s; trying again)"
        except UserError as exc:
            text = f"({exc.message})"
        except Exception as exc:  # noqa: BLE001 - an engine's or a cloud's failure is this panel's text, not a 500
            text = f"(the logs could not be read: {type(exc).__name__}: {str(exc)[:200]})"
        return PlainTextResponse(text)

    async def act(self, request: Request) -> Response:
        ref, verb = request.path_params["ref"], request.path_params["verb"]
        try:
            job = self.ctx.jobs.start(verb, ref)
        except actions.JobRefused as exc:
            return JSONResponse({"error": str(exc)}, status_code=409)
        return JSONResponse(job.as_json(), status_code=202)

    async def job(self, request: Request) -> Response:
        found = self.ctx.jobs.get(request.path_params["job"])
        return JSONResponse(found or {"error": "no such job"}, status_code=200 if found else 404)

    async def events(self, request: Request) -> Response:
        return _sse(events.stream(self._watcher()))

    async def deployment_events(self, request: Request) -> Response:
        record_id = _record_id(request.path_params["ref"])
        last = {"t": time.time() - 1.0}

        async def points() -> AsyncIterator[str]:
            for point in self.ctx.scrapers.points(record_id, last["t"]):
                last["t"] = point["t"]
                yield events.event("point", point)

        return _sse(events.stream(self._watcher(), points))

    # ------------------------------------------------------------------ helpers

    def _watcher(self) -> events.Watcher:
        assert self.ctx.watcher is not None, "the app's startup makes the watcher"
        return self.ctx.watcher

    def _overview_data(self) -> dict[str, Any]:
        from .images import builds, image_rows

        return views.overview(self.ctx.health, self.ctx.orphans, image_rows(), builds())

    async def _page(self, request: Request, template: str, data: Any) -> Response:
        """Render `template` with `data()` (read in a thread); an unreadable store is a banner, not a 500."""
        status, problem, found = 200, None, {}
        try:
            found = await asyncio.to_thread(data)
        except NotFound as exc:
            status, problem = 404, str(exc)
        except UserError as exc:
            status, problem = _status_of(exc), exc.message
        watcher = self.ctx.watcher
        problem = problem or (watcher.problem if watcher else None)
        context = dict(found, problem=problem, csrf=csrf_of(self.ctx.token), now=time.time(), path=request.url.path)
        return self.templates.TemplateResponse(request, template if status == 200 else "missing.html.j2", context,
                                               status_code=status)

    async def _json(self, data: Any) -> Response:
        try:
            return JSONResponse(await asyncio.to_thread(data))
        except UserError as exc:
            return JSONResponse({"error": exc.message}, status_code=503)

    def _sync_scrapers(self) -> None:
        """Watch every ready deployment's /metrics (with its key and pinned certificate) and no other."""
        from ..deploy import keys, store
        from ..deploy.common import READY
        from .scrape import Target

        try:
            records = store.records()
        except UserError:
            return
        self.ctx.scrapers.sync(Target(r.id, r.endpoint, keys.get(r.id), r.spec.get("tls_sha256"))
                               for r in records if r.status == READY and r.endpoint)

    async def _watch_orphans(self) -> None:
        from ..deploy import gc

        while True:
            try:
                found = await asyncio.wait_for(asyncio.to_thread(gc.find), ORPHANS_EVERY_S)
                self.ctx.orphans.update(count=len(found), checked=time.time(), error=None)
            except (UserError, TimeoutError) as exc:
                self.ctx.orphans.update(error=getattr(exc, "message", None) or "the clouds did not answer in time")
            await asyncio.sleep(ORPHANS_EVERY_S)


class NotFound(LookupError):
    """A page or API path naming something that is not there (404, one line)."""


class BadQuery(ValueError):
    """A query parameter that does not parse (400, one line)."""


async def _favicon(request: Request) -> Response:
    """The icon, also where a browser looks without a <link rel=icon> (a 404 here was a console error on every
    page in Chromium: issue 46). base.html.j2 links it; it is shipped in static/, so it is served offline."""
    return FileResponse(HERE / "static" / "favicon.svg", media_type="image/svg+xml",
                        headers={"Cache-Control": "max-age=86400"})


async def _not_found(request: Request, exc: Exception) -> Response:
    return PlainTextResponse(f"{exc}\n", status_code=404)


async def _bad_query(request: Request, exc: Exception) -> Response:
    return PlainTextResponse(f"{exc}\n", status_code=400)


def _status_of(exc: UserError) -> int:
    """A library's one-line error as an HTTP status: the store unreadable is 503, a bad reference 400, something
    that is not there ("no deployment 7", "no local image …") 404, anything else (an invalid catalog) 503."""
    if exc.message.startswith("state database"):
        return 503
    if "is not an image reference" in exc.message:
        return 400
    return 404 if exc.message.startswith("no ") else 503


def _record_id(ref: str) -> int:
    if not ref.isdigit():
        raise NotFound(f"no deployment {ref!r}: ids are numbers (services are s<N>)")
    return int(ref)


def _logs_of(record_id: int) -> str:
    from ..deploy import store, target
    from ..deploy.common import LIVE

    record = store.get(record_id)
    if record.status not in LIVE:
        return f"(deployment {record_id} is {record.status}: no logs)"
    return target(record.cloud).logs(record, 100)


def _sse(body: AsyncIterator[str]) -> StreamingResponse:
    return StreamingResponse(body, media_type="text/event-stream",
                             headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    days, rest = divmod(max(0, int(seconds)), 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d {hours}h"
    if hours:
        return f"{hours}h {minutes}m"
    return f"{minutes}m {secs}s" if minutes else f"{secs}s"


def _size(n: float | None) -> str:
    if n is None:
        return "—"
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


def _money(value: float | None, currency: str = "") -> str:
    return "—" if value is None else f"{value:.2f} {currency}/h".strip()


def _when(ts: float | None) -> str:
    return "—" if not ts else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


def _show(value: Any) -> str:
    """A record's field as a reader wants it: JSON for mappings and lists, the text otherwise."""
    return json.dumps(value, sort_keys=True) if isinstance(value, dict | list) else str(value)


_FILTERS = {"duration": _duration, "size": _size, "money": _money, "when": _when, "show": _show}
