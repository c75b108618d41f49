"""The manager's access token: an ASGI middleware in front of every route.

The operator sets a token (`populace manager --token`, or POPULACE_MANAGER_TOKEN). With a token,
every page, form POST and event stream asks for it:
- a browser signs in once on `/login` (one field). The answer is a cookie that is HttpOnly and
  SameSite=Strict (Secure over https). The cookie holds an HMAC of the token, not the token;
- a script sends `Authorization: Bearer <token>`.

A wrong or missing token gets a 401 (a page for a browser's form, text for the rest). A
browser's GET without a token goes to the login page. The token is compared in constant time
(hmac.compare_digest over digests, so its length does not show either) and never logged.
Guessing is slow and bounded (`LoginLimits`): every wrong token (a sign-in, a bearer token, a
forged cookie) is answered `delay_s` late, and a client (an address; IPv6 by its /64) with
`failures` wrong tokens in `window_s` has its next wrong ones answered 429 with Retry-After
until the oldest of them leaves the window. The right token and a valid session cookie always
pass, so the limit cannot keep the operator out (every user behind a proxy shares its address);
a token has at least MIN_TOKEN_CHARS characters, so guessing it a second at a time is hopeless.
`/healthz` stays open: it says only whether the manager's NATS connection is up, for a
container's healthcheck.

Without a token the manager must listen on a loopback address (`bind_refusal`), and it
answers only requests whose Host header is a loopback name or address (`loopback_host`): a
page of another site whose name an attacker re-pointed at 127.0.0.1 (DNS rebinding) reaches
the socket, but its requests name that site and get a 421. The same-origin check on POSTs
(web.py) applies with or without a token.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import html
import ipaddress
import math
import re
import time
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from urllib.parse import parse_qs, quote, urlsplit

from starlette.middleware.body_limit import RequestBodyLimitMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from populace.core import logs

TOKEN_ENV = "POPULACE_MANAGER_TOKEN"
COOKIE = "populace_manager"
LOGIN, LOGOUT = "/login", "/logout"
OPEN_PATHS = frozenset({"/healthz"})  # no token: a container healthcheck reads it
MAX_LOGIN_BYTES = 4096  # the sign-in form's body: one field (a larger one is a 413, unread)


log = logs.get("populace.manager")


def is_loopback(host: str) -> bool:
    """`host` (a name or an address, no port) is this machine's loopback: `localhost`, 127.0.0.0/8, ::1."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


# A Host header: a name or IPv4 address, or an IPv6 address in brackets, then maybe a port.
_HOST_HEADER = re.compile(r"(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<name>[A-Za-z0-9.-]+))(?::[0-9]{1,5})?")


def loopback_host(header: str) -> bool:
    """A request's Host header names a loopback name or address (with or without a port).
    Starlette's TrustedHostMiddleware matches names only (not 127.0.0.0/8, not `[::1]:8080`)."""
    m = _HOST_HEADER.fullmatch(header)
    if m is None:
        return is_loopback(header)  # a bare IPv6 address, as some clients send it
    return is_loopback(m.group("v6") or m.group("name"))


# A token must take longer to guess than anyone can try: a right one always passes (the limit on
# wrong ones never locks its operator out), so the token's own length is what bounds guessing.
MIN_TOKEN_CHARS = 16


def bind_refusal(host: str, token: str | None) -> str | None:
    """Why the manager must not listen on `host` with `token` (None: it may). Without a token only
    a loopback address is allowed; with one, any address, if the token is long enough."""
    if token and len(token) < MIN_TOKEN_CHARS:
        return (f"--token: {len(token)} characters is too easy to guess; give at least {MIN_TOKEN_CHARS} "
                "(e.g. `python -c 'import secrets; print(secrets.token_urlsafe(32))'`)")
    if token or is_loopback(host):
        return None
    return (f"--host {host}: without an access token the manager listens on a loopback address only "
            f"(127.0.0.1, ::1, localhost). Set one with --token or {TOKEN_ENV} (e.g. "
            "`python -c 'import secrets; print(secrets.token_urlsafe(32))'`), or reach the manager "
            "through an SSH tunnel")


def cookie_value(token: str) -> str:
    """What the login cookie holds: an HMAC of the token (a stolen cookie does not reveal the
    token, and it stops working when the operator changes the token)."""
    return hmac.new(token.encode(), b"populace-manager-session", hashlib.sha256).hexdigest()


def _same(a: str, b: str) -> bool:
    """Constant time, and digests first: compare_digest returns early on different lengths."""
    return hmac.compare_digest(hashlib.sha256(a.encode()).digest(), hashlib.sha256(b.encode()).digest())


