"""The manager's access token (populace.manager.access): without a token only a loopback
address is allowed; with one, every page, form POST and event stream asks for it, a browser
signs in on /login (an HttpOnly, SameSite=Strict cookie), a script sends a bearer token, and a
wrong token is a 401, never a traceback. The middleware is tried on a stand-in app with the
manager's kinds of route (no NATS), and on create_app's own routes before anything connects."""

from __future__ import annotations

import asyncio
import logging

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, StreamingResponse
from starlette.routing import Route
from starlette.testclient import TestClient
from typer.testing import CliRunner

from populace.cli.main import app as cli
from populace.manager import ManagerSettings, create_app
from populace.manager.access import (
    COOKIE,
    TOKEN_ENV,
    LoginLimits,
    TokenAccess,
    bind_refusal,
    cookie_value,
    loopback_host,
)

TOKEN = "s3cret-token-for-tests"
HTML = {"accept": "text/html,application/xhtml+xml"}


def stand_in(token: str | None, **access) -> Starlette:
    async def runs(request: Request):
        return PlainTextResponse("the runs page")

    async def events(request: Request):
        async def body():
            yield b"data: {}\n\n"
            await asyncio.sleep(0)

        return StreamingResponse(body(), media_type="text/event-stream")

    async def start(request: Request):
        return PlainTextResponse("submitted " + (await request.body()).decode())

    async def healthz(request: Request):
        return PlainTextResponse("ok")

    app = Starlette(routes=[Route("/runs", runs), Route("/events/runs", events), Route("/healthz", healthz),
                            Route("/start", start, methods=["POST"])])
    app.add_middleware(TokenAccess, token=token, **access)
    return app


@pytest.fixture
def client():
    # wrong tokens answered at once here: the delay has its own test
    with TestClient(stand_in(TOKEN, limits=LoginLimits(delay_s=0)), follow_redirects=False) as c:
        yield c


# --- where the manager may listen --------------------------------------------------------
@pytest.mark.parametrize("host", ["127.0.0.1", "::1", "localhost"])
def test_without_a_token_a_loopback_address_is_allowed(host):
    assert bind_refusal(host, None) is None


@pytest.mark.parametrize("host", ["0.0.0.0", "10.0.0.5", "::", "manager.example.org"])
def test_without_a_token_another_address_is_refused_naming_the_option_and_the_variable(host):
    said = bind_refusal(host, None)
    assert said and f"--host {host}" in said and "--token" in said and TOKEN_ENV in said
    assert bind_refusal(host, TOKEN) is None


def test_the_command_refuses_a_public_address_without_a_token_before_it_starts_anything(monkeypatch):
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    res = CliRunner().invoke(cli, ["manager", "--host", "0.0.0.0", "--nats", "nats://127.0.0.1:1"])
    assert res.exit_code == 2
    assert "--token" in res.output and TOKEN_ENV in res.output and "loopback" in res.output
    # a blank variable is no token
    monkeypatch.setenv(TOKEN_ENV, "  ")
    res = CliRunner().invoke(cli, ["manager", "--host", "0.0.0.0", "--nats", "nats://127.0.0.1:1"])
    assert res.exit_code == 2 and TOKEN_ENV in res.output


@pytest.mark.parametrize("host", ["localhost", "localhost:8080", "LocalHost:80", "127.0.0.1", "127.0.0.1:8080",
                                  "127.255.0.9:1", "[::1]", "[::1]:8080", "::1"])
def test_a_loopback_host_header_is_recognised_with_or_without_its_port(host):
    assert loopback_host(host)


@pytest.mark.parametrize("host", ["", "evil.example", "evil.example:8080", "localhost.evil.example",
                                  "127.0.0.1.evil.example", "localhost.", "10.0.0.5:8080", "0.0.0.0",
                                  "[::]:8080", "[::ffff:10.0.0.1]", "127.0.0.1:8080:9", "evil@127.0.0.1",
                                  "127.0.0.1/evil", "[::1]x", "127.1", "localhost:99999999", "localhost\n"])
def test_any_other_host_header_is_not(host):
    assert not loopback_host(host)


