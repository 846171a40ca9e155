"""The unsubscribe link's page in a real browser (Chromium) against the production web server
(gunicorn): the GET page says what will happen and changes nothing; its button unsubscribes."""

from __future__ import annotations

import pytest

from preferences.models import Preferences, Recipient, Unsubscribe
from preferences.unsubscribe import UnsubscribeToken, make_token

pytestmark = pytest.mark.browser

expect = pytest.importorskip("playwright.sync_api", reason="the pip package `playwright` is not installed").expect


def test_the_page_renders_and_its_button_unsubscribes(page):
    Recipient.objects.create(user_id="reader-1", email="reader@example.org")
    token = make_token(UnsubscribeToken(user_id="reader-1", category="marketing"))

    page.goto(f"/u/{token}")

    expect(page.locator("h1")).to_have_text("Unsubscribe from marketing emails?")
    expect(page.locator("main")).to_contain_text("You will no longer receive marketing messages by email.")
    assert (Preferences.objects.count(), Unsubscribe.objects.count()) == (0, 0)  # the GET changed nothing

    page.locator("#unsubscribe").click()

    expect(page.locator("#done")).to_have_text("You are unsubscribed")
    assert Preferences.objects.get(recipient_id="reader-1").category_opt_outs == {"marketing": ["email"]}
    assert list(Unsubscribe.objects.values_list("recipient_id", "category", "channel", "source")) == [
        ("reader-1", "marketing", "email", "page")]


def test_a_tampered_link_shows_the_error_page(page):
    token = make_token(UnsubscribeToken(user_id="reader-1", category="marketing"))

    response = page.goto(f"/u/{token[:-2]}")

    assert response.status == 400
    expect(page.locator("#error")).to_have_text("this link is not valid.")
    expect(page.locator("main")).to_contain_text("Nothing was changed.")
