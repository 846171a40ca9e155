"""Provider health: an admin page for the on-call engineer (staff only), linked from the admin index.

Per channel: the providers in order, emulator or real, their calls in the last N minutes by outcome;
queue depths, pending rows, scheduler lag, dead letters; each provider's breaker state and budget;
the partitioned tables' retention and last maintenance run (docs/OPERATIONS.md, "Provider health
page"). :func:`install` (``config/urls.py``) adds ``/admin/provider-health/`` before the site's own
URLs and an "Operations" entry. The attempts query reads at most :data:`ATTEMPT_SCAN_CAP` newest
attempts by primary key (no ``created_at`` index) and the page says when the window held more.
"""

from __future__ import annotations

import logging
import re
import weakref
from datetime import timedelta

from django.contrib import admin
from django.db import connection
from django.http import HttpResponseBadRequest
from django.template import engines
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html_join

from core import clock
from notifications.health import CALL_OUTCOMES, ERROR_OUTCOMES, NOT_CALLED_CODES
from notifications.provider_minutes.last_hour import last_hour

log = logging.getLogger(__name__)

WINDOW_MINUTES = 15
WINDOW_MAX_MINUTES = 60
ATTEMPT_SCAN_CAP = 50_000
OUTCOMES = CALL_OUTCOMES
#: The key :func:`recent_calls` counts refused attempts under (``health.NOT_CALLED_CODES``): no call
#: was made, so they are in no outcome column, total or error ratio, only in the breaker cell.
REFUSED = "not_called"
#: The table's outcome headers: a line may break after an underscore (the page fits a 1366 px window).
OUTCOME_HEADERS = [format_html_join("", "{}<wbr>", ((part,) for part in re.split("(?<=_)", o))) for o in OUTCOMES]

_RECENT_SQL = """
WITH recent AS (
    SELECT provider, CASE WHEN error_code = ANY(%(not_called)s) THEN %(refused)s ELSE outcome END AS outcome,
           created_at FROM notifications_deliveryattempt ORDER BY id DESC LIMIT %(cap)s
)
SELECT provider, outcome, count(*) FILTER (WHERE created_at >= %(since)s), NULL::timestamptz
  FROM recent GROUP BY provider, outcome
UNION ALL
SELECT NULL, NULL, count(*), min(created_at) FROM recent
"""


def recent_calls(minutes: int) -> tuple[dict[tuple[str, str], int], bool]:
    """``({(provider, outcome): count}, truncated)`` for calls made in the last ``minutes`` (of the
    platform clock, which stamped them); attempts refused before a call under ``(provider, REFUSED)``."""
    since = clock.now() - timedelta(minutes=minutes)
    counts: dict[tuple[str, str], int] = {}
    truncated = False
    with connection.cursor() as cur:
        cur.execute(_RECENT_SQL, {"cap": ATTEMPT_SCAN_CAP, "since": since, "not_called": list(NOT_CALLED_CODES),
                                  "refused": REFUSED})
        for provider, outcome, count, oldest in cur.fetchall():
            if provider is None:
                truncated = count >= ATTEMPT_SCAN_CAP and oldest is not None and oldest >= since
            elif count:
                counts[(provider, outcome)] = count
    return counts, truncated


def breaker_text(name: str) -> str:
    """``closed``, ``open (12 s to the next probe)``, ``probe due (…)``, ``half-open (probing)`` plus how
    often it opened; the state is the breaker's own (``isolation.breaker_state``)."""
    import time

    from providers.isolation import breaker_state

    state = breaker_state(name)
    text = {"half_open": "half-open (probing)",
            "probe_due": "probe due (open period over: the next call decides)"}.get(state["state"], state["state"])
    if state["state"] == "open":
        text = f"open ({max(0.0, state['until_ms'] / 1000 - time.time()):.0f} s to the next probe)"
    if state["opened"]:
        text += f"; opened {state['opened']}×"
    return text


def refused_text(refused: int) -> str:
    """``; 587 not called (refused: breaker open, no slot or budget)`` for the window, or nothing."""
    return f"; {refused:,} not called (refused: breaker open, no slot or budget)" if refused else ""


def budget_text(name: str) -> str:
    """``1,000/s (100/s reserved for high); ≤ 6 high / 32 standard calls at once``."""
    from providers.isolation import limits_for

    limits = limits_for(name)
    return (f"{limits.rate_per_s:,.0f}/s ({limits.high_reserved_per_s:,.0f}/s reserved for high); "
            f"≤ {limits.max_concurrency.get('high')} high / {limits.max_concurrency.get('standard')} "
            "standard calls at once")


