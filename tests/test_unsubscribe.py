"""One-click unsubscribe (RFC 8058), in process: the signed token, the ``/u/{token}`` page and POST,
the opt-out and its ``Unsubscribe`` row, the metric, which emails carry the headers, and the
campaign's count and rate (docs/TYPES.md, "Unsubscribe")."""

from __future__ import annotations

import dataclasses
import os
import time
import uuid

import pytest
from django.core import signing
from django.test import Client
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from notifications import metrics
from notifications.delivery.load import message_for
from notifications.delivery.types import Row
from notifications.events.content import SendOptions
from notifications.models import Notification
from notifications.unsubscribe import carries_unsubscribe
from preferences.models import Preferences, Recipient, Unsubscribe
from preferences.unsubscribe import MAX_AGE, SALT, BadToken, UnsubscribeToken, make_token, read_token
from providers.base import unsubscribe_headers

CAMPAIGN = uuid.UUID("00000000-0000-4000-8000-00000000c0de")
NOTIFICATION = uuid.UUID("00000000-0000-4000-8000-0000000000aa")
LINK = UnsubscribeToken(user_id="u-1", category="marketing", channel="email", campaign_id=CAMPAIGN,
                        notification_id=NOTIFICATION)


@pytest.fixture(autouse=True)
def prom(tmp_path, settings):
    """A private multiprocess directory; /metrics open to local requests."""
    settings.METRICS_TOKEN = ""
    previous = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    metrics.use_multiprocess_dir(str(tmp_path / "prometheus"))
    yield
    metrics.use_multiprocess_dir(previous)


def unsubscribes_metric(client) -> dict:
    text = client.get("/metrics").content.decode()
    return {tuple(sorted(s.labels.items())): s.value for family in text_string_to_metric_families(text)
            for s in family.samples if s.name == "notify_unsubscribes_total"}


@pytest.fixture
def recipient(db):
    return Recipient.objects.create(user_id="u-1", email="ada@example.org")


@pytest.fixture
def mail_client():
    """Like a mail provider: no cookies, no CSRF token, CSRF checks on."""
    return Client(enforce_csrf_checks=True)


def category_opt_outs(user_id: str = "u-1") -> dict:
    prefs = Preferences.objects.filter(recipient_id=user_id).first()
    return prefs.category_opt_outs if prefs is not None else {}


# --- the token -------------------------------------------------------------------------------------


def test_a_token_round_trips_user_category_channel_campaign_and_notification():
    token = make_token(LINK)

    assert read_token(token) == LINK
    assert read_token(make_token(UnsubscribeToken(user_id="ü ser/1", category="news"))) == UnsubscribeToken(
        user_id="ü ser/1", category="news", channel="email", campaign_id=None, notification_id=None)
    assert "/" not in token  # one path segment


def test_a_token_expires_after_60_days(monkeypatch):
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() - MAX_AGE.total_seconds() - 5)
    old = make_token(LINK)
    monkeypatch.setattr(time, "time", lambda: real() - MAX_AGE.total_seconds() + 60)
    recent = make_token(LINK)
    monkeypatch.setattr(time, "time", real)

    with pytest.raises(BadToken, match="expired"):
        read_token(old)
    assert read_token(recent) == LINK


@pytest.mark.parametrize("token", [
    "", "x", "abc:def", signing.dumps({"u": "u-1", "c": "marketing", "ch": "email"}, salt="another salt"),
    signing.dumps({"u": "u-1", "c": "marketing", "ch": "email"}, salt=SALT, key="not our secret key"),
    signing.dumps({"user": "u-1"}, salt=SALT),  # ours, but not an unsubscribe payload
    signing.dumps(["u-1"], salt=SALT),
], ids=["empty", "x", "colon", "another-salt", "another-key", "not-a-link", "a-list"])  # (signed tokens carry the time)
def test_forged_and_malformed_tokens_are_refused(token):
    with pytest.raises(BadToken):
        read_token(token)


TOKEN = make_token(LINK)
TOKEN_CHARS = st.sampled_from("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_.:=%")