@dataclass(frozen=True)
class LoginLimits:
    failures: int = 10  # wrong tokens a client may send in `window_s` before it must wait
    window_s: float = 300.0
    delay_s: float = 1.0  # how late every wrong token is answered
    clients: int = 10_000  # clients remembered at once (the least recent forgotten first)

    def __post_init__(self) -> None:
        rules = (("failures", self.failures >= 1, "≥ 1"), ("window_s", self.window_s > 0, "> 0"),
                 ("delay_s", self.delay_s >= 0, "≥ 0"), ("clients", self.clients >= 1, "≥ 1"))
        for name, ok, rule in rules:
            value = getattr(self, name)
            if not ok or not math.isfinite(value):
                raise ValueError(f"LoginLimits.{name}: must be {rule} (got {value!r})")


def client_key(address: str | None) -> str:
    """Whom failed sign-ins are counted against: the client's address, an IPv6 one by its /64
    (one host holds a whole /64 and could change address for every guess)."""
    try:
        ip = ipaddress.ip_address(address or "")
    except ValueError:
        return address or "unknown"
    return str(ipaddress.ip_network(f"{ip}/64", strict=False)) if ip.version == 6 else str(ip)


class FailedLogins:
    """Wrong tokens per client in a sliding window (a deque of times each; at most
    `limits.clients` clients, the least recent forgotten first, so memory stays bounded)."""

    def __init__(self, limits: LoginLimits, clock: Callable[[], float] = time.monotonic) -> None:
        self.limits = limits
        self.clock = clock
        self._times: OrderedDict[str, deque[float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._times)

    def retry_after(self, client: str | None) -> float | None:
        """Seconds the client must wait before its next token is compared (None: none)."""
        times = self._times.get(client_key(client))
        if times is None:
            return None
        horizon = self.clock() - self.limits.window_s
        while times and times[0] <= horizon:
            times.popleft()
        if len(times) < self.limits.failures:
            return None
        return times[0] - horizon

    def failed(self, client: str | None) -> bool:
        """Count a wrong token; True when this one used the client's last try."""
        key = client_key(client)
        times = self._times.pop(key, None) or deque()
        times.append(self.clock())
        self._times[key] = times  # the most recent last
        while len(self._times) > self.limits.clients:
            self._times.popitem(last=False)
        return len(times) >= self.limits.failures


def _local_path(target: str) -> str:
    """`next` after the login: one of our own paths, never another site ('//evil', 'http://…')."""
    if not target.startswith("/") or target.startswith("//") or "\\" in target or urlsplit(target).netloc:
        return "/"
    return target


def _same_origin(request: Request) -> bool:
    origin = request.headers.get("origin") or request.headers.get("referer")
    return not origin or urlsplit(origin).netloc == request.headers.get("host", "")


def login_page(next_path: str = "/", error: str = "", status_code: int = 200) -> HTMLResponse:
    err = f'<p class="error" id="login-error">{html.escape(error)}</p>' if error else ""
    body = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>Populace manager: sign in</title>
<style>
  body {{ font: 14px/1.45 system-ui, sans-serif; color: #1d2329; background: #f7f8fa; margin: 0; }}
  form {{ background: #fff; border: 1px solid #d8dde2; border-radius: 6px; padding: 20px; width: 340px;
         margin: 12vh auto 0; }}
  input {{ width: 100%; margin: 8px 0 12px; padding: 6px; }} .error {{ color: #b3261e; }}
</style></head>
<body><form method="post" action="{LOGIN}">
<h1 style="font-size:18px;margin:0 0 10px">Populace manager</h1>
{err}<label for="token">Access token</label>
<input type="password" id="token" name="token" autocomplete="current-password" autofocus required>
<input type="hidden" name="next" value="{html.escape(next_path)}">
<button type="submit">Sign in</button>
</form></body></html>"""
    return HTMLResponse(body, status_code=status_code, headers={"Cache-Control": "no-store"})


class TokenAccess:
    """Pure ASGI (event streams pass through unbuffered). `token` None or empty: no check."""

    def __init__(self, app: ASGIApp, token: str | None, limits: LoginLimits | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], Awaitable[object]] = asyncio.sleep) -> None:
        self.app = app
        self.token = token or None
        self.cookie = cookie_value(token) if token else ""
        self.failed_logins = FailedLogins(limits or LoginLimits(), clock)
        self.sleep = sleep

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        if self.token is None:
            await self._loopback_only(scope, receive, send)
            return
        path = scope.get("path", "")
        if scope["type"] == "websocket":
            if await self._allowed(Request(scope)) is True:
                await self.app(scope, receive, send)
            else:
                await send({"type": "websocket.close", "code": 1008})
            return
        request = Request(scope, receive)
        if path == LOGIN:
            # one field: its body is cut off at MAX_LOGIN_BYTES, inside the app's own limit
            await RequestBodyLimitMiddleware(self._login_app, MAX_LOGIN_BYTES)(scope, receive, send)
            return
        if path == LOGOUT and request.method == "POST":
            response = RedirectResponse(LOGIN, status_code=303)
            response.delete_cookie(COOKIE, path="/", httponly=True, samesite="strict")
        elif path in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        else:
            allowed = await self._allowed(request)
            if allowed is True:
                await self.app(scope, receive, send)
                return
            response = allowed if isinstance(allowed, Response) else self._refuse(request)
            if COOKIE in request.cookies:  # a stale cookie (the token changed): the browser forgets it
                response.delete_cookie(COOKIE, path="/", httponly=True, samesite="strict")
        await response(scope, receive, send)

    async def _loopback_only(self, scope: Scope, receive: Receive, send: Send) -> None:
        """No token: only requests addressed to a loopback name reach the app (DNS rebinding)."""
        host = Request(scope).headers.get("host", "")
        if loopback_host(host):
            await self.app(scope, receive, send)
            return
        client = scope.get("client")
        log.warning("manager.host_refused", host=host[:200], client=client[0] if client else None,
                    path=scope.get("path", ""))
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        response = PlainTextResponse(
            "this manager has no access token, so it answers only requests addressed to a loopback name "
            "(localhost, 127.0.0.1, [::1]): a page under another name is refused (DNS rebinding). To serve "
            f"it under another name, give it a token (--token or {TOKEN_ENV})", status_code=421)
        await response(scope, receive, send)

    async def _allowed(self, request: Request) -> bool | Response:
        """True: the request carries the token (a bearer token, or the login cookie); False: it
        carries none or a wrong one (counted and answered late); a 429 while its client waits."""
        auth = request.headers.get("authorization", "")
        scheme, _, given = auth.partition(" ")
        if auth and scheme.lower() == "bearer":
            return await self._try(request, given.strip(), self.token or "")
        cookie = request.cookies.get(COOKIE)
        if cookie is None:
            return False
        return await self._try(request, cookie, self.cookie)

    async def _try(self, request: Request, given: str, expected: str) -> bool | Response:
        """One try. The right token (or session cookie) always passes, whatever its address did:
        behind a reverse proxy or Docker's published ports every user shares one address, and a
        limit that held back right tokens let ten wrong ones keep everyone out. A wrong one is
        counted, logged and answered `delay_s` late; past the client's limit, with a 429 that says
        how long to wait (guessing stays slow, and a token is long: MIN_TOKEN_CHARS)."""
        if _same(given, expected):
            return True
        client = request.client.host if request.client else None
        wait = self.failed_logins.retry_after(client)
        last = self.failed_logins.failed(client)
        log.warning("manager.wrong_token", client=client, path=request.url.path, last_try=last,
                    held=wait is not None)
        await self.sleep(self.failed_logins.limits.delay_s)
        if wait is not None:
            return self._too_many(request, wait)
        return False

    def _too_many(self, request: Request, wait: float) -> Response:
        seconds = max(1, math.ceil(wait))
        said = f"too many failed sign-ins from this address: try again in {seconds} s"
        headers = {"Retry-After": str(seconds)}
        if request.url.path == LOGIN:
            page = login_page(error=said, status_code=429)
            page.headers.update(headers)
            return page
        return PlainTextResponse(said, status_code=429, headers=headers)

    def _refuse(self, request: Request) -> Response:
        if request.headers.get("authorization"):
            return PlainTextResponse("wrong access token", status_code=401,
                                     headers={"WWW-Authenticate": 'Bearer realm="populace-manager"'})
        browser_page = request.method in ("GET", "HEAD") and "text/html" in request.headers.get("accept", "")
        if browser_page:
            target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
            return RedirectResponse(f"{LOGIN}?next={quote(target, safe='')}", status_code=303)
        return PlainTextResponse(f"this manager asks for its access token: sign in on {LOGIN}, or send "
                                 "'Authorization: Bearer <token>'", status_code=401,
                                 headers={"WWW-Authenticate": 'Bearer realm="populace-manager"'})

    async def _login_app(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = await self._login(Request(scope, receive))
        await response(scope, receive, send)

    async def _login(self, request: Request) -> Response:
        if request.method not in ("POST",):
            next_path = _local_path(request.query_params.get("next", "/"))
            allowed = await self._allowed(request)
            if allowed is True:
                return RedirectResponse(next_path, status_code=303)
            return allowed if isinstance(allowed, Response) else login_page(next_path)
        if not _same_origin(request):
            return PlainTextResponse("cross-site form posts are refused", status_code=403)
        body = await request.body()
        form = {k: v[-1] for k, v in parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True).items()}
        next_path = _local_path(form.get("next", "/"))
        allowed = await self._try(request, form.get("token", "").strip(), self.token or "")
        if isinstance(allowed, Response):
            return allowed
        if not allowed:
            return login_page(next_path, error="wrong access token", status_code=401)
        response = RedirectResponse(next_path, status_code=303)
        response.set_cookie(COOKIE, self.cookie, path="/", httponly=True, samesite="strict",
                            secure=request.url.scheme == "https")
        return response
