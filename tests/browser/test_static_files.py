"""Static files as ``make run`` serves them: the ``Procfile``'s gunicorn with WhiteNoise and the
collected, hashed files (see ``conftest.web_server``). Without them every admin page is unstyled and
without JavaScript, ``/api/docs/`` is blank and the campaign form's Segment and Template pickers
are empty, so a campaign cannot be created in the admin at all.
"""

from __future__ import annotations

import pytest
import requests

from campaigns import roles, services

pytestmark = pytest.mark.browser

expect = pytest.importorskip("playwright.sync_api", reason="the pip package `playwright` is not installed").expect

# Django admin's base.css: `#header { background: var(--header-bg) }`, --header-bg: #417690.
ADMIN_HEADER_BACKGROUND = "rgb(65, 118, 144)"


def record_static(page) -> dict[str, int]:
    """Collect ``{url: status}`` of every /static/ response the page loads (status 0: the request failed)."""
    seen: dict[str, int] = {}
    page.on("response", lambda r: seen.__setitem__(r.url, r.status) if "/static/" in r.url else None)
    page.on("requestfailed", lambda r: seen.__setitem__(r.url, 0) if "/static/" in r.url else None)
    return seen


def test_admin_pages_load_their_stylesheets_and_scripts(page, log_in, staff_member, web_server):
    static = record_static(page)
    log_in(*staff_member("mia", roles.MARKETING))
    page.goto("/admin/campaigns/campaign/add/")
    page.wait_for_load_state("load")

    stylesheets = [u for u in static if u.endswith(".css")]
    scripts = [u for u in static if u.endswith(".js")]
    assert any("/static/admin/css/base." in u for u in stylesheets), stylesheets
    assert any("/static/admin/js/vendor/select2/select2.full." in u for u in scripts), scripts
    assert {u: s for u, s in static.items() if s != 200} == {}
    # The styles apply, and the admin's JavaScript (jQuery + select2, the pickers' widget) runs.
    assert page.evaluate("getComputedStyle(document.getElementById('header')).backgroundColor") == \
        ADMIN_HEADER_BACKGROUND
    assert page.evaluate("typeof django !== 'undefined' && typeof django.jQuery.fn.select2") == "function"

    # Served as in production: hashed names from the manifest, cached for ever, gzip on request.
    css = next(u for u in stylesheets if "/static/admin/css/base." in u)
    assert css.rsplit("/", 1)[1].count(".") == 2  # base.<hash>.css
    r = requests.get(css, headers={"Accept-Encoding": "gzip"}, timeout=5)
    assert r.status_code == 200
    assert r.headers["Content-Encoding"] == "gzip"
    assert "immutable" in r.headers["Cache-Control"]


def test_the_root_url_leads_to_the_swagger_ui_api_docs(page):
    static = record_static(page)
    page.goto("/")
    assert page.url.endswith("/api/docs/")
    expect(page.locator(".swagger-ui .info .title")).to_contain_text("Notification platform API")
    expect(page.locator(".opblock-summary-path[data-path='/v1/notifications']").first).to_be_visible()
    assert any("swagger-ui-bundle." in u for u in static), static
    assert {u: s for u, s in static.items() if s != 200} == {}


def test_campaign_form_offers_segments_and_templates_in_its_pickers(page, log_in, staff_member):
    services.upsert_segment("spring", name="Spring audience")
    services.upsert_segment("vip", name="VIP customers")
    for template_id, name in [("spring-sms", "Spring SMS"), ("welcome", "Welcome")]:
        services.upsert_template(template_id, name=name, default_locale="en",
                                 variants=[{"locale": "en", "body": "Hello {{ first_name }}"}])
    log_in(*staff_member("mia", roles.MARKETING))
    page.goto("/admin/campaigns/campaign/add/")

    for field, expected in [("segment", ["Spring audience", "VIP customers"]),
                            ("template", ["Spring SMS", "Welcome"])]:
        page.click(f".field-{field} .select2-selection")
        options = page.locator(".select2-container--open .select2-results__option")
        expect(options).to_have_count(len(expected))
        assert sorted(options.all_inner_texts()) == expected
        page.keyboard.press("Escape")