@st.composite
def mutated(draw) -> str:
    """TOKEN with one character replaced, inserted or removed, or cut short, or extended."""
    at = draw(st.integers(0, len(TOKEN) - 1))
    how = draw(st.sampled_from(["replace", "insert", "delete", "truncate", "append"]))
    char = draw(TOKEN_CHARS)
    if how == "replace":
        char = draw(TOKEN_CHARS.filter(lambda c: c != TOKEN[at]))
        return TOKEN[:at] + char + TOKEN[at + 1:]
    if how == "insert":
        return TOKEN[:at] + char + TOKEN[at:]
    if how == "delete":
        return TOKEN[:at] + TOKEN[at + 1:]
    if how == "truncate":
        return TOKEN[:at]
    return TOKEN + char


@settings(max_examples=400, deadline=None)
@given(mutated())
def test_any_mutation_of_a_valid_token_is_refused(token):
    assert token != TOKEN
    with pytest.raises(BadToken):
        read_token(token)


# --- the page and the POST -------------------------------------------------------------------------


def test_post_one_click_opts_out_once_however_often_it_is_posted(recipient, mail_client, client,
                                                                  django_capture_on_commit_callbacks):
    Preferences.objects.create(recipient=recipient, category_opt_outs={"news": ["sms"]})
    url = f"/u/{make_token(LINK)}"

    with django_capture_on_commit_callbacks(execute=True):
        first = mail_client.post(url, {"List-Unsubscribe": "One-Click"})
    with django_capture_on_commit_callbacks(execute=True):
        second = mail_client.post(url, "List-Unsubscribe=One-Click", content_type="application/x-www-form-urlencoded")

    assert (first.status_code, second.status_code) == (200, 200)
    assert b"You are unsubscribed" in first.content and b"You are unsubscribed" in second.content
    assert category_opt_outs() == {"news": ["sms"], "marketing": ["email"]}
    assert list(Unsubscribe.objects.values_list("recipient_id", "category", "channel", "source", "campaign_id",
                                                "notification_id")) == [
        ("u-1", "marketing", "email", "one_click", CAMPAIGN, NOTIFICATION)]
    assert unsubscribes_metric(client) == {(("category", "marketing"), ("source", "one_click")): 1.0}


@pytest.mark.parametrize("category", ["security", "transactional"])
def test_a_link_of_a_transactional_category_never_opts_out(recipient, mail_client, category):
    """No email of these categories carries a link (the rule above); one made anyway (before the
    rule, or by hand with the key) is refused, on GET and POST, and changes nothing."""
    url = f"/u/{make_token(dataclasses.replace(LINK, category=category))}"

    page, posted = mail_client.get(url), mail_client.post(url, {"List-Unsubscribe": "One-Click"})

    assert (page.status_code, posted.status_code) == (400, 400)
    assert f"{category} emails (security alerts, password resets, receipts) cannot be unsubscribed".encode() in (
        posted.content)
    assert Unsubscribe.objects.count() == 0 and not Preferences.objects.filter(recipient=recipient).exists()


def test_the_pages_button_unsubscribes_with_source_page(recipient, mail_client, client,
                                                        django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        response = mail_client.post(f"/u/{make_token(LINK)}", {"confirm": "unsubscribe"})

    assert response.status_code == 200
    assert list(Unsubscribe.objects.values_list("source", flat=True)) == ["page"]
    assert category_opt_outs() == {"marketing": ["email"]}
    assert unsubscribes_metric(client) == {(("category", "marketing"), ("source", "page")): 1.0}


def test_an_already_opted_out_recipient_gets_200_and_no_row(recipient, mail_client):
    Preferences.objects.create(recipient=recipient, category_opt_outs={"marketing": ["email"]})

    response = mail_client.post(f"/u/{make_token(LINK)}", {"List-Unsubscribe": "One-Click"})

    assert response.status_code == 200
    assert Unsubscribe.objects.count() == 0
    assert category_opt_outs() == {"marketing": ["email"]}


def test_get_shows_the_confirm_page_and_changes_nothing(recipient, mail_client):
    url = f"/u/{make_token(LINK)}"

    response = mail_client.get(url)
    again = mail_client.get(url)

    assert (response.status_code, again.status_code) == (200, 200)
    page = response.content.decode()
    assert "Unsubscribe from marketing emails?" in page
    assert '<form method="post">' in page and 'name="confirm" value="unsubscribe"' in page
    assert response["Referrer-Policy"] == "no-referrer" and response["Cache-Control"] == "no-store"
    assert (Preferences.objects.count(), Unsubscribe.objects.count()) == (0, 0)


@pytest.mark.parametrize("method", ["get", "post"])
def test_a_tampered_forged_or_expired_token_answers_400_and_changes_nothing(recipient, mail_client, method,
                                                                           monkeypatch):
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() - MAX_AGE.total_seconds() - 1)
    expired = make_token(LINK)
    monkeypatch.setattr(time, "time", real)
    token = make_token(LINK)
    tampered = token[:-1] + ("A" if token[-1] != "A" else "B")
    forged = signing.dumps({"u": "u-1", "c": "marketing", "ch": "email"}, salt=SALT, key="guessed", compress=True)

    for bad in (tampered, forged, expired):
        response = getattr(mail_client, method)(f"/u/{bad}", {"List-Unsubscribe": "One-Click"})
        assert response.status_code == 400, bad
        assert b"Nothing was changed" in response.content
    assert (Preferences.objects.count(), Unsubscribe.objects.count()) == (0, 0)