def test_without_a_token_a_request_for_another_host_is_refused_before_the_app():
    with TestClient(stand_in(None), base_url="http://evil.example", follow_redirects=False) as c:
        for method, path in (("GET", "/runs"), ("POST", "/start"), ("GET", "/events/runs"), ("GET", "/healthz")):
            res = c.request(method, path, headers={"origin": "http://evil.example"})
            assert res.status_code == 421 and "DNS rebinding" in res.text, path
            assert "the runs page" not in res.text and "submitted" not in res.text


def test_no_token_on_loopback_asks_for_nothing():
    with TestClient(stand_in(None), base_url="http://127.0.0.1:8080", follow_redirects=False) as c:
        assert c.get("/runs", headers=HTML).text == "the runs page"
        assert c.get("/events/runs").status_code == 200
        assert c.post("/start", content=b"x=1").text == "submitted x=1"
        assert c.get("/login").status_code == 404  # no login page: nothing to sign in to


# --- with a token --------------------------------------------------------------------------
def test_a_browser_goes_to_the_login_page_and_comes_back_signed_in(client):
    res = client.get("/runs?all=1", headers=HTML)
    assert res.status_code == 303 and res.headers["location"] == "/login?next=%2Fruns%3Fall%3D1"
    page = client.get(res.headers["location"])
    assert page.status_code == 200 and 'name="token"' in page.text and 'type="password"' in page.text
    assert 'value="/runs?all=1"' in page.text

    res = client.post("/login", data={"token": TOKEN, "next": "/runs?all=1"})
    assert res.status_code == 303 and res.headers["location"] == "/runs?all=1"
    cookie = res.headers["set-cookie"]
    assert f"{COOKIE}={cookie_value(TOKEN)}" in cookie
    assert "httponly" in cookie.lower() and "samesite=strict" in cookie.lower() and "Path=/" in cookie
    assert TOKEN not in cookie  # the cookie holds an HMAC of the token, not the token
    # the client keeps the cookie: pages, posts and streams are open now
    assert client.get("/runs", headers=HTML).text == "the runs page"
    assert client.post("/start", content=b"a=b").text == "submitted a=b"
    stream = client.get("/events/runs")
    assert stream.status_code == 200 and stream.text.startswith("data: ")
    # the login page of a signed-in browser sends it on
    assert client.get("/login?next=/runs").headers["location"] == "/runs"
    # signing out forgets the cookie
    out = client.post("/logout")
    assert out.status_code == 303 and out.headers["location"] == "/login"
    assert client.get("/runs", headers=HTML).status_code == 303


def test_a_wrong_token_on_the_login_page_is_a_401_page_and_no_cookie(client, caplog):
    with caplog.at_level(logging.DEBUG):
        res = client.post("/login", data={"token": "guess", "next": "/runs"})
    assert res.status_code == 401 and "wrong access token" in res.text and 'name="token"' in res.text
    assert "set-cookie" not in res.headers
    assert client.get("/runs", headers=HTML).status_code == 303
    assert TOKEN not in caplog.text and "guess" not in caplog.text


def test_the_login_sends_only_to_our_own_pages(client):
    for target in ("https://evil.example/", "//evil.example/x", "/\\evil.example"):
        res = client.post("/login", data={"token": TOKEN, "next": target})
        assert res.status_code == 303 and res.headers["location"] == "/", target


def test_a_cross_site_login_post_is_refused(client):
    res = client.post("/login", data={"token": TOKEN}, headers={"origin": "https://evil.example"})
    assert res.status_code == 403 and "set-cookie" not in res.headers


def test_a_script_sends_a_bearer_token(client):
    ok = {"authorization": f"Bearer {TOKEN}"}
    assert client.get("/runs", headers=ok).text == "the runs page"
    assert client.post("/start", content=b"q=1", headers=ok).text == "submitted q=1"
    assert client.get("/events/runs", headers=ok).status_code == 200
    assert client.get("/runs", headers={"authorization": f"bearer {TOKEN}"}).status_code == 200


