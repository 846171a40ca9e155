"""At most TEMPLATE_CHECK_CONCURRENCY requests check templates at once per process (attack report,
finding 1: eight saves of heavy templates at once starved every thread of a gthread worker, the
GIL being shared). The slot is taken by a request's check budget
(:mod:`notifications.rendering.checking`); a save that gets none within TEMPLATE_CHECK_WAIT_MS is
503 ``template_checks_busy`` with ``Retry-After`` (API) or a form error (admin), and writes nothing.

The slot is held by another thread (a request checking templates) and the wait is 0 ms, so the
verdict does not depend on timing."""

from __future__ import annotations

import json
import threading

import pytest
from django.contrib.auth.models import Group, User
from django.test import Client
from django.urls import reverse

from campaigns.models import Campaign, Template
from notifications.events.models import NotificationType
from notifications.models import APIClient
from notifications.rendering import checking
from tests.conftest import EVERY_SCOPE

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("fast_password_hashing")]

BUSY = ("other requests are checking templates: at most 1 at once per process (TEMPLATE_CHECK_CONCURRENCY), "
        "none free within 0 ms (TEMPLATE_CHECK_WAIT_MS); nothing was saved: retry shortly")


@pytest.fixture
def http() -> Client:
    _, key = APIClient.objects.create_key(name="tool", scopes=list(EVERY_SCOPE))
    return Client(headers={"Authorization": f"Api-Key {key}"})


@pytest.fixture
def marketing(client) -> Client:
    user = User.objects.create_user("mia", is_staff=True, is_superuser=True)
    user.groups.add(Group.objects.get(name="marketing"))
    client.force_login(user)
    return client


class Holder:
    """Another thread inside a request's template checks, holding the process's one slot."""

    def __init__(self) -> None:
        self.held, self.done = threading.Event(), threading.Event()
        self.thread = threading.Thread(target=self.run)
        self.thread.start()
        assert self.held.wait(10)

    def run(self) -> None:
        with checking.check_budget() as budget:
            budget.left()  # the first check takes the slot
            self.held.set()
            self.done.wait(10)

    def release(self) -> None:
        self.done.set()
        self.thread.join(10)
        assert not self.thread.is_alive()


@pytest.fixture
def holder(settings):
    settings.CAMPAIGNS = {**settings.CAMPAIGNS, "CHECK_CONCURRENCY": 1, "CHECK_WAIT_MS": 0, "CHECK_CPU_MS": 1000}
    held = Holder()
    yield held
    held.release()


def put(http, path, body):
    return http.put(path, data=json.dumps(body), content_type="application/json")


def assert_busy(r) -> None:
    assert r.status_code == 503, r.content
    assert r["Retry-After"] == "1"
    assert r.json() == {"error": {"status": 503, "code": "template_checks_busy", "message": BUSY}}


TEMPLATE = {"name": "T", "default_locale": "en", "variants": [{"locale": "en", "body": "Hi {{ first_name }}"}]}


def test_a_template_save_without_a_check_slot_is_503_and_saves_nothing(http, holder):
    assert_busy(put(http, "/v1/templates/t", TEMPLATE))
    assert not Template.objects.exists()
    holder.release()
    assert put(http, "/v1/templates/t", TEMPLATE).status_code == 201


def test_a_type_save_without_a_check_slot_is_503_and_saves_nothing(http, holder):
    kind = {"name": "Order shipped", "category": "shipping", "channels": ["sms"],
            "templates": [{"channel": "sms", "locale": "en", "body": "Shipped: {{ data.url }}"}]}
    assert_busy(put(http, "/v1/notification-types/order_shipped", kind))
    assert not NotificationType.objects.exists()
    holder.release()
    assert put(http, "/v1/notification-types/order_shipped", kind).status_code == 201


def test_inline_campaign_content_without_a_check_slot_is_503_and_saves_nothing(http, holder):
    assert put(http, "/v1/segments/vip", {"name": "VIPs"}).status_code == 201
    body = json.dumps({"segment_id": "vip", "channel": "sms", "content": {"body": "Hi {{ first_name }}"}})
    r = http.post("/v1/campaigns", data=body, content_type="application/json", headers={"Idempotency-Key": "c1"})
    assert_busy(r)
    assert not Campaign.objects.exists()
    holder.release()
    r = http.post("/v1/campaigns", data=body, content_type="application/json", headers={"Idempotency-Key": "c2"})
    assert r.status_code == 202, r.content


def test_a_request_that_checks_no_template_takes_no_slot(http, holder):
    assert put(http, "/v1/segments/vip", {"name": "VIPs"}).status_code == 201
    assert put(http, "/v1/templates/t", {**TEMPLATE, "variants": [{"locale": "en", "body": "Hi"}]}).status_code == 201


def template_post(body: str) -> dict:
    return {"template_id": "t", "name": "T", "default_locale": "en", "variants-TOTAL_FORMS": "1",
            "variants-INITIAL_FORMS": "0", "variants-MIN_NUM_FORMS": "1", "variants-MAX_NUM_FORMS": "1000",
            "variants-0-locale": "en", "variants-0-title": "", "variants-0-body": body, "variants-0-html": ""}


def test_the_admin_template_form_says_so_and_saves_nothing(marketing, holder):
    assert marketing.get(reverse("admin:campaigns_template_add")).status_code == 200  # no check, no slot
    r = marketing.post(reverse("admin:campaigns_template_add"), template_post("Hi {{ first_name }}"))
    assert r.status_code == 200
    assert r.context["inline_admin_formsets"][0].formset.errors == [{"__all__": [BUSY[:1].upper() + BUSY[1:] + "."]}]
    assert not Template.objects.exists()
    holder.release()
    r = marketing.post(reverse("admin:campaigns_template_add"), template_post("Hi {{ first_name }}"))
    assert r.status_code == 302
    assert Template.objects.get().variants.get().body == "Hi {{ first_name }}"
