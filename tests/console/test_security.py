"""The console's defences, tried with a plain HTTP client (httpx) against a real console on a
real cluster: the cookies' flags, CSRF tokens on every change, the origin check, no page or
live stream without a session, the security headers, HTTPS only."""

from __future__ import annotations

import re
import socket
import ssl
import time
from collections.abc import Iterator

import httpx
import pytest

from browsing import Running

pytestmark = pytest.mark.cluster

TOPIC = "console-csrf"


def _web(running: Running) -> httpx.Client:
    return httpx.Client(base_url=running.console.url,
                        verify=ssl.create_default_context(
                            cafile=str(running.cluster.security.ca_file)))  # type: ignore[union-attr]


def _csrf(html: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', html)
    assert found is not None
    return found.group(1)


def _logged_in(running: Running) -> tuple[httpx.Client, str]:
    """A client holding a session, and that session's CSRF token."""
    web = _web(running)
    form = web.get("/login")
    answer = web.post("/login", data={"csrf": _csrf(form.text), "token": running.token()})
    assert answer.status_code == 303, answer.text
    return web, _csrf(web.get("/admin").text)


@pytest.fixture
def web(running: Running) -> Iterator[tuple[httpx.Client, str]]:
    client, csrf = _logged_in(running)
    try:
        yield client, csrf
    finally:
        client.close()


def _pending(running: Running) -> int:
    with running.cluster.client() as admin:
        return sum(p.pending for p in admin.cluster_info().pending if p.topic == TOPIC)


def test_cookies_are_httponly_secure_and_samesite_strict(running: Running) -> None:
    with _web(running) as web:
        form = web.get("/login")
        answer = web.post("/login", data={"csrf": _csrf(form.text), "token": running.token()})
    for cookie in (form.headers["set-cookie"], answer.headers.get_list("set-cookie")[0]):
        flags = {part.strip().lower() for part in cookie.split(";")[1:]}
        assert cookie.startswith("__Host-")
        assert {"httponly", "secure", "samesite=strict", "path=/"} <= flags, cookie


def test_a_change_without_the_csrf_token_is_refused(web: tuple[httpx.Client, str],
                                                    running: Running) -> None:
    client, csrf = web
    before = _pending(running)
    schedule = {"topic": TOPIC, "body": "x", "delay_s": "600"}
    assert client.post("/admin/schedule", data=schedule).status_code == 403
    assert client.post("/admin/schedule", data={**schedule, "csrf": "guessed"}).status_code == 403
    other, other_csrf = _logged_in(running)
    other.close()
    assert client.post("/admin/schedule",
                       data={**schedule, "csrf": other_csrf}).status_code == 403
    assert client.post("/admin/schedule", data={**schedule, "csrf": csrf},
                       headers={"origin": "https://evil.example"}).status_code == 403
    assert client.post("/dead-letters/resend", data={"target": TOPIC}).status_code == 403
    assert client.post("/logout").status_code == 403  # still logged in below
    assert client.post("/admin/schedule", data={**schedule, "csrf": csrf}).status_code == 200
    # the same request with the token is done; any refused one that had gone through would
    # have been applied before it (one log), so the count shows it by then
    deadline = time.monotonic() + 10
    while (pending := _pending(running)) < before + 1:
        assert time.monotonic() < deadline, "the scheduled message never showed"
        time.sleep(0.05)
    assert pending == before + 1


def test_nothing_without_a_session(running: Running) -> None:
    with _web(running) as web:
        for path in ("/cluster", "/topics", "/histogram", "/admin", "/message",
                     "/dead-letters"):
            answer = web.get(path)
            assert (answer.status_code, answer.headers["location"]) == (303, "/login"), path
        assert web.get("/live/cluster").status_code == 403
        assert web.post("/admin/cancel", data={"handle": "1"}).status_code == 403
        assert web.post("/dead-letters/resend", data={"target": "x"}).status_code == 403
        refused = web.post("/login", data={"csrf": "made-up", "token": running.token()})
        assert refused.status_code == 403
        assert not [c for c in refused.headers.get_list("set-cookie") if "session" in c]


def test_a_session_ends_at_logout(running: Running) -> None:
    web, csrf = _logged_in(running)
    try:
        cookie = web.cookies.get("__Host-tickwheel-session")
        assert cookie and web.get("/cluster").status_code == 200
        assert web.post("/logout", data={"csrf": csrf}).status_code == 303
        assert web.get("/cluster").headers["location"] == "/login"
        web.cookies.set("__Host-tickwheel-session", cookie)  # the old id, sent again
        assert web.get("/cluster").headers["location"] == "/login"
    finally:
        web.close()


def test_answers_carry_the_security_headers(web: tuple[httpx.Client, str]) -> None:
    client, _ = web
    headers = client.get("/cluster").headers
    assert "script-src 'self'" in headers["content-security-policy"]
    assert "frame-ancestors 'none'" in headers["content-security-policy"]
    assert headers["cache-control"] == "no-store"
    assert headers["x-content-type-options"] == "nosniff"


def test_the_console_serves_https_only(running: Running) -> None:
    with socket.create_connection(("127.0.0.1", running.console.port), timeout=5) as plain:
        plain.sendall(b"GET /login HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        answer = plain.recv(4096)
    assert b"tickwheel" not in answer and not answer.startswith(b"HTTP/1.1 200")
