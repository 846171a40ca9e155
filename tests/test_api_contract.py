"""Contract test: schemathesis generates requests from our OpenAPI schema (``/api/schema/``), sends
them to the Django app in-process (WSGI) and checks every answer against the same schema.

Checks: all that schemathesis has for OpenAPI (``not_a_server_error``, ``status_code_conformance``,
``content_type_conformance``, ``response_schema_conformance``, ``response_headers_conformance``,
``negative_data_rejection``, ``missing_required_header``, ``unsupported_method``, ``ignored_auth``,
…) except those in ``EXCLUDED_CHECKS``, each with its reason, plus our own: a request the schema
calls valid gets no 4xx but for a rule the schema cannot state (each listed with its reason). JSON
types are strict (a ``0`` for a string is a 422, not coerced), so a type-changed body must be
refused like any other. Phases: examples (the schema's own examples), coverage (boundary values;
with ``CONTRACT_FULL=1`` also negative ones, unexpected methods and media types) and fuzzing, at
most ``MAX_EXAMPLES`` generated cases per operation, derandomized with a fixed seed so a failure
reproduces. In ``make test`` some 550 requests (about 15 s of CPU); ``CONTRACT_FULL=1`` some 2,500.

The database is real (``transactional_db``: requests commit, as in production). Objects are seeded
through the API first (``alice`` with phone, email and a device; a segment with members; a template;
notifications, one of them sensitive; campaigns), and every other generated case gets the seeded ids
instead of random ones, so the 2xx answers are checked too, not only 404s and 422s.

Run: ``TEST_DATABASE_NAME=test_contract TEST_REDIS_DB=9 .venv/bin/python -m pytest tests/test_api_contract.py``.
``CONTRACT_STATS=/tmp/stats.txt`` appends one line per request (method, path, status, phase).
"""

from __future__ import annotations

import fnmatch
import json
import os
import uuid
from datetime import timedelta

import pytest

schemathesis = pytest.importorskip("schemathesis")

from django.core.wsgi import get_wsgi_application  # noqa: E402
from django.test import Client  # noqa: E402
from django.utils import timezone  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402
from schemathesis.config import SchemathesisConfig  # noqa: E402

from notifications.models import APIClient  # noqa: E402
from tests.conftest import EVERY_SCOPE  # noqa: E402

#: CI-sized by default (``make test``): a few generated cases per operation, the coverage phase's
#: boundary values of valid requests only (no unexpected methods), a few hundred requests in all.
#: ``CONTRACT_FULL=1``: 25 per operation and every coverage case (negative ones, unexpected methods
#: and media types), some 2,500 requests.
FULL = bool(os.environ.get("CONTRACT_FULL"))
MAX_EXAMPLES = 25 if FULL else 4
SEED = 20260101

EXCLUDED_CHECKS = {
    # A body that is valid by the schema can still be refused, rightly, with a 422: the user, segment
    # or template must exist, the content must suit the channel (SMS ≤ 1,600 characters, email needs a
    # title)… schemathesis' check only knows statuses, so it is replaced by
    # refused_only_for_what_the_schema_cannot_state below, which reads the refusal's codes.
    "positive_data_acceptance",
}

