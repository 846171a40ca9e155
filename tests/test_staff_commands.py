"""``manage.py create_staff_user`` and ``manage.py load_demo_data`` (issue 23): a staff user in a role
group, with exactly that role's effective permissions; a demo that a second run leaves unchanged and
that refuses production settings unless forced.

In-process (``call_command``, rolled-back transactions).
"""

from __future__ import annotations

import io

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command
from django.urls import reverse

from campaigns import roles
from campaigns.models import Campaign, CampaignStatus, Segment, SegmentMember
from notifications.events.models import NotificationType, TypeTemplate
from preferences.models import Device, Recipient

pytestmark = pytest.mark.django_db


def run(*args, **options) -> list[str]:
    out = io.StringIO()
    call_command(*args, stdout=out, **options)
    return out.getvalue().splitlines()


# --- create_staff_user -----------------------------------------------------------------------------

def test_a_support_user_with_a_generated_password_printed_once(client):
    lines = run("create_staff_user", "sam", "--role", "support", "--email", "sam@example.com")

    assert lines[:2] == ["Created staff user 'sam' (role support).", "Its password, shown only now:"]
    password = lines[2]
    assert len(lines) == 3 and len(password) == 24
    user = User.objects.get(username="sam")
    assert (user.email, user.is_staff, user.is_superuser, user.is_active) == ("sam@example.com", True, False, True)
    assert list(user.groups.values_list("name", flat=True)) == [roles.SUPPORT]
    assert user.check_password(password) and password not in user.password  # only the hash is stored
    assert user.get_all_permissions() == set(roles.GROUP_PERMISSIONS[roles.SUPPORT])
    # The permissions take effect: support reads recipients, and is refused campaigns.
    login = client.post(reverse("admin:login") + "?next=/admin/", {"username": "sam", "password": password})
    assert (login.status_code, login["Location"]) == (302, "/admin/")
    assert client.get(reverse("admin:preferences_recipient_changelist")).status_code == 200
    assert client.get(reverse("admin:campaigns_campaign_changelist")).status_code == 403


def test_two_roles_and_a_given_password():
    lines = run("create_staff_user", "pia", "--role", "product", "--role", "marketing", "--role", "product",
                "--password", "correct-horse-battery-17")

    assert lines == ["Created staff user 'pia' (role product, marketing)."]
    user = User.objects.get(username="pia")
    assert sorted(user.groups.values_list("name", flat=True)) == [roles.MARKETING, roles.PRODUCT]
    assert user.check_password("correct-horse-battery-17")
    assert user.get_all_permissions() == (set(roles.GROUP_PERMISSIONS[roles.PRODUCT])
                                          | set(roles.GROUP_PERMISSIONS[roles.MARKETING]))


@pytest.mark.parametrize(("typed", "outcome"), [
    (["correct-horse-battery-17", "correct-horse-battery-17"], "typed"),
    (["correct-horse-battery-17", "correct-horse-battery-71"], "the two passwords differ"),
    ([""], "generated"),
])
def test_on_a_terminal_the_password_is_asked_for(monkeypatch, typed, outcome):
    answers = iter(typed)
    monkeypatch.setattr("sys.stdin.isatty", lambda: True)
    monkeypatch.setattr("getpass.getpass", lambda prompt: next(answers))
    if outcome == "the two passwords differ":
        with pytest.raises(CommandError, match="the two passwords differ"):
            run("create_staff_user", "sam", "--role", "support")
        assert not User.objects.filter(username="sam").exists()
        return
    lines = run("create_staff_user", "sam", "--role", "support")
    user = User.objects.get(username="sam")
    if outcome == "typed":
        assert lines == ["Created staff user 'sam' (role support)."]
        assert user.check_password("correct-horse-battery-17")
    else:
        assert len(lines) == 3 and user.check_password(lines[2])
    assert next(answers, None) is None  # every answer asked for, no more


