"""The notification-type admin (notifications/admin/types.py): the form and its template rows
validated by the API's rule set with the API's words (and nothing saved on any problem), a valid save
through the service, the channel × locale matrix, the preview rendered by the send-time code, and who
may do what (the ``product`` group; high-priority types; types in use).

In-process (Django test client, rolled-back transactions); no worker processes.
"""

from __future__ import annotations

import json
import re
import uuid
from urllib.parse import quote

import pytest
from django.contrib.admin.models import ADDITION, CHANGE, LogEntry
from django.contrib.auth.models import Group, Permission, User
from django.test import Client
from django.urls import reverse
from django.utils.html import escape
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from campaigns import roles
from notifications.admin.types import HIDDEN, Cell, channel_matrix
from notifications.api.types import payload
from notifications.content_limits import rendered_problem
from notifications.events import services
from notifications.events.content import ChannelPreview, SendOptions, TypeContent, preview
from notifications.events.models import NotificationType, TypeTemplate
from notifications.models import APIClient, Notification
from preferences.models import Recipient
from tests.conftest import EVERY_SCOPE

pytestmark = pytest.mark.django_db

ADD = reverse("admin:notifications_notificationtype_add")


def change_url(key: str) -> str:
    return reverse("admin:notifications_notificationtype_change", args=[key])


def staff(username: str, group: str | None) -> User:
    user = User.objects.create_user(username, is_staff=True)
    if group:
        user.groups.add(Group.objects.get(name=group))
    return User.objects.get(pk=user.pk)


@pytest.fixture
def product(client) -> Client:
    client.force_login(staff("pia", roles.PRODUCT))
    return client


@pytest.fixture
def alice() -> Recipient:
    return Recipient.objects.create(user_id="alice", email="alice@example.com", locale="de-AT",
                                    attributes={"first_name": "<b>Ali</b>"})


PUSH_EN = {"channel": "push", "locale": "en", "title": "Shipped", "body": "Order {{ data.order_id }} is on its way",
           "data": {"url": "{{ data.tracking_url }}"}}
PUSH_DE = {"channel": "push", "locale": "de", "title": "Verschickt", "body": "Bestellung {{ data.order_id }}"}
EMAIL_EN = {"channel": "email", "locale": "en", "title": "Order {{ data.order_id }} shipped",
            "body": "Hi {{ first_name }}, track it: {{ data.tracking_url }}",
            "html": "<p>Hi {{ first_name }}</p>"}


def definition(**over) -> dict:
    """A type as the API takes it (``PUT /v1/notification-types/{key}``)."""
    body = {"name": "Order shipped", "category": "shipping", "channels": ["push", "email"], "routing": "all",
            "quiet_hours": "silent", "required_data": ["tracking_url"], "templates": [PUSH_EN, PUSH_DE, EMAIL_EN]}
    body.update(over)
    return body


def form_post(key: str | None, body: dict, ids: list | None = None) -> dict:
    """The change form's POST for ``body`` (the API's shape): the type's fields as the admin's inputs
    (channels and required data as comma lists), the templates as inline rows; ``ids``: the saved
    templates the first rows are (a change page's rows)."""
    templates = body.get("templates", [])
    ids = ids or []
    data = {"name": body["name"], "description": body.get("description", ""), "category": body["category"],
            "priority": body.get("priority", "standard"), "channels": ", ".join(body["channels"]),
            "routing": body.get("routing", "all"), "quiet_hours": body.get("quiet_hours", "defer"),
            "ttl_seconds": body.get("ttl_seconds") or "", "collapse_key": body.get("collapse_key", ""),
            "sms_from": body.get("sms_from", ""), "email_from": body.get("email_from", ""),
            "email_reply_to": body.get("email_reply_to", ""), "required_data": ", ".join(body.get("required_data", [])),
            "default_locale": body.get("default_locale", "en"),
            "templates-TOTAL_FORMS": str(len(templates)), "templates-INITIAL_FORMS": str(len(ids)),
            "templates-MIN_NUM_FORMS": "0", "templates-MAX_NUM_FORMS": "1000"}
    if key is not None:
        data["key"] = key
    for flag in ("required", "sensitive"):
        if body.get(flag):
            data[flag] = "on"
    for i, t in enumerate(templates):
        data.update({f"templates-{i}-{name}": t.get(name, "") for name in ("channel", "locale", "title", "body",
                                                                            "html")})
        data[f"templates-{i}-data"] = json.dumps(t.get("data") or {})
        if i < len(ids):
            data[f"templates-{i}-id"] = str(ids[i])
    return data


