"""The OpenAPI schema generates without warnings, validates, and documents every endpoint, with the
scope each operation needs."""

import pytest
import yaml
from django.core.management import call_command

from core.identifiers import CONTROL_CHARACTERS, NAME_CONTROL_CHARACTERS, USER_ID_CHARACTERS, USER_ID_PATTERN
from core.vocabulary import CHANNELS


@pytest.fixture
def schema(tmp_path):
    out = tmp_path / "schema.yaml"
    call_command("spectacular", "--file", str(out), "--validate", "--fail-on-warn")
    return yaml.safe_load(out.read_text())


def test_schema_documents_the_api(schema):
    assert set(schema["paths"]) == {
        "/v1/notifications", "/v1/notifications/{notification_id}", "/v1/notifications/{notification_id}/cancel",
        "/v1/notifications/{notification_id}/receipts",
        "/v1/users/{user_id}", "/v1/users/{user_id}/preferences", "/v1/users/{user_id}/devices",
        "/v1/users/{user_id}/devices/{push_token}",
        "/v1/segments/{segment_id}", "/v1/segments/{segment_id}/members", "/v1/templates/{template_id}",
        "/v1/campaigns", "/v1/campaigns/{campaign_id}", "/v1/campaigns/{campaign_id}/cancel",
        "/v1/campaigns/{campaign_id}/pause", "/v1/campaigns/{campaign_id}/resume", "/v1/campaigns/{campaign_id}/runs",
        "/v1/users/{user_id}/notifications", "/v1/segments", "/v1/templates",
        "/v1/events", "/v1/events/{event_id}", "/v1/events/{event_id}/cancel", "/v1/events/{event_id}/recipients",
        "/v1/notification-types", "/v1/notification-types/{key}",
        "/v1/users/{user_id}/inbox", "/v1/users/{user_id}/inbox/counts", "/v1/users/{user_id}/inbox/mark",
        "/v1/segment-preview",
        "/v1/webhook-endpoints", "/v1/webhook-endpoints/{endpoint_id}", "/v1/webhook-endpoints/{endpoint_id}/test",
    }
    lists = {"/v1/users/{user_id}/notifications": {"status", "channel", "category"}, "/v1/segments": set(),
             "/v1/segments/{segment_id}/members": set(), "/v1/templates": set(),
             "/v1/campaigns": {"status", "channel", "segment_id"}, "/v1/notification-types": set(),
             "/v1/events/{event_id}/recipients": set(), "/v1/campaigns/{campaign_id}/runs": set(),
             "/v1/webhook-endpoints": set()}
    for path, filters in lists.items():
        get = schema["paths"][path]["get"]
        assert {p["name"] for p in get["parameters"] if p["in"] == "query"} == {"limit", "cursor", *filters}, path
        ref = get["responses"]["200"]["content"]["application/json"]["schema"]["$ref"].rsplit("/", 1)[1]
        assert set(schema["components"]["schemas"][ref]["properties"]) == {"items", "next_cursor"}
        assert "422" in get["responses"]
    erase = schema["paths"]["/v1/users/{user_id}"]["delete"]
    assert set(erase["responses"]) == {"200", "401", "403", "404", "422", "429", "503"}
    send = schema["paths"]["/v1/notifications"]["post"]
    assert {p["name"] for p in send["parameters"]} == {"Idempotency-Key"}
    assert set(send["responses"]) == {"202", "400", "401", "403", "413", "415", "422", "429", "503"}
    assert schema["components"]["securitySchemes"]["ApiKeyAuth"]["name"] == "Authorization"


def test_the_description_names_every_channel(schema):
    """The docs' opening names every channel (``in_app``, added later, was missing)."""
    description = schema["info"]["description"].lower()
    assert [channel for channel in CHANNELS if channel not in description] == []


