"""The OpenAPI schema generates without warnings, validates, and documents every endpoint."""

import pytest
import yaml
from django.core.management import call_command


@pytest.fixture
def schema(tmp_path):
    out = tmp_path / "schema.yaml"
    call_command("spectacular", "--file", str(out), "--validate", "--fail-on-warn")
    return yaml.safe_load(out.read_text())


def test_schema_documents_the_api(schema):
    assert set(schema["paths"]) == {
        "/v1/notifications", "/v1/notifications/{notification_id}", "/v1/notifications/{notification_id}/cancel",
        "/v1/users/{user_id}", "/v1/users/{user_id}/preferences", "/v1/users/{user_id}/devices",
        "/v1/users/{user_id}/devices/{push_token}",
        "/v1/segments/{segment_id}", "/v1/segments/{segment_id}/members", "/v1/templates/{template_id}",
        "/v1/campaigns", "/v1/campaigns/{campaign_id}", "/v1/campaigns/{campaign_id}/cancel",
    }
    send = schema["paths"]["/v1/notifications"]["post"]
    assert {p["name"] for p in send["parameters"]} == {"Idempotency-Key"}
    assert set(send["responses"]) == {"202", "400", "401", "403", "422", "429"}
    assert schema["components"]["securitySchemes"]["ApiKeyAuth"]["name"] == "Authorization"
