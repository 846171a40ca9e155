"""Generated inputs for the rules a notification type adds to the checks stage (docs/TYPES.md):
quiet-hours policy (defer, bypass, silent) × channel × required × opt-outs (channel, category, type)
× contacts × inside or outside the recipient's window, against an oracle written from the docs;
and fallback's outcome rule over every status and reason. Pure: rows built in memory."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, time, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from notifications.delivery import checks
from notifications.delivery.checks import Facts
from notifications.events.fallback import outcome
from notifications.events.models import NotificationType
from notifications.models import Notification, Reason, Status
from preferences.models import Preferences, Recipient

NOW = datetime(2026, 12, 2, 1, 30, tzinfo=UTC)
CHANNELS = ("push", "email", "sms")


@st.composite
def cases(draw):
    channel = draw(st.sampled_from(CHANNELS))
    policy = draw(st.sampled_from(["defer", "bypass", "silent"]))
    required = draw(st.booleans())
    opt_outs = draw(st.lists(st.sampled_from(CHANNELS), unique=True, max_size=3))
    category_opt_outs = draw(st.lists(st.sampled_from(CHANNELS), unique=True, max_size=3))
    type_opt_outs = draw(st.lists(st.sampled_from(CHANNELS), unique=True, max_size=3))
    contacts = {"phone": draw(st.sampled_from(["", "+15550001234"])),
                "email": draw(st.sampled_from(["", "a@example.org"])),
                "email_invalid_reason": draw(st.sampled_from(["", "bounced"]))}
    quiet = draw(st.sampled_from(["none", "inside", "outside"]))
    return channel, policy, required, opt_outs, category_opt_outs, type_opt_outs, contacts, quiet


def build(channel, policy, required, opt_outs, category_opt_outs, type_opt_outs, contacts, quiet):
    kind = NotificationType(key="order_shipped", category="shipping", channels=list(CHANNELS), quiet_hours=policy,
                            required=required)
    recipient = Recipient(user_id="u", timezone="UTC", **contacts)
    windows = {"inside": (time(1, 0), time(7, 0)), "outside": (time(22, 0), time(1, 0)), "none": (None, None)}
    start, end = windows[quiet]
    recipient.preferences = Preferences(recipient=recipient, opt_outs=opt_outs,
                                        category_opt_outs={"shipping": category_opt_outs},
                                        type_opt_outs={"order_shipped": type_opt_outs}, quiet_start=start,
                                        quiet_end=end, quiet_timezone="UTC")
    n = Notification(id=uuid.uuid4(), recipient=recipient, channel=channel, priority="standard", category="shipping",
                     notification_type=kind)
    return n, Facts(kind=kind, stopped_phones=set(), devices=["device"])


def oracle(channel, policy, required, opt_outs, category_opt_outs, type_opt_outs, contacts, quiet):
    """docs/TYPES.md, written out: opt-outs unless required, then the contact, then quiet hours."""
    if not required:
        if channel in opt_outs:
            return "suppressed", Reason.OPTED_OUT_CHANNEL
        if channel in category_opt_outs:
            return "suppressed", Reason.OPTED_OUT_CATEGORY
        if channel in type_opt_outs:
            return "suppressed", Reason.OPTED_OUT_TYPE
    if channel == "sms" and not contacts["phone"]:
        return "suppressed", Reason.NO_PHONE
    if channel == "email" and not contacts["email"]:
        return "suppressed", Reason.NO_EMAIL
    if channel == "email" and contacts["email_invalid_reason"]:
        return "suppressed", Reason.EMAIL_INVALID
    if quiet != "inside" or policy == "bypass":
        return "send", ""
    if policy == "silent" and channel == "push":
        return "silent", ""
    return "deferred", Reason.QUIET_HOURS


@settings(max_examples=400, deadline=None)
@given(cases())
def test_the_checks_verdict_of_a_typed_row_follows_the_documented_order(case):
    n, facts = build(*case)
    verdict = checks.verdict(n, facts, NOW)
    expected, reason = oracle(*case)
    if expected == "send":
        assert verdict is None
    elif expected == "silent":
        assert (verdict.kind, verdict.status) == (checks.SILENT, Status.SENDING)
    elif expected == "deferred":
        assert (verdict.status, verdict.reason, verdict.until) == (Status.SCHEDULED, reason,
                                                                   datetime(2026, 12, 2, 7, 0, tzinfo=UTC))
    else:
        assert (verdict.status, verdict.reason) == (Status.SUPPRESSED, reason)


@given(st.sampled_from(Status.values), st.sampled_from(["", *Reason.values]))
def test_fallback_outcome_of_every_status_and_reason(status, reason):
    got = outcome(status, reason)
    if status in (Status.SENT, Status.DELIVERED, Status.DISPLAYED, Status.DISMISSED, Status.OPENED) \
            or reason == Reason.FALLBACK_NOT_NEEDED:  # reached the recipient (an app receipt says so too)
        assert got == "not_needed"
    elif status == Status.CANCELLED:
        assert got == "cancelled"
    elif status in (Status.FAILED, Status.SUPPRESSED, Status.EXPIRED):
        assert got == "release"
    else:  # scheduled, queued, sending: not ended
        assert got is None


def test_a_window_ending_while_silent_is_still_the_deferral_instant():
    case = ("email", "silent", False, [], [], [], {"phone": "", "email": "a@example.org",
                                                   "email_invalid_reason": ""}, "inside")
    n, facts = build(*case)
    assert checks.verdict(n, facts, NOW + timedelta(hours=5)).until == datetime(2026, 12, 2, 7, 0, tzinfo=UTC)