#: ``(field, code)`` of the 422s a schema-valid request may get: rules OpenAPI 3.0 cannot state
#: (no lookups, no clock, no comparison of two properties, no property-name patterns, rules that
#: depend on another field's value or on a setting). ``*`` matches any field. A schema-valid
#: request refused with anything else means the schema is looser than the code (an unknown key
#: where it lacks ``additionalProperties: false``, a rule across fields it does not state).
REFUSALS_THE_SCHEMA_CANNOT_STATE = {
    ("user_id", "unknown_user"): "the recipient must exist",
    ("segment_id", "unknown_segment"): "the segment must exist",
    ("template_id", "unknown_template"): "the template must exist",
    ("template_id", "missing_title"): "email: every variant of the (stored) template needs a title",
    ("cursor", "invalid_cursor"): "a cursor must be one this list handed out",
    ("Idempotency-Key", "idempotency_key_reused"): "the key was used before with another body",
    ("scheduled_at", "too_far_ahead"): "within 366 days of now (the clock)",
    ("scheduled_at", "too_far_past"): "within 366 days of now",
    ("local_time.date", "too_far_ahead"): "within 366 days of now",
    ("local_time", "local_time_passed"): "the wall time must still be ahead in UTC+14 (the clock)",
    # Recurring campaigns (docs/RECURRING.md): an RRULE's grammar and its expansion.
    ("schedule.rrule", "invalid_rrule"): "RFC 5545 RRULE grammar (dateutil's rrulestr)",
    ("schedule.rrule", "too_frequent"): "the expansion's least interval (a setting, across occurrences)",
    ("schedule.rrule", "count_too_large"): "COUNT inside the rule's text (a setting)",
    ("schedule.rrule", "no_occurrence"): "an occurrence still ahead (the clock)",
    ("schedule.start", "invalid"): "a wall time YYYY-MM-DDTHH:MM:SS (the format with the error naming it)",
    ("schedule.start", "too_far_past"): "within 366 days of now (the clock)",
    ("schedule.start", "too_far_ahead"): "within 366 days of now (the clock)",
    ("end", "empty_window"): "quiet hours' end differs from start: JSON Schema cannot compare two properties",
    ("quiet_hours.end", "empty_window"): "as above",
    ("default_locale", "no_such_variant"): "one of the variants' locales (a value of another property)",
    ("variants", "duplicate_locale"): "each variant's locale once (uniqueness by one key of an object)",
    ("priority", "marketing_not_high"): "priority high depends on the category and a setting",
    ("priority", "category_not_high"): "as above",
    ("category", "bulk_transactional_category"): "a standard campaign may not use a category that bypasses quiet "
                                                 "hours (a setting; depends on priority)",
    ("channel", "channel_unavailable"): "a channel without providers (a setting: an empty *_PROVIDERS list)",
    ("add", "max_length"): "add + remove together at most 10,000 (a sum over two properties)",
    ("content.body", "max_length"): "SMS ≤ 1,600 characters, an in_app body ≤ 5,000: depends on channel",
    ("content.body", "blank"): "not only whitespace as Python strips it",
    ("content.title", "required"): "email needs a subject: depends on channel",
    ("content.title", "not_allowed_for_channel"): "depends on channel",
    ("content.html", "not_allowed_for_channel"): "depends on channel",
    ("metadata.*", "invalid_key"): "metadata keys: a letter or '_', then letters, digits, '_', '.', '-' (no "
                                   "property-name patterns in OpenAPI 3.0)",
    ("metadata.*", "control_character"): "metadata strings: no invisible character (core/identifiers.py)",
    ("metadata", "payload_too_large"): "metadata ≤ 2 KB as JSON",
    ("metadata", "digest_type"): "a digest type's event takes no metadata (its notification is many events')",
    ("content", "payload_too_large"): "push: title + body + data ≤ 4,096 bytes as JSON",
    ("content.data", "not_allowed_for_channel"): "SMS carries only its body: depends on channel",
    ("content.data", "payload_too_large"): "email data ≤ 10,000 bytes as JSON (SendGrid custom_args), in_app ≤ 4,096",
    ("content.title", "line_break"): "an email subject is one line: depends on channel",
    ("*", "reserved_key"): "data keys FCM reserves or the platform sets, case-insensitive, by channel",
    ("add", "add_and_remove"): "an id in both add and remove (a relation between two properties)",
    ("remove", "add_and_remove"): "as above",
    ("*", "template_syntax"): "Jinja2 syntax",
    ("*", "invalid_timezone"): "an IANA zone (tz database lookup)",
    ("phone", "invalid_phone"): "a dialable number (phonenumbers)",
    ("attributes", "invalid_name"): "attribute names are identifiers: propertyNames is OpenAPI 3.1",
    ("category_opt_outs", "invalid_category"): "category names: propertyNames is OpenAPI 3.1",
    ("category_opt_outs", "max_length"): "at most 100 categories",
    ("type_opt_outs", "invalid_type_key"): "notification type keys: propertyNames is OpenAPI 3.1",
    # Notification types and events (docs/TYPES.md).
    ("type", "unknown_type"): "the notification type must exist",
    ("notification_type", "unknown_type"): "as above (the segment preview's campaign type)",
    ("channel", "not_in_type"): "one of the (stored) type's channels",
    ("data.*", "required"): "a key the (stored) type requires in data",
    ("data", "payload_too_large"): "event data ≤ 16 KB as JSON",
    ("user_ids.*", "unknown_user"): "each recipient must exist",
    ("user_ids.*", "duplicate"): "each user once (uniqueness of array items is fine, but not across user_id forms)",
    ("user_id", "exclusive"): "user_id or user_ids: JSON Schema could (oneOf), but the error names one field",
    ("user_id", "required"): "as above",
    ("channels.*", "duplicate"): "each channel once",
    ("required_data.*", "duplicate"): "each data key once",
    ("name", "control_character"): "no control character (C0, DEL, C1): the error names the character",
    ("*", "confusable"): "an id in one script (Unicode TS #39 highly restrictive: Unicode's script data)",
    ("*", "not_normalized"): "a user id is in NFKC (Unicode normalization: no pattern states it)",
    ("attributes.*", "control_character"): "attribute values follow a description's rule (multi-line text: line "
                                           "breaks allowed, so no one character class)",
    ("templates.*.data.*", "control_character"): "in_app data keys and values: propertyNames is OpenAPI 3.1, "
                                                 "depends on channel",
    ("content.data.*", "control_character"): "as above",
    ("description", "control_character"): "as above, line breaks and tabs allowed",
    ("routing", "fallback_needs_two"): "fallback needs two channels (depends on another property)",
    ("channels", "sensitive_not_in_app"): "a sensitive type cannot list in_app (depends on another property)",
    ("sensitive", "sensitive_not_in_app"): "sensitive content never goes to in_app (depends on another property)",
    ("quiet_hours", "marketing_bypass"): "depends on the category",
    ("required", "marketing_required"): "depends on the category",
    ("sms_from", "invalid"): "a dialable E.164 number (phonenumbers) or a Messaging Service SID",
    ("email_from", "invalid"): "an email address (Django's validator)",
    ("email_reply_to", "invalid"): "as above",
    ("sms_from", "sender_not_allowed"): "a lookup: the sender allow-list (issue 23 #10)",
    ("email_from", "sender_not_allowed"): "as above",
    ("email_reply_to", "sender_not_allowed"): "as above",
    ("templates", "missing_channel"): "every channel of the type needs a template (across two properties)",
    ("templates.*.channel", "not_in_channels"): "a template's channel must be one of the type's",
    ("templates.*.locale", "duplicate"): "one template per channel and locale",
    ("templates.*", "not_allowed_for_channel"): "which parts a channel has: depends on channel",
    ("templates.*.body", "blank"): "not only whitespace as Python strips it",
    ("templates.*.title", "required"): "email needs a subject: depends on channel",
    ("templates.*.title", "line_break"): "an email subject is one line: depends on channel",
    ("templates.*.data", "invalid"): "push data templates are strings",
    ("*", "render_bound"): "a dry render passes a render bound",
    ("digest", "high_not_digest"): "a high-priority type cannot be a digest (depends on another property)",
    ("digest.key", "unknown_variable"): "a digest key reads only data.* (template analysis)",
    ("data", "digest_key"): "the (stored) type's digest key must render with the event's data",
    ("*", "digest_type"): "a digest type's event takes no timing or collapse key (depends on the stored type)",
    # Rule segments (campaigns/rules.py, docs/SEGMENTS.md): the rule is JSON of its own language, stated in the
    # field's description (a recursive schema of and/or/not with six leaves is more than OpenAPI 3.0 tools take).
    **{(field, code): "the rule language (docs/SEGMENTS.md), named by the rule's path"
       for field in ("rules", "rules.*")
       for code in ("unknown_rule", "unknown_operator", "unknown_key", "wrong_type", "empty", "out_of_range",
                    "too_deep", "too_many_rules", "max_length", "invalid", "invalid_name", "required")},
    ("channel", "required"): "a rule using subscribed needs the campaign's channel (depends on the rule)",
    ("segment_id", "not_found"): "the segment to count must exist",
    # Receipts from the app (notifications/app_receipts.py).
    ("event", "not_app_channel"): "only a push or in_app notification gets app receipts (the stored row's channel)",
    ("at", "too_far_ahead"): "at most 60 s ahead of now (the clock)",
    # The inbox (notifications/api/inbox.py).
    ("content.title", "control_character"): "an in_app title has no control or bidi override character (channel)",
    ("content.body", "control_character"): "an in_app body: none but line breaks and tabs (depends on channel)",
    ("*", "out_of_range"): "an instant whose UTC form is outside years 1–9999 (date-time format allows it)",
    # Text that shows nothing (core.identifiers.shows_nothing): unassigned, private-use, zero-width.
    ("content.body", "empty_body"): "a body must show something (Unicode categories: no pattern states it)",
    ("*.body", "empty_body"): "as above, for a template's parts",
    # Status webhooks (notifications/webhooks/safety.py): https to a public address (docs/WEBHOOKS.md).
    ("url", "url_not_allowed"): "a URL's scheme and its host's address class (a format cannot state them)",
}


