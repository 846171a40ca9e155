"""The abuse-limit rule (docs/POLICIES.md, "Abuse limits") against a model of it: generated request
sequences (users sharing phones and addresses, types, categories, channels, instants, duplicates of
an earlier request) go through :func:`notifications.acceptance.rules.reserve` (the Redis Lua
script), and each answer (accepted, or refused naming the rule, the user and the seconds until a
slot frees) must be the model's. Worked examples first."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from core.api.refusals import AcceptanceLimited
from core.redis_client import get_redis
from notifications.acceptance.rules import Rule, reserve

T0 = datetime(2026, 12, 2, 9, 0, tzinfo=UTC)

RULES = [
    Rule("otp_user", type_key="otp", category="", per="user", limit=3, window_seconds=60),
    Rule("security_phone", type_key="", category="security", per="phone", limit=4, window_seconds=120),
    Rule("otp_mail", type_key="otp", category="security", per="email", limit=2, window_seconds=30),
]
# u0 and u1 share a phone and (in another case) an address; u3 has neither.
USERS = {
    "u0": SimpleNamespace(user_id="u0", phone="+491510000001", email="pat@example.org"),
    "u1": SimpleNamespace(user_id="u1", phone="+491510000001", email="Pat@Example.org"),
    "u2": SimpleNamespace(user_id="u2", phone="+491510000002", email="kim@example.org"),
    "u3": SimpleNamespace(user_id="u3", phone="", email=""),
}


@dataclass(frozen=True)
class Req:
    at_ms: int
    request_id: str
    users: tuple[str, ...]
    type_key: str
    category: str
    channels: tuple[str, ...]


def contact(rule: Rule, user_id: str) -> str:
    u = USERS[user_id]
    return {"user": u.user_id, "phone": u.phone, "email": u.email.lower()}[rule.per]


def counts(rule: Rule, req: Req) -> bool:
    """The rule's own words: a type and/or category; per phone only what may send an SMS, per email
    only what may send an email."""
    return ((not rule.type_key or rule.type_key == req.type_key)
            and (not rule.category or rule.category == req.category)
            and {"user": True, "phone": "sms" in req.channels, "email": "email" in req.channels}[rule.per])


class Model:
    """Accepted requests per (rule, contact): {member: instant ms}. A request is refused when, for a
    (user, rule) in order, the contact's window (the last ``window`` ms, its start excluded) already
    holds ``limit`` other requests (this request's earlier users counted); the wait is the least time
    after which fewer than ``limit`` would be left."""

    def __init__(self) -> None:
        self.windows: dict[tuple[str, str], dict[str, int]] = {}

    def submit(self, req: Req) -> tuple[str, str, int] | None:
        taking: list[tuple[tuple[str, str], str]] = []
        for user_id in req.users:
            for rule in RULES:
                subject = contact(rule, user_id)
                if not counts(rule, req) or not subject:
                    continue
                window_ms = rule.window_seconds * 1000
                key, member = (rule.name, subject), f"{req.request_id}:{user_id}"
                live = {m: t for m, t in self.windows.get(key, {}).items() if t > req.at_ms - window_ms}
                self.windows[key] = live
                if member in live or (key, member) in taking:
                    continue
                pending = sum(1 for k, _ in taking if k == key)
                if len(live) + pending >= rule.limit:
                    candidates = [t + window_ms - req.at_ms for t in live.values()] + [window_ms]
                    wait = min(d for d in candidates
                               if sum(1 for t in live.values() if t + window_ms > req.at_ms + d) + pending < rule.limit)
                    return rule.name, user_id, max(1, math.ceil(wait / 1000))
                taking.append((key, member))
        for key, member in taking:
            self.windows[key].setdefault(member, req.at_ms)
        return None


def run(reqs: list[Req]) -> list[tuple[str, str, int] | None]:
    """What the platform answers: ``None`` (accepted) or ``(rule, user, wait s)``."""
    r = get_redis()
    keys = list(r.scan_iter("acceptance:*"))
    if keys:
        r.delete(*keys)
    out = []
    for req in reqs:
        rules = [rule for rule in RULES if rule.matches(req.type_key, req.category, req.channels)]
        try:
            reserve(rules, request_id=req.request_id, recipients=[USERS[u] for u in req.users], client=None,
                    now=T0 + timedelta(milliseconds=req.at_ms))
            out.append(None)
        except AcceptanceLimited as exc:
            out.append((exc.limit, exc.user_id, exc.wait))
    return out


def otp(at_s: float, rid: str, *users: str, channels=("sms",)) -> Req:
    return Req(int(at_s * 1000), rid, users or ("u0",), "otp", "security", tuple(channels))


def test_the_fourth_otp_within_a_minute_waits_for_the_first_to_leave():
    reqs = [otp(0, "a"), otp(10, "b"), otp(20, "c"), otp(30, "d"), otp(60, "e")]
    assert run(reqs) == [None, None, None, ("otp_user", "u0", 30), None]


def test_a_duplicate_counts_once_and_a_refused_request_takes_no_slot():
    reqs = [otp(0, "a"), otp(1, "a"), otp(2, "b"), otp(3, "c"), otp(4, "a"), otp(5, "d"), otp(6, "d")]
    assert run(reqs) == [None, None, None, None, None, ("otp_user", "u0", 55), ("otp_user", "u0", 54)]


def test_the_phone_is_shared_across_users_and_an_event_for_two_of_them_counts_both():
    reqs = [Req(0, "e1", ("u0", "u1"), "login", "security", ("sms",)),
            Req(1000, "e2", ("u2", "u1"), "login", "security", ("sms",)),
            Req(2000, "e3", ("u0", "u1"), "login", "security", ("sms",)),
            Req(3000, "e4", ("u0",), "login", "security", ("push",)),
            Req(4000, "e5", ("u0",), "login", "security", ("sms",))]
    # u0+u1 (2 of 4), u1 (3), then u0 takes the 4th and u1 of the same event is refused: e3 is refused whole.
    assert run(reqs) == [None, None, ("security_phone", "u1", 118), None, None]


def test_addresses_are_compared_without_case():
    reqs = [otp(0, "a", "u0", channels=("email",)), otp(1, "b", "u1", channels=("email",)),
            otp(2, "c", "u0", channels=("email",))]
    assert run(reqs) == [None, None, ("otp_mail", "u0", 28)]


requests = st.lists(st.tuples(
    # ms since the request before; whole windows often, so instants fall on a window's very edge
    st.one_of(st.integers(0, 40_000), st.sampled_from([10_000, 30_000, 60_000])),
    st.one_of(st.none(), st.integers(0, 30)),  # None: a new request; n: repeat the id of the n-th one before
    st.lists(st.sampled_from(sorted(USERS)), min_size=1, max_size=3, unique=True),
    st.sampled_from(["otp", "login"]), st.sampled_from(["security", "account"]),
    st.lists(st.sampled_from(["sms", "email", "push"]), min_size=1, max_size=3, unique=True),
), max_size=30)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=requests)
@example(steps=[(0, None, ["u0"], "otp", "security", ["sms", "email"])] * 6)
def test_generated_sequences_answer_as_the_model(steps):
    reqs, at = [], 0
    for i, (gap, repeat, users, type_key, category, channels) in enumerate(steps):
        at += gap
        if repeat is not None and repeat < len(reqs):
            before = reqs[len(reqs) - 1 - repeat]
            reqs.append(Req(at, before.request_id, before.users, before.type_key, before.category, before.channels))
        else:
            reqs.append(Req(at, f"r{i}", tuple(users), type_key, category, tuple(channels)))
    model = Model()
    assert run(reqs) == [model.submit(req) for req in reqs]
