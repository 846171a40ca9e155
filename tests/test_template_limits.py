"""What one save may carry (issue 23, findings 6 and 7; docs/TYPES.md, "Limits"): at most 50 variants
per template and 200 templates per type, refused before any is checked; ONE CPU budget for checking
all the templates of one request (``TEMPLATE_CHECK_CPU_MS``), not one per template; a body over
100,000 characters refused in the house style.

The budget is tested with a fake CPU clock (each read advances it by a fixed step), so the verdict
does not depend on the machine: every template alone is far inside the budget, all of them together
are not."""

from __future__ import annotations

import json

import pytest
from django.contrib.auth.models import Group, User
from django.test import Client
from django.urls import reverse

from campaigns.models import Template
from notifications.events.models import NotificationType
from notifications.models import APIClient
from notifications.rendering import check_parts, checking
from tests.conftest import EVERY_SCOPE

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("fast_password_hashing")]

#: Each read of the fake CPU clock advances it this far (seconds): a one-part template's check reads
#: it a handful of times (before the compile, before each of four dry renders).
STEP = 0.01


@pytest.fixture
def http() -> Client:
    _, key = APIClient.objects.create_key(name="tool", scopes=list(EVERY_SCOPE))
    return Client(headers={"Authorization": f"Api-Key {key}"})


@pytest.fixture
def fake_cpu(monkeypatch, settings):
    """A CPU clock that advances STEP per read, and a check budget of 1,000 ms."""
    settings.CAMPAIGNS = {**settings.CAMPAIGNS, "CHECK_CPU_MS": 1000}
    now = [0.0]

    def clock() -> float:
        now[0] += STEP
        return now[0]

    monkeypatch.setattr(checking, "cpu_clock", clock)
    return now


def put(http, path, body):
    return http.put(path, data=json.dumps(body), content_type="application/json")


def variants(n: int, body: str = "Hi {{ first_name }}") -> list[dict]:
    return [{"locale": "en" if i == 0 else f"en-r{i:03d}", "body": body} for i in range(n)]


def a_type(templates: list[dict]) -> dict:
    return {"name": "Order shipped", "category": "shipping", "channels": ["sms"], "templates": templates}


BUDGET_SAYS = ("checking the templates of this request took more than 1,000 ms of CPU (TEMPLATE_CHECK_CPU_MS: one "
               "budget for all the templates and variants saved together); save fewer or simpler templates at once")


# --- counts ----------------------------------------------------------------------------------------

def test_a_template_of_more_than_50_variants_is_refused_before_any_is_checked(http, monkeypatch):
    checked = []
    monkeypatch.setattr(checking, "cpu_clock", lambda: checked.append(1) or 0.0)
    r = put(http, "/v1/templates/t", {"name": "T", "default_locale": "en", "variants": variants(51)})
    assert r.status_code == 422
    assert r.json()["error"]["fields"] == [
        {"field": "variants", "code": "max_length",
         "message": "51 variants; at most 50, one per locale (docs/TYPES.md)"}]
    assert not checked and not Template.objects.exists()
    r = put(http, "/v1/templates/t", {"name": "T", "default_locale": "en", "variants": variants(50)})
    assert r.status_code == 201


def test_a_type_of_more_than_200_templates_is_refused(http):
    r = put(http, "/v1/notification-types/order_shipped", a_type(
        [{"channel": "sms", "locale": f"en-r{i:03d}", "body": "Hi"} for i in range(201)]))
    assert r.status_code == 422
    assert r.json()["error"]["fields"] == [{"field": "templates", "code": "max_length", "message": (
        "201 templates; at most 200: each of the 4 channels in at most 50 locales (docs/TYPES.md)")}]
    assert not NotificationType.objects.exists()