#: Other 4xx a schema-valid request may get: ``(status, code)`` (the code of each field entry, else the
#: error's) → why the schema cannot state it (each is in the status's description).
OTHER_REFUSALS_THE_SCHEMA_CANNOT_STATE = {
    (404, "not_found"): "an id that names nothing, or another client's (a lookup)",
    (409, "not_cancellable"): "not cancellable any more (the row's state)",
    (409, "list_segment"): "a rule for a segment that has members (the segment's state)",
    (409, "rule_segment"): "members for a rule segment (the segment's state)",
    (409, "not_recurring"): "pause and resume are for recurring campaigns (the row's schedule)",
    (409, "wrong_status"): "pause a scheduled one, resume a paused one (the row's state)",
    (409, "notification_*"): "an app receipt of a notification not sent (the row's state)",
    (409, "too_many_endpoints"): "a client's webhook endpoints are counted (WEBHOOKS_MAX_ENDPOINTS_PER_CLIENT)",
    (409, "endpoint_disabled"): "a disabled webhook endpoint gets no test event (the row's state)",
    (400, "invalid_cursor"): "the inbox's cursor must be one it handed out",
    (400, "unstorable_character"): "no NUL or lone surrogate in any string, map keys included (core/api/parsers.py): "
                                   "a rule for every string of a body",
}


