"""Shared fixtures. End-to-end tests get the whole platform as real processes (bench/stack.py);
they write through autocommit connections (no wrapping transaction) so those processes see the rows,
and they keep to their own unique user ids and keys instead of flushing tables between tests.

Under pytest-xdist (``make test``: ``-n 2 --dist loadgroup``, the Makefile) each worker has its own
test database, Redis database and Prometheus directory (config/test_settings.py); every test that
uses the stack runs on one worker, in one xdist group (:func:`pytest_collection_modifyitems`).
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest
import requests
from django.conf import settings

from bench.stack import Stack, collect_static
from core.api.scopes import Scope

#: The xdist groups: tests that must share one worker. The stack's (one set of processes, not one
#: per worker) and the browser's (one web server, one Chromium); ``--dist loadgroup`` hands the biggest
#: unit out first, so both start at once; every other test is its own unit.
STACK_GROUP, BROWSER_GROUP = "stack", "browser"


def _xdist_group(item) -> str | None:
    if "stack" in item.fixturenames:
        return STACK_GROUP
    if item.get_closest_marker("browser"):
        return BROWSER_GROUP
    return None


def _stack_env(item) -> dict[str, str]:
    """The environment the stack runs with for ``item``: its module's ``STACK_ENV``, else none."""
    return getattr(getattr(item, "module", None), "STACK_ENV", {})


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups and pytest-django orders by database use
def pytest_collection_modifyitems(config, items):
    """The tests of modules that run the stack with an environment of their own (``STACK_ENV``:
    chaos, starved workers) go last, so the stack is restarted for them and never back. Under xdist,
    the stack's and the browser's tests get their group."""
    items.sort(key=lambda item: bool(_stack_env(item)))
    if not config.pluginmanager.hasplugin("xdist"):
        return
    for item in items:
        if group := _xdist_group(item):
            item.add_marker(pytest.mark.xdist_group(group))
            if getattr(config.option, "loadgroup", False) and not hasattr(item, "_nodeid"):
                # pytest 9.2 keeps the id in ``_id``: xdist 3.8 still writes the group suffix into
                # ``_nodeid``, so no test was grouped (pytest-dev/pytest-xdist#1386). Until a release
                # fixes it, the suffix its scheduler reads is written here.
                item._id = type(item._id).parse(f"{item.nodeid}@{group}")


#: The session's stack, once made (:func:`stack`).
_SESSION_STACK: list[Stack] = []


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item, nextitem):
    """Under xdist a group runs as one block wherever the worker is in the collection order, and the
    worker goes on with other tests: after the last test of the stack's or the browser's group, put
    back what pytest-django's order (tests without a database marker, the stack's, last; transactional
    ones, the browser's, before them) kept from any later test (:func:`restore_after_group`)."""
    group = _xdist_group(item)
    if (group is not None and nextitem is not None and _xdist_group(nextitem) != group
            and "PYTEST_XDIST_WORKER" in os.environ):
        from pytest_django.plugin import blocking_manager_key

        restore_after_group(_SESSION_STACK[0] if _SESSION_STACK else None, item.config.stash[blocking_manager_key])


def restore_after_group(stack: Stack | None, django_db_blocker) -> None:
    """Stop the stack (if it runs) and put back what its tests and the browser's change for good: the
    test database as migrated (Django's serialized copy, as ``serialized_rollback`` restores it; the
    browser's tests flush it, the stack's commit rows), the worker's Redis database, and the metric
    files of other processes."""
    from django.core.management import call_command
    from django.db import connection

    from core.redis_client import get_redis

    if stack is not None and stack.procs:
        stack.stop_all()
    with django_db_blocker.unblock():
        call_command("flush", interactive=False, verbosity=0, inhibit_post_migrate=True)
        connection.creation.deserialize_db_from_string(connection._test_serialized_contents)
    get_redis().flushdb()
    for path in Path(settings.PROMETHEUS_MULTIPROC_DIR).glob("*.db"):
        if not path.stem.endswith(f"_{os.getpid()}"):  # this process's own files stay
            path.unlink()


@pytest.fixture
def as_migrated(django_db_blocker):
    """The test database as migrated (staff groups, notification types) for a transactional test that
    needs its data migrations' rows: an earlier transactional test on the worker flushed them."""
    from django.contrib.auth.models import Group

    if not Group.objects.exists():
        restore_after_group(None, django_db_blocker)