@pytest.mark.parametrize("auth", [f"Bearer {TOKEN}x", "Bearer ", f"Basic {TOKEN}", "Bearer s3cret"])
def test_a_wrong_token_is_a_401_without_a_traceback(client, auth):
    for method, path in (("GET", "/runs"), ("POST", "/start"), ("GET", "/events/runs")):
        res = client.request(method, path, headers={"authorization": auth, **HTML})
        assert res.status_code == 401, (method, path)
        assert res.headers["www-authenticate"].startswith("Bearer")
        assert "Traceback" not in res.text and TOKEN not in res.text


def test_without_a_token_posts_and_streams_are_refused_and_a_forged_cookie_too(client):
    assert client.post("/start", content=b"x=1").status_code == 401
    stream = client.get("/events/runs", headers={"accept": "text/event-stream"})
    assert stream.status_code == 401 and "data:" not in stream.text
    client.cookies.set(COOKIE, cookie_value("another token"))
    assert client.get("/runs").status_code == 401
    assert client.get("/runs", headers=HTML).status_code == 303
    client.cookies.set(COOKIE, TOKEN)  # the token itself is not the cookie
    assert client.post("/start", content=b"x=1").status_code == 401


def test_healthz_stays_open_for_healthchecks(client):
    assert client.get("/healthz").text == "ok"


def test_create_app_puts_every_route_of_the_manager_behind_its_token():
    # no `with`: the lifespan (the NATS connection) never runs; nothing here reaches a handler
    app = create_app(ManagerSettings(nats_url="nats://127.0.0.1:1", token=TOKEN))
    assert TOKEN not in repr(app.state.settings)
    c = TestClient(app, follow_redirects=False)
    for path in ("/", "/runs", "/runs/r1", "/nodes", "/start", "/replicas", "/nodes/n1/logs/p1"):
        res = c.get(path, headers=HTML)
        assert res.status_code == 303 and res.headers["location"].startswith("/login?next="), path
    for path in ("/events/runs", "/events/runs/r1", "/events/nodes"):
        assert c.get(path).status_code == 401, path
    for path in ("/start", "/runs/r1/cancel", "/runs/r1/resume", "/nodes/n1/start", "/nodes/n1/stop",
                 "/nodes/n1/cleanup"):
        assert c.post(path, data={"x": "1"}).status_code == 401, path
    assert c.get("/login").status_code == 200


