"""Fixtures for provider tests: a real emulator subprocess and real backends pointed at it.

``emu_server`` (session) starts ``python -m providers.emulator`` on free ports; ``emu`` (function)
gives the same server with no messages, no fault rules and zeroed counters. No database is needed.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import requests
from django.conf import settings

if not settings.configured:
    # Run with `-p no:django`: the SMTP backend only needs Django's mail settings.
    settings.configure(DEFAULT_CHARSET="utf-8", EMAIL_USE_LOCALTIME=False, USE_TZ=True)

ROOT = Path(__file__).resolve().parents[2]
PROJECT_ID = "emulator-project"


def settle_until(deadline: float) -> None:
    """Sleep until ``time.monotonic()`` reaches ``deadline`` (lets slow emulator answers land)."""
    time.sleep(max(0.0, deadline - time.monotonic()))


def wait_for(probe, timeout: float, interval: float = 0.1):
    """Call ``probe()`` until it returns something truthy (returned) or ``timeout`` seconds pass.

    Raises:
        AssertionError: still falsy after ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"nothing after {timeout} s")
        time.sleep(interval)


def free_port() -> int:
    """A port that was free on 127.0.0.1 a moment ago (bind to 0, read it, close)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class EmulatorProcess:
    """One ``python -m providers.emulator`` subprocess plus a tiny JSON client for ``/_emulator/``."""

    def __init__(self, record_file: Path | None = None, env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.smtp_port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.record_file = record_file
        self.extra_env = env or {}
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 15.0) -> EmulatorProcess:
        env = {**os.environ, "EMULATOR_LOG_LEVEL": "WARNING"}
        for name in ("EMULATOR_RECORD_FILE", "EMULATOR_RECEIPTS", "EMULATOR_SENDGRID_EVENTS_URL",
                     "EMULATOR_SENDGRID_SIGNING_KEY_FILE"):
            env.pop(name, None)
        if self.record_file is not None:
            env["EMULATOR_RECORD_FILE"] = str(self.record_file)
        env.update(self.extra_env)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "providers.emulator", "--port", str(self.port), "--smtp-port", str(self.smtp_port)],
            cwd=ROOT, env=env,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"emulator exited with {self.proc.returncode}")
            try:
                if self.call("GET", "/_emulator/health") == {"status": "ok"}:
                    return self
            except requests.ConnectionError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError("emulator did not become healthy")

    def stop(self) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        return self.proc.returncode

    def call(self, method: str, path: str, body: Any = None, **query: str) -> Any:
        """JSON request to the emulator; returns the decoded body (``None`` for 204).

        Raises:
            requests.HTTPError: the emulator answered 4xx/5xx.
        """
        response = requests.request(method, self.url + path, json=body, params=query or None, timeout=5)
        response.raise_for_status()
        return response.json() if response.content else None

    def messages(self, **filters: str) -> list[dict]:
        return self.call("GET", "/_emulator/messages", **filters)

    def count(self, **filters: str) -> int:
        return self.call("GET", "/_emulator/messages/count", **filters)["count"]

    def fault(self, **rule: Any) -> dict:
        return self.call("POST", "/_emulator/faults", rule)

    def fired(self, rule: dict) -> int:
        """How many requests ``rule`` (as returned by :meth:`fault`) has matched so far.

        Exact for the requests of one test: a request still held by an earlier test's latency rule
        lands in ``/_emulator/stats`` of whichever test is running, but never in this rule's count.
        """
        [current] = [r for r in self.call("GET", "/_emulator/faults") if r["id"] == rule["id"]]
        return current["fired"]

    def stats(self, provider: str) -> dict:
        return self.call("GET", "/_emulator/stats")[provider]

    def reset(self) -> None:
        self.call("DELETE", "/_emulator/messages")
        self.call("DELETE", "/_emulator/faults")
        self.call("DELETE", "/_emulator/stats")
        self.call("DELETE", "/_emulator/receipts")
        self.call("DELETE", "/_emulator/webhooks")
        self.call("DELETE", "/_emulator/engagement")


@pytest.fixture(scope="session")
def emu_server():
    server = EmulatorProcess().start()
    yield server
    server.stop()


@pytest.fixture
def emu(emu_server):
    """The emulator with an empty message list, no fault rules and zeroed counters."""
    emu_server.reset()
    yield emu_server
    emu_server.reset()


@pytest.fixture
def notification_id() -> str:
    return str(uuid.uuid4())


def twilio_options(emu: EmulatorProcess, **overrides: Any) -> dict:
    return {
        "ACCOUNT_SID": "AC" + "0" * 32,
        "AUTH_TOKEN": "emulator-auth-token",
        "FROM_NUMBER": "+15005550006",
        "BASE_URL": emu.url,
        "STATUS_CALLBACK_URL": "https://notify.example.com/webhooks/twilio/status",
        "TIMEOUT": 2,
        **overrides,
    }


def sendgrid_options(emu: EmulatorProcess, **overrides: Any) -> dict:
    return {"API_KEY": "SG.emulator", "FROM_EMAIL": "Notify <notify@example.com>", "HOST": emu.url,
            "TIMEOUT": 2, **overrides}


def smtp_options(emu: EmulatorProcess, **overrides: Any) -> dict:
    return {"HOST": "127.0.0.1", "PORT": emu.smtp_port, "USE_TLS": False, "USERNAME": "", "PASSWORD": "",
            "FROM_EMAIL": "notify@example.com", "TIMEOUT": 2, **overrides}


def fcm_options(emu: EmulatorProcess, **overrides: Any) -> dict:
    return {"PROJECT_ID": PROJECT_ID, "CREDENTIALS": None,
            "FCM_URL": emu.url + "/v1/projects/{0}/messages:send", "TOKEN_URI": emu.url + "/token",
            "TIMEOUT": 2, **overrides}


def _backend(cls, options):
    backend = cls(options=options)
    backend.open()
    return backend


@pytest.fixture
def twilio(emu):
    from providers.twilio.backend import TwilioSmsBackend

    backend = _backend(TwilioSmsBackend, twilio_options(emu))
    yield backend
    backend.close()


@pytest.fixture
def sendgrid(emu):
    from providers.sendgrid.backend import SendGridEmailBackend

    backend = _backend(SendGridEmailBackend, sendgrid_options(emu))
    yield backend
    backend.close()


@pytest.fixture
def smtp(emu):
    from providers.smtp.backend import SmtpEmailBackend

    backend = _backend(SmtpEmailBackend, smtp_options(emu))
    yield backend
    backend.close()


@pytest.fixture(scope="session")
def _fcm_session_backend(emu_server):
    """One FCM backend for the session: its OAuth token is fetched once, as in production."""
    from providers.fcm.backend import FcmPushBackend

    backend = _backend(FcmPushBackend, fcm_options(emu_server))
    yield backend
    backend.close()


@pytest.fixture
def fcm(emu, _fcm_session_backend):
    return _fcm_session_backend