@pytest.fixture(scope="session")
def django_db_setup(request, django_test_environment, django_db_blocker, django_db_keepdb,
                    django_db_modify_db_settings):
    """Always create the test database for the default alias.

    pytest-django creates only the databases that collected tests *mark* as used; end-to-end tests
    use it through ``live_db`` without a mark, so a run of only those would otherwise talk to the
    development database. ``django_db_modify_db_settings`` names it per xdist worker (``_gw0``).
    """
    from django.test.utils import setup_databases, teardown_databases

    with django_db_blocker.unblock():
        config = setup_databases(verbosity=request.config.option.verbose, interactive=False,
                                 keepdb=django_db_keepdb, aliases={"default"})
    yield
    with django_db_blocker.unblock():
        try:
            teardown_databases(config, verbosity=request.config.option.verbose)
        except Exception as exc:  # a worker's connection still closing: leave it for next time
            import warnings

            warnings.warn(f"test database not dropped: {exc}", stacklevel=1)


def server_database_url() -> str:
    """The pytest test database as a URL, for server processes started by the tests."""
    db = settings.DATABASES["default"]
    return f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}"


@pytest.fixture(scope="session")
def static_root(tmp_path_factory):
    """The static files collected once per session, as `make run` collects them (bench/stack.py)."""
    return collect_static(tmp_path_factory.mktemp("static"))


@pytest.fixture(scope="session")
def stack(django_db_setup, django_db_blocker, tmp_path_factory, static_root):
    """The session's stack; started by :func:`stack_env` before a test that uses it (with that test's
    environment, so a module with its own ``STACK_ENV`` that comes first does not cost a restart)."""
    from core.redis_client import get_redis

    get_redis().flushdb()  # the worker's own Redis db (TEST_REDIS_DB): drop tasks and markers of earlier runs
    s = Stack(server_database_url(), settings.REDIS_URL, tmp_path_factory.mktemp("stack"), static_root=static_root)
    _SESSION_STACK.append(s)
    try:
        yield s
    finally:
        s.stop_all()


@pytest.fixture(autouse=True)
def stack_env(request):
    """A test that uses the stack gets it running with its module's ``STACK_ENV`` (none by default):
    started, or restarted only when that differs from what it runs with
    (:meth:`bench.stack.Stack.use_env`). Module-scoped fixtures that need it running call ``use_env``
    themselves (they are set up before this one)."""
    if "stack" in request.fixturenames:
        request.getfixturevalue("stack").use_env(_stack_env(request.node))


@pytest.fixture(autouse=True)
def forget_frequency_caps():
    """Each test starts with no frequency-cap windows in Redis (``fcap:*``, and the tracking markers
    ``fcap-tracking:*``, which would let a moved clock skip a rebuild): in-process tests roll
    their rows back but reuse user ids, whose windows would otherwise carry over. A window left
    out is rebuilt from Postgres, so this never hides a slot the stack's own rows hold."""
    import redis as redis_lib

    from core.redis_client import get_redis

    try:
        r = get_redis()
        keys = list(r.scan_iter("fcap:*", count=1000)) + list(r.scan_iter("fcap-tracking:*", count=1000))
        if keys:
            r.delete(*keys)
    except redis_lib.RedisError:
        pass


@pytest.fixture
def live_db(django_db_blocker):
    """Database access in autocommit mode: what the test writes is visible to the stack at once."""
    with django_db_blocker.unblock():
        yield


def reset_isolation() -> None:
    """Forget every circuit breaker, bulkhead and token bucket (Redis), so one test's injected
    provider outage never leaves a breaker open for the next."""
    from core.redis_client import get_redis

    r = get_redis()
    # SCAN's default COUNT of 10 took 1.3 s for the three patterns once an end-to-end session had
    # left 15,000 keys (sent markers): twice per end-to-end test.
    keys = [k for pattern in ("breaker:*", "bulkhead:*", "bucket:*") for k in r.scan_iter(pattern, count=1000)]
    if keys:
        r.delete(*keys)


def reset_acceptance_windows() -> None:
    """Empty every abuse-limit window (docs/POLICIES.md, Redis): for a test, or a Hypothesis example,
    whose database starts afresh while Redis would remember the OTPs sent to ``alice`` before."""
    from core.redis_client import get_redis

    r = get_redis()
    keys = list(r.scan_iter("acceptance:*", count=1000))  # (as above: before every test)
    if keys:
        r.delete(*keys)


@pytest.fixture(autouse=True)
def fresh_acceptance_windows():
    """Every test starts with empty abuse-limit windows: the database rolls back between tests,
    Redis does not."""
    reset_acceptance_windows()


