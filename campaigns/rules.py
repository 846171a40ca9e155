"""The rule language of rule segments (docs/SEGMENTS.md): validation and compilation to a Django ``Q``.

A rule is JSON: ``and`` / ``or`` (lists of rules), ``not`` (one rule), and leaves over who a
recipient is (``attribute``, ``locale``, ``timezone``), whether they can be reached (``has``,
``subscribed``) and what they did (``engaged``). :func:`validate` names the first broken rule by its
path (``rules.and[2].attribute``) and the rule it broke; :func:`compile_rules` turns a valid rule
into one ``Q`` over ``preferences.Recipient``, so membership is decided in SQL, never per row in
Python. Who is a member, given a rule, is :mod:`campaigns.membership`'s to say.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import DateTimeField, Exists, OuterRef, Q, Value
from django.db.models.functions import Coalesce, Lower
from django.db.models.lookups import Exact, StartsWith

from core.vocabulary import CHANNELS, TEMPLATE_LOCALE_PATTERN
from notifications.records import engaged_since
from preferences.api.serializers import ATTRIBUTE_NAME
from preferences.models import Device
from preferences.suppression import opted_out_q
from preferences.validation import validate_iana_zone

#: Bounds on one rule (docs/SEGMENTS.md, "Validation and limits"): nesting, rules in all, values in all
#: lists together (each is a clause of the SQL), characters in a value.
MAX_DEPTH = 8
MAX_NODES = 100
MAX_VALUES = 1000
MAX_VALUE_LENGTH = 1000

ATTRIBUTE_OPS = ("eq", "in", "exists")
HAS = ("email", "phone", "push_device")
ENGAGEMENTS = ("opened", "sent")
LEAVES = ("attribute", "locale", "timezone", "has", "subscribed", "engaged")
COMBINATORS = ("and", "or", "not")


class RuleError(Exception):
    """A rule broke the language: ``path`` names it (``rules.and[2].attribute``), ``code`` the rule
    it broke (``unknown_operator``, ``wrong_type``, ``too_deep``…)."""

    def __init__(self, path: str, code: str, message: str) -> None:
        super().__init__(f"{path}: {message}")
        self.path, self.code, self.message = path, code, message


@dataclass(frozen=True)
class Context:
    """What a rule is evaluated against: the campaign's ``channel``, ``category`` and notification
    type (``subscribed``), and ``now`` (``engaged`` counts back ``within_days`` from it)."""

    now: datetime
    channel: str = ""
    category: str = ""
    type_key: str = ""


def max_days() -> int:
    """The longest ``within_days``: notifications older than their retention no longer exist."""
    return int(settings.NOTIFY["RETENTION_DAYS"]["notifications_notificationhistory"])


def _type_name(value) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), "a number")


class _Validator:
    def __init__(self) -> None:
        self.nodes = 0
        self.values = 0
        self.uses_context = False

    def rule(self, node, path: str, depth: int) -> None:
        if depth > MAX_DEPTH:
            raise RuleError(path, "too_deep", f"rules nest at most {MAX_DEPTH} deep")
        self.nodes += 1
        if self.nodes > MAX_NODES:
            raise RuleError(path, "too_many_rules", f"a segment's rule holds at most {MAX_NODES} rules in all")
        if not isinstance(node, dict):
            raise RuleError(path, "wrong_type", f"a rule is an object, not {_type_name(node)}")
        kinds = [k for k in node if k in COMBINATORS or k in LEAVES]
        if len(kinds) != 1:
            unknown = next((k for k in node if k not in COMBINATORS and k not in LEAVES), None)
            if not kinds and unknown is not None:
                raise RuleError(f"{path}.{unknown}", "unknown_rule",
                                f"unknown rule {unknown!r}; one of {', '.join(COMBINATORS + LEAVES)}")
            raise RuleError(path, "invalid", "a rule has exactly one of " + ", ".join(COMBINATORS + LEAVES)
                            + (f"; found {', '.join(kinds)}" if kinds else ""))
        kind = kinds[0]
        getattr(self, f"_{kind}")(node, path, depth)

    def _only(self, node: dict, path: str, allowed: tuple[str, ...]) -> None:
        for key in node:
            if key not in allowed:
                raise RuleError(f"{path}.{key}", "unknown_key",
                                f"not a key of this rule; it takes {', '.join(allowed)}")

    def _and(self, node: dict, path: str, depth: int, kind: str = "and") -> None:
        self._only(node, path, (kind,))
        items = node[kind]
        if not isinstance(items, list):
            raise RuleError(f"{path}.{kind}", "wrong_type", f"{kind} takes a list of rules, not {_type_name(items)}")
        if not items:
            raise RuleError(f"{path}.{kind}", "empty", f"{kind} takes at least one rule")
        for i, item in enumerate(items):
            self.rule(item, f"{path}.{kind}[{i}]", depth + 1)

    def _or(self, node: dict, path: str, depth: int) -> None:
        self._and(node, path, depth, "or")

    def _not(self, node: dict, path: str, depth: int) -> None:
        self._only(node, path, ("not",))
        self.rule(node["not"], f"{path}.not", depth + 1)

    def _attribute(self, node: dict, path: str, depth: int) -> None:
        self._only(node, path, ("attribute", "op", "value"))
        name = node["attribute"]
        if not isinstance(name, str) or not ATTRIBUTE_NAME.match(name):
            raise RuleError(f"{path}.attribute", "invalid_name" if isinstance(name, str) else "wrong_type",
                            f"an attribute name (`{ATTRIBUTE_NAME.pattern}`), as in PUT /v1/users/{{user_id}}")
        op = node.get("op")
        if op not in ATTRIBUTE_OPS:
            raise RuleError(f"{path}.op", "required" if op is None else "unknown_operator",
                            f"op is one of {', '.join(ATTRIBUTE_OPS)}" + ("" if op is None else f", not {op!r}"))
        if "value" not in node:
            raise RuleError(f"{path}.value", "required", f"op {op} needs a value")
        value = node["value"]
        if op == "eq":
            self._string(value, f"{path}.value", "attributes are strings: eq takes a string")
        elif op == "in":
            self._strings(value, f"{path}.value", lambda v, p: self._string(v, p, "attributes are strings"))
        elif not isinstance(value, bool):
            raise RuleError(f"{path}.value", "wrong_type", f"exists takes true or false, not {_type_name(value)}")

    def _string(self, value, path: str, what: str) -> None:
        if not isinstance(value, str):
            raise RuleError(path, "wrong_type", f"{what}, not {_type_name(value)}")
        if len(value) > MAX_VALUE_LENGTH:
            raise RuleError(path, "max_length", f"at most {MAX_VALUE_LENGTH} characters")

    def _strings(self, value, path: str, check) -> None:
        if not isinstance(value, list):
            raise RuleError(path, "wrong_type", f"a list, not {_type_name(value)}")
        if not value:
            raise RuleError(path, "empty", "a list of at least one value")
        self.values += len(value)
        if self.values > MAX_VALUES:
            raise RuleError(path, "max_length", f"at most {MAX_VALUES} values in all the rule's lists together")
        for i, item in enumerate(value):
            check(item, f"{path}[{i}]")

    def _locale(self, node: dict, path: str, depth: int) -> None:
        self._only(node, path, ("locale",))

        def tag(value, p: str) -> None:
            if not isinstance(value, str) or not TEMPLATE_LOCALE_PATTERN.match(value):
                raise RuleError(p, "invalid" if isinstance(value, str) else "wrong_type",
                                'a BCP 47 language tag ("de", "de-AT")')

        self._strings(node["locale"], f"{path}.locale", tag)

    def _timezone(self, node: dict, path: str, depth: int) -> None:
        self._only(node, path, ("timezone",))

        def zone(value, p: str) -> None:
            if not isinstance(value, str):
                raise RuleError(p, "wrong_type", f"an IANA zone name, not {_type_name(value)}")
            try:
                validate_iana_zone(value)
            except Exception as exc:  # django ValidationError: its message names the rule
                raise RuleError(p, "invalid", getattr(exc, "messages", [str(exc)])[0]) from None

        self._strings(node["timezone"], f"{path}.timezone", zone)

    def _has(self, node: dict, path: str, depth: int) -> None:
        self._only(node, path, ("has",))
        if node["has"] not in HAS:
            raise RuleError(f"{path}.has", "unknown_operator" if isinstance(node["has"], str) else "wrong_type",
                            f"has is one of {', '.join(HAS)}")

    def _subscribed(self, node: dict, path: str, depth: int) -> None:
        self._only(node, path, ("subscribed",))
        if node["subscribed"] is not True:
            raise RuleError(f"{path}.subscribed", "wrong_type",
                            'subscribed takes true (for "opted out", wrap it in not)')
        self.uses_context = True

    def _engaged(self, node: dict, path: str, depth: int) -> None:
        self._only(node, path, ("engaged", "within_days"))
        if node["engaged"] not in ENGAGEMENTS:
            raise RuleError(f"{path}.engaged", "unknown_operator" if isinstance(node["engaged"], str)
                            else "wrong_type", f"engaged is one of {', '.join(ENGAGEMENTS)}")
        days = node.get("within_days")
        if days is None:
            raise RuleError(f"{path}.within_days", "required", "engaged needs within_days")
        if isinstance(days, bool) or not isinstance(days, int):
            raise RuleError(f"{path}.within_days", "wrong_type", f"a whole number of days, not {_type_name(days)}")
        if not 1 <= days <= max_days():
            raise RuleError(f"{path}.within_days", "out_of_range",
                            f"1 to {max_days()} days (notifications are kept {max_days()} days)")


def validate(rules, path: str = "rules") -> bool:
    """Raises :class:`RuleError` naming the first broken rule. Returns whether the rule needs a
    campaign's channel and category (it uses ``subscribed``)."""
    checker = _Validator()
    checker.rule(rules, path, 1)
    return checker.uses_context