# --- guessing the token --------------------------------------------------------------------
class Clock:
    """The limiter's clock and its delay, by hand: no test waits on real time."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)


def guarded(clock: Clock, **limits) -> Starlette:
    rules = LoginLimits(**{"failures": 3, "window_s": 60.0, "delay_s": 0.5, **limits})
    return stand_in(TOKEN, limits=rules, clock=clock, sleep=clock.sleep)


def test_failed_sign_ins_are_limited_per_client_and_the_right_token_always_passes():
    clock = Clock()
    app = guarded(clock)
    with TestClient(app, client=("203.0.113.5", 5000), follow_redirects=False) as attacker, \
            TestClient(app, client=("203.0.113.5", 5001), follow_redirects=False) as operator:
        for guess in ("a", "b", "c"):
            assert attacker.post("/login", data={"token": guess}).status_code == 401
        res = attacker.post("/login", data={"token": "d"})
        assert res.status_code == 429 and "too many failed sign-ins" in res.text
        assert int(res.headers["retry-after"]) == 60
        assert attacker.get("/runs", headers={"authorization": "Bearer e"}).status_code == 429
        # the operator behind the same address (a proxy, Docker's published port) is never held
        # back: the right token signs in, a bearer token is served, a session cookie stays valid
        res = operator.post("/login", data={"token": TOKEN})
        assert res.status_code == 303 and f"{COOKIE}=" in res.headers["set-cookie"]
        assert operator.get("/runs").text == "the runs page"
        assert operator.get("/runs", headers={"authorization": f"Bearer {TOKEN}"}).text == "the runs page"
        # a flood of wrong tokens keeps nobody out either, and each wrong one is still answered late
        for _ in range(20):
            assert attacker.get("/runs", headers={"authorization": "Bearer wrong"}).status_code == 429
        assert operator.get("/runs").text == "the runs page"
        assert clock.slept == [0.5] * 25
        clock.now += 61  # the window has passed
        assert attacker.post("/login", data={"token": "f"}).status_code == 401


def test_a_token_too_short_to_resist_guessing_is_refused_before_the_manager_starts():
    assert "at least 16" in bind_refusal("0.0.0.0", "short-token")
    with pytest.raises(ValueError, match="token: at least 16 characters"):
        ManagerSettings(nats_url="nats://127.0.0.1:1", token="abc")


def test_bearer_guesses_and_forged_cookies_count_as_failed_sign_ins():
    clock = Clock()
    with TestClient(guarded(clock), follow_redirects=False) as c:
        assert c.get("/runs", headers={"authorization": "Bearer x"}).status_code == 401
        forged = {"cookie": f"{COOKIE}={cookie_value('a guess')}"}
        res = c.get("/runs", headers=forged)
        assert res.status_code == 401
        # a browser forgets a cookie that is refused (a stale one, after the token changed),
        # so an open page that reconnects does not lock its operator out
        assert res.headers["set-cookie"].startswith(f'{COOKIE}="";') and "max-age=0" in res.headers["set-cookie"].lower()
        assert c.get("/events/runs", headers=forged).status_code == 401
        assert c.get("/runs", headers=forged).status_code == 429  # past the limit: held
        # a request with no token at all is no guess: it is sent to sign in, as before
        assert c.get("/runs", headers=HTML).headers["location"].startswith("/login")


def test_each_failed_sign_in_is_answered_late_and_a_good_one_at_once():
    clock = Clock()
    with TestClient(guarded(clock, delay_s=0.75), follow_redirects=False) as c:
        assert c.post("/login", data={"token": "nope"}).status_code == 401
        assert c.get("/runs", headers={"authorization": "Bearer nope"}).status_code == 401
        assert clock.slept == [0.75, 0.75]
        assert c.post("/login", data={"token": TOKEN}).status_code == 303
        assert c.get("/runs").text == "the runs page"
        assert clock.slept == [0.75, 0.75]


def test_an_ipv6_client_is_counted_by_its_64_prefix_and_the_table_stays_bounded():
    clock = Clock()
    app = guarded(clock, failures=2, clients=4)
    for host in ("2001:db8:1:2::a", "2001:db8:1:2::b"):
        with TestClient(app, client=(host, 1), follow_redirects=False) as c:
            assert c.post("/login", data={"token": "x"}).status_code == 401
    with TestClient(app, client=("2001:db8:1:2:ffff::1", 1), follow_redirects=False) as c:
        assert c.post("/login", data={"token": "x"}).status_code == 429
    with TestClient(app, client=("2001:db8:1:3::1", 1), follow_redirects=False) as c:
        assert c.post("/login", data={"token": "x"}).status_code == 401
    access = app.middleware_stack or app.build_middleware_stack()
    while not isinstance(access, TokenAccess):
        access = access.app
    for i in range(50):  # fifty addresses: only the newest `clients` are remembered
        access.failed_logins.failed(f"198.51.100.{i}")
    assert len(access.failed_logins) == 4


@pytest.mark.parametrize(("field", "value"), [("failures", 0), ("window_s", 0), ("delay_s", -1), ("clients", 0)])
def test_login_limits_are_checked_naming_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        LoginLimits(**{field: value})


def test_tokens_are_compared_as_digests_of_equal_length(monkeypatch):
    """hmac.compare_digest returns early on inputs of different lengths: the token's length
    would show in the answer's timing. Both sides are digested first."""
    import hmac

    compared: list[tuple[int, int]] = []
    real = hmac.compare_digest

    def spy(a, b):
        compared.append((len(a), len(b)))
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", spy)
    clock = Clock()
    with TestClient(guarded(clock, failures=100), follow_redirects=False) as c:
        for guess in ("x", "a much longer guess than the token itself is"):
            c.post("/login", data={"token": guess})
            c.get("/runs", headers={"authorization": f"Bearer {guess}"})
    assert compared and all(a == b for a, b in compared)