@pytest.fixture(scope="module")
def module_emulator():
    """A test module's own emulator subprocess (receipts off), for in-process tests that run no stack;
    one per module. Not :func:`emulator`, which is the stack's (end-to-end tests)."""
    from tests.providers.conftest import EmulatorProcess

    server = EmulatorProcess(env={"EMULATOR_RECEIPTS": "0"}).start()
    yield server
    server.stop()


@pytest.fixture
def emulator(stack):
    """The stack's emulator with no faults and an empty message list; breakers closed."""
    stack.clear_faults()
    stack.set_clock_offset(0)
    reset_isolation()
    yield stack
    stack.clear_faults()
    stack.set_clock_offset(0)
    reset_isolation()


class Api:
    """A requests session for one API client against the stack's API server."""

    def __init__(self, base: str, key: str) -> None:
        self.base = base
        self.session = requests.Session()
        self.session.headers["Authorization"] = f"Api-Key {key}"

    def request(self, method: str, path: str, *, key: str | None = None, **kw) -> requests.Response:
        headers = kw.pop("headers", {})
        if key is not None:
            headers["Idempotency-Key"] = key
        try:
            return self.session.request(method, self.base + path, headers=headers, timeout=10, **kw)
        except requests.ConnectionError as exc:
            if "reset by peer" not in str(exc) and "RemoteDisconnected" not in str(exc):
                raise
            # gunicorn closes an idle keep-alive connection after its keep-alive time (2 s): a request
            # sent on it at that instant is reset unread (seen under load on a campaign cancel). Once
            # more on a new connection; sends carry their Idempotency-Key, so a retry is safe anyway.
            return self.session.request(method, self.base + path, headers=headers, timeout=10, **kw)

    def send(self, body: dict, key: str | None = None) -> requests.Response:
        return self.request("POST", "/v1/notifications", json=body, key=key or uuid.uuid4().hex)

    def put_user(self, user_id: str, **fields) -> dict:
        r = self.request("PUT", f"/v1/users/{user_id}", json=fields)
        assert r.status_code in (200, 201), r.text
        return r.json()


#: Every scope: the end-to-end tests' client plays every internal service at once.
EVERY_SCOPE = list(Scope.values)
#: A marketing tool's key: its segments, templates and campaigns, and reads; no priority high.
MARKETING_SCOPES = [Scope.SEGMENTS_WRITE, Scope.TEMPLATES_WRITE, Scope.CAMPAIGNS_WRITE, Scope.READ]


def make_client(name: str = "tests", allow_high: bool = True, rate_limit: str = "",
                scopes: list[str] | None = None) -> tuple:
    """A new API client and its key: ``scopes`` (default :data:`EVERY_SCOPE`), with
    ``notifications:send_high`` exactly when ``allow_high``."""
    from notifications.models import APIClient

    return APIClient.objects.create_key(name=f"{name}-{uuid.uuid4().hex[:6]}", allow_high=allow_high,
                                        rate_limit=rate_limit, scopes=list(EVERY_SCOPE if scopes is None else scopes))


@pytest.fixture
def api(stack, live_db) -> Api:
    _, key = make_client()
    return Api(stack.api, key)


@pytest.fixture
def uid() -> str:
    """A fresh user id, so end-to-end tests never see each other's rows."""
    return f"u-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def fast_password_hashing(settings):
    """Users created with a password (admin_client, staff logins) skip PBKDF2's deliberate slowness."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def frozen(request, monkeypatch):
    """The platform clock (``core.clock.now``) stands at the test module's ``NOW`` (an aware
    UTC datetime); returns a one-item list, so a test moves the clock with ``frozen[0] = …``."""
    from core import clock

    current = [request.module.NOW]
    monkeypatch.setattr(clock, "now", lambda: current[0])
    return current


@pytest.fixture
def host_clock(monkeypatch):
    """The host clock Django's signing reads (``time.time`` in ``django.core.signing``), standing
    still until a test moves it: ``host_clock[0] += seconds``."""
    from django.core import signing

    current = [1_800_000_000.0]
    monkeypatch.setattr(signing, "time", type("FakeTime", (), {"time": staticmethod(lambda: current[0])}))
    return current


@pytest.fixture
def fresh_subscriptions():
    """Each test reads the webhook subscriptions anew: the per-process cache
    (``notifications.webhooks.outbox.subscribers``) forgotten before and after it."""
    from notifications.webhooks import outbox

    outbox.forget_subscriptions()
    yield
    outbox.forget_subscriptions()