def multipart(value: str) -> tuple[bytes, str]:
    """A ``multipart/form-data`` one-click body with ``value`` as the field's content."""
    boundary = "----=_Part_0_1234567.1701600000000"
    body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"List-Unsubscribe\"\r\n\r\n"
            f"{value}\r\n--{boundary}--\r\n").encode()
    return body, f"multipart/form-data; boundary={boundary}"


FORM = "application/x-www-form-urlencoded"


@pytest.mark.parametrize(("body", "content_type"), [
    (b"List-Unsubscribe=One-Click\r\n", FORM),  # a body ending in CRLF, as some mailbox providers send it
    (b"List-Unsubscribe=One-Click\n", FORM),
    (b"List-Unsubscribe=One-Click%0D%0A", FORM),
    (b"List-Unsubscribe=One-Click  \t\r\n", FORM),
    (b"List-Unsubscribe=One-Click", FORM),
    (*multipart("One-Click"),),
    (*multipart("One-Click\r\n"),),  # the part's content ends in a CRLF of its own
], ids=["crlf", "lf", "crlf-encoded", "blanks", "plain", "multipart", "multipart-crlf"])
def test_a_one_click_post_is_accepted_as_mailbox_providers_send_it(recipient, mail_client, body, content_type):
    # Issue 23 #6: "List-Unsubscribe=One-Click\r\n" was refused (400): the CRLF stayed in the value.
    response = mail_client.post(f"/u/{make_token(LINK)}", body, content_type=content_type)

    assert response.status_code == 200, response.content
    assert category_opt_outs() == {"marketing": ["email"]}
    assert list(Unsubscribe.objects.values_list("category", "source")) == [("marketing", "one_click")]


@pytest.mark.parametrize(("body", "content_type"), [
    (b"List-Unsubscribe=one-click", FORM),
    (b"List-Unsubscribe=%20One-Click", FORM),
    (b"List-Unsubscribe=One-Click-Now", FORM),
    (b"List-Unsubscribe=One-Click%0D%0Ax", FORM),
    (b"List-Unsubscribe =One-Click", FORM),
    (b"List-Unsubscribe=One-Click", "text/plain"),  # RFC 8058: form-encoded or multipart only
    (*multipart("One Click"),),
])
def test_nothing_looser_than_the_rfc_8058_one_click_is_accepted(recipient, mail_client, body, content_type):
    response = mail_client.post(f"/u/{make_token(LINK)}", body, content_type=content_type)

    assert response.status_code == 400
    assert b"List-Unsubscribe: the form field must be One-Click" in response.content
    assert (Preferences.objects.count(), Unsubscribe.objects.count()) == (0, 0)


def test_a_post_without_the_one_click_field_is_400_naming_it(recipient, mail_client):
    response = mail_client.post(f"/u/{make_token(LINK)}", {"List-Unsubscribe": "yes"})

    assert response.status_code == 400
    assert b"List-Unsubscribe: the form field must be One-Click" in response.content
    assert (Preferences.objects.count(), Unsubscribe.objects.count()) == (0, 0)