def saved_rows(key: str) -> tuple[list[dict], list[int]]:
    """A type's saved templates as the change page lists them (its rows, their ids)."""
    rows = list(TypeTemplate.objects.filter(type_id=key).order_by("channel", "locale"))
    return [{f: getattr(t, f) for f in services.TEMPLATE_FIELDS} for t in rows], [t.pk for t in rows]


def api_problems(body: dict) -> dict[str, str]:
    """What ``PUT /v1/notification-types/probe`` answers for ``body``: ``{field: message}``."""
    _client, key = APIClient.objects.create_key(name=f"probe-{uuid.uuid4().hex[:6]}", scopes=list(EVERY_SCOPE))
    resp = Client(headers={"Authorization": f"Api-Key {key}"}).put(
        "/v1/notification-types/probe", data=json.dumps(body), content_type="application/json")
    assert resp.status_code == 422, resp.content
    return {f["field"]: f["message"] for f in resp.json()["error"]["fields"]}


def errors_of(resp):
    """(the type form's errors, each template row's errors, the rows' non-form errors)."""
    form = resp.context["adminform"].form
    formset = resp.context["inline_admin_formsets"][0].formset
    return ({k: list(v) for k, v in form.errors.items()}, [{k: list(v) for k, v in f.errors.items()}
                                                          for f in formset.forms], list(formset.non_form_errors()))


# --- validation: the API's rules and words, nothing saved --------------------------------------------

def test_a_bad_template_is_refused_on_its_row_with_the_apis_message_and_nothing_is_saved(product):
    bad = {**PUSH_DE, "body": "Hallo\n{{ data.order_id }"}
    body = definition(templates=[PUSH_EN, bad, EMAIL_EN])
    resp = product.post(ADD, form_post("order_shipped", body))
    assert resp.status_code == 200
    form_errors, rows, above = errors_of(resp)
    message = api_problems(body)["templates.1.body"]
    assert message.startswith("push [de] body: template syntax error on line 2: ")
    assert (form_errors, rows, above) == ({}, [{}, {"body": [message]}, {}], [])
    assert escape(message) in resp.content.decode()
    assert NotificationType.objects.count() == 0 and TypeTemplate.objects.count() == 0


