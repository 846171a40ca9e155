"""``manage.py doctor``: check the configuration and the stack around it, in plain words.

Checks (``--skip NAME`` leaves one out): ``providers``, ``public-url``, ``sendgrid-key``,
``timezone``, ``workers`` (every queue of ``core/queues.py`` consumed; ``--timeout``),
``migrations``, ``redis``, ``metrics``, and ``progress`` (the checks other apps register in
``notifications.health.PROGRESS_CHECKS``: stalled campaigns). What each says:
docs/OPERATIONS.md, "``manage.py doctor``". Prints ``OK``/``WARN``/``FAIL`` lines and exits 1 when
any check failed (warnings do not fail).
"""

from __future__ import annotations

import os
import sys
from urllib.parse import urlsplit

from django.conf import settings
from django.core.management.base import BaseCommand

CHECKS = ("providers", "public-url", "sendgrid-key", "timezone", "workers", "migrations", "redis", "metrics",
          "progress")
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1", "0.0.0.0")  # noqa: S104 - compared, not bound


class Command(BaseCommand):
    help = "Check configuration, workers, migrations and Redis; explain what is wrong. Exit 1 on failure."

    def add_arguments(self, parser):
        parser.add_argument("--skip", action="append", default=[], choices=CHECKS, metavar="CHECK",
                            help=f"leave a check out (repeatable): {', '.join(CHECKS)}")
        parser.add_argument("--timeout", type=float, default=1.0,
                            help="seconds to wait for Celery workers to answer (default 1)")

    def handle(self, *args, skip, timeout, **options):
        self.failures = 0
        self.warnings = 0
        self.timeout = timeout
        self.real = self._real_providers()
        for name in CHECKS:
            if name in skip:
                self.line("SKIP", f"{name}: skipped")
                continue
            getattr(self, "check_" + name.replace("-", "_"))()
        self.stdout.write("")
        if self.failures:
            self.stdout.write(f"doctor: {self.failures} problem(s), {self.warnings} warning(s). Fix the FAIL lines.")
            sys.exit(1)
        self.stdout.write(f"doctor: everything checked is fine ({self.warnings} warning(s)).")

    # --- output -----------------------------------------------------------------------------

    def line(self, level: str, text: str) -> None:
        if level == "FAIL":
            self.failures += 1
        elif level == "WARN":
            self.warnings += 1
        self.stdout.write(f"{level:<4}  {text}")

    def _real_providers(self) -> list[str]:
        from notifications.health import provider_mode

        return [e.get("NAME", "?") for entries in (getattr(settings, "PROVIDERS", None) or {}).values()
                for e in entries or [] if provider_mode(e) == "real"]

    # --- checks -----------------------------------------------------------------------------

    def check_providers(self) -> None:
        from notifications.health import providers_overview
        from providers.registry import check_providers_configured

        for problem in check_providers_configured():
            self.line("FAIL", f"providers: {problem}")
        overview = providers_overview()
        for channel, providers in overview.items():
            if not providers:
                continue
            names = " → ".join(f"{p['name']} ({p['mode']})" for p in providers)
            self.line("OK", f"providers: {channel}: {names}; primary {providers[0]['name']}")
            for p in providers:
                if p["mode"] == "real" and p["missing_env"]:
                    self.line("FAIL", f"providers: {channel}: {p['name']} is configured for real use but "
                                      f"{', '.join(p['missing_env'])} {'is' if len(p['missing_env']) == 1 else 'are'}"
                                      " not set")
                elif p["mode"] == "emulator":
                    needs = ", ".join(p["missing_env"]) or "its credentials"
                    self.line("INFO", f"providers: {channel}: {p['name']} talks to the local emulator; "
                                      f"for the real service set {needs}")
                elif p["mode"] == "custom":
                    self.line("INFO", f"providers: {channel}: {p['name']} is a custom backend; not checked")
        if self.real:
            emulated = sorted({c for c, ps in overview.items() for p in ps if p["mode"] == "emulator"})
            if emulated:
                self.line("WARN", f"providers: real credentials are set for {', '.join(sorted(set(self.real)))} "
                                  f"but {', '.join(emulated)} still use the emulator: those messages go nowhere")
        for name in self.real:
            if name == "fcm":
                path = os.environ.get("FCM_CREDENTIALS", "")
                if path and not os.path.isfile(path):
                    self.line("FAIL", f"providers: FCM_CREDENTIALS names {path}, which is not a readable file")
            if name == "twilio" and not os.environ.get("TWILIO_STATUS_CALLBACK_URL"):
                self.line("WARN", "providers: real Twilio without TWILIO_STATUS_CALLBACK_URL: no SMS delivery "
                                  "receipts (set it to PUBLIC_BASE_URL + /webhooks/twilio/status)")

    def check_public_url(self) -> None:
        url = getattr(settings, "PUBLIC_BASE_URL", "") or ""
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            self.line("FAIL", f"PUBLIC_BASE_URL {url!r} is not an absolute http(s) URL such as "
                              "https://notify.example.com; providers' receipts cannot reach the webhooks")
            return
        if parts.path not in ("", "/") or parts.query or parts.fragment:
            self.line("WARN", f"PUBLIC_BASE_URL {url!r} has a path or query; it should be an origin only "
                              "(scheme://host[:port]): webhook signatures cover origin + the request path")
        loopback = parts.hostname in LOOPBACK_HOSTS or parts.hostname.startswith("127.")
        if loopback and self.real:
            self.line("FAIL", f"PUBLIC_BASE_URL {url!r} is a loopback address, but real providers "
                              f"({', '.join(sorted(set(self.real)))}) must reach the webhooks from the internet")
            return
        if self.real and parts.scheme != "https":
            self.line("WARN", f"PUBLIC_BASE_URL {url!r} is plain http with real providers; use https")
            return
        self.line("OK", f"PUBLIC_BASE_URL is {url}" + (" (local: fine with the emulator)" if loopback else ""))

    def check_sendgrid_key(self) -> None:
        email = [e.get("NAME") for e in (getattr(settings, "PROVIDERS", None) or {}).get("email", [])]
        key = getattr(settings, "SENDGRID_WEBHOOK_PUBLIC_KEY", "") or ""
        if "sendgrid" not in email:
            self.line("OK", "SENDGRID_WEBHOOK_PUBLIC_KEY: SendGrid is not an email provider; not needed")
            return
        if not key:
            self.line("FAIL", "SENDGRID_WEBHOOK_PUBLIC_KEY is not set: every SendGrid delivery receipt will be "
                              "refused with 403 (copy the verification key from SendGrid's Event Webhook settings)")
            return
        from cryptography.hazmat.primitives.asymmetric import ec
        from sendgrid.helpers.eventwebhook import EventWebhook

        try:
            public_key = EventWebhook(key).public_key  # what the webhook view verifies with
        except Exception as exc:
            self.line("FAIL", f"SENDGRID_WEBHOOK_PUBLIC_KEY does not decode as a base64 DER public key "
                              f"({type(exc).__name__}); copy it again from SendGrid")
            return
        if not isinstance(public_key, ec.EllipticCurvePublicKey):
            self.line("FAIL", "SENDGRID_WEBHOOK_PUBLIC_KEY decodes, but it is not an ECDSA key as SendGrid uses")
            return
        self.line("OK", f"SENDGRID_WEBHOOK_PUBLIC_KEY decodes ({public_key.curve.name} ECDSA key)")
        self._emulator_signs_with(public_key)

    def _emulator_signs_with(self, public_key) -> None:
        """With the emulator standing in for SendGrid, its signing key's public half must be the key
        the platform verifies with (a shell that exported another stack's .run/env overrides this one's)."""
        from cryptography.hazmat.primitives import serialization

        from notifications.health import provider_mode

        sendgrid = next(e for e in settings.PROVIDERS["email"] if e.get("NAME") == "sendgrid")
        path = os.environ.get("EMULATOR_SENDGRID_SIGNING_KEY_FILE") or str(
            settings.RUN_DIR / "sendgrid-webhook-signing-key.pem")
        if provider_mode(sendgrid) != "emulator" or not os.path.isfile(path):
            return
        try:
            with open(path, "rb") as f:
                signing = serialization.load_pem_private_key(f.read(), password=None)
        except (OSError, ValueError, TypeError) as exc:
            self.line("WARN", f"SENDGRID_WEBHOOK_PUBLIC_KEY: the emulator's signing key {path} does not load "
                              f"({type(exc).__name__})")
            return
        der = serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        if signing.public_key().public_bytes(*der) != public_key.public_bytes(*der):
            self.line("FAIL", f"SENDGRID_WEBHOOK_PUBLIC_KEY is not the public half of the emulator's signing key "
                              f"{path}: every emulated SendGrid receipt will be refused with 403 (the process "
                              "environment overrides .run/env: unset SENDGRID_WEBHOOK_PUBLIC_KEY in this shell)")

    def check_timezone(self) -> None:
        from datetime import UTC, datetime
        from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

        try:
            offset = datetime(2025, 1, 15, 12, tzinfo=UTC).astimezone(ZoneInfo("Europe/Berlin")).utcoffset()
        except ZoneInfoNotFoundError:
            self.line("FAIL", "time zone data missing: zoneinfo cannot find Europe/Berlin (pip install tzdata, "
                              "or install the OS tzdata package)")
            return
        if offset is None or offset.total_seconds() != 3600:
            self.line("FAIL", f"time zone data looks wrong: Europe/Berlin in January is UTC{offset}, expected +01:00")
            return
        self.line("OK", "time zone data present (Europe/Berlin found)")

    def check_workers(self) -> None:
        from celery import current_app as app  # config.celery's app (config/__init__.py loads it)

        from core.queues import ALL_QUEUES

        try:
            replies = app.control.inspect(timeout=self.timeout).active_queues() or {}
        except Exception as exc:
            self.line("FAIL", f"workers: could not ask the workers ({type(exc).__name__}: {exc})")
            return
        if not replies:
            self.line("FAIL", f"workers: no Celery worker answered within {self.timeout:g} s, so no queue is "
                              "consumed (is `make run` running?)")
            return
        consumed: dict[str, list[str]] = {}
        for worker, queues in sorted(replies.items()):
            names = sorted(q.get("name", "?") for q in queues or [])
            self.line("OK", f"workers: {worker} consumes {', '.join(names) or 'nothing'}")
            for name in names:
                consumed.setdefault(name, []).append(worker)
        missing = [q for q in ALL_QUEUES if q not in consumed]
        if missing:
            self.line("FAIL", f"workers: no running worker consumes {', '.join(missing)}: what is sent there waits")
        else:
            self.line("OK", f"workers: all {len(ALL_QUEUES)} queues are consumed")

    def check_migrations(self) -> None:
        from django.db import connection
        from django.db.migrations.executor import MigrationExecutor

        try:
            executor = MigrationExecutor(connection)
            plan = executor.migration_plan(executor.loader.graph.leaf_nodes())
        except Exception as exc:
            self.line("FAIL", f"migrations: cannot read the database ({type(exc).__name__}: {exc})")
            return
        if plan:
            names = ", ".join(f"{m.app_label}.{m.name}" for m, _ in plan[:5]) + (" …" if len(plan) > 5 else "")
            self.line("FAIL", f"migrations: {len(plan)} not applied ({names}); run manage.py migrate")
        else:
            self.line("OK", "migrations: all applied")

    def check_redis(self) -> None:
        import redis

        from core.redis_client import client_for
        from notifications.health import broker_redis_url

        targets = [("Redis (REDIS_URL)", settings.REDIS_URL)]
        broker = broker_redis_url()
        if broker and broker != settings.REDIS_URL:
            targets.append(("broker (CELERY_BROKER_URL)", broker))
        for label, url in targets:
            try:
                client_for(url).ping()
            except redis.RedisError as exc:
                self.line("FAIL", f"{label} does not answer: {type(exc).__name__}: {exc}")
            else:
                self.line("OK", f"{label} answers")

    def check_metrics(self) -> None:
        path = os.environ.get("PROMETHEUS_MULTIPROC_DIR", "")
        if not path or not os.path.isdir(path) or not os.access(path, os.W_OK):
            self.line("FAIL", f"metrics: PROMETHEUS_MULTIPROC_DIR {path!r} is not a writable directory")
        else:
            self.line("OK", f"metrics: processes write their counters to {path}")
        if getattr(settings, "METRICS_TOKEN", ""):
            self.line("OK", "metrics: /metrics requires the bearer token METRICS_TOKEN")
        elif not getattr(settings, "LOCAL_DEVELOPMENT", False):
            self.line("WARN", "metrics: METRICS_TOKEN is not set; outside local development /metrics refuses "
                              "every request (set it, and give it to Prometheus)")
        else:
            self.line("INFO", "metrics: METRICS_TOKEN is not set; /metrics answers local requests only "
                              "(local development)")

    def check_progress(self) -> None:
        from notifications.health import PROGRESS_CHECKS

        for name, check in PROGRESS_CHECKS.items():
            try:
                problems = check()
            except Exception as exc:
                self.line("FAIL", f"{name}: progress could not be checked ({type(exc).__name__}: {exc})")
                continue
            for problem in problems:
                self.line("FAIL", f"{name}: {problem}")
            if not problems:
                self.line("OK", f"{name}: nothing stalled")