def test_a_deleted_recipient_is_404_and_nothing_is_written(db, mail_client):
    response = mail_client.post(f"/u/{make_token(LINK)}", {"List-Unsubscribe": "One-Click"})

    assert response.status_code == 404
    assert (Preferences.objects.count(), Unsubscribe.objects.count()) == (0, 0)


def test_other_methods_are_refused(recipient, mail_client):
    assert mail_client.put(f"/u/{make_token(LINK)}").status_code == 405
    assert Unsubscribe.objects.count() == 0


# --- which emails carry the headers ----------------------------------------------------------------


def row(channel="email", category="marketing", campaign=False, typed=False, required=False) -> Row:
    n = Notification(id=NOTIFICATION, channel=channel, category=category, body="b", title="t",
                     campaign_id=CAMPAIGN if campaign else None, notification_type_id="sale" if typed else None,
                     recipient=Recipient(user_id="u-1", email="ada@example.org"))
    return Row(n, options=SendOptions(required=required) if typed else None)


@pytest.mark.parametrize(("kwargs", "carries"), [
    ({"campaign": True}, True),
    ({"campaign": True, "category": ""}, False),  # nothing to opt out of
    ({"campaign": True, "channel": "sms"}, False),
    ({"campaign": True, "channel": "push"}, False),
    ({"typed": True}, True),
    ({"typed": True, "required": True}, False),  # a required type (security, legal) cannot be opted out of
    ({"typed": True, "category": "security"}, False),  # one click would silence password resets too
    ({"campaign": True, "category": "security"}, False),  # a high-priority emergency to everyone
    ({"category": "marketing"}, True),  # a plain single send
    ({"category": "news"}, True),
    ({"category": "security"}, False),  # QUIET_HOURS_BYPASS_CATEGORIES: transactional-required
    ({"category": "transactional"}, False),
    ({"category": ""}, False),  # the quick start's OTP: uncategorised
])
def test_which_emails_carry_the_headers(kwargs, carries, settings):
    settings.PUBLIC_BASE_URL = "https://notify.example.com/"

    message = message_for(row(**kwargs), "ada@example.org")

    if not carries:
        assert (message.unsubscribe_url, unsubscribe_headers(message)) == (None, {})
        return
    prefix = "https://notify.example.com/u/"
    assert message.unsubscribe_url.startswith(prefix)
    assert read_token(message.unsubscribe_url.removeprefix(prefix)) == UnsubscribeToken(
        user_id="u-1", category=kwargs.get("category", "marketing"), channel="email",
        campaign_id=CAMPAIGN if kwargs.get("campaign") else None, notification_id=NOTIFICATION)
    assert unsubscribe_headers(message) == {"List-Unsubscribe": f"<{message.unsubscribe_url}>",
                                            "List-Unsubscribe-Post": "List-Unsubscribe=One-Click"}


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(channel=st.sampled_from(["email", "sms", "push"]),
       category=st.sampled_from(["", "marketing", "news", "security", "transactional", "billing.v2"]),
       campaign=st.booleans(), typed=st.booleans(), required=st.booleans(),
       bypass=st.lists(st.sampled_from(["security", "transactional", "news"]), unique=True))
def test_headers_follow_channel_category_campaign_type_and_required(channel, category, campaign, typed, required,
                                                                    bypass):
    """An email has a link exactly when it has a category outside QUIET_HOURS_BYPASS_CATEGORIES and
    is a campaign's, a plain one, or a typed one of a type not required; the link
    names that user, category, campaign and notification."""
    from django.test import override_settings

    with override_settings(QUIET_HOURS_BYPASS_CATEGORIES=tuple(bypass), PUBLIC_BASE_URL="https://n.example"):
        message = message_for(row(channel, category, campaign, typed, required), "to")
        expected = channel == "email" and bool(category) and category not in bypass and (
            campaign or not (typed and required))
        assert carries_unsubscribe(channel, category, campaign=campaign, typed=typed, required=required) is expected
    assert (message.unsubscribe_url is not None) is expected
    assert bool(unsubscribe_headers(message)) is expected
    if expected:
        link = read_token(message.unsubscribe_url.removeprefix("https://n.example/u/"))
        assert (link.user_id, link.category, link.campaign_id, link.notification_id) == (
            "u-1", category, CAMPAIGN if campaign else None, NOTIFICATION)


