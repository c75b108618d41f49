"""What every area's routes share: the app's settings, NATS connection and templates (on
`app.state`), the page renderer, the form reader, the same-origin check and the answers they
give (a 303 back to a page with a message, a 403, an event stream)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from urllib.parse import parse_qs, quote, urlencode, urlsplit

import jinja2
from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response, StreamingResponse
from starlette.templating import Jinja2Templates

from populace.core import bus
from populace.manager.settings import ManagerSettings

# Every request body (a scenario pasted or loaded into the form is the largest): one declared
# larger is refused by its Content-Length before it is read, one without a length is cut off
# as it passes the limit (Starlette's max_body_size; a 413 either way).
MAX_FORM_BYTES = 1_048_576


def templates() -> Jinja2Templates:
    env = jinja2.Environment(loader=jinja2.PackageLoader("populace.manager", "templates"),
                             autoescape=True, undefined=jinja2.StrictUndefined)
    return Jinja2Templates(env=env)


def settings_of(request: Request) -> ManagerSettings:
    return request.app.state.settings


def nc_of(request: Request):
    """The manager's one NATS connection (opened in the app's lifespan)."""
    return request.app.state.nc


def page(request: Request, name: str, status_code: int = 200, **context) -> Response:
    """A template rendered with the title and the message or error the URL carries."""
    context = {"title": settings_of(request).title, "msg": request.query_params.get("msg", ""),
               "error": request.query_params.get("error", ""), **context}
    return request.app.state.templates.TemplateResponse(request, name, context, status_code=status_code)


async def read_form(request: Request) -> dict[str, str]:
    """An urlencoded form (the pages post nothing else: a scenario file is read into the
    textarea by the page's script), last value per key. At most MAX_FORM_BYTES: the app
    refuses a larger body with a 413 before this reads it."""
    body = await request.body()
    pairs = parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True)
    return {k: v[-1] for k, v in pairs.items()}


def same_origin(request: Request) -> bool:
    """A POST from one of our own pages: a browser sends Origin (or at least Referer) with a
    form's POST; one from another site is refused (with an access token too)."""
    origin = request.headers.get("origin") or request.headers.get("referer")
    if not origin:
        return True  # not a browser (curl, a test client): nothing to forge
    host = request.headers.get("host", "")
    return urlsplit(origin).netloc == host


def forbidden() -> Response:
    return PlainTextResponse("cross-site form posts are refused", status_code=403)


def back(path: str, **params: object) -> RedirectResponse:
    """303 to one of our own pages (the path quoted), with a message or an error to show."""
    query = urlencode({k: v for k, v in params.items() if v not in (None, "")})
    return RedirectResponse(quote(path) + (f"?{query}" if query else ""), status_code=303)


def short(err: Exception) -> str:
    return bus.short_error(err) if isinstance(err, ValidationError) else str(err)


def sse(body: AsyncIterator[bytes]) -> StreamingResponse:
    return StreamingResponse(body, media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