def refused_only_for_what_the_schema_cannot_state(ctx, response, case) -> None:
    """A schema-valid request (schemathesis' positive cases) is accepted, or refused only for what
    the schema cannot state: a 422 for the rules in :data:`REFUSALS_THE_SCHEMA_CANNOT_STATE`, a 404
    or 409 of :data:`OTHER_REFUSALS_THE_SCHEMA_CANNOT_STATE`. Any other 4xx fails."""
    if case.meta is None or not case.meta.generation.mode.is_positive or not 400 <= response.status_code < 500:
        return
    error = response.json()["error"]
    if response.status_code != 422:
        codes = {f["code"] for f in error.get("fields", [])} or {error["code"]}
        unstated = [code for code in codes
                    if not any(status == response.status_code and fnmatch.fnmatchcase(code, pattern)
                               for status, pattern in OTHER_REFUSALS_THE_SCHEMA_CANNOT_STATE)]
        assert not unstated, f"schema-valid request refused for a rule the schema does not state: {error}"
        return
    fields = error["fields"]
    unstated = [(f["field"], f["code"]) for f in fields
                if not any(code == f["code"] and fnmatch.fnmatchcase(f["field"] or "", field)
                           for field, code in REFUSALS_THE_SCHEMA_CANNOT_STATE)]
    assert not unstated, f"schema-valid request refused for a rule the schema does not state: {unstated}"

