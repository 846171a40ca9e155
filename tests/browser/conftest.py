"""Real-browser admin tests: Playwright for Python drives Debian's Chromium (``/usr/bin/chromium``,
installed by ``make browser-deps``), headless, against the web server ``make run`` starts: the
``Procfile``'s ``web`` command (gunicorn, production settings, static files collected and served by
WhiteNoise as in production), run as a separate process on a free loopback port against the test
database and the tests' Redis database. Each test runs with ``transactional_db``: what the test
writes is committed, so the server sees it.

* Skipped, with the reason, when ``/usr/bin/chromium`` or the ``playwright`` package is missing.
  Playwright never downloads a browser here (no ``playwright install``): it launches that executable.
* A failing test leaves a screenshot of its page in ``test-artifacts/screenshots/<test>.png``.
* ``transactional_db`` flushes every table after each test; the staff groups and the two custom
  permissions of the newest staff-groups migration (``campaigns.roles.MIGRATION``) are put back right
  after the flush (a ``post_migrate`` receiver running that migration's own code), so later tests
  still find them.
* The flush also empties ``django_content_type``, which ``post_migrate`` refills with new ids, while
  the web server keeps the ids it read (Django's per-process ContentType cache): its next admin log
  entry then named a content type that no longer existed (a 500 on save, depending on test order).
  :func:`_keep_content_type_ids` gives each content type back the id it had when the server started.
"""

from __future__ import annotations

import importlib
import os
import re
import subprocess
from pathlib import Path

import pytest
import requests
from django.apps import apps as global_apps
from django.conf import settings
from django.db.models.signals import post_migrate

from bench.stack import LOG_DIR, ROOT, free_port, procfile_command, wait_until
from campaigns import roles
from tests.conftest import server_database_url

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
SCREENSHOTS = Path(settings.BASE_DIR) / "test-artifacts" / "screenshots"
TIMEOUT_MS = 10_000
#: How long an assertion waits for what a self-refreshing page shows after the data changed (the
#: campaign page polls every 3 s, after a failed poll 15 s, then reloads). Playwright's ``expect``
#: waits 5 s by default (``TIMEOUT_MS`` is for actions only): one poll plus a reload on a loaded machine.
POLL_TIMEOUT_MS = 30_000


def _restore_staff_groups(sender, using, **kwargs):
    if sender.label == "campaigns":
        importlib.import_module(roles.MIGRATION).sync(global_apps, using)


post_migrate.connect(_restore_staff_groups, weak=False, dispatch_uid="tests.browser.restore_staff_groups")

# {(app_label, model): id} as the web server read them; filled when the server starts.
CONTENT_TYPE_IDS: dict[tuple[str, str], int] = {}


def _keep_content_type_ids(sender, using, **kwargs):
    """Once ``post_migrate`` has (re)created every app's content types and permissions (the last app's
    signal), move the content types to the ids the running web server has cached, in one transaction
    (the foreign keys are deferred; through negative ids so that no two rows meet), and the id
    sequence past every id in use."""
    from django.contrib.contenttypes.models import ContentType
    from django.db import connections, transaction

    last = [config for config in global_apps.get_app_configs() if config.models_module is not None][-1]
    if not CONTENT_TYPE_IDS or sender.label != last.label:
        return
    with transaction.atomic(using=using), connections[using].cursor() as cursor:
        cursor.execute("SET CONSTRAINTS ALL DEFERRED")
        cursor.execute("SELECT id, app_label, model FROM django_content_type")
        moves = [(pk, CONTENT_TYPE_IDS[(label, model)]) for pk, label, model in cursor.fetchall()
                 if CONTENT_TYPE_IDS.get((label, model), pk) != pk]
        for pairs in ([(old, -new) for old, new in moves], [(-new, new) for _, new in moves]):
            for a, b in pairs:
                cursor.execute("UPDATE django_content_type SET id = %s WHERE id = %s", [b, a])
                cursor.execute("UPDATE auth_permission SET content_type_id = %s WHERE content_type_id = %s", [b, a])
        cursor.execute("SELECT setval(pg_get_serial_sequence('django_content_type', 'id'), "
                       "(SELECT GREATEST(MAX(id), %s) FROM django_content_type))", [max(CONTENT_TYPE_IDS.values())])
    ContentType.objects.clear_cache()


