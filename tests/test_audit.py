"""The API audit log (issue 11 #2): every write through the API is one APIAuditEntry: who, what (method,
path, object type and id, which fields changed: names only), when, and the outcome; refusals too;
never a body's values. Support reads it in the admin (read-only, filters by client and date).

In-process (Django test client, rolled-back transactions); no worker processes.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.auth.models import Group, User
from django.db import DatabaseError
from django.test import Client

from campaigns.models import Template, TemplateVariant
from campaigns.roles import SUPPORT
from core.api.scopes import Scope
from notifications.models import APIAuditEntry, APIClient
from preferences.models import Device, Recipient
from tests.conftest import EVERY_SCOPE, MARKETING_SCOPES

pytestmark = pytest.mark.django_db

NOW = datetime(2030, 3, 1, 9, 0, 0, 123000, tzinfo=UTC)
COLUMNS = ["client__name", "method", "path", "object_type", "object_id", "status", "error_code", "fields"]


def http_for(key: str, **headers) -> Client:
    return Client(headers={"Authorization": f"Api-Key {key}", **headers})


def call(http, method, path, body=None, **headers):
    return getattr(http, method)(path, data=json.dumps(body) if body is not None else None,
                                 content_type="application/json", headers=headers)


def entries() -> list[tuple]:
    return list(APIAuditEntry.objects.order_by("id").values_list(*COLUMNS))


@pytest.fixture
def user_service():
    return APIClient.objects.create_key(name="user-service", scopes=EVERY_SCOPE)


@pytest.fixture
def http(user_service):
    return http_for(user_service[1])


def test_contact_writes_are_recorded_with_the_fields_changed_never_their_values(http, frozen):
    r = call(http, "put", "/v1/users/alice", {"email": "alice@example.com", "phone": "+4915112345678"})
    assert r.status_code == 201
    frozen[0] = NOW + timedelta(seconds=5)
    r = call(http, "put", "/v1/users/alice", {"email": "alice@example.com", "phone": "+4915199999999",
                                              "attributes": {"first_name": "Alice"}})
    assert r.status_code == 200
    assert entries() == [
        ("user-service", "PUT", "/v1/users/alice", "recipient", "alice", 201, "", ["email", "phone"]),
        ("user-service", "PUT", "/v1/users/alice", "recipient", "alice", 200, "", ["attributes.first_name", "phone"]),
    ]
    assert [e.at for e in APIAuditEntry.objects.order_by("id")] == [NOW, NOW + timedelta(seconds=5)]
    stored = json.dumps([list(row) for row in APIAuditEntry.objects.values_list()], default=str)
    for value in ("alice@example.com", "+4915112345678", "+4915199999999", "Alice"):
        assert value not in stored


def test_a_refused_write_is_recorded_with_its_status_and_code_and_no_fields(frozen):
    Recipient.objects.create(user_id="alice", phone="+4915112345678")
    _, key = APIClient.objects.create_key(name="marketing-tool", scopes=MARKETING_SCOPES)
    r = call(http_for(key), "put", "/v1/users/alice", {"phone": "+4915100000666"})
    assert r.status_code == 403
    assert entries() == [("marketing-tool", "PUT", "/v1/users/alice", "recipient", "alice", 403, "missing_scope", [])]
    assert APIAuditEntry.objects.get().at == NOW


def test_sends_record_the_new_id_and_a_replay_records_no_change(http):
    Recipient.objects.create(user_id="alice", phone="+4915112345678")
    body = {"user_id": "alice", "channel": "sms", "priority": "high", "content": {"body": "Your code is 918273"},
            "sensitive": True}
    first = call(http, "post", "/v1/notifications", body, **{"Idempotency-Key": "otp-1"})
    again = call(http, "post", "/v1/notifications", body, **{"Idempotency-Key": "otp-1"})
    nid = first.json()["id"]
    assert (first.status_code, again.status_code, again.json()["id"]) == (202, 202, nid)
    assert entries() == [
        ("user-service", "POST", "/v1/notifications", "notification", nid, 202, "",
         ["channel", "content", "priority", "sensitive", "user_id"]),
        ("user-service", "POST", "/v1/notifications", "notification", nid, 202, "", []),
    ]
    assert "918273" not in json.dumps(list(APIAuditEntry.objects.values_list("path", "fields")))


def test_device_and_preference_writes_name_the_user_and_hide_push_tokens(http):
    alice = Recipient.objects.create(user_id="alice")
    Recipient.objects.create(user_id="mallory")
    Device.objects.create(recipient=alice, platform="android", push_token="tok-alice")
    assert call(http, "put", "/v1/users/mallory/devices", {"platform": "android", "push_token": "tok-alice"}
                ).status_code == 200
    assert call(http, "delete", "/v1/users/mallory/devices/tok-alice").status_code == 204
    assert call(http, "put", "/v1/users/alice/preferences", {
        "opt_outs": ["sms"], "category_opt_outs": {"marketing": ["email"]}}).status_code == 200
    assert entries() == [
        ("user-service", "PUT", "/v1/users/mallory/devices", "device", "mallory", 200, "", ["user_id"]),
        ("user-service", "DELETE", "/v1/users/mallory/devices/{push_token}", "device", "mallory", 204, "", []),
        ("user-service", "PUT", "/v1/users/alice/preferences", "preferences", "alice", 200, "",
         ["category_opt_outs.marketing", "opt_outs"]),
    ]
    assert "tok-alice" not in json.dumps(list(APIAuditEntry.objects.values_list("path", "object_id", "fields")))


def test_template_and_campaign_writes(http):
    assert call(http, "put", "/v1/segments/vip", {"name": "VIPs"}).status_code == 201
    template = {"name": "Promo", "default_locale": "en", "variants": [{"locale": "en", "body": "Sale"},
                                                                      {"locale": "de", "body": "Angebot"}]}
    assert call(http, "put", "/v1/templates/promo", template).status_code == 201
    template["variants"][1]["body"] = "Rabatt"
    assert call(http, "put", "/v1/templates/promo", template).status_code == 200
    r = call(http, "post", "/v1/campaigns", {"segment_id": "vip", "channel": "sms", "template_id": "promo"},
             **{"Idempotency-Key": "c1"})
    cid = r.json()["id"]
    assert call(http, "post", f"/v1/campaigns/{cid}/cancel").status_code == 200
    assert entries() == [
        ("user-service", "PUT", "/v1/segments/vip", "segment", "vip", 201, "", ["name"]),
        ("user-service", "PUT", "/v1/templates/promo", "template", "promo", 201, "",
         ["default_locale", "name", "variants"]),
        ("user-service", "PUT", "/v1/templates/promo", "template", "promo", 200, "", ["variants.de"]),
        ("user-service", "POST", "/v1/campaigns", "campaign", cid, 202, "", ["channel", "segment_id", "template_id"]),
        ("user-service", "POST", f"/v1/campaigns/{cid}/cancel", "campaign", cid, 200, "", ["status"]),
    ]
    assert "Rabatt" not in json.dumps(list(APIAuditEntry.objects.values_list("fields", flat=True)))


def test_reads_and_unauthenticated_or_rate_limited_requests_are_not_recorded(http):
    Recipient.objects.create(user_id="alice")
    assert http.get("/v1/users/alice").status_code == 200
    assert call(Client(), "put", "/v1/users/alice", {"phone": "+4915100000666"}).status_code == 401
    _, key = APIClient.objects.create_key(name="limited", scopes=EVERY_SCOPE, rate_limit="1/min")
    limited = http_for(key)
    assert call(limited, "put", "/v1/users/alice", {"locale": "en"}).status_code == 200
    assert call(limited, "put", "/v1/users/alice", {"locale": "de"}).status_code == 429
    assert entries() == [("limited", "PUT", "/v1/users/alice", "recipient", "alice", 200, "", ["locale"])]


def test_a_path_id_postgres_cannot_store_is_recorded_readably(http):
    r = http.put("/v1/users/a%00b", data=json.dumps({}), content_type="application/json")
    assert r.status_code == 422
    assert entries() == [("user-service", "PUT", "/v1/users/a\ufffdb", "recipient", "a\ufffdb", 422,
                          "validation_error", [])]


def test_a_failing_audit_write_never_fails_the_request(http, monkeypatch, caplog):
    def broken(**kwargs):
        raise DatabaseError("audit table unavailable")

    monkeypatch.setattr(APIAuditEntry.objects, "create", broken)
    r = call(http, "put", "/v1/users/alice", {"locale": "en"})
    assert r.status_code == 201
    assert Recipient.objects.get(pk="alice").locale == "en"
    assert "API write not recorded in the audit log: PUT /v1/users/alice" in caplog.text


# --- the admin ---------------------------------------------------------------------------------------

@pytest.fixture
def supporter(fast_password_hashing) -> User:
    user = User.objects.create_user("sam", is_staff=True)
    user.groups.add(Group.objects.get(name=SUPPORT))
    return User.objects.get(pk=user.pk)


def test_support_reads_the_audit_log_filtered_by_client_and_date(client, supporter, http, frozen):
    _, other_key = APIClient.objects.create_key(name="marketing-tool", scopes=MARKETING_SCOPES)
    call(http, "put", "/v1/users/alice", {"locale": "en"})
    frozen[0] = NOW + timedelta(days=3)
    call(http_for(other_key), "put", "/v1/users/alice", {"locale": "de"})
    client.force_login(supporter)
    url = "/admin/notifications/apiauditentry/"
    page = client.get(url).content.decode()
    assert "2030-03-01 09:00:00.123 UTC" in page and "missing_scope" in page
    user_service = APIClient.objects.get(name="user-service")
    assert f'href="?client={user_service.prefix}"' in page  # the client filter, by prefix
    assert "at__gte=" in page  # the date filter
    only = client.get(url, {"client": user_service.prefix}).content.decode()
    assert "2030-03-01 09:00:00.123 UTC" in only and "missing_scope" not in only
    day = client.get(url, {"at__gte": "2030-03-04 00:00:00+00:00",
                           "at__lt": "2030-03-05 00:00:00+00:00"}).content.decode()
    assert "missing_scope" in day and "2030-03-01 09:00:00.123 UTC" not in day
    entry = APIAuditEntry.objects.filter(client=user_service).get()
    detail = client.get(f"{url}{entry.pk}/change/")
    assert detail.status_code == 200 and "locale" in detail.content.decode()


HASH_LOOKUPS = ["client__id__startswith", "client__id__exact", "client__id", "client__pk__startswith",
                "client__startswith", "client__exact", "client", "client__hashed_key__startswith",
                "client__id__regex", "client__in"]


@pytest.mark.parametrize("lookup", HASH_LOOKUPS)
def test_support_cannot_look_up_an_api_keys_hash_on_the_audit_log(client, supporter, http, lookup):
    """Issue 23 #9: ``?client__id__startswith=`` reads the key's hash (the client's id is
    ``prefix.<hash>``) one character at a time from "1 result"/"0 results". Every lookup that reaches
    the id or the hash is 400; nothing is listed."""
    call(http, "put", "/v1/users/alice", {"locale": "en"})
    user_service = APIClient.objects.get(name="user-service")
    client.force_login(supporter)
    value = user_service.pk if lookup != "client__in" else f"{user_service.pk},x"
    if lookup == "client":  # the filter's own parameter: a prefix, never an id
        r = client.get("/admin/notifications/apiauditentry/", {lookup: user_service.pk})
        assert (r.status_code, r.context["cl"].result_count) == (200, 0)
        return
    r = client.get("/admin/notifications/apiauditentry/", {lookup: value[:12]})
    assert r.status_code == 400, (lookup, r.status_code)
    assert user_service.hashed_key not in r.content.decode()


def test_no_page_support_reads_shows_an_api_keys_hash(client, supporter, http):
    call(http, "put", "/v1/users/alice", {"locale": "en"})
    user_service = APIClient.objects.get(name="user-service")
    entry = APIAuditEntry.objects.get()
    client.force_login(supporter)
    url = "/admin/notifications/apiauditentry/"
    for page in (client.get(url), client.get(url, {"client": user_service.prefix}),
                 client.get(f"{url}{entry.pk}/change/")):
        text = page.content.decode()
        assert page.status_code == 200
        assert user_service.hashed_key not in text and user_service.hashed_key[:16] not in text
        assert "sha512$$" not in text
    listed = client.get(url).content.decode()
    assert f"user-service ({user_service.prefix})" in listed
    assert "/admin/notifications/apiclient/" not in listed  # support may not open API clients: no link


def test_the_admin_addresses_api_clients_by_prefix(admin_client, http):
    call(http, "put", "/v1/users/alice", {"locale": "en"})
    user_service = APIClient.objects.get(name="user-service")
    by_prefix = f"/admin/notifications/apiclient/{user_service.prefix}/change/"
    pages = {"list": admin_client.get("/admin/notifications/apiclient/"),
             "audit log": admin_client.get("/admin/notifications/apiauditentry/"),
             "client": admin_client.get(by_prefix),
             "history": admin_client.get(f"/admin/notifications/apiclient/{user_service.prefix}/history/")}
    for name, page in pages.items():
        text = page.content.decode()
        assert page.status_code == 200, name
        assert user_service.hashed_key not in text and "sha512$$" not in text, name
    assert f'href="{by_prefix}"' in pages["list"].content.decode()
    assert f'href="{by_prefix}"' in pages["audit log"].content.decode()
    r = admin_client.post(by_prefix, {"name": "user-service", "scopes": ["read"], "rate_limit": ""})
    assert r.status_code == 302
    from django.contrib.admin.models import LogEntry

    assert list(LogEntry.objects.values_list("object_id", flat=True)) == [user_service.prefix]
    history = admin_client.get(f"/admin/notifications/apiclient/{user_service.prefix}/history/").content.decode()
    assert "Changed Scopes" in history and "sha512$$" not in history
    # the id (with the hash) addresses nothing
    assert admin_client.get(f"/admin/notifications/apiclient/{user_service.pk}/change/").status_code == 302


def test_pages_naming_a_client_never_carry_its_id(client, supporter, http, fast_password_hashing):
    """A notification's page (support) named its client with Django's link to the client's page,
    whose URL held the id; a segment's or template's select (marketing) had ids as option values."""
    import uuid

    from campaigns.models import Segment
    from campaigns.roles import MARKETING
    from notifications.models import Notification

    user_service = APIClient.objects.get(name="user-service")
    alice = Recipient.objects.create(user_id="alice")
    sent = Notification.objects.create(id=uuid.uuid4(), client=user_service, recipient=alice, channel="sms",
                                       body="x", status="sent")
    segment = Segment.objects.create(segment_id="seg", name="Seg", client=user_service)
    client.force_login(supporter)
    page = client.get(f"/admin/notifications/notification/{sent.pk}/change/").content.decode()
    assert f"user-service ({user_service.prefix})" in page and "sha512$$" not in page
    marketer = User.objects.create_user("mia", is_staff=True)
    marketer.groups.add(Group.objects.get(name=MARKETING))
    client.force_login(marketer)
    url = f"/admin/campaigns/segment/{segment.pk}/change/"
    page = client.get(url).content.decode()
    assert "sha512$$" not in page
    assert f'<option value="{user_service.prefix}" selected>user-service ({user_service.prefix})</option>' in page
    r = client.post(url, {"segment_id": "seg", "name": "Renamed", "description": "", "client": user_service.prefix})
    assert r.status_code == 302
    segment.refresh_from_db()
    assert (segment.name, segment.client_id) == ("Renamed", user_service.pk)


def test_existing_admin_log_entries_of_clients_are_moved_to_their_prefix(admin_user, user_service):
    import importlib
    from types import SimpleNamespace

    from django.apps import apps
    from django.contrib.admin.models import CHANGE, LogEntry
    from django.contrib.contenttypes.models import ContentType
    from django.db import connection

    client_row = user_service[0]
    LogEntry.objects.create(user=admin_user, content_type=ContentType.objects.get_for_model(APIClient),
                            object_id=client_row.pk, object_repr="user-service", action_flag=CHANGE)
    migration = importlib.import_module("notifications.migrations.0026_admin_log_client_prefix")
    migration.to_prefix(apps, SimpleNamespace(connection=connection))
    assert list(LogEntry.objects.values_list("object_id", flat=True)) == [client_row.prefix]


def test_the_audit_log_is_read_only_even_for_superusers(admin_client, http):
    call(http, "put", "/v1/users/alice", {"locale": "en"})
    entry = APIAuditEntry.objects.get()
    url = "/admin/notifications/apiauditentry/"
    assert admin_client.get(f"{url}add/").status_code == 403
    assert admin_client.post(f"{url}{entry.pk}/change/", {"status": 500}).status_code == 403
    assert admin_client.post(f"{url}{entry.pk}/delete/", {"post": "yes"}).status_code == 403
    assert APIAuditEntry.objects.get().status == 201


def test_marketing_does_not_see_the_audit_log(client, fast_password_hashing):
    user = User.objects.create_user("mia", is_staff=True)
    user.groups.add(Group.objects.get(name="marketing"))
    client.force_login(user)
    assert client.get("/admin/notifications/apiauditentry/").status_code == 403


def test_a_refusal_by_an_ownership_rule_is_recorded_with_its_code(frozen):
    """A refusal by an ownership rule is recorded with its code."""
    owner, _ = APIClient.objects.create_key(name="owner", scopes=MARKETING_SCOPES)
    template = Template.objects.create(template_id="t", name="T", client=owner)
    TemplateVariant.objects.create(template=template, locale="en", body="Hi")
    _, key = APIClient.objects.create_key(name="other", scopes=[Scope.TEMPLATES_WRITE])
    r = call(http_for(key), "put", "/v1/templates/t", {"name": "T", "default_locale": "en",
                                                        "variants": [{"locale": "en", "body": "x"}]})
    assert r.status_code == 403
    assert entries() == [("other", "PUT", "/v1/templates/t", "template", "t", 403, "not_owner", [])]


def test_the_audit_row_of_a_send_is_one_statement_without_a_transaction_of_its_own(transactional_db):
    """Outside a transaction (as in production) the audit INSERT commits by itself: the send's request
    commits once, for its row and event, not a second time for the audit row."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    _, key = APIClient.objects.create_key(name="audit-commits", scopes=EVERY_SCOPE)
    Recipient.objects.create(user_id="alice", phone="+4915112345678")
    body = {"user_id": "alice", "channel": "sms", "content": {"body": "hello"}}
    with CaptureQueriesContext(connection) as queries:
        r = call(http_for(key), "post", "/v1/notifications", body, **{"Idempotency-Key": "one-commit"})
    assert r.status_code == 202
    sql = [q["sql"] for q in queries.captured_queries]
    assert sum(s == "COMMIT" for s in sql) == 1
    audit = [i for i, s in enumerate(sql) if s.startswith('INSERT INTO "notifications_apiauditentry"')]
    assert len(audit) == 1 and sql[audit[0] - 1] == "COMMIT"  # after the send's own commit, not in a BEGIN
    assert APIAuditEntry.objects.filter(object_id=r.json()["id"], status=202).count() == 1