def provider_rows(minutes: int) -> tuple[list[dict], bool]:
    """One row per configured provider (channel order, primary first) with its recent calls."""
    from notifications.health import providers_overview

    counts, truncated = recent_calls(minutes)
    rows = []
    for channel, providers in providers_overview().items():
        for position, p in enumerate(providers, start=1):
            by_outcome = [counts.get((p["name"], o), 0) for o in OUTCOMES]
            total = sum(by_outcome)
            errors = sum(counts.get((p["name"], o), 0) for o in ERROR_OUTCOMES)
            rows.append({
                "channel": channel, "position": position, "name": p["name"], "primary": p["primary"],
                "mode": p["mode"], "missing_env": p["missing_env"], "by_outcome": by_outcome, "total": total,
                "error_ratio": f"{errors / total:.1%}" if total else "–",
                "breaker": breaker_text(p["name"]) + refused_text(counts.get((p["name"], REFUSED), 0)),
                "budget": budget_text(p["name"]),
            })
    return rows, truncated


def _queues() -> tuple[list[dict], str]:
    from notifications.health import queue_snapshot

    try:
        snapshot = queue_snapshot()
    except Exception as exc:
        log.warning("provider health: queue depths unavailable: %s", exc)
        return [], f"broker unreachable ({type(exc).__name__})"
    if not snapshot:
        return [], "the broker is not Redis: depths not available"
    return [{"name": q, "depth": info["depth"],
             "oldest": "–" if info["oldest_age"] is None else f"{info['oldest_age']:.1f} s"}
            for q, info in snapshot.items()], ""


def _pipeline() -> tuple[dict | None, str]:
    from notifications.health import pipeline_snapshot

    try:
        return pipeline_snapshot(), ""
    except Exception as exc:
        log.warning("provider health: pipeline snapshot unavailable: %s", exc)
        return None, f"Postgres query failed ({type(exc).__name__})"


_TEMPLATE = engines["django"].from_string("""{% extends "admin/base_site.html" %}
{% block title %}Provider health | {{ site_title|default:"Django site admin" }}{% endblock %}
{% block breadcrumbs %}<div class="breadcrumbs"><a href="{% url 'admin:index' %}">Home</a> › Provider health</div>
{% endblock %}
{% block content %}<div id="content-main">
<p>Provider calls in the last <b>{{ minutes }} min</b> (window:
{% for m in windows %}<a href="?minutes={{ m }}">{{ m }} min</a>{% if not forloop.last %} · {% endif %}{% endfor %}),
from the delivery log. Error ratio = (transient + permanent + configuration) / all calls; contact_invalid is about
the recipient, not the provider.{% if truncated %} <b>More than {{ cap }} calls in this window: only the newest
{{ cap }} are counted.</b>{% endif %}</p>
<h2>Providers</h2>
<div class="table-scroll"><table id="providers">
<thead><tr><th>Channel</th><th>Order</th><th>Provider</th><th>Mode</th>
{% for o in outcome_headers %}<th>{{ o }}</th>{% endfor %}<th>All calls</th><th>Error ratio</th>
<th>Circuit breaker</th><th>Send budget</th></tr></thead>
<tbody>{% for p in providers %}
<tr><td>{{ p.channel }}</td><td>{{ p.position }}{% if p.primary %} (primary){% endif %}</td><td>{{ p.name }}</td>
<td>{{ p.mode }}{% if p.mode == "emulator" and p.missing_env %}
<br><small>real needs: {{ p.missing_env|join:", " }}</small>
{% elif p.mode == "real" and p.missing_env %}
<br><small style="color:#cf222e">missing: {{ p.missing_env|join:", " }}</small>{% endif %}</td>
{% for c in p.by_outcome %}<td>{{ c }}</td>{% endfor %}<td>{{ p.total }}</td><td>{{ p.error_ratio }}</td>
<td>{{ p.breaker }}</td><td>{{ p.budget }}</td></tr>
{% endfor %}</tbody></table></div>
{% include "admin/provider_health/last_hour.html" %}
<h2>Queues</h2>
{% if queues_error %}<p class="errornote">{{ queues_error }}</p>{% else %}
<table id="queues"><thead><tr><th>Queue</th><th>Depth</th><th>Oldest message</th></tr></thead>
<tbody>{% for q in queues %}<tr><td>{{ q.name }}</td><td>{{ q.depth }}</td><td>{{ q.oldest }}</td></tr>{% endfor %}
</tbody></table>{% endif %}
<h2>Pipeline</h2>
{% if pipeline_error %}<p class="errornote">{{ pipeline_error }}</p>{% else %}
<table id="pipeline"><tbody>
<tr><th>Dead letters</th><td>
<a href="{% url 'admin:notifications_deadletter_changelist' %}">{{ pipeline.dead_letters }}</a>
{% if pipeline.dead_letters_oldest_age_seconds is not None %}(oldest {{ dead_oldest }}){% endif %}</td></tr>
<tr><th>Scheduled / queued / sending</th><td>{{ pipeline.pending.scheduled }} / {{ pipeline.pending.queued }} /
{{ pipeline.pending.sending }}</td></tr>
<tr><th>Due but not released (scheduler lag)</th><td>{{ pipeline.due_unreleased }} ({{ lag }})</td></tr>
<tr><th>Expired worker leases</th><td>{{ pipeline.expired_leases }}</td></tr>
</tbody></table>{% endif %}
<h2>Retention</h2>
{% if partitions_error %}<p class="errornote">{{ partitions_error }}</p>{% else %}
<p>Last partition maintenance: {% if partitions.last_run.at %}{{ partitions.last_run.at|date:"Y-m-d H:i:s" }} UTC,
<b>{{ partitions.last_run.outcome }}</b>{% if partitions.last_run.success_at %} (last success
{{ partitions.last_run.success_at|date:"Y-m-d H:i:s" }} UTC){% endif %}{% else %}never recorded{% endif %}.</p>
{% if partitions.stale %}<p class="errornote" id="partitions-stale"><b>Stale</b>: no successful partition
maintenance in the last {{ stale_after }} (twice its interval). The days ahead run out after
PARTITIONS_AHEAD_DAYS and rows then land in DEFAULT: check beat and the maintenance worker.</p>{% endif %}
<table id="partitions"><thead><tr><th>Table</th><th>Retention</th><th>Day partitions</th><th>Oldest day</th>
<th>Rows in DEFAULT</th></tr></thead>
<tbody>{% for t in partitions.tables %}<tr><td>{{ t.table }}</td><td>{{ t.retention_days }} days</td>
<td>{{ t.partitions }}</td><td>{{ t.oldest_day|date:"Y-m-d"|default:"–" }}</td><td>{{ t.default_rows }}</td></tr>
{% endfor %}</tbody></table>{% endif %}
</div>{% endblock %}
""")