@pytest.mark.parametrize(("args", "message"), [
    (["--role", "admin"], "argument --role: invalid choice: 'admin'"),
    ([], "the following arguments are required: --role"),
    (["--role", "support", "--password", "12345678"],
     "password: This password is too common. This password is entirely numeric."),
    (["--role", "support", "--password", "short1"],
     "password: This password is too short. It must contain at least 8 characters."),
    (["--role", "support", "--email", "sam@"], "--email 'sam@' is not an email address"),
])
def test_bad_input_is_refused_and_makes_no_user(args, message):
    with pytest.raises(CommandError) as refused:
        run("create_staff_user", "sam", *args)
    assert message in str(refused.value)
    assert not User.objects.filter(username="sam").exists()


def test_an_existing_user_is_refused_and_left_alone():
    User.objects.create_user("sam", password="pw-sam-0123", is_staff=False)
    with pytest.raises(CommandError, match="user 'sam' already exists: change its groups in the admin"):
        run("create_staff_user", "sam", "--role", "support")
    user = User.objects.get(username="sam")
    assert (user.is_staff, user.groups.count(), user.check_password("pw-sam-0123")) == (False, 0, True)


# --- load_demo_data --------------------------------------------------------------------------------

def demo_rows() -> dict[str, object]:
    """Every demo row with the fields a run could change (stamps included)."""
    return {
        "recipients": list(Recipient.objects.order_by("pk").values()),
        "devices": list(Device.objects.order_by("pk").values()),
        "types": list(NotificationType.objects.order_by("pk").values()),
        "templates": list(TypeTemplate.objects.order_by("pk").values()),
        "segments": list(Segment.objects.order_by("pk").values()),
        "members": list(SegmentMember.objects.order_by("pk").values()),
        "campaigns": list(Campaign.objects.order_by("pk").values()),
    }


def test_demo_data_fills_a_demo_and_a_second_run_changes_nothing(settings):
    settings.LOCAL_DEVELOPMENT = True
    first = run("load_demo_data")

    assert first == ["Demo data: user demo-ada, device demo-token-ada-android, user demo-ben, "
                     "device demo-token-ben-ios, device demo-token-ben-web, user demo-chloe, type demo_order_shipped, "
                     "segment demo, 3 segment members, campaign 'Demo: spring sale'."]
    assert sorted(Recipient.objects.values_list("pk", "email")) == [
        ("demo-ada", "ada@example.com"), ("demo-ben", "ben@example.com"), ("demo-chloe", "chloe@example.com")]
    assert sorted(Device.objects.values_list("recipient_id", "platform", "active")) == [
        ("demo-ada", "android", True), ("demo-ben", "ios", True), ("demo-ben", "web", True)]
    kind = NotificationType.objects.get()
    assert (kind.key, kind.channels, kind.required_data, kind.client_id) == (
        "demo_order_shipped", ["push", "email", "in_app"], ["order_id"], None)
    assert sorted(kind.templates.values_list("channel", "locale")) == [
        ("email", "en"), ("in_app", "en"), ("push", "en")]
    assert sorted(SegmentMember.objects.filter(segment_id="demo").values_list("recipient_id", flat=True)) == [
        "demo-ada", "demo-ben", "demo-chloe"]
    campaign = Campaign.objects.get()
    assert (campaign.name, campaign.status, campaign.segment_id, campaign.channel) == (
        "Demo: spring sale", CampaignStatus.DRAFT, "demo", "push")

    before = demo_rows()
    assert run("load_demo_data") == ["Demo data: already there, nothing changed."]
    assert demo_rows() == before


@pytest.mark.parametrize("force", [False, True])
def test_demo_data_refuses_production_settings_unless_forced(settings, force):
    settings.LOCAL_DEVELOPMENT, settings.NOTIFY_ENV = False, "production"
    if not force:
        with pytest.raises(CommandError, match=r"NOTIFY_ENV=production: demo data goes into local development "
                                               r"databases only \(NOTIFY_ENV=local\); --force to load it anyway"):
            run("load_demo_data")
        assert (Recipient.objects.count(), NotificationType.objects.count(), Campaign.objects.count()) == (0, 0, 0)
    else:
        run("load_demo_data", "--force")
        assert (Recipient.objects.count(), Device.objects.count(), NotificationType.objects.count(),
                Segment.objects.count(), Campaign.objects.count()) == (3, 3, 1, 1, 1)
