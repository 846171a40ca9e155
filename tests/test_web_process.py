"""The Procfile's web process (gunicorn with config/gunicorn_conf.py), run for real (issue 23):

* #13a: a one-click unsubscribe URL (``/u/<token>``, a 60-day bearer capability) never reaches the
  access log: the line reads ``/u/[token]``, in the request line and in a Referer alike;
* #14: what gunicorn refuses itself (a request line over 4094 bytes: 414; a header over 8190 bytes:
  431; a malformed request line: 400) is answered in the API's JSON error shape, not gunicorn's HTML;
  an idle keep-alive connection is still open after longer than gunicorn's old 2 s (clients behind a
  load balancer reuse connections);
* a request whose headers never end is dropped after the read timeout, freeing its thread.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import subprocess
import time

import pytest
import requests

from bench.stack import LOG_DIR, ROOT, free_port, procfile_command, wait_until
from preferences.unsubscribe import UnsubscribeToken, make_token

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def web(tmp_path_factory):
    """``(base URL, port, access log path)`` of the Procfile's web process."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TWILIO_", "SENDGRID_", "FCM_", "SMTP_"))}
    env.update({"DJANGO_SETTINGS_MODULE": "config.settings", "PORT": str(port),
                "PUBLIC_BASE_URL": f"http://127.0.0.1:{port}",
                "PROMETHEUS_MULTIPROC_DIR": str(tmp_path_factory.mktemp("prom"))})
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    log_path = LOG_DIR / "web-process.log"
    with open(log_path, "wb") as out:
        proc = subprocess.Popen(procfile_command("web", port), cwd=ROOT, env=env, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: _answers(f"{base}/healthz"), 60, interval=0.2, message="the web process")
        yield base, port, log_path
    finally:
        proc.terminate()
        proc.wait(timeout=15)


def _answers(url: str) -> bool:
    try:
        return requests.get(url, timeout=2).status_code == 200
    except requests.RequestException:
        return False


def raw(port: int, request: bytes) -> tuple[int, dict, bytes]:
    """Send ``request`` as written; the status, headers and body of the answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(request)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), headers, body


def test_the_unsubscribe_token_never_reaches_the_access_log(web):
    base, _, log_path = web
    token = make_token(UnsubscribeToken(user_id="alice", category="marketing", channel="email"))
    page = requests.get(f"{base}/u/{token}", timeout=10, headers={"Referer": f"{base}/u/{token}"})
    assert page.status_code in (200, 404)
    line = f'"GET /u/[token] HTTP/1.1" {page.status_code}'  # the access line (Django's own comes first)
    wait_until(lambda: line in log_path.read_text(), 10, message="the access log line")
    text = log_path.read_text()
    assert token not in text and token.split(":")[0] not in text
    assert f'"{base}/u/[token]"' in text  # the Referer


@pytest.mark.parametrize(("request_bytes", "status", "code", "field"), [
    (b"GET /v1/users/" + b"a" * 5000 + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", 414, "request_line_too_long",
     "request_line"),
    (b"GET /v1/users/alice HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"a" * 9000 + b"\r\n\r\n", 431,
     "header_too_large", "headers"),
    (b"GET /v1/users/alice HTTP/1.1\r\nHost: 127.0.0.1\r\n"
     + b"".join(b"X-H%d: v\r\n" % i for i in range(120)) + b"\r\n", 431, "header_too_large", "headers"),
    (b"G\x01T / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", 400, "bad_request", None),
], ids=["long-url", "long-header", "many-headers", "bad-method"])
def test_what_gunicorn_refuses_is_answered_in_the_api_error_shape(web, request_bytes, status, code, field):
    # The API's one error shape (core/api/errors.py), fields included (a fresh attack on main: they
    # had no `fields` and a layout of their own).
    _, port, _ = web
    got, headers, body = raw(port, request_bytes)
    assert got == status
    assert headers["Content-Type"] == "application/json"
    error = json.loads(body)["error"]
    assert set(error) == {"status", "code", "message", "fields"}
    assert (error["status"], error["code"]) == (status, code)
    [entry] = error["fields"]
    assert (entry["field"], entry["code"]) == (field, code) and entry["message"]
    assert error["message"] == (f"{field}: {entry['message']}" if field else entry["message"])


def test_half_sent_requests_are_dropped_and_free_their_threads(web):
    # A fresh attack on main: 8 connections that start a request and never finish the headers held
    # all 8 threads (2 workers x 4) for as long as they liked; gthread read them with no timeout.
    # Now each read waits at most GUNICORN_READ_TIMEOUT (5 s): the server closes them.
    base, port, _ = web
    stalled = [socket.create_connection(("127.0.0.1", port), timeout=30) for _ in range(8)]
    try:
        for sock in stalled:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")  # never the blank line
        time.sleep(1)  # every thread is reading one of them
        assert requests.get(f"{base}/healthz", timeout=60).status_code == 200
        for sock in stalled:
            assert sock.recv(1024) == b""  # closed by the server, nothing answered (within 30 s)
    finally:
        for sock in stalled:
            sock.close()


def test_an_idle_keep_alive_connection_is_reused_after_more_than_two_seconds(web):
    _, port, _ = web
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", "/healthz")
        first = conn.getresponse()
        first.read()
        assert first.status == 200 and first.getheader("Connection", "").lower() != "close"
        local = conn.sock.getsockname()
        time.sleep(3)  # past gunicorn's default keep-alive (2 s)
        conn.request("GET", "/healthz")
        second = conn.getresponse()
        second.read()
        assert second.status == 200
        assert conn.sock.getsockname() == local  # the same connection, not a new one
    finally:
        conn.close()


def test_the_web_process_binds_the_hosts_address_when_given():
    """Behind a balancer on another host the web process must listen on its host's address
    (``WEB_HOST``); unset it stays on loopback. honcho expands ``${WEB_HOST:-127.0.0.1}`` in a shell,
    the stack's :func:`procfile_command` the same way (tests/test_e2e_two_hosts.py runs it on 10.231.0.2)."""
    def bind(env):
        command = procfile_command("web", 8123, env)
        return command[command.index("--bind") + 1]

    assert bind({}) == "127.0.0.1:8123"
    assert bind({"WEB_HOST": "10.231.0.2"}) == "10.231.0.2:8123"
    shell = subprocess.run(["sh", "-c", 'echo "${WEB_HOST:-127.0.0.1}:$PORT"'], capture_output=True, text=True,
                           env={"WEB_HOST": "10.231.0.2", "PORT": "8123"}).stdout.strip()
    assert shell == bind({"WEB_HOST": "10.231.0.2"})
