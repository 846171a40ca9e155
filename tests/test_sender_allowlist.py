"""Issue 23 #10: a notification type's senders. Each field names exactly one sender (no list, no
group, no line break), and only a sender on the allow-list staff keep (global, or for one API
client; an email address or a whole domain; an SMS number) or the configured default: on the API
(``PUT /v1/notification-types/{key}``) and in the admin (tests/test_admin_types.py has the form's
side of the same rules), with a 422 naming the field and nothing written."""

from __future__ import annotations

import json

import pytest
from django.test import Client
from django.urls import reverse

from notifications.events.models import NotificationType
from notifications.models import APIClient
from notifications.senders import AllowedSender
from providers import emulator_credentials
from tests.conftest import EVERY_SCOPE

pytestmark = pytest.mark.django_db

SHOP = "Shop <shop@shop.example>"


def key_for(name: str) -> tuple[APIClient, Client]:
    client, key = APIClient.objects.create_key(name=name, scopes=list(EVERY_SCOPE))
    return client, Client(headers={"Authorization": f"Api-Key {key}"})


@pytest.fixture
def shop():
    return key_for("shop")


def email_type(**senders) -> dict:
    return {"name": "Receipt", "category": "billing", "channels": ["email", "sms"], **senders,
            "templates": [{"channel": "email", "locale": "en", "title": "Receipt", "body": "Thanks"},
                          {"channel": "sms", "locale": "en", "body": "Thanks"}]}


def put(http: Client, body: dict, key: str = "receipt"):
    return http.put(f"/v1/notification-types/{key}", data=json.dumps(body), content_type="application/json")


def refused(resp) -> dict:
    assert resp.status_code == 422, resp.content
    return {f["field"]: f["code"] for f in resp.json()["error"]["fields"]}


def allow(channel: str, value: str, client: APIClient | None = None) -> None:
    AllowedSender.objects.create(channel=channel, value=value, client=client)


@pytest.mark.parametrize(("field", "value", "words"), [
    ("email_reply_to", "a@evil.example, b@evil.example", "more than one address"),
    ("email_from", "Shop <shop@shop.example>, b@evil.example", "more than one address"),
    ("email_reply_to", "team: a@evil.example, b@evil.example;", "a group"),
    ("email_reply_to", "team: a@evil.example;", "a group"),
    ("email_from", "Shop <shop@shop.example>\r\nBcc: all@evil.example", "line break"),
    ("email_from", "Shop\u202e <shop@shop.example>", "control character"),
    ("sms_from", "+49 151 23456789", "not an E.164 number"),
    ("sms_from", "+4915123456789, +4915123456780", "not an E.164 number"),
])
def test_a_sender_field_names_exactly_one_sender(shop, field, value, words):
    """The reported Reply-To of two addresses went out as given (parseaddr read the first)."""
    allow("email", "shop.example")
    allow("email", "evil.example")
    resp = put(shop[1], email_type(**{field: value}))
    assert refused(resp) == {field: "invalid"}
    assert words in resp.json()["error"]["fields"][0]["message"]
    assert not NotificationType.objects.exists()


@pytest.mark.parametrize(("field", "value", "words"), [
    # The attacker's payloads: the check decoded the encoded word and saw one mailbox at the allowed
    # address; SendGrid's parseaddr sent from security@paypal.com / a reply_to of "=?utf-8?q?x@evil.com".
    ("email_from", "=?utf-8?q?<security@paypal.com>?= <notifications@example.com>", "encoded word"),
    ("email_reply_to", "=?utf-8?q?x@evil.com,_?= <notifications@example.com>", "encoded word"),
    ("email_from", "=?utf-8?q?Shop=E2=80=AE?= <notifications@example.com>", "encoded word"),  # U+202E
    ("email_from", '"security@paypal.com" <notifications@example.com>', "may not contain @, < or >"),
    ("email_from", '"<security@paypal.com>" <notifications@example.com>', "may not contain @, < or >"),
    # Second round: a fullwidth @ in the name; an @ in a quoted local part (SendGrid refused the send,
    # SMTP rebuilt another address); a Kelvin sign that .lower() turned into the allowed "k".
    ("email_from", '"service\uff20paypal.com" <notifications@example.com>', "may not contain @, < or >"),
    ("email_from", '"service\ufe6bpaypal.com" <notifications@example.com>', "may not contain @, < or >"),
    ("email_from", '"security@paypal.com"@example.com', "unquoted local part"),
    ("email_reply_to", "notifications@\u212aey.example.com", "plain ASCII"),
    # Third round: angle brackets' look-alikes, a domain written with look-alike dots, a blank name.
    ("email_from", '"\u02c2security\ufe52paypal\ufe52com\u02c3" <notifications@example.com>', "may not contain @"),
    ("email_from", '"security\u2024paypal\u2024com" <notifications@example.com>', "names a domain"),
    ("email_from", '"paypal.com \u2039security\u203a" <notifications@example.com>', "may not contain @"),
    ("email_from", '"\u2800" <notifications@example.com>', "shows nothing"),
])
def test_a_sender_says_what_it_is_in_plain_text(shop, field, value, words):
    """Issue hfix2 #1: no encoded word, no display name that looks like an address."""
    allow("email", "notifications@example.com")
    allow("email", "example.com")
    allow("email", "key.example.com")
    resp = put(shop[1], email_type(**{field: value}))
    assert refused(resp) == {field: "invalid"}
    assert words in resp.json()["error"]["fields"][0]["message"]
    assert not NotificationType.objects.exists()