@pytest.mark.parametrize(("change", "api_field", "where"), [
    ({"channels": ["push", "fax"], "templates": [PUSH_EN, PUSH_DE]}, "channels.1",
     ("form", "channels", "'fax' (item 2): ")),
    ({"channels": ["push", "push"], "templates": [PUSH_EN]}, "channels.1", ("form", "channels", "'push' (item 2): ")),
    ({"channels": ["push"], "routing": "fallback", "templates": [PUSH_EN]}, "routing", ("form", "routing", "")),
    ({"category": "marketing", "quiet_hours": "bypass"}, "quiet_hours", ("form", "quiet_hours", "")),
    ({"required_data": ["9lives"]}, "required_data.0", ("form", "required_data", "'9lives' (item 1): ")),
    ({"collapse_key": "{{ data.order_id "}, "collapse_key", ("form", "collapse_key", "")),
    ({"sms_from": "12345"}, "sms_from", ("form", "sms_from", "")),
    # Issue 23 #10: one mailbox per field, and only senders on the allow-list.
    ({"email_reply_to": "a@evil.example, b@evil.example"}, "email_reply_to", ("form", "email_reply_to", "")),
    ({"email_from": "PayPal Security <service@paypal.com>"}, "email_from", ("form", "email_from", "")),
    ({"sms_from": "+4915123456789"}, "sms_from", ("form", "sms_from", "")),
    ({"channels": ["push", "email", "sms"]}, "templates", ("above", None, "")),
    ({"templates": [PUSH_EN, {**PUSH_DE, "html": "<p>x</p>"}, EMAIL_EN]}, "templates.1.html", ("row", 1, "html")),
    ({"templates": [PUSH_EN, {**PUSH_DE, "data": {"google.x": "1"}}, EMAIL_EN]}, "templates.1.data.google.x",
     ("row", 1, "data")),
    ({"templates": [PUSH_EN, {**PUSH_DE, "locale": "EN"}, EMAIL_EN]}, "templates.1.locale", ("row", 1, "locale")),
    ({"templates": [PUSH_EN, {**PUSH_DE, "body": "  "}, EMAIL_EN]}, "templates.1.body", ("row", 1, "body")),
    ({"templates": [PUSH_EN, PUSH_DE, {**EMAIL_EN, "title": ""}]}, "templates.2.title", ("row", 2, "title")),
    ({"templates": [PUSH_EN, PUSH_DE, EMAIL_EN, {"channel": "sms", "locale": "en", "body": "x"}]},
     "templates.3.channel", ("row", 3, "channel")),
])
def test_each_problem_lands_where_it_belongs_in_the_apis_words_and_nothing_is_saved(product, change, api_field,
                                                                                  where):
    body = definition(**change)
    message = api_problems(body)[api_field]
    resp = product.post(ADD, form_post("order_shipped", body))
    assert resp.status_code == 200
    form_errors, rows, above = errors_of(resp)
    kind, place, prefix = where
    if kind == "form":
        assert form_errors == {place: [prefix + message]}
        assert above == ["Not saved: correct the type's fields marked above."]
    elif kind == "row":
        assert rows[place] == {prefix: [message]} and form_errors == {} and above == []
    else:
        assert above == [message] and form_errors == {} and rows == [{}] * len(body["templates"])
    assert NotificationType.objects.count() == 0 and TypeTemplate.objects.count() == 0


GOOD_TEMPLATES = {
    "push": {"channel": "push", "locale": "en", "title": "Hi", "body": "Order {{ data.order_id }}",
             "data": {"url": "{{ data.url }}"}},
    "email": {"channel": "email", "locale": "en", "title": "Order {{ data.order_id }}", "body": "Hi\n",
              "html": "<p>{{ first_name }}</p>"},
    "sms": {"channel": "sms", "locale": "en", "body": "Order {{ data.order_id }}"}}
BAD_PARTS = st.sampled_from([("locale", "EN"), ("locale", "de_AT"), ("locale", "de"), ("title", ""),
                             ("title", "a\nb"), ("body", "  "), ("body", "x\n{{ y }"),
                             ("body", '{{ "".__class__ }}'), ("html", "<p>x</p>"), ("data", {"google.x": "1"}),
                             ("data", {"a": "{{ b }}"})])


@st.composite
def definitions(draw) -> dict:
    """Type definitions the API's serializer takes field by field (so what remains is the rule set's):
    mostly valid, each with a few of the rules' refusals mixed in."""
    channels = draw(st.permutations(["push", "email", "sms"]))[:draw(st.integers(1, 3))]
    if draw(st.integers(0, 5)) == 0:
        channels = [*channels[:2], draw(st.sampled_from(["fax", channels[0]]))]  # unknown, or twice
    templates = []
    for channel in dict.fromkeys(c for c in channels if c in GOOD_TEMPLATES):
        if draw(st.integers(0, 7)) == 0:
            continue  # a channel without a template
        template = dict(GOOD_TEMPLATES[channel])
        if draw(st.integers(0, 3)) == 0:
            part, value = draw(BAD_PARTS)
            template[part] = value
        templates.append(template)
    if draw(st.integers(0, 7)) == 0:
        templates.append(dict(draw(st.sampled_from(list(GOOD_TEMPLATES.values())))))  # a duplicate or stray row
    pick = (lambda *values: draw(st.sampled_from(values)))  # noqa: E731
    return {"name": "Generated", "category": pick("shipping", "shipping", "shipping", "marketing", "Bad Cat"),
            "priority": "standard", "channels": channels, "routing": pick("all", "all", "fallback"),
            "quiet_hours": pick("defer", "silent", "defer", "bypass"), "required": pick(False, False, True),
            "required_data": pick([], [], ["url"], [], ["url", "9lives"]),
            "collapse_key": pick("", "", "order-{{ data.order_id }}", "", "{{ x "),
            "sms_from": pick("", "", "+4915123456789", "", "12345"), "templates": templates}