def compile_rules(rules, context: Context) -> Q:
    """A valid rule (:func:`validate`) as a ``Q`` over ``preferences.Recipient``."""
    if "and" in rules:
        q = Q()
        for item in rules["and"]:
            q &= compile_rules(item, context)
        return q
    if "or" in rules:
        q = compile_rules(rules["or"][0], context)
        for item in rules["or"][1:]:
            q |= compile_rules(item, context)
        return q
    if "not" in rules:
        return ~compile_rules(rules["not"], context)
    if "attribute" in rules:
        return _attribute_q(rules["attribute"], rules["op"], rules["value"])
    if "locale" in rules:
        # A tag matches itself and its more specific tags: "de" matches "de-AT"; in any case (BCP 47
        # tags are case-insensitive: "DE" matches "de-DE"). recipient_locale_idx is on lower(locale):
        # = and LIKE 'de-%' are both index range scans.
        q = Q()
        for tag in rules["locale"]:
            q |= Q(Exact(Lower("locale"), tag.lower())) | Q(StartsWith(Lower("locale"), f"{tag.lower()}-"))
        return q
    if "timezone" in rules:
        return Q(timezone__in=rules["timezone"])
    if "has" in rules:
        return _has_q(rules["has"])
    if "subscribed" in rules:
        return ~opted_out_q(context.channel, context.category, context.type_key)
    if "engaged" in rules:
        since = context.now - timedelta(days=rules["within_days"])
        # A user re-created after an erasure: what the erased one did is not theirs (what was created
        # before the erasure counts for no one). The constant bound stays for partition pruning.
        after_erasure = Coalesce(OuterRef("erased_at"), Value(since, output_field=DateTimeField()))
        return Q(Exists(engaged_since(rules["engaged"], since).filter(recipient_id=OuterRef("user_id"),
                                                                      created_at__gte=after_erasure)))
    raise ValueError(f"not a valid rule: {rules!r}")  # validate() first


def _attribute_q(name: str, op: str, value) -> Q:
    # Containment (``@>``) and key existence (``?``) are what recipient_attributes_gin serves.
    if op == "eq":
        return Q(attributes__contains={name: value})
    if op == "in":
        q = Q()
        for item in value:
            q |= Q(attributes__contains={name: item})
        return q
    return Q(attributes__has_key=name) if value else ~Q(attributes__has_key=name)


def _has_q(what: str) -> Q:
    """A usable contact: present and not marked invalid by a provider (the suppression rule's
    ``no_email`` / ``email_invalid``; an SMS STOP is per sender, so it is left to the send)."""
    if what == "email":
        return ~Q(email="") & Q(email_invalid_reason="")
    if what == "phone":
        return ~Q(phone="") & Q(phone_invalid_reason="")
    return Q(Exists(Device.objects.filter(recipient_id=OuterRef("user_id"), active=True)))


def channel_problem(channel: str) -> str:
    """Why ``channel`` cannot be a rule's context channel (``""``: it can)."""
    return "" if channel in CHANNELS else f"one of {', '.join(CHANNELS)}"
