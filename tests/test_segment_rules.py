"""Rule segments (docs/SEGMENTS.md): each rule over a small seeded population gives its exact member
set; and/or/not trees agree with a Python oracle (Hypothesis); erased recipients never match; the
SQL opt-out agrees with the suppression rule; engagement reads live and archived rows within the
window only."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from campaigns.membership import matching
from campaigns.rules import Context, RuleError, validate
from core import clock
from notifications.models import DeliveryEvent, Notification
from preferences.models import Device, Preferences, Recipient
from preferences.suppression import RecipientFacts, channels, opt_out_reason, opted_out_q
from tests import history

pytestmark = pytest.mark.django_db

NOW = clock.now()

#: user_id → what the population gives them (the oracle's facts).
PEOPLE = {
    "ada": dict(attributes={"plan": "gold", "city": "Berlin"}, locale="de-DE", timezone="Europe/Berlin",
                email="ada@example.org"),
    "bob": dict(attributes={"plan": "free"}, locale="de", timezone="Europe/Vienna", phone="+4915112345678"),
    "cyd": dict(attributes={"plan": "platinum"}, locale="en-US", timezone="America/New_York",
                email="cyd@example.org", email_invalid_reason="hard_bounce"),
    "dee": dict(attributes={}, locale="en", timezone="", phone="+4915112345679", phone_invalid_reason="21211"),
    "eve": dict(attributes={"city": "Paris"}, locale="fr", timezone="Europe/Paris", email="eve@example.org"),
    "fay": dict(attributes={"plan": "gold"}, locale="", timezone="Europe/Berlin"),
    "gus": dict(attributes={"plan": "Gold"}, locale="de-AT", timezone="Europe/Vienna", email="gus@example.org"),
    "hal": dict(attributes={"plan": "gold"}, locale="dex", timezone="UTC", email="hal@example.org"),
}
#: Active push devices (ivy's is inactive).
DEVICES = {"ada": True, "eve": True, "ivy": False}
#: Stored preferences, in the shapes users and old rows have.
PREFS = {
    "bob": dict(opt_outs=["email"]),
    "cyd": dict(category_opt_outs={"marketing": "email"}),          # a bare string names one channel
    "eve": dict(category_opt_outs={"marketing": ["email", "sms"]}),
    "gus": dict(category_opt_outs={"news": ["email"]}, type_opt_outs={"promo": ["email"]}),
    "hal": dict(opt_outs={"email": True}),                           # an object names no channel
}
#: (user, channel, status, days ago, archived, email open receipt)
SENDS = [
    ("ada", "push", "opened", 2, False, False),
    ("bob", "sms", "delivered", 3, True, False),      # sent, archived, in the window
    ("cyd", "email", "delivered", 5, True, True),     # opened by an email receipt, archived
    ("dee", "sms", "failed", 1, False, False),        # not sent
    ("eve", "email", "sent", 20, True, True),         # opened, but 20 days ago
    ("fay", "in_app", "opened", 40, True, False),     # opened 40 days ago
    ("gus", "email", "suppressed", 1, False, False),  # not sent
]
ERASED = "zed"  # erased: bare, but had sends and matched everything before


@pytest.fixture
def population():
    for user_id, fields in PEOPLE.items():
        Recipient.objects.create(user_id=user_id, **fields)
    Recipient.objects.create(user_id="ivy")
    Recipient.objects.create(user_id=ERASED, erased_at=NOW - timedelta(hours=1))
    for user_id, active in DEVICES.items():
        Device.objects.create(recipient_id=user_id, platform="android", push_token=f"tok-{user_id}", active=active)
    for user_id, prefs in PREFS.items():
        Preferences.objects.create(recipient_id=user_id, **prefs)
    rows = []
    for user_id, channel, status, days, _archived, opened in [*SENDS, (ERASED, "push", "opened", 1, False, False)]:
        created = NOW - timedelta(days=days)
        rows.append(Notification.objects.create(id=uuid.uuid4(), recipient_id=user_id, channel=channel, body="b",
                                                status=status, created_at=created, updated_at=created))
        if opened:
            DeliveryEvent.objects.create(notification_id=rows[-1].pk, kind="receipt:open", created_at=created)
    archived_ids = [str(n.pk) for n, s in zip(rows, [*SENDS, None], strict=True) if s and s[4]]
    history.archive(*archived_ids)
    return rows


ALIVE = {*PEOPLE, "ivy"}
CONTEXT = Context(now=NOW, channel="email", category="marketing", type_key="promo")


def members(rules, context: Context = CONTEXT) -> set[str]:
    validate(rules)
    return set(matching(rules, context).values_list("user_id", flat=True))


CASES = [
    ({"attribute": "plan", "op": "eq", "value": "gold"}, {"ada", "fay", "hal"}),  # case-sensitive: not gus
    ({"attribute": "plan", "op": "in", "value": ["free", "platinum"]}, {"bob", "cyd"}),
    ({"attribute": "city", "op": "exists", "value": True}, {"ada", "eve"}),
    ({"attribute": "city", "op": "exists", "value": False}, ALIVE - {"ada", "eve"}),
    ({"locale": ["de"]}, {"ada", "bob", "gus"}),  # de and its subtags, not "dex"
    ({"locale": ["de-AT", "fr"]}, {"gus", "eve"}),
    ({"locale": ["DE"]}, {"ada", "bob", "gus"}),  # BCP 47 tags are case-insensitive (before: no one)
    ({"locale": ["de-de", "EN-us"]}, {"ada", "cyd"}),
    ({"timezone": ["Europe/Vienna", "UTC"]}, {"bob", "gus", "hal"}),
    ({"has": "email"}, {"ada", "eve", "gus", "hal"}),  # cyd's bounced
    ({"has": "phone"}, {"bob"}),  # dee's is invalid
    ({"has": "push_device"}, {"ada", "eve"}),  # ivy's is inactive
    ({"subscribed": True}, ALIVE - {"bob", "cyd", "eve", "gus"}),  # gus: the type promo
    ({"engaged": "opened", "within_days": 7}, {"ada", "cyd"}),
    ({"engaged": "opened", "within_days": 30}, {"ada", "cyd", "eve"}),
    ({"engaged": "sent", "within_days": 7}, {"ada", "bob", "cyd"}),
    ({"engaged": "sent", "within_days": 90}, {"ada", "bob", "cyd", "eve", "fay"}),
    ({"not": {"engaged": "sent", "within_days": 7}}, ALIVE - {"ada", "bob", "cyd"}),
    ({"and": [{"locale": ["de"]}, {"has": "email"}, {"subscribed": True}]}, {"ada"}),
    ({"or": [{"has": "phone"}, {"not": {"locale": ["de", "en", "fr"]}}]}, {"bob", "fay", "hal", "ivy"}),
]


@pytest.mark.parametrize(("rules", "expected"), CASES)
def test_each_rule_matches_exactly_its_recipients(population, rules, expected):
    assert members(rules) == expected


def test_an_erased_recipient_matches_no_rule_not_even_a_negated_one(population):
    """Before: a ``not`` (or an engagement: its sends stay) matched the bare row of an erased user."""
    assert ERASED not in members({"not": {"has": "email"}})
    assert ERASED not in members({"engaged": "opened", "within_days": 7})
    assert ERASED not in members({"or": [{"subscribed": True}, {"not": {"subscribed": True}}]})
    assert members({"or": [{"subscribed": True}, {"not": {"subscribed": True}}]}) == ALIVE


def test_subscribed_without_a_category_or_type_is_the_channel_opt_out_only(population):
    assert members({"subscribed": True}, Context(now=NOW, channel="email")) == ALIVE - {"bob"}
    assert members({"subscribed": True}, Context(now=NOW, channel="sms", category="marketing")) == ALIVE - {"eve"}


STORED = [["email"], "email", ["sms"], ["email", "sms"], {"email": True}, [1, "email"], None, 7, ["emails"], []]


@pytest.mark.parametrize("opt_outs", STORED)
@pytest.mark.parametrize("category_value", STORED)
def test_the_sql_opt_out_agrees_with_the_suppression_rule(opt_outs, category_value):
    """One rule in two forms: ``opted_out_q`` (SQL) says opted out exactly when ``opt_out_reason``
    (Python, the send path's) does, for every stored shape ``channels`` reads."""
    Recipient.objects.create(user_id="u")
    Preferences.objects.create(recipient_id="u", opt_outs=opt_outs if opt_outs is not None else [],
                               category_opt_outs={"marketing": category_value})
    facts = RecipientFacts(opt_outs=channels(opt_outs), category_opt_outs={"marketing": channels(category_value)})
    expected = bool(opt_out_reason(facts, "email", "marketing"))
    assert Recipient.objects.filter(opted_out_q("email", "marketing")).exists() is expected


# --- and / or / not against an oracle ---------------------------------------------------------------

LEAVES = [rules for rules, _ in CASES if not {"and", "or", "not"} & set(rules)]


def oracle(rules) -> set[str]:
    """The member set by set algebra over the leaves' sets (checked above), with ALIVE as the universe."""
    if "and" in rules:
        return set.intersection(*(oracle(r) for r in rules["and"]))
    if "or" in rules:
        return set.union(*(oracle(r) for r in rules["or"]))
    if "not" in rules:
        return ALIVE - oracle(rules["not"])
    return next(expected for leaf, expected in CASES if leaf == rules)


trees = st.recursive(st.sampled_from(LEAVES), lambda inner: st.one_of(
    st.lists(inner, min_size=1, max_size=4).map(lambda rs: {"and": rs}),
    st.lists(inner, min_size=1, max_size=4).map(lambda rs: {"or": rs}),
    inner.map(lambda r: {"not": r})), max_leaves=12)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rules=trees)
def test_and_or_not_match_exactly_what_the_oracle_says(population, rules):
    try:
        validate(rules)
    except RuleError as exc:
        assert exc.code in ("too_deep", "too_many_rules")
        return
    assert members(rules) == oracle(rules)