CI_COVERAGE = """
[phases.coverage]
unexpected-methods = []
generation.mode = "positive"
"""

CONFIG = f"""
seed = {SEED}

[generation]
max-examples = {MAX_EXAMPLES}
deterministic = true
database = "none"

[checks]
{chr(10).join(f"{name}.enabled = false" for name in sorted(EXCLUDED_CHECKS))}
# 413: a body over DATA_UPLOAD_MAX_MEMORY_SIZE is refused before it is read (schema-invalid or not).
negative_data_rejection.expected-statuses = [400, 401, 403, 404, 405, 406, 409, 413, 415, 422, 428, 429, "5xx"]

[phases.examples]
# The schema's examples lack some parameters (e.g. path ids of GETs): generate those.
fill-missing = true
{"" if FULL else CI_COVERAGE}
[phases.stateful]
# Our operations have no OpenAPI links to chain; the seeded ids below play that part.
enabled = false
"""

# Loaded when the module is imported (pytest-django has configured Django by then); serving the
# schema needs no database. One test item per operation.
schema = schemathesis.openapi.from_wsgi("/api/schema/", get_wsgi_application(),
                                        config=SchemathesisConfig.from_str(CONFIG))


@pytest.fixture
def api_key(transactional_db) -> str:
    _, key = APIClient.objects.create_key(name=f"contract-{uuid.uuid4().hex[:6]}", scopes=EVERY_SCOPE)
    return key


class Seeded:
    user_id = "alice"
    push_token = "fcm-token-1"
    segment_id = "spring-sale"  # the ids of the schema's examples, so the examples phase finds them
    template_id = "welcome"

    def __init__(self) -> None:
        self.notification_ids: list[str] = []
        self.campaign_ids: list[str] = []
        self.calls = 0

    def use_seeded_ids(self, case) -> None:
        """Every other case, swap the generated ids (path and body) for seeded ones, so the success
        paths are exercised too (deterministic, as the generation is). Parts that schemathesis made
        invalid on purpose are left alone."""
        self.calls += 1
        if self.calls % 2:
            return
        n = self.calls // 2
        seeded = {"notification_id": self.notification_ids[n % len(self.notification_ids)],
                  "campaign_id": self.campaign_ids[n % len(self.campaign_ids)],
                  "user_id": self.user_id, "segment_id": self.segment_id, "template_id": self.template_id,
                  "push_token": self.push_token}
        for location, params in (("path", case.path_parameters), ("body", case.body)):
            if isinstance(params, dict) and not _negative(case, location):
                for name in params.keys() & seeded.keys():
                    if isinstance(params[name], str):
                        params[name] = seeded[name]


