"""deploy/: the Grafana dashboard and the Prometheus alert rules stay true to ``/metrics``. Every series
they name is one the platform exposes (the event series of notifications/metrics_series.py, the
scrape-time gauges of notifications/metrics_scrape.py), every dashboard query parses, the dashboard
imports anywhere (its datasource an input), and each alert is explained in docs/OPERATIONS.md and
links a section that exists. promtool checks and unit-tests the rules themselves (`make alert-rules`)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest
import yaml
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from bench.stack import ROOT
from core import partitions
from core.queues import ALL_QUEUES, WORKERS
from core.redis_client import get_redis
from notifications import health, metrics
from notifications.metrics_series import Series
from notifications.models import Notification
from preferences.models import Recipient
from tests.test_docs import _anchors

DASHBOARD = ROOT / "deploy" / "grafana" / "notifications.json"
ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yml"
OPERATIONS = ROOT / "docs" / "OPERATIONS.md"
SERIES = re.compile(r"\bnotify_[a-z0-9_]+")
#: The sample names each type of event series exposes.
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count")}


def dashboard_queries() -> list[str]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [target["expr"] for panel in panels for target in panel.get("targets", [])]


def alert_rules() -> list[dict]:
    return [rule for group in yaml.safe_load(ALERTS.read_text())["groups"] for rule in group["rules"]]


@pytest.fixture
def exposed(client, settings, tmp_path):
    """Every sample name /metrics can expose: the event series as declared (a labelled one appears
    only with its first event), the gauges of a scrape made with every conditional one present."""
    settings.METRICS_TOKEN = ""
    names = {family.name + suffix for family in Series().registry.collect() for suffix in SUFFIXES[family.type]}
    health.write_beat_heartbeat()
    health.write_worker_heartbeat(ALL_QUEUES)
    partitions.maintain()
    recipient = Recipient.objects.create(user_id=f"dash-{uuid.uuid4().hex[:8]}")
    Notification.objects.create(id=uuid.uuid4(), recipient=recipient, channel="sms", body="b", status="queued",
                                queued_at=timezone.now())
    metrics.use_multiprocess_dir(str(tmp_path / "prometheus"))
    try:
        response = client.get("/metrics")
    finally:
        metrics.use_multiprocess_dir(None)
    assert response.status_code == 200
    gauges = {f.name for f in text_string_to_metric_families(response.content.decode()) if f.type == "gauge"}
    assert {"notify_scheduler_heartbeat_age_seconds", "notify_queued_oldest_age_seconds",
            "notify_partition_maintenance_last_success_timestamp", "notify_worker_heartbeat_age_seconds",
            "notify_receipts_buffered", "notify_housekeeping_last_success_timestamp",
            "notify_housekeeping_interval_seconds"} <= gauges
    yield names | gauges
    get_redis().delete(health.HEARTBEAT_KEY, partitions.LAST_RUN_KEY,
                       *(health.WORKER_HEARTBEAT_PREFIX + kind for kind in WORKERS))


@pytest.mark.django_db
def test_every_series_the_dashboard_and_the_alerts_name_is_exposed(exposed):
    used = {name for expr in [*dashboard_queries(), *(rule["expr"] for rule in alert_rules())]
            for name in SERIES.findall(expr)}
    assert used - exposed == set()
    # What an operator needs to look at is all there.
    assert {"notify_accept_to_provider_seconds_bucket", "notify_queue_depth", "notify_queue_oldest_age_seconds",
            "notify_notification_outcomes_total", "notify_dead_letters", "notify_provider_breaker_state",
            "notify_receipts_buffered", "notify_worker_heartbeat_age_seconds",
            "notify_partition_maintenance_last_success_timestamp", "notify_task_failures_total",
            "notify_queued_oldest_age_seconds", "notify_housekeeping_last_success_timestamp",
            "notify_housekeeping_interval_seconds"} <= used


def test_the_dashboard_imports_anywhere():
    dashboard = json.loads(DASHBOARD.read_text())
    assert [i["name"] for i in dashboard["__inputs"]] == ["DS_PROMETHEUS"]
    panels = dashboard["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    sources = {json.dumps(t["datasource"]) for p in panels for t in p.get("targets", [])}
    sources |= {json.dumps(p["datasource"]) for p in panels if "datasource" in p}
    assert sources == {json.dumps({"type": "prometheus", "uid": "${DS_PROMETHEUS}"})}
    assert all(p["gridPos"]["x"] + p["gridPos"]["w"] <= 24 for p in panels)


#: promtool on the PATH, or where `make alert-rules` puts it (.venv/bin), or None.
PROMTOOL = shutil.which("promtool") or shutil.which("promtool",
                                                   path=str(Path(__file__).resolve().parents[1] / ".venv" / "bin"))


@pytest.mark.skipif(PROMTOOL is None, reason="promtool is missing (`make alert-rules` takes it out of Debian's "
                                              "prometheus package, as root)")
def test_every_dashboard_query_parses(tmp_path):
    """promtool parses each query as a recording rule's expression (it has no query checker)."""
    rules = tmp_path / "dashboard.yml"
    rules.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:query{i}", "expr": expr} for i, expr in enumerate(dashboard_queries())]}]}))
    checked = subprocess.run([str(PROMTOOL), "check", "rules", str(rules)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_each_alert_is_explained_and_links_a_section_that_exists():
    section = OPERATIONS.read_text().split("\n## Dashboards and alerts\n", 1)[1].split("\n## ", 1)[0]
    anchors = _anchors(OPERATIONS)
    for rule in alert_rules():
        assert f"`{rule['alert']}`" in section, rule["alert"]
        assert rule["labels"]["severity"] in ("page", "ticket")
        assert {"summary", "description", "runbook"} <= set(rule["annotations"])
        file, _, anchor = rule["annotations"]["runbook"].partition("#")
        assert (file, anchor in anchors) == ("docs/OPERATIONS.md", True), rule["annotations"]["runbook"]