post_migrate.connect(_keep_content_type_ids, weak=False, dispatch_uid="tests.browser.keep_content_type_ids")


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    """Keep each phase's report on the item, for the screenshot-on-failure in ``page``."""
    report = yield
    setattr(item, f"rep_{report.when}", report)
    return report


@pytest.fixture(scope="package")
def browser():
    """One headless Chromium for the package's tests."""
    if not CHROMIUM.exists():
        pytest.skip(f"{CHROMIUM} is missing: `make browser-deps` installs Debian's chromium (as root)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="the pip package `playwright` is not installed")
    # While Playwright's sync API is active its event loop counts as running in this thread, and Django
    # refuses ORM calls from "async" code; the test's own ORM calls are plain synchronous code.
    previous = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    playwright = sync_api.sync_playwright().start()
    try:
        chromium = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            yield chromium
        finally:
            chromium.close()
    finally:
        playwright.stop()
        if previous is None:
            os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        else:
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = previous


@pytest.fixture(scope="session")
def web_server(django_db_setup, django_db_blocker, static_root):
    """The ``Procfile``'s ``web`` process (gunicorn) on a free port: the production settings
    (``config.settings``) against the test database; returns its base URL. Log:
    ``browser-web.log`` in ``bench.stack.LOG_DIR`` (``test-artifacts/logs/<xdist worker>/``)."""
    from django.contrib.contenttypes.models import ContentType

    with django_db_blocker.unblock():
        CONTENT_TYPE_IDS.update({(ct.app_label, ct.model): ct.pk for ct in ContentType.objects.all()})
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TWILIO_", "SENDGRID_", "FCM_", "SMTP_"))}
    env.update({"DJANGO_SETTINGS_MODULE": "config.settings", "PORT": str(port), "DATABASE_URL": server_database_url(),
                "REDIS_URL": settings.REDIS_URL, "CELERY_BROKER_URL": settings.REDIS_URL,
                "STATIC_ROOT": str(static_root), "PUBLIC_BASE_URL": f"http://127.0.0.1:{port}"})
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    with open(LOG_DIR / "browser-web.log", "ab") as log:
        proc = subprocess.Popen(procfile_command("web", port), cwd=ROOT, env=env, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"

    def up():
        if proc.poll() is not None:
            raise AssertionError(f"the web process exited with {proc.returncode}: see {LOG_DIR / 'browser-web.log'}")
        try:
            return requests.get(f"{base}/admin/login/", timeout=2).status_code == 200
        except requests.RequestException:
            return False

    try:
        wait_until(up, 60, interval=0.2, message="the Procfile's web process")
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture
def timezone_id() -> str:
    """The browser's IANA zone (the viewer's zone); a test overrides it with
    ``@pytest.mark.parametrize("timezone_id", [...])``."""
    return "UTC"


@pytest.fixture
def page(request, browser, web_server, transactional_db, timezone_id):
    """A fresh browser context (no cookies) on the web server; screenshot on failure."""
    context = browser.new_context(base_url=web_server, viewport={"width": 1280, "height": 900},
                                  timezone_id=timezone_id)
    context.set_default_timeout(TIMEOUT_MS)
    page = context.new_page()
    try:
        yield page
    finally:
        reports = (getattr(request.node, f"rep_{when}", None) for when in ("setup", "call"))
        if any(report is not None and report.failed for report in reports):
            SCREENSHOTS.mkdir(parents=True, exist_ok=True)
            name = re.sub(r"[^A-Za-z0-9_.-]+", "_", request.node.name)
            try:
                page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=True)
            except Exception as exc:  # a crashed page: keep the test's own failure
                print(f"screenshot of {name} failed: {exc}")
        context.close()


@pytest.fixture
def staff_member():
    """Make a staff user (not superuser) in one of the staff groups; returns (username, password)."""
    from django.contrib.auth.models import Group, User

    def make(username: str, group: str) -> tuple[str, str]:
        password = f"pw-{username}-0123"
        user = User.objects.create_user(username, password=password, is_staff=True)
        user.groups.add(Group.objects.get(name=group))
        return username, password

    return make


@pytest.fixture
def log_in(page):
    """Log in through the admin's login page, as a person would."""

    def log_in(username: str, password: str) -> None:
        page.goto("/admin/")
        page.fill("#id_username", username)
        page.fill("#id_password", password)
        page.click("input[type=submit]")
        page.wait_for_selector("#user-tools")
        assert "/admin/login/" not in page.url

    return log_in