def test_the_create_endpoints_document_the_abuse_limits_429_and_503(schema):
    for path in ("/v1/notifications", "/v1/events"):
        responses = schema["paths"][path]["post"]["responses"]
        assert "`acceptance_limited`" in responses["429"]["description"], path
        assert "`acceptance_limits_unavailable`" in responses["503"]["description"], path
        assert "Retry-After" in responses["429"]["headers"], path
    error = schema["components"]["schemas"]["ErrorBody"]["properties"]
    assert {"limit", "retry_after"} <= set(error)
    # Other endpoints keep the rate limit's 429 only.
    assert "acceptance" not in schema["paths"]["/v1/campaigns"]["post"]["responses"]["429"]["description"]


def test_every_operation_names_its_scope_and_documents_the_403(schema):
    """The scope in the document is the one the view declares (tests/test_scopes.py walks the views)."""
    from tests.test_scopes import declared_operations

    declared = {(route, method): scope for route, method, scope, _ in declared_operations()}
    documented = {}
    for path, operations in schema["paths"].items():
        for method, operation in operations.items():
            documented[(path, method)] = operation["x-required-scope"]
            assert f"**Scope:** `{operation['x-required-scope']}`." in operation["description"], (path, method)
            forbidden = operation["responses"]["403"]
            assert f"lacks the scope `{operation['x-required-scope']}`" in forbidden["description"], (path, method)
            assert forbidden["content"]["application/json"]["schema"]["$ref"] == "#/components/schemas/Error"
    assert documented == declared
    # Every GET needs `read`, but the inbox's (scope `inbox`: the audited cross-client exception) and
    # the webhook endpoints' (scope `webhooks`, for every method).
    assert {scope for (path, method), scope in documented.items() if method == "get"
            and not path.startswith(("/v1/users/{user_id}/inbox", "/v1/webhook-endpoints"))} == {"read"}
    assert {scope for (path, _), scope in documented.items() if path.startswith("/v1/webhook-endpoints")} == {
        "webhooks"}
    assert {scope for (path, _), scope in documented.items() if path.startswith("/v1/users/{user_id}/inbox")} == {
        "inbox"}


def test_request_bodies_are_as_strict_as_the_code(schema):
    """Issue 11 #7 (schemathesis' ST202 findings): every request body refuses unknown keys, as the
    API does (``unknown_field``); campaigns state content xor template_id, scheduled_at xor
    local_time and missed_policy only with local_time; a template needs a variant; the locale and
    the user id of every path have their patterns; equal quiet-hours bounds are documented."""
    components = schema["components"]["schemas"]
    requests = sorted(name for name in components if name.endswith("Request"))
    assert requests == ["AppReceiptRequest", "CampaignRequestRequest", "ContentRequest", "DeviceRequest",
                        "DigestRequest", "EndpointCreateRequest", "EventRequestRequest", "InboxMarkRequest",
                        "LocalTimeRequest", "MembersRequest", "NotificationTypeRequest", "PreferencesRequest",
                        "QuietHoursRequest", "RecipientRequest", "ScheduleRequest", "SegmentPreviewRequest",
                        "SegmentRequest", "SendRequestRequest", "SendTimeRequest", "TemplateRequest",
                        "TypeTemplateRequest", "VariantRequest", "WindowRequest"]
    assert {name: components[name].get("additionalProperties") for name in requests} == dict.fromkeys(requests, False)
    assert "additionalProperties" not in components["Segment"]  # responses may grow fields
    assert "Serializer mixin" not in str(components["ContentRequest"])  # no description borrowed from the mixin

    rules = components["CampaignRequestRequest"]["allOf"]
    assert rules[0] == {"oneOf": [{"required": ["content"], "properties": {"content": {"type": "object"}}},
                                  {"required": ["template_id"], "properties": {"template_id": {"type": "string"}}},
                                  {"required": ["type"], "properties": {"type": {"type": "string"}}}]}
    assert components["SendRequestRequest"]["allOf"][0] == {"oneOf": [{"required": ["content"]},
                                                                       {"required": ["type"]}]}
    assert rules[1]["not"]["required"] == ["scheduled_at", "local_time"]
    assert components["TemplateRequest"]["allOf"] == [{"properties": {"variants": {"minItems": 1, "maxItems": 50}}}]
    assert "must differ from start" in components["QuietHoursRequest"]["properties"]["end"]["description"]
    assert components["RecipientRequest"]["properties"]["locale"]["oneOf"][0]["pattern"] == \
        "^[A-Za-z]{2,3}(?:[-_][A-Za-z0-9]{2,8})*$"
    for path, operations in schema["paths"].items():
        for operation in operations.values():
            for parameter in operation.get("parameters", []):
                if parameter["in"] == "path" and parameter["name"] == "user_id":
                    assert parameter["schema"]["pattern"] == USER_ID_PATTERN, path
    assert f"^[^{USER_ID_CHARACTERS}]{{1,255}}$" == USER_ID_PATTERN