@pytest.mark.parametrize(("field", "value"), [
    ("email_from", "PayPal Security <service@paypal.com>"),
    ("email_reply_to", "service@paypal.com"),
    ("sms_from", "+4915123456789"),
    ("sms_from", "MG" + "0" * 32),
])
def test_a_sender_not_on_the_allow_list_is_refused_naming_the_field(shop, field, value):
    resp = put(shop[1], email_type(**{field: value}))
    assert refused(resp) == {field: "sender_not_allowed"}
    message = resp.json()["error"]["fields"][0]["message"]
    assert message.startswith(f"{field}: ") and "allow-list" in message
    assert not NotificationType.objects.exists()


def test_the_configured_defaults_are_always_allowed(shop):
    resp = put(shop[1], email_type(email_from=f"Notifications <{emulator_credentials.EMAIL_FROM.upper()}>",
                                   email_reply_to=emulator_credentials.EMAIL_FROM,
                                   sms_from=emulator_credentials.TWILIO_BACKUP_FROM_NUMBER))
    assert resp.status_code == 201, resp.content
    assert NotificationType.objects.get().sms_from == emulator_credentials.TWILIO_BACKUP_FROM_NUMBER


def test_global_entries_allow_an_address_a_whole_domain_and_a_number(shop):
    allow("email", "billing@bank.example")
    allow("email", "shop.example")
    allow("sms", "+4915123456789")
    fine = email_type(email_from=SHOP, email_reply_to="Billing <BILLING@bank.example>", sms_from="+4915123456789")
    assert put(shop[1], fine).status_code == 201
    # The domain is exactly that domain (not a subdomain); an address entry is only that address.
    assert refused(put(shop[1], email_type(email_from="x@mail.shop.example"), "other")) == {
        "email_from": "sender_not_allowed"}
    assert refused(put(shop[1], email_type(email_reply_to="other@bank.example"), "other")) == {
        "email_reply_to": "sender_not_allowed"}
    assert list(NotificationType.objects.values_list("key", "email_from", "sms_from")) == [
        ("receipt", SHOP, "+4915123456789")]


def test_a_clients_entry_is_that_clients_alone(shop):
    other = key_for("other")
    allow("email", "shop.example", client=shop[0])
    assert put(shop[1], email_type(email_from=SHOP)).status_code == 201
    assert refused(put(other[1], email_type(email_from=SHOP), "copycat")) == {"email_from": "sender_not_allowed"}
    assert list(NotificationType.objects.values_list("key", flat=True)) == ["receipt"]


def test_a_sender_removed_from_the_list_is_refused_on_the_next_change(shop):
    allow("sms", "+4915123456789")
    body = email_type(sms_from="+4915123456789")
    assert put(shop[1], body).status_code == 201
    AllowedSender.objects.all().delete()
    assert refused(put(shop[1], {**body, "name": "Receipt!"})) == {"sms_from": "sender_not_allowed"}
    assert NotificationType.objects.get().name == "Receipt"


# --- the admin ------------------------------------------------------------------------------------

ADD = "admin:notifications_allowedsender_add"


