"""Webhook URL rules at save and at connect (docs/WEBHOOKS.md, "Safety"): ASCII only (an IDN host in
its punycode form), so the check sees the host the connection goes to, in every mode. The API's
422 and the transport's refusal say the same rule."""

from __future__ import annotations

import pytest

from notifications.webhooks import safety, transport
from notifications.webhooks.models import WebhookEndpoint
from tests.conftest import make_client
from tests.test_status_webhooks import http_for, post

pytestmark = pytest.mark.django_db

MODES = {"production": False, "insecure": True}


@pytest.fixture(params=list(MODES))
def mode(request, settings):
    settings.WEBHOOKS = {**settings.WEBHOOKS, "ALLOW_INSECURE": MODES[request.param]}
    return request.param


def refused_at_save(url: str) -> str:
    """The 422's message on ``url`` (nothing written)."""
    _, key = make_client()
    r = post(http_for(key), "/v1/webhook-endpoints", {"url": url, "events": ["notification.sent"]})
    assert r.status_code == 422, r.content
    assert [(f["field"], f["code"]) for f in r.json()["error"]["fields"]] == [("url", "url_not_allowed")]
    assert WebhookEndpoint.objects.count() == 0
    return r.json()["error"]["fields"][0]["message"]


@pytest.mark.parametrize(("url", "host"), [
    ("https://пример.example/hook", "пример.example"), ("https://bücher.example/hook", "bücher.example"),
    ("https://ｌｏｃａｌｈｏｓｔ/hook", "ｌｏｃａｌｈｏｓｔ"), ("https://127。0。0。1/hook", "127。0。0。1"),
    ("https://hooks.ex\u00adample.com/hook", "hooks.ex\u00adample.com")])
def test_a_non_ascii_host_is_refused_at_save_and_at_connect_asking_for_its_punycode(mode, url, host):
    rule = f"host {host!r} is not ASCII: use its punycode form (xn--…)"
    assert refused_at_save(url) == rule
    assert transport.Connection(url, 5).refused == f"refused: {rule}"  # one saved before the rule


def test_a_non_ascii_path_is_refused_asking_to_percent_encode_it(mode):
    url = "https://hooks.example.com/bücher?q=ä"
    rule = "must be ASCII: percent-encode the path and query (%C3%BC for ü)"
    assert refused_at_save(url) == rule
    assert transport.Connection(url, 5).refused == f"refused: {rule}"


def test_the_punycode_form_and_a_percent_encoded_path_are_saved_as_given(mode):
    _, key = make_client()
    url = "https://xn--e1afmkfd.example/b%C3%BCcher"
    r = post(http_for(key), "/v1/webhook-endpoints", {"url": url, "events": ["notification.sent"]})
    assert r.status_code == 201, r.content
    assert WebhookEndpoint.objects.get().url == url


# --- special-purpose addresses Python's ``is_global`` lets through (IANA registries) --------------------

DENIED = [("fec0::1", "site-local"), ("fed0:1::1", "site-local"), ("5f00::1", "SRv6 SIDs"),
          ("3fff::1", "documentation"), ("3fff:fff:ffff::1", "documentation"), ("100:0:0:1::1", "dummy IPv6 prefix"),
          ("192.88.99.1", "6to4 relay anycast"), ("192.0.0.9", "IETF protocol assignments"),
          ("2002:c058:6301::1", "6to4 relay anycast")]  # the last: 6to4 of 192.88.99.1, judged by it


@pytest.mark.parametrize(("address", "name"), DENIED)
def test_a_special_purpose_address_is_refused_at_save_and_at_connect_naming_its_block(settings, monkeypatch,
                                                                                     address, name):
    settings.WEBHOOKS = {**settings.WEBHOOKS, "ALLOW_INSECURE": False}
    host = f"[{address}]" if ":" in address else address
    message = refused_at_save(f"https://{host}/hook")
    assert "is not a public address" in message and f"{name}," in message, message
    monkeypatch.setattr(safety, "getaddrinfo", lambda _host, _port: [address])
    with pytest.raises(safety.Refused, match=f"{name},"):
        safety.resolve("hooks.example.com", 443)


@pytest.mark.parametrize("address", ["192.88.98.1", "3fff:1000::1", "5f01::1", "2a00:1450:4001::1", "93.184.215.14"])
def test_the_neighbours_of_the_denied_blocks_pass(settings, monkeypatch, address):
    settings.WEBHOOKS = {**settings.WEBHOOKS, "ALLOW_INSECURE": False}
    monkeypatch.setattr(safety, "getaddrinfo", lambda _host, _port: [address])
    assert safety.resolve("hooks.example.com", 443) == address
    safety.check_url(f"https://{f'[{address}]' if ':' in address else address}/hook")