def test_every_no_control_character_pattern_is_the_one_rule(schema):
    """Issue 12 #5: the patterns of user ids, member ids, push tokens and names are built from one
    character class (core.identifiers.CONTROL_CHARACTERS: C0, DEL, C1 and, issue 23 #11, the format
    and separator characters; names allow the joiners and direction marks text needs), so they keep
    in step."""
    found = []

    def walk(node, where):
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "pattern" and isinstance(value, str) and "\\u0000" in value:
                    found.append((where, value))
                walk(value, f"{where}.{key}")
        elif isinstance(node, list):
            for i, value in enumerate(node):
                walk(value, f"{where}.{i}")

    walk(schema, "")
    assert len(found) >= 5, found
    for where, pattern in found:
        assert pattern.startswith((f"^[^{CONTROL_CHARACTERS}]{{", f"^[^{NAME_CONTROL_CHARACTERS}]{{",
                                   f"^[^{USER_ID_CHARACTERS}]{{")), (where, pattern)
    where_all = " ".join(w for w, _ in found)
    for place in ("user_id", "push_token", "MembersRequest", "DeviceRequest", "SegmentRequest", "TemplateRequest"):
        assert place in where_all, place


def _exclusions(rules) -> list[list[str]]:
    """The ``not: {required: [a, b]}`` pairs of a component's rules (fields that may not come together)."""
    found = []
    for rule in (rules or {}).get("allOf", []):
        if "required" in rule.get("not", {}):
            found.append(rule["not"]["required"])
    return found


def test_no_default_the_server_does_not_apply_in_every_case(schema):
    """Issue 23 #4: a generated client (openapi-python-client) sends every field that has a default;
    ``priority`` and ``sensitive`` had one on ``SendRequestRequest``, so a typed send from such a
    client was 422 ``not_allowed_with_type``. A field the schema declares mutually exclusive with
    another has no default, and the send's defaults are in their descriptions."""
    components = schema["components"]["schemas"]
    checked = set()
    for name, component in components.items():
        for pair in _exclusions(component):
            for field in pair:
                assert "default" not in components[name]["properties"][field], (name, field)
                checked.add((name, field))
    assert {("SendRequestRequest", f) for f in ("type", "priority", "category", "sensitive")} <= checked
    send = components["SendRequestRequest"]["properties"]
    assert "Default `standard`" in send["priority"]["description"]
    assert "Default false" in send["sensitive"]["description"]


def test_the_rules_across_fields_are_stated(schema):
    """Issue 23 (schemathesis' failures): the inbox mark's exactly one of ids and all_before, the
    segment members' at least one id to add or remove, the attributes' count; where OpenAPI 3.0
    cannot state a rule (attribute names, an empty quiet-hours window), the description does."""
    components = schema["components"]["schemas"]
    assert components["InboxMarkRequest"]["allOf"] == [{"oneOf": [{"required": ["ids"]},
                                                                  {"required": ["all_before"]}]}]
    assert components["MembersRequest"]["allOf"] == [{"anyOf": [
        {"required": ["add"], "properties": {"add": {"minItems": 1}}},
        {"required": ["remove"], "properties": {"remove": {"minItems": 1}}}]}]
    assert components["RecipientRequest"]["allOf"] == [{"properties": {"attributes": {"maxProperties": 50}}}]
    assert "`^[A-Za-z_][A-Za-z0-9_]{0,63}$`" in components["RecipientRequest"]["properties"]["attributes"][
        "description"]
    assert "`7:5` and `07:05` are equal" in components["QuietHoursRequest"]["properties"]["end"]["description"]