# --- the campaign's count and rate -----------------------------------------------------------------


def test_the_campaign_shows_its_unsubscribes_and_their_rate_of_sent(db, mail_client):
    import json

    from campaigns.models import Campaign
    from notifications.models import APIClient
    from tests.conftest import MARKETING_SCOPES

    _, key = APIClient.objects.create_key(name="marketing-tool", scopes=MARKETING_SCOPES)
    http = Client(headers={"Authorization": f"Api-Key {key}"})
    assert http.put("/v1/segments/vip", json.dumps({"name": "VIPs"}), content_type="application/json"
                    ).status_code == 201
    body = {"segment_id": "vip", "channel": "email", "content": {"title": "Sale", "body": "Sale!"}}
    created = http.post("/v1/campaigns", json.dumps(body), content_type="application/json",
                        headers={"Idempotency-Key": "c1"})
    assert created.status_code == 202, created.content
    campaign = Campaign.objects.get()

    def detail() -> dict:
        return http.get(f"/v1/campaigns/{campaign.pk}").json()

    assert (detail()["unsubscribes"], detail()["unsubscribe_rate"]) == (0, None)  # nothing sent yet
    users = [Recipient.objects.create(user_id=f"u{i}", email=f"u{i}@example.org") for i in range(4)]
    for i, user in enumerate(users):
        Notification.objects.create(id=uuid.uuid4(), recipient=user, channel="email", category="marketing",
                                    campaign_id=campaign.pk, status="sent" if i < 3 else "suppressed")
    for user in users[:2]:
        link = UnsubscribeToken(user_id=user.pk, category="marketing", campaign_id=campaign.pk)
        assert mail_client.post(f"/u/{make_token(link)}", {"List-Unsubscribe": "One-Click"}).status_code == 200
    other = UnsubscribeToken(user_id=users[2].pk, category="marketing", campaign_id=uuid.uuid4())
    assert mail_client.post(f"/u/{make_token(other)}", {"List-Unsubscribe": "One-Click"}).status_code == 200

    got = detail()
    assert (got["unsubscribes"], got["unsubscribe_rate"], got["counts"]["outcome"]["sent"]) == (2, 2 / 3, 3)
    # One of them re-subscribes and clicks the same link again: two rows, still one recipient.
    Preferences.objects.filter(recipient=users[0]).update(category_opt_outs={})
    link = UnsubscribeToken(user_id=users[0].pk, category="marketing", campaign_id=campaign.pk)
    assert mail_client.post(f"/u/{make_token(link)}", {"List-Unsubscribe": "One-Click"}).status_code == 200
    assert Unsubscribe.objects.filter(campaign_id=campaign.pk).count() == 3
    assert (detail()["unsubscribes"], detail()["unsubscribe_rate"]) == (2, 2 / 3)
    [listed] = http.get("/v1/campaigns").json()["items"]
    assert "unsubscribes" not in listed and "unsubscribe_rate" not in listed


def test_the_admin_campaign_page_shows_unsubscribes_and_rate(admin_client, fast_password_hashing):
    from django.urls import reverse

    from campaigns import services
    from campaigns.models import CampaignStatus

    segment, _ = services.upsert_segment("vip", name="VIPs")
    campaign = services.create_campaign(client=None, idempotency_key=None, status=CampaignStatus.COMPLETED,
                                        segment=segment, channel="email", title="Sale", body="hello").campaign
    users = [Recipient.objects.create(user_id=f"a{i}", email=f"a{i}@example.org") for i in range(4)]
    for user in users:
        Notification.objects.create(id=uuid.uuid4(), recipient=user, channel="email", category="marketing",
                                    campaign_id=campaign.pk, status="sent")
    Unsubscribe.objects.create(recipient=users[0], category="marketing", channel="email", source="one_click",
                               campaign_id=campaign.pk, at="2026-12-02T10:00:00Z")

    page = admin_client.get(reverse("admin:campaigns_campaign_change", args=[campaign.pk])).content.decode()

    assert "Unsubscribes" in page and "1 (25.0 % of sent)" in page