@pytest.mark.parametrize(("channel", "value", "stored"), [
    ("email", "Shop@Shop.Example", "shop@shop.example"), ("email", "@Shop.example", "shop.example"),
    ("email", "shop.example", "shop.example"), ("sms", "+4915123456789", "+4915123456789"),
])
def test_staff_add_an_entry_in_its_normal_form(admin_client, channel, value, stored):
    resp = admin_client.post(reverse(ADD), {"channel": channel, "value": value, "note": "ticket 42"})
    assert resp.status_code == 302, resp.context["adminform"].form.errors
    assert list(AllowedSender.objects.values_list("channel", "value", "client")) == [(channel, stored, None)]


@pytest.mark.parametrize(("channel", "value"), [
    ("email", "Shop <shop@shop.example>"), ("email", "a@x.example, b@y.example"), ("email", "not a domain"),
    ("sms", "12345"), ("sms", "ShopName"), ("sms", "shop@shop.example"),
])
def test_the_admin_refuses_an_entry_that_is_not_one_sender(admin_client, channel, value):
    resp = admin_client.post(reverse(ADD), {"channel": channel, "value": value, "note": ""})
    assert resp.status_code == 200 and "value" in resp.context["adminform"].form.errors
    assert not AllowedSender.objects.exists()


def test_an_entry_is_listed_once_per_owner(admin_client, shop):
    allow("email", "shop.example")
    resp = admin_client.post(reverse(ADD), {"channel": "email", "value": "shop.example", "note": ""})
    assert resp.status_code == 200 and AllowedSender.objects.count() == 1
    resp = admin_client.post(reverse(ADD), {"channel": "email", "value": "shop.example", "client": shop[0].prefix,
                                            "note": ""})
    assert resp.status_code == 302 and AllowedSender.objects.count() == 2


def test_the_type_admin_checks_the_owners_list(admin_client, shop):
    """Staff fixing an API client's type may keep that client's own sender; a type made in the
    admin may use only global entries."""
    from notifications.events import services
    from tests.test_admin_types import ADD as TYPE_ADD
    from tests.test_admin_types import change_url, definition, form_post, saved_rows

    allow("email", "shop.example", client=shop[0])
    assert put(shop[1], email_type(email_from=SHOP)).status_code == 201
    rows, ids = saved_rows("receipt")
    kind = NotificationType.objects.get()
    fields = {name: getattr(kind, name) for name in services.TYPE_FIELDS}
    resp = admin_client.post(change_url("receipt"), form_post(None, {**fields, "name": "Receipt!", "templates": rows},
                                                              ids))
    assert resp.status_code == 302, resp.context["adminform"].form.errors
    resp = admin_client.post(TYPE_ADD, form_post("staff_made", definition(email_from=SHOP)))
    assert resp.status_code == 200
    assert "allow-list" in str(resp.context["adminform"].form.errors["email_from"])
    assert list(NotificationType.objects.values_list("key", "name", "client")) == [("receipt", "Receipt!", shop[0].pk)]


def test_the_allow_list_admin_never_carries_or_looks_up_a_clients_id(admin_client, shop):
    """Adversary (review): the page had no lookup guard (``?client__id__startswith=`` answered) and its
    client select offered ids (which carry the key's hash)."""
    allow("email", "shop.example", client=shop[0])
    changelist = reverse(ADD).replace("add/", "")
    assert admin_client.get(changelist, {"client__id__startswith": shop[0].pk[:12]}).status_code == 400
    assert admin_client.get(changelist, {"for": "client"}).status_code == 200
    page = admin_client.get(reverse(ADD)).content.decode()
    assert shop[0].pk not in page and shop[0].hashed_key not in page
    assert f'value="{shop[0].prefix}"' in page


@pytest.mark.parametrize("model", ["allowedsender", "apiauditentry", "campaign", "notificationtype"])
def test_the_admins_autocomplete_never_answers_a_clients_id(admin_client, shop, model):
    """Second round: as a superuser, /admin/autocomplete/ for any field pointing at API clients listed
    their ids (the key's hash)."""
    app = "campaigns" if model == "campaign" else "notifications"
    resp = admin_client.get("/admin/autocomplete/", {"app_label": app, "model_name": model,
                                                    "field_name": "client", "term": ""})
    assert resp.status_code in (403, 404)
    assert shop[0].hashed_key not in resp.content.decode()


def test_a_display_name_may_name_the_addresss_own_domain(shop):
    allow("email", "booking.com")
    assert put(shop[1], email_type(email_from='"Booking.com" <noreply@booking.com>')).status_code == 201