@pytest.fixture
def seeded(api_key) -> Seeded:
    http = Client(headers={"Authorization": f"Api-Key {api_key}"})
    s = Seeded()

    def call(method: str, path: str, body: dict, expect: int, **headers) -> dict:
        r = getattr(http, method)(path, data=json.dumps(body), content_type="application/json", headers=headers)
        assert r.status_code == expect, (path, r.status_code, r.content)
        return r.json()

    call("put", f"/v1/users/{s.user_id}", {"email": "alice@example.com", "phone": "+4915112345678",
                                           "timezone": "Europe/Berlin", "locale": "de-DE"}, 201)
    call("put", f"/v1/users/{s.user_id}/devices", {"platform": "android", "push_token": s.push_token}, 201)
    call("put", f"/v1/users/{s.user_id}/preferences",
         {"opt_outs": [], "category_opt_outs": {"marketing": ["sms"]},
          "quiet_hours": {"start": "22:00", "end": "07:00", "timezone": "Europe/Berlin"}}, 200)
    call("put", f"/v1/segments/{s.segment_id}", {"name": "Spring sale"}, 201)
    call("post", f"/v1/segments/{s.segment_id}/members", {"add": [s.user_id, "bob"]}, 200)
    call("put", f"/v1/templates/{s.template_id}",
         {"name": "Welcome", "default_locale": "en",
          "variants": [{"locale": "en", "title": "Hi {{ first_name }}", "body": "Welcome"},
                       {"locale": "de", "title": "Hallo", "body": "Willkommen", "html": "<p>Willkommen</p>"}]}, 201)
    later = (timezone.now() + timedelta(days=2)).isoformat()
    for i, body in enumerate([
        # Scheduled, so still cancellable (the first cancel is 200, later ones 409); sensitive: content null.
        {"user_id": s.user_id, "channel": "sms", "priority": "high", "content": {"body": "Code 123456"},
         "sensitive": True, "scheduled_at": later},
        {"user_id": s.user_id, "channel": "email", "content": {"title": "Hello", "body": "Hi", "html": "<b>Hi</b>",
                                                               "data": {"k": "v"}}, "scheduled_at": later},
        {"user_id": s.user_id, "channel": "push", "content": {"title": "Ping", "body": "Pong"}},
    ]):
        accepted = call("post", "/v1/notifications", body, 202, **{"Idempotency-Key": f"seed-{i}"})
        s.notification_ids.append(accepted["id"])
    for i, body in enumerate([
        {"segment_id": s.segment_id, "channel": "email", "template_id": s.template_id, "scheduled_at": later},
        {"segment_id": s.segment_id, "channel": "sms", "content": {"body": "Sale!"},
         "local_time": {"date": (timezone.now() + timedelta(days=3)).date().isoformat(), "time": "09:30"}},
    ]):
        s.campaign_ids.append(call("post", "/v1/campaigns", body, 202, **{"Idempotency-Key": f"seed-c{i}"})["id"])
    return s


def _negative(case, location: str) -> bool:
    """Whether schemathesis made this part of the request invalid on purpose."""
    components = case.meta.components if case.meta is not None else {}
    return any(loc.value == location and info.mode.is_negative for loc, info in components.items())


@schema.parametrize()
# Not under xdist: schemathesis gives every operation's item one node id, and xdist then runs and
# reports one of the 35 (the others never ran). `make test` runs `serial` tests in one process.
@pytest.mark.serial
# The fixtures (database, seeded rows, API key) are set up once per operation, not per example: the
# examples of one operation share them, which is what we want (state accumulates as in production).
@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_api_contract(case, seeded, api_key):
    seeded.use_seeded_ids(case)
    # A case made invalid by leaving Authorization out (coverage phase) is sent without it.
    dropped = _negative(case, "header") and "Authorization" not in (case.headers or {})
    response = case.call_and_validate(headers={} if dropped else {"Authorization": f"Api-Key {api_key}"},
                                      additional_checks=[refused_only_for_what_the_schema_cannot_state])
    if os.environ.get("CONTRACT_STATS"):
        phase = case.meta.phase.name.value if case.meta is not None else "-"
        with open(os.environ["CONTRACT_STATS"], "a") as f:
            f.write(f"{case.method} {case.operation.path} {response.status_code} {phase}\n")


def test_rate_limited_answer_matches_the_schema(transactional_db):
    """429 (and its Retry-After header) is documented everywhere but hard to reach by generation:
    one client with a limit of 1 request a minute, checked by the same schemathesis checks."""
    _, key = APIClient.objects.create_key(name=f"contract-rl-{uuid.uuid4().hex[:6]}", rate_limit="1/min")
    case = schema["/v1/users/{user_id}"]["GET"].Case(path_parameters={"user_id": "nobody"})
    headers = {"Authorization": f"Api-Key {key}"}
    assert case.call_and_validate(headers=headers).status_code == 404
    response = case.call_and_validate(headers=headers)
    assert response.status_code == 429
    assert int(response.headers["retry-after"][0]) > 0
    assert response.json()["error"]["code"] == "throttled"