ITEM_PREFIX = re.compile(r"^'[^']*' \(item \d+\): ")


@settings(max_examples=60, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(body=definitions())
def test_the_admin_refuses_what_the_api_refuses_in_the_same_words(product, body):
    """Generated definitions: the admin's messages (item prefixes aside) are exactly the API's, and a
    definition one of them accepts, the other accepts too (and both save the same type)."""
    _client, key = APIClient.objects.create_key(name=f"gen-{uuid.uuid4().hex[:6]}", scopes=list(EVERY_SCOPE))
    api = Client(headers={"Authorization": f"Api-Key {key}"}).put(
        "/v1/notification-types/api_made", data=json.dumps(body), content_type="application/json")
    resp = product.post(ADD, form_post("admin_made", body))
    event("api: " + str(api.status_code))
    try:
        if api.status_code == 201:
            assert resp.status_code == 302, errors_of(resp)
            saved = {k: v for k, v in payload(NotificationType.objects.get(pk="admin_made")).items()
                     if k not in ("key", "owner", "created_at", "updated_at")}
            wanted = {k: v for k, v in api.json().items() if k not in ("key", "owner", "created_at", "updated_at")}
            assert saved == wanted
            return
        assert api.status_code == 422, api.content
        assert resp.status_code == 200 and not NotificationType.objects.filter(pk="admin_made").exists()
        form_errors, rows, above = errors_of(resp)
        shown = [ITEM_PREFIX.sub("", m) for messages in form_errors.values() for m in messages]
        shown += [m for row in rows for messages in row.values() for m in messages]
        shown += [m for m in above if m != "Not saved: correct the type's fields marked above."]
        assert sorted(shown) == sorted(f["message"] for f in api.json()["error"]["fields"])
    finally:
        NotificationType.objects.all().delete()


@pytest.mark.parametrize("key", ["Order_Shipped", "order shipped", "-order", "o" * 65])
def test_a_bad_key_is_refused_in_the_words_of_the_apis_path_rule(product, key):
    _client, api_key = APIClient.objects.create_key(name="probe", scopes=list(EVERY_SCOPE))
    api = Client(headers={"Authorization": f"Api-Key {api_key}"}).put(
        f"/v1/notification-types/{quote(key)}", data=json.dumps(definition()), content_type="application/json")
    [field] = api.json()["error"]["fields"]
    resp = product.post(ADD, form_post(key, definition()))
    assert field["field"] == "key" and errors_of(resp)[0] == {"key": [field["message"]]}
    assert not NotificationType.objects.exists()


def test_a_valid_type_is_saved_with_exactly_its_templates_and_a_later_fix_moves_updated_at(product, alice):
    resp = product.post(ADD, {**form_post("order_shipped", definition()), "_continue": "1"})
    assert resp.status_code == 302, errors_of(resp)
    kind = NotificationType.objects.get(pk="order_shipped")
    assert (kind.name, kind.category, kind.channels, kind.quiet_hours, kind.required_data, kind.client_id) == (
        "Order shipped", "shipping", ["push", "email"], "silent", ["tracking_url"], None)
    assert sorted(TypeTemplate.objects.filter(type=kind).values_list("channel", "locale", "body", "data")) == [
        ("email", "en", EMAIL_EN["body"], {}), ("push", "de", PUSH_DE["body"], {}),
        ("push", "en", PUSH_EN["body"], {"url": "{{ data.tracking_url }}"})]
    assert LogEntry.objects.get().action_flag == ADDITION

    # A typo fixed on the change page: the rows are replaced as a whole, the type's updated_at moves.
    saved = kind.updated_at
    rows, ids = saved_rows("order_shipped")  # email en, push de, push en
    rows[1]["body"] = "Bestellung {{ data.order_id }} ist unterwegs"
    resp = product.post(change_url("order_shipped"), form_post(None, definition(templates=rows), ids))
    assert resp.status_code == 302, errors_of(resp)
    kind.refresh_from_db()
    assert kind.updated_at > saved
    assert TypeTemplate.objects.get(type=kind, channel="push", locale="de").body == (
        "Bestellung {{ data.order_id }} ist unterwegs")
    assert TypeTemplate.objects.filter(type=kind).count() == 3
    change = LogEntry.objects.filter(action_flag=CHANGE).get()
    assert "template" in change.get_change_message()


def test_an_existing_key_is_not_overwritten_from_the_add_page(product):
    services.save_type("order_shipped", {"name": "Old", "category": "shipping", "channels": ["push"]},
                       [PUSH_EN], client=None)
    resp = product.post(ADD, form_post("order_shipped", definition()))
    assert resp.status_code == 200 and "key" in errors_of(resp)[0]
    assert NotificationType.objects.get(pk="order_shipped").name == "Old"


# --- high priority, ownership, types in use ---------------------------------------------------------

def test_high_priority_needs_its_permission_to_define_or_change(client, alice):
    pia = staff("pia", roles.PRODUCT)
    client.force_login(pia)
    assert 'value="high"' not in client.get(ADD).content.decode()
    resp = client.post(ADD, form_post("otp", definition(priority="high", category="security")))
    assert resp.status_code == 200 and "priority" in errors_of(resp)[0]
    assert not NotificationType.objects.exists()

    services.save_type("otp", {"name": "OTP", "category": "security", "priority": "high", "channels": ["push"],
                               "quiet_hours": "bypass"}, [PUSH_EN], client=None)
    page = client.get(change_url("otp"))
    assert page.status_code == 200 and page.context["has_change_permission"] is False
    assert client.post(change_url("otp"), form_post(None, definition(priority="standard"))).status_code == 403

    pia.user_permissions.add(Permission.objects.get(codename="define_high_priority_type"))
    client.force_login(User.objects.get(pk=pia.pk))
    assert client.get(change_url("otp")).context["has_change_permission"] is True


def test_overriding_users_choices_is_products_in_the_admin(client):
    """Issue hfix2 #2, the admin's road: ``required`` and quiet hours ``bypass`` are the product
    role's (it defines the transactional types, docs/OPERATIONS.md "Staff roles"); marketing
    cannot reach the type pages at all. (The API's road needs ``types:override``: tests/test_scopes.py.)"""
    client.force_login(staff("max", roles.MARKETING))
    assert client.post(ADD, form_post("alert", definition(required=True, quiet_hours="bypass"))).status_code == 403
    assert not NotificationType.objects.exists()

    client.force_login(staff("pia", roles.PRODUCT))
    resp = client.post(ADD, form_post("alert", definition(required=True, quiet_hours="bypass", category="security")))
    assert resp.status_code == 302, errors_of(resp)
    assert list(NotificationType.objects.values_list("key", "required", "quiet_hours")) == [("alert", True, "bypass")]


def test_a_type_events_use_cannot_be_deleted_and_one_unused_can(product, alice):
    used, _ = services.save_type("used", definition(), [PUSH_EN, EMAIL_EN], client=None)
    services.save_type("unused", definition(), [PUSH_EN, EMAIL_EN], client=None)
    api = APIClient.objects.create_key(name="shop")[0]
    services.accept_event(client=api, idempotency_key="k1", fingerprint="f", kind=used, recipients=[alice],
                          data={"tracking_url": "https://t.example/1"})
    delete = reverse("admin:notifications_notificationtype_delete", args=["used"])
    assert product.post(delete, {"post": "yes"}).status_code == 403
    assert product.post(reverse("admin:notifications_notificationtype_delete", args=["unused"]),
                        {"post": "yes"}).status_code == 302
    assert list(NotificationType.objects.values_list("key", flat=True)) == ["used"]


def test_an_api_owned_type_keeps_its_owner_when_staff_fix_it(product):
    api = APIClient.objects.create_key(name="shop")[0]
    services.save_type("order_shipped", definition(), [PUSH_EN, EMAIL_EN], client=api)
    page = product.get(change_url("order_shipped"))
    assert "API client shop" in page.content.decode()
    rows, ids = saved_rows("order_shipped")
    resp = product.post(change_url("order_shipped"), form_post(None, definition(name="Order shipped!", templates=rows),
                                                               ids))
    assert resp.status_code == 302, errors_of(resp)
    kind = NotificationType.objects.get(pk="order_shipped")
    assert (kind.name, kind.client_id) == ("Order shipped!", api.pk)


# --- the matrix ------------------------------------------------------------------------------------

def test_the_matrix_marks_a_missing_channel_and_where_each_locale_falls_back(product):
    kind = NotificationType.objects.create(key="digest", name="Digest", category="social",
                                           channels=["push", "email", "sms"], default_locale="en")
    for channel, locale in [("push", "en"), ("push", "de"), ("email", "en"), ("email", "fr-CA")]:
        TypeTemplate.objects.create(type=kind, channel=channel, locale=locale, title="t", body="b")
    matrix = channel_matrix(kind)
    assert matrix.locales == ["en", "de", "fr-CA"]
    assert [(r.channel, r.missing, r.cells) for r in matrix.rows] == [
        ("push", False, [Cell(True), Cell(True), Cell(False, "en")]),
        ("email", False, [Cell(True), Cell(False, "en"), Cell(True)]),
        ("sms", True, [Cell(False, ""), Cell(False, ""), Cell(False, "")])]
    html = product.get(change_url("digest")).content.decode()
    assert 'class="matrix-sms matrix-missing"' in html
    assert "No template: every sms notification of this type fails (template_error)" in html
    assert 'class="matrix-push"' in html and 'class="matrix-email"' in html


# --- the preview -----------------------------------------------------------------------------------

def preview_get(client, key: str, user: str, data) -> object:
    text = data if isinstance(data, str) else json.dumps(data)
    return client.get(change_url(key), {"preview_user": user, "preview_data": text})


def test_the_preview_renders_every_channel_for_the_user_as_a_send_would(product, alice):
    kind, _ = services.save_type("order_shipped", definition(collapse_key="order-{{ data.order_id }}",
                                                             email_from="Shop <shop@example.com>"),
                                 [PUSH_EN, PUSH_DE, EMAIL_EN], client=None)
    data = {"order_id": "8812", "tracking_url": "https://t.example/8812"}
    shown = preview(kind, alice, data)
    assert shown == {
        "push": ChannelPreview(locale="de", title="Verschickt", body="Bestellung 8812", html="", data=None,
                               options=SendOptions(collapse_key="order-8812")),
        "email": ChannelPreview(locale="en", title="Order 8812 shipped",
                                body="Hi <b>Ali</b>, track it: https://t.example/8812",
                                html="<p>Hi &lt;b&gt;Ali&lt;/b&gt;</p>",
                                options=SendOptions(sender="Shop <shop@example.com>"))}
    # The send path's own rendering of an accepted event's notifications says the same.
    shop = APIClient.objects.create_key(name="shop")[0]
    accepted = services.accept_event(client=shop, idempotency_key="k", fingerprint="f", kind=kind, recipients=[alice],
                                     data=data)
    content = TypeContent()
    for n in accepted.notifications:
        n = Notification.objects.select_related("recipient").get(pk=n.pk)
        options = content.render(n)
        assert ChannelPreview(locale=shown[n.channel].locale, title=n.title, body=n.body, html=n.html, data=n.data,
                              options=options) == shown[n.channel]

    page = preview_get(product, "order_shipped", "alice", data)
    html = page.content.decode()
    assert page.status_code == 200 and [c for c, _ in page.context["previews"]] == ["push", "email"]
    assert '<pre class="readonly preview-body">Bestellung 8812</pre>' in html
    assert "Hi &lt;b&gt;Ali&lt;/b&gt;, track it" in html  # text escaped on the page
    assert "&lt;p&gt;Hi &amp;lt;b&amp;gt;Ali&amp;lt;/b&amp;gt;&lt;/p&gt;" in html  # html source, escaped twice
    assert "<b>Ali</b>" not in html


def test_a_render_error_is_shown_as_text_and_the_other_channels_still_render(product, alice):
    broken = {**EMAIL_EN, "body": "{{ data.total / data.count }}"}  # accepted: it depends on the data
    services.save_type("order_shipped", definition(), [PUSH_EN, broken], client=None)
    page = preview_get(product, "order_shipped", "alice", {"tracking_url": "u", "total": 1, "count": 0,
                                                           "order_id": "7"})
    previews = dict(page.context["previews"])
    assert previews["email"].error == "template error: ZeroDivisionError: division by zero"
    assert previews["push"].body == "Order 7 is on its way" and previews["push"].data == {"url": "u"}
    html = page.content.decode()
    assert '<p class="errornote preview-error">template error: ZeroDivisionError: division by zero</p>' in html


def test_rendered_text_over_a_channels_limit_is_shown_as_the_send_would_fail_it(product, alice):
    long_title = {**EMAIL_EN, "title": "{{ data.order_id }}"}
    services.save_type("order_shipped", definition(), [PUSH_EN, long_title], client=None)
    page = preview_get(product, "order_shipped", "alice", {"tracking_url": "u", "order_id": "x" * 999})
    previews = dict(page.context["previews"])
    assert previews["email"].error == rendered_problem("email", "x" * 999, "b", "", None)
    assert previews["email"].error == "the rendered title is 999 characters; at most 998"
    assert previews["email"].body == "" and previews["push"].error == ""


@pytest.mark.parametrize(("user", "data", "field", "message"), [
    ("alice", '{"tracking_url": "u",}', "preview_data", "Sample data is not valid JSON: Expecting property name "
                                                       "enclosed in double quotes: line 1 column 22 (char 21)"),
    ("alice", '["u"]', "preview_data", "Sample data must be a JSON object ({...}), not list."),
    ("alice", '{"n": NaN}', "preview_data", "Sample data is not valid JSON: NaN is not a JSON number"),
    ("alice", "{}", "preview_data", "data.tracking_url: type order_shipped requires tracking_url in data "
                                    "(its templates use it)"),
    ("nobody", '{"tracking_url": "u"}', "preview_user", "No recipient with user id 'nobody'."),
])
def test_bad_preview_input_is_a_form_error_and_nothing_is_rendered(product, alice, user, data, field, message):
    services.save_type("order_shipped", definition(), [PUSH_EN, EMAIL_EN], client=None)
    page = preview_get(product, "order_shipped", user, data)
    assert page.status_code == 200 and "previews" not in page.context
    assert page.context["preview_form"].errors == {field: [message]}


def test_a_sensitive_types_preview_is_shown_to_who_may_change_it_only(client, alice):
    services.save_type("login_code", {"name": "Login code", "category": "security", "channels": ["push"],
                                      "sensitive": True},
                       [{"channel": "push", "locale": "en", "body": "Your code is {{ data.code }}"}], client=None)
    client.force_login(staff("pia", roles.PRODUCT))
    html = preview_get(client, "login_code", "alice", {"code": "918273"}).content.decode()
    assert "Your code is 918273" in html
    client.force_login(staff("sam", roles.SUPPORT))  # may view types and recipients, not change types
    page = preview_get(client, "login_code", "alice", {"code": "918273"})
    assert page.status_code == 200 and page.context["has_change_permission"] is False
    assert page.content.decode().count("918273") == 1  # in the typed sample data only
    assert dict(page.context["previews"])["push"].body == HIDDEN


def test_staff_without_the_recipient_view_get_no_preview(client, alice):
    services.save_type("order_shipped", definition(), [PUSH_EN, EMAIL_EN], client=None)
    viewer = staff("vic", None)
    viewer.user_permissions.set(Permission.objects.filter(codename__in=["view_notificationtype",
                                                                        "view_typetemplate"]))
    client.force_login(User.objects.get(pk=viewer.pk))
    page = preview_get(client, "order_shipped", "alice", {"tracking_url": "u"})
    assert page.status_code == 200 and "preview_form" not in page.context and "matrix" in page.context
