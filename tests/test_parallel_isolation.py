"""`make test` runs the suite in two pytest-xdist workers: each has its own test database, Redis
database and Prometheus directory (config/test_settings.py, tests/conftest.py), and every test that
uses the end-to-end stack is in one xdist group, so only one worker starts a stack."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid

import pytest
from django.conf import settings
from django.db import connection

from bench.stack import ROOT

SHOW_SETTINGS = ("from django.conf import settings; import json, os; print(json.dumps([settings.REDIS_URL, "
                 "settings.SPARE_REDIS_DB, settings.PROMETHEUS_MULTIPROC_DIR, "
                 "os.environ['PROMETHEUS_MULTIPROC_DIR']]))")


def test_settings(tmp_path, **env: str) -> list:
    """``config.test_settings`` as a process with ``env`` (on top of this one's, minus xdist's) reads it."""
    base = {k: v for k, v in os.environ.items()
            if not k.startswith(("PYTEST_XDIST_", "PROMETHEUS_MULTIPROC_DIR", "NOTIFY_TEST_PROM_DIR"))}
    done = subprocess.run([sys.executable, "-c", SHOW_SETTINGS], cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env={**base, "DJANGO_SETTINGS_MODULE": "config.test_settings", "TEST_REDIS_DB": "9", **env})
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


test_settings.__test__ = False  # a helper, not a test


def test_each_worker_has_its_own_redis_database_and_prometheus_directory(tmp_path):
    controller = tmp_path / "prom"
    controller.mkdir()
    inherited = {"PROMETHEUS_MULTIPROC_DIR": str(controller), "NOTIFY_TEST_PROM_DIR": str(controller),
                 "PYTEST_XDIST_WORKER_COUNT": "2"}
    gw0 = test_settings(tmp_path, PYTEST_XDIST_WORKER="gw0", **inherited)
    gw1 = test_settings(tmp_path, PYTEST_XDIST_WORKER="gw1", **inherited)
    assert gw0 == [settings.REDIS_URL.rsplit("/", 1)[0] + "/9", 11, str(controller / "gw0"), str(controller / "gw0")]
    assert gw1 == [settings.REDIS_URL.rsplit("/", 1)[0] + "/10", 11, str(controller / "gw1"), str(controller / "gw1")]


def test_a_process_given_its_own_prometheus_directory_keeps_it(tmp_path):
    """A worker's child with a directory of its own (tests/test_metrics.py) is not moved into a subdirectory."""
    own = tmp_path / "own"
    own.mkdir()
    child = test_settings(tmp_path, PYTEST_XDIST_WORKER="gw1", PROMETHEUS_MULTIPROC_DIR=str(own),
                          NOTIFY_TEST_PROM_DIR=str(tmp_path / "controller"))
    assert child[2:] == [str(own), str(own)]


def test_without_xdist_the_base_redis_database_is_used(tmp_path):
    assert test_settings(tmp_path)[:2] == [settings.REDIS_URL.rsplit("/", 1)[0] + "/9", 10]


@pytest.mark.django_db
def test_a_worker_tests_against_a_database_of_its_own():
    """pytest-django names each worker's test database ``<name>_gwN``; the conftest's own
    ``django_db_setup`` must ask for that (``django_db_modify_db_settings``)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    name = settings.DATABASES["default"]["TEST"]["NAME"] or ""
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_database()")
        [current] = cursor.fetchone()
    if worker is None:
        pytest.skip("not an xdist worker (make test runs two)")
    assert current == connection.settings_dict["NAME"]
    assert current.endswith(f"_{worker}") and name.endswith(f"_{worker}"), (current, name)


#: Collects as an xdist worker does (``--dist loadgroup``), then prints each test's scope as the
#: controller's scheduler reads it from the node id the worker reports: its group, or the id itself.
COLLECT = """
import sys, pytest
from xdist.scheduler import LoadGroupScheduling
class Worker:
    @pytest.hookimpl(tryfirst=True)
    def pytest_configure(self, config):
        config.option.loadgroup = True
    def pytest_collection_finish(self, session):
        scheduler = LoadGroupScheduling.__new__(LoadGroupScheduling)  # only its scope rule is used
        for item in session.items:
            scope = scheduler._split_scope(item.nodeid)
            print("GROUP", item.nodeid.split("@")[0], "-" if scope == item.nodeid else scope)
sys.exit(pytest.main(sys.argv[1:], plugins=[Worker()]))
"""


def test_the_stack_tests_are_one_xdist_group_with_chaos_last():
    """Collected as an xdist worker collects them and scheduled as the controller reads their ids:
    every test that uses the stack is in the group ``stack`` (one stack, on one worker), the chaos
    module's (its own stack environment) after all others; the browser tests are the group
    ``browser``; every other test is on its own. (With pytest 9.2 xdist's own suffix was lost and
    nothing was grouped: two stacks.)"""
    files = ["tests/test_caps.py", "tests/chaos/test_chaos.py", "tests/test_e2e_delivery.py",
             "tests/browser/test_admin_roles.py", "tests/test_make_run.py"]
    done = subprocess.run([sys.executable, "-c", COLLECT, "--collect-only", "-q", "-p", "no:cacheprovider", *files],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = [line.split()[1:] for line in done.stdout.splitlines() if line.startswith("GROUP ")]
    groups = {}
    for nodeid, group in rows:
        groups.setdefault(nodeid.split("::")[0], set()).add(group)
    assert groups == {"tests/test_e2e_delivery.py": {"stack"}, "tests/chaos/test_chaos.py": {"stack"},
                      "tests/browser/test_admin_roles.py": {"browser"}, "tests/test_caps.py": {"-"},
                      "tests/test_make_run.py": {"-"}}
    stack_files = [nodeid.split("::")[0] for nodeid, group in rows if group == "stack"]
    assert stack_files == sorted(stack_files, key=lambda path: "chaos" in path)
    assert stack_files[-1] == "tests/chaos/test_chaos.py"


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("as_migrated")
def test_after_a_group_the_database_redis_and_metric_files_are_as_migrated(django_db_blocker, settings, tmp_path):
    """What a worker's next test finds after the stack's group (committed rows, Redis keys, the stack's
    metric files) or the browser's (a flushed database): the database as migrated (its staff groups
    and notification types), an empty Redis database, only this process's metric files; the stack stopped."""
    from django.contrib.auth.models import Group

    from core.redis_client import get_redis
    from notifications.models import Notification
    from preferences.models import Recipient
    from tests.conftest import restore_after_group

    migrated = sorted(Group.objects.values_list("name", flat=True))
    assert migrated  # campaigns' staff groups (a data migration)
    recipient = Recipient.objects.create(user_id="left-by-the-stack")
    Notification.objects.create(id=uuid.uuid4(), recipient=recipient, channel="sms", body="b")
    Group.objects.all().delete()  # as a flush would
    get_redis().set("sent:left-by-the-stack", 1)
    settings.PROMETHEUS_MULTIPROC_DIR = str(tmp_path)
    own, other = tmp_path / f"counter_{os.getpid()}.db", tmp_path / "counter_999999999.db"
    own.write_bytes(b"")
    other.write_bytes(b"")
    stopped = []

    class Stopped:
        procs = {"web": object()}

        def stop_all(self):
            stopped.append(True)

    restore_after_group(Stopped(), django_db_blocker)
    assert stopped == [True]
    assert (Recipient.objects.count(), Notification.objects.count()) == (0, 0)
    assert sorted(Group.objects.values_list("name", flat=True)) == migrated
    assert get_redis().dbsize() == 0
    assert [p.name for p in tmp_path.iterdir()] == [own.name]
