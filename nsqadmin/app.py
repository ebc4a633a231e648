"""The aiohttp application: routes under --base-path, the jinja2 templates, static assets,
and Go's replies for what matches no route (`{"message":"NOT_FOUND"}` 404,
`METHOD_NOT_ALLOWED` 405)."""

import mimetypes
import time
from pathlib import Path
from typing import TYPE_CHECKING

import jinja2
from aiohttp import web

from nsqpy.nsqadmin.api import API, v1_error
from nsqpy.nsqadmin.cluster import ACTING_CREDENTIAL
from nsqpy.nsqadmin.format import FILTERS
from nsqpy.nsqadmin.pages import Pages

if TYPE_CHECKING:
    from nsqpy.nsqadmin.server import NSQAdmin

PACKAGE_DIR = Path(__file__).parent
STATIC_DIR = PACKAGE_DIR / "static"
TEMPLATE_DIR = PACKAGE_DIR / "templates"


def template_environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATE_DIR),
        autoescape=jinja2.select_autoescape(["html"]),
        trim_blocks=True,
        lstrip_blocks=True,
        undefined=jinja2.StrictUndefined,
    )
    env.filters.update(FILTERS)
    return env


def build_app(admin: "NSQAdmin") -> web.Application:
    options = admin.options
    prefix = options.base_path.rstrip("/")
    static_dir = Path(options.dev_static_dir) if options.dev_static_dir else STATIC_DIR
    app = web.Application(middlewares=[_go_errors(admin)])
    pages = Pages(admin, template_environment(), prefix)
    app.add_routes(API(admin).routes(prefix))
    app.add_routes(pages.routes())
    app.add_routes([web.get(f"{prefix}/static/{{asset}}", _static_handler(static_dir))])
    return app


def _static_handler(static_dir: Path):
    async def static(request: web.Request) -> web.StreamResponse:
        name = request.match_info["asset"]
        path = static_dir / name
        if name.startswith(".") or not path.is_file():
            return v1_error(404, "NOT_FOUND")
        content_type = mimetypes.guess_type(name)[0] or "application/octet-stream"
        response = web.FileResponse(path, headers={"Content-Type": content_type})
        response.headers["Cache-Control"] = "max-age=300"
        return response

    return static


def _go_errors(admin: "NSQAdmin"):
    @web.middleware
    async def middleware(request: web.Request, handler) -> web.StreamResponse:
        started = time.monotonic()
        ACTING_CREDENTIAL.set(request.headers.get("Authorization"))
        try:
            response = await handler(request)
        except web.HTTPNotFound:
            response = v1_error(404, "NOT_FOUND")
        except web.HTTPMethodNotAllowed:
            response = v1_error(405, "METHOD_NOT_ALLOWED")
        except web.HTTPException:
            raise
        except Exception:
            admin.log.exception("HTTP: internal error on %s %s", request.method, request.path)
            response = v1_error(500, "INTERNAL_ERROR")
        # Go's http_api.Log decorator, at debug level.
        admin.log.debug(
            "%d %s %s (%s) %.3fms",
            response.status,
            request.method,
            request.path_qs,
            request.remote,
            (time.monotonic() - started) * 1000,
        )
        return response

    return middleware