def _partitions() -> tuple[dict | None, str]:
    from notifications.health import partition_snapshot

    try:
        return partition_snapshot(), ""
    except Exception as exc:
        log.warning("provider health: partition snapshot unavailable: %s", exc)
        return None, f"partition query failed ({type(exc).__name__})"


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "–"
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def make_view(site: admin.AdminSite):
    def provider_health(request):
        raw = request.GET.get("minutes", str(WINDOW_MINUTES))
        if not (raw.isascii() and raw.isdigit()) or not 1 <= int(raw) <= WINDOW_MAX_MINUTES:
            return HttpResponseBadRequest(f"minutes: a whole number of minutes from 1 to {WINDOW_MAX_MINUTES}, "
                                          f"not {raw[:20]!r}", content_type="text/plain; charset=utf-8")
        minutes = int(raw)
        providers, truncated = provider_rows(minutes)
        hour = last_hour(list(dict.fromkeys(p["name"] for p in providers)))
        queues, queues_error = _queues()
        pipeline, pipeline_error = _pipeline()
        partition_state, partitions_error = _partitions()
        context = {
            **site.each_context(request), "title": "Provider health", "minutes": minutes,
            "windows": (5, 15, 60), "outcome_headers": OUTCOME_HEADERS, "providers": providers, "truncated": truncated,
            "cap": ATTEMPT_SCAN_CAP, "queues": queues, "queues_error": queues_error, "pipeline": pipeline,
            "pipeline_error": pipeline_error, "partitions": partition_state, "partitions_error": partitions_error,
            "dead_oldest": _age(pipeline["dead_letters_oldest_age_seconds"]) if pipeline else "",
            "lag": _age(pipeline["scheduler_lag_seconds"]) if pipeline else "",
            "last_hour": hour,
            "stale_after": _age(partition_state["stale_after"].total_seconds()) if partition_state else "",
        }
        return TemplateResponse(request, _TEMPLATE, context)

    return provider_health


#: The sites :func:`install` has patched (it is idempotent).
_installed: weakref.WeakSet[admin.AdminSite] = weakref.WeakSet()


def install(site: admin.AdminSite = admin.site) -> None:
    """Add the page's URL to ``site`` and an "Operations › Provider health" entry to its index.

    Call before ``site.urls`` is read (``config/urls.py`` does). Idempotent.
    """
    if site in _installed:
        return
    site_get_urls = site.get_urls
    site_get_app_list = site.get_app_list

    def get_urls():
        page = path("provider-health/", site.admin_view(make_view(site)), name="provider_health")
        return [page, *site_get_urls()]

    def get_app_list(request, app_label=None):
        apps = site_get_app_list(request, app_label)
        user = getattr(request, "user", None)
        if app_label is None and user is not None and user.is_active and user.is_staff:
            url = reverse("admin:provider_health", current_app=site.name)
            apps = [*apps, {
                "name": "Operations", "app_label": "operations", "app_url": url, "has_module_perms": True,
                "models": [{"name": "Provider health", "object_name": "ProviderHealth", "admin_url": url,
                            "add_url": None, "view_only": True, "perms": {"view": True}}],
            }]
        return apps

    # Patching this one instance (the default site, whose class settings do not choose here).
    site.get_urls = get_urls  # type: ignore[method-assign]
    site.get_app_list = get_app_list  # type: ignore[method-assign]
    _installed.add(site)