def admin_post(client, n: int, body: str):
    user = User.objects.create_user("mia", is_staff=True)
    user.groups.add(Group.objects.get(name="marketing"))
    client.force_login(user)
    data = {"template_id": "t", "name": "T", "default_locale": "en", "variants-TOTAL_FORMS": str(n),
            "variants-INITIAL_FORMS": "0", "variants-MIN_NUM_FORMS": "1", "variants-MAX_NUM_FORMS": "1000"}
    for i, variant in enumerate(variants(n)):
        data.update({f"variants-{i}-locale": variant["locale"], f"variants-{i}-title": "",
                     f"variants-{i}-body": body, f"variants-{i}-html": ""})
    return client.post(reverse("admin:campaigns_template_add"), data)


def test_the_admin_refuses_more_than_50_variants(client):
    r = admin_post(client, 51, "Hi")
    assert r.status_code == 200
    assert r.context["inline_admin_formsets"][0].formset.non_form_errors() == [
        "51 variants; at most 50, one per locale (docs/TYPES.md)."]
    assert not Template.objects.exists()


# --- one budget per request --------------------------------------------------------------------------

def test_one_template_is_far_inside_the_budget(fake_cpu):
    before = fake_cpu[0]
    assert check_parts({"body": "Hi {{ first_name }}"}) == {}
    assert fake_cpu[0] - before <= 10 * STEP  # about 50 ms of the 1,000 on the fake clock


def test_checks_inside_one_budget_share_it_and_a_new_request_starts_afresh(fake_cpu):
    with pytest.raises(checking.CheckBudgetSpent) as caught, checking.check_budget():
        for _ in range(40):
            check_parts({"body": "Hi {{ first_name }}"})
    assert str(caught.value) == BUDGET_SAYS
    assert check_parts({"body": "Hi {{ first_name }}"}) == {}  # outside it: a budget of its own


def test_a_template_whose_variants_together_pass_the_budget_is_refused(http, fake_cpu):
    r = put(http, "/v1/templates/t", {"name": "T", "default_locale": "en", "variants": variants(40)})
    assert r.status_code == 422
    assert r.json()["error"]["fields"] == [{"field": "variants", "code": "render_budget", "message": BUDGET_SAYS}]
    assert not Template.objects.exists()
    r = put(http, "/v1/templates/t", {"name": "T", "default_locale": "en", "variants": variants(5)})
    assert r.status_code == 201, r.content


def test_the_admin_template_page_checks_all_variants_of_a_save_within_one_budget(client, fake_cpu):
    r = admin_post(client, 40, "Hi {{ first_name }}")
    assert r.status_code == 200
    errors = r.context["inline_admin_formsets"][0].formset.errors
    assert errors[0] == {} and errors[-1] == {"__all__": [BUDGET_SAYS[:1].upper() + BUDGET_SAYS[1:] + "."]}
    assert not Template.objects.exists()


def test_a_type_whose_templates_together_pass_the_budget_is_refused(http, fake_cpu):
    templates = [{"channel": "sms", "locale": v["locale"], "body": v["body"]} for v in variants(40)]
    r = put(http, "/v1/notification-types/order_shipped", a_type(templates))
    assert r.status_code == 422
    assert r.json()["error"]["fields"] == [{"field": "templates", "code": "render_budget", "message": BUDGET_SAYS}]
    assert not NotificationType.objects.exists()
    assert put(http, "/v1/notification-types/order_shipped", a_type(templates[:5])).status_code == 201


# --- the body limit ---------------------------------------------------------------------------------

def test_a_body_over_100000_characters_is_refused_in_the_house_style(http):
    r = put(http, "/v1/templates/t", {"name": "T", "default_locale": "en", "variants": [
        {"locale": "en", "title": "Hi", "body": "x" * 100_001}]})
    assert r.status_code == 422
    assert r.json()["error"]["fields"] == [
        {"field": "variants.0.body", "code": "max_length", "message": "body is 100001 characters; at most 100000"}]
    r = http.post("/v1/notifications", data=json.dumps({"user_id": "u", "channel": "email", "content": {
        "title": "Hi", "body": "x" * 100_001}}), content_type="application/json", headers={"Idempotency-Key": "k"})
    assert r.status_code == 422
    assert {"field": "content.body", "code": "max_length", "message": "body is 100001 characters; at most 100000"} in (
        r.json()["error"]["fields"])
