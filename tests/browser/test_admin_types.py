"""Notification types in a real browser: a member of the ``product`` group defines a type with a push
and an email template through the form (a template error first, shown on its row), sees the channel ×
locale matrix, and previews the type for a user with sample data.
"""

from __future__ import annotations

import pytest

from campaigns import roles
from notifications.events.models import NotificationType, TypeTemplate
from preferences.models import Recipient

pytestmark = pytest.mark.browser

expect = pytest.importorskip("playwright.sync_api", reason="the pip package `playwright` is not installed").expect


def test_product_defines_a_type_sees_its_matrix_and_previews_it(page, log_in, staff_member):
    Recipient.objects.create(user_id="ada", email="ada@example.com", locale="de-AT", attributes={"first_name": "Ada"})
    log_in(*staff_member("pia", roles.PRODUCT))

    page.click("a[href='/admin/notifications/notificationtype/add/']")
    page.fill("#id_key", "order_shipped")
    page.fill("#id_name", "Order shipped")
    page.fill("#id_category", "shipping")
    page.fill("#id_channels", "push, email")
    page.select_option("#id_quiet_hours", "silent")
    page.select_option("#id_templates-0-channel", "push")
    page.fill("#id_templates-0-locale", "de")
    page.fill("#id_templates-0-title", "Verschickt")
    page.fill("#id_templates-0-body", "Bestellung {{ data.order_id }} ist unterwegs, {{ first_name }}")
    page.click("#templates-group .add-row a")
    page.select_option("#id_templates-1-channel", "email")
    page.fill("#id_templates-1-locale", "en")
    page.fill("#id_templates-1-title", "Order {{ data.order_id }} shipped")
    page.fill("#id_templates-1-body", "Hi {{ first_name }},\n{{ data.order_id }")
    page.fill("#id_templates-1-html", "<p>Hi {{ first_name }}</p>")
    page.click("input[name=_continue]")

    # The API's words, on the email row's body; nothing saved.
    expect(page.locator("#templates-1 .field-body .errorlist")).to_have_text(
        "email [en] body: template syntax error on line 2: unexpected '}'")
    assert not NotificationType.objects.exists()
    page.fill("#id_templates-1-body", "Hi {{ first_name }},\norder {{ data.order_id }} is on its way.")
    page.click("input[name=_continue]")
    expect(page.locator(".messagelist .success")).to_contain_text("order_shipped")
    assert sorted(TypeTemplate.objects.filter(type_id="order_shipped").values_list("channel", "locale")) == [
        ("email", "en"), ("push", "de")]

    # The matrix: the default locale (en) first; push has only de, email only en.
    matrix = page.locator("#type-matrix")
    expect(matrix.locator("thead th")).to_have_text(["Channel", "en (default)", "de"])
    expect(matrix.locator("tr.matrix-push td")).to_have_text(["→ de", "✓"])
    expect(matrix.locator("tr.matrix-email td")).to_have_text(["✓", "→ en"])

    # The preview for ada (de-AT): push in German, email in the default locale, her first name filled in.
    page.fill("#id_preview_user", "ada")
    page.fill("#id_preview_data", '{"order_id": "8812"}')
    page.click("#preview-submit")
    expect(page.locator("#preview-push h2")).to_have_text("push [de]")
    expect(page.locator("#preview-push .preview-title")).to_have_text("Verschickt")
    expect(page.locator("#preview-push .preview-body")).to_have_text("Bestellung 8812 ist unterwegs, Ada")
    expect(page.locator("#preview-email h2")).to_have_text("email [en]")
    expect(page.locator("#preview-email .preview-title")).to_have_text("Order 8812 shipped")
    expect(page.locator("#preview-email .preview-body")).to_have_text("Hi Ada,\norder 8812 is on its way.")
    expect(page.locator("#preview-email .preview-html-source")).to_have_text("<p>Hi Ada</p>")
    frame = page.frame_locator("#preview-email iframe.preview-html")
    expect(frame.locator("p")).to_have_text("Hi Ada")

    # Bad sample data: a form error, no preview.
    page.fill("#id_preview_data", "{order_id: 8812}")
    page.click("#preview-submit")
    expect(page.locator("#type-preview .field-preview_data .errorlist")).to_contain_text(
        "Sample data is not valid JSON: Expecting property name enclosed in double quotes")
    expect(page.locator(".preview-channel")).to_have_count(0)
