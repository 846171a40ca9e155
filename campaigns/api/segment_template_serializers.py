"""Request/response shapes for segments' members and templates (``/v1/segments/{id}/members``,
``/v1/templates``): the rules their bodies pass, and the helpers that name a template's broken part."""

from __future__ import annotations

import json

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from campaigns.selectors import content_check
from core.api.fields import LabelField, RejectUnknownFields
from core.identifiers import MAX_USER_ID_LENGTH, USER_ID_PATTERN, problem_code, user_id_problem
from core.vocabulary import TEMPLATE_LOCALE_PATTERN
from notifications.api.serializers import (
    body_field,
    checks_busy,
    html_field,
)
from notifications.rendering import RenderError
from notifications.rendering.checking import MAX_VARIANTS, CheckBudgetSpent, ChecksBusy, check_budget

MAX_MEMBER_IDS = 10_000
#: The one wording of the bound, whether one list or the two together pass it.
MEMBER_IDS_LIMIT = f"at most {MAX_MEMBER_IDS} ids per call (add + remove)"



def _valid_user_id(value: str) -> None:
    """The ``/v1/users/{user_id}`` rule (:func:`core.identifiers.user_id_problem`); its code
    (``control_character``, ``confusable``, else ``invalid``)."""
    problem = user_id_problem(value)
    if problem:
        raise serializers.ValidationError(f"a user id {problem}, as in /v1/users/{{user_id}}",
                                          code=problem_code(problem))


@extend_schema_field({"type": "string", "minLength": 1, "maxLength": MAX_USER_ID_LENGTH,
                       "pattern": USER_ID_PATTERN})
class MemberIdField(serializers.CharField):
    """A user id to add to a segment: the ``/v1/users/{user_id}`` rule, documented as its pattern.
    Taken as given, never trimmed (DRF's default would store ``"\u2028sep"`` as ``sep``, which the
    path ``/v1/users/%E2%80%A8sep`` does not reach)."""

    def __init__(self, **kwargs) -> None:
        super().__init__(trim_whitespace=False, **kwargs)


class MembersSerializer(RejectUnknownFields, serializers.Serializer):
    """``{"add": [user id, …], "remove": [user id, …]}``. Ids to add follow the ``/v1/users/{user_id}``
    rule (1–255 characters, no control character): a member must be reachable there. Ids to remove
    need not (a member created before the rule existed can still be removed). An id in both lists is
    refused (422 ``add_and_remove`` on both fields, naming the ids): the outcome would be ambiguous."""

    #: At least one id to add or remove, in the OpenAPI schema too (core.api.fields.RejectUnknownFieldsSchema).
    schema_rules = {"allOf": [{"anyOf": [{"required": ["add"], "properties": {"add": {"minItems": 1}}},
                                         {"required": ["remove"], "properties": {"remove": {"minItems": 1}}}]}]}

    add = serializers.ListField(child=MemberIdField(max_length=MAX_USER_ID_LENGTH, validators=[_valid_user_id]),
                                required=False, default=list, max_length=MAX_MEMBER_IDS,
                                error_messages={"max_length": MEMBER_IDS_LIMIT},
                                help_text="User ids to add (unknown ones are created as bare recipients); 1–255 "
                                          "characters without control characters, as in /v1/users/{user_id}.")
    remove = serializers.ListField(child=serializers.CharField(max_length=MAX_USER_ID_LENGTH, trim_whitespace=False),
                                   required=False, default=list, max_length=MAX_MEMBER_IDS,
                                   error_messages={"max_length": MEMBER_IDS_LIMIT},
                                   help_text="User ids to remove; an id may not be in add too (422 add_and_remove).")

    def validate(self, attrs):
        if len(attrs["add"]) + len(attrs["remove"]) > MAX_MEMBER_IDS:
            raise serializers.ValidationError({"add": serializers.ErrorDetail(MEMBER_IDS_LIMIT, code="max_length")})
        if not attrs["add"] and not attrs["remove"]:
            raise serializers.ValidationError({"add": serializers.ErrorDetail(
                "give at least one id to add or remove", code="required")})
        both = both_added_and_removed(attrs["add"], attrs["remove"])
        if both:
            message = f"{len(both)} id(s) both to add and to remove: {shown_ids(both)}; give each id once"
            raise serializers.ValidationError({
                "add": serializers.ErrorDetail(message, code="add_and_remove"),
                "remove": serializers.ErrorDetail(message, code="add_and_remove")})
        return attrs


#: How many ids a message lists (the count names them all).
SHOWN_IDS = 10


def both_added_and_removed(add: list[str], remove: list[str]) -> list[str]:
    """The ids in both ``add`` and ``remove`` (exact strings, as stored), in the order ``add`` gives them."""
    removed = set(remove)
    return list(dict.fromkeys(user_id for user_id in add if user_id in removed))


def shown_ids(ids: list[str]) -> str:
    """``ids`` as JSON strings, at most :data:`SHOWN_IDS` of them, then ``… and N more``."""
    shown = ", ".join(json.dumps(user_id, ensure_ascii=False) for user_id in ids[:SHOWN_IDS])
    return shown + (f" … and {len(ids) - SHOWN_IDS} more" if len(ids) > SHOWN_IDS else "")


class MembersResultSerializer(serializers.Serializer):
    added = serializers.IntegerField()
    removed = serializers.IntegerField()
    created_recipients = serializers.IntegerField()
    member_count = serializers.IntegerField()


def render_error_detail(exc: RenderError) -> serializers.ErrorDetail:
    """A 422 detail for a template part, with the error's code: ``render_bound`` (the message names
    the bound and its setting), ``undefined_variable`` (``{{ data.code }}``: a campaign has no
    ``data``) or ``template_syntax``."""
    return serializers.ErrorDetail(str(exc), code=exc.code)


def content_errors(parts: dict[str, str], prefix: str = "") -> dict[str, serializers.ErrorDetail]:
    """``{prefix + part: detail}`` for the parts of campaign content (a template variant's, inline)
    that the save rule refuses (:func:`campaigns.selectors.content_check`). Raises CheckBudgetSpent."""
    return {f"{prefix}{part}": render_error_detail(exc) for part, exc in content_check(parts).items()}


def budget_error(field: str, exc: CheckBudgetSpent) -> Exception:
    """The API's answer to a save whose checks could not finish: 503 when no check slot freed
    (:func:`notifications.api.serializers.checks_busy`), else 422 ``render_budget`` on ``field``."""
    if isinstance(exc, ChecksBusy):
        return checks_busy(str(exc))
    return serializers.ValidationError({field: serializers.ErrorDetail(str(exc), code=exc.code)})


class VariantSerializer(RejectUnknownFields, serializers.Serializer):
    """One locale of a template; its parts are checked as templates by :class:`TemplateSerializer`
    (all variants within one check budget)."""

    locale = serializers.RegexField(TEMPLATE_LOCALE_PATTERN.pattern, max_length=35)
    title = serializers.CharField(required=False, allow_blank=True, default="", max_length=998)
    body = body_field()
    html = html_field(default="")


class TemplateSerializer(RejectUnknownFields, serializers.Serializer):
    template_id = serializers.CharField(read_only=True)
    name = LabelField()
    default_locale = serializers.CharField(max_length=35, default="en")
    variants = VariantSerializer(many=True, allow_empty=False,
                                 help_text=f"One per locale, at most {MAX_VARIANTS} (docs/TYPES.md, \"Limits\").")

    #: In the OpenAPI schema too (notifications.api.serializers.RejectUnknownFieldsSchema).
    schema_rules = {"allOf": [{"properties": {"variants": {"minItems": 1, "maxItems": MAX_VARIANTS}}}]}

    def validate(self, attrs):
        variants = attrs["variants"]
        if len(variants) > MAX_VARIANTS:
            raise serializers.ValidationError({"variants": serializers.ErrorDetail(
                f"{len(variants)} variants; at most {MAX_VARIANTS}, one per locale (docs/TYPES.md)",
                code="max_length")})
        locales = [v["locale"] for v in variants]
        if len(set(locales)) != len(locales):
            raise serializers.ValidationError({"variants": serializers.ErrorDetail(
                "each locale at most once", code="duplicate_locale")})
        if attrs["default_locale"] not in locales:
            raise serializers.ValidationError({"default_locale": serializers.ErrorDetail(
                "must be the locale of one of the variants", code="no_such_variant")})
        errors: dict[str, serializers.ErrorDetail] = {}
        try:
            with check_budget():  # one budget for every variant of this request
                for index, variant in enumerate(variants):
                    parts = {name: variant.get(name, "") or "" for name in ("title", "body", "html")}
                    errors.update(content_errors(parts, prefix=f"variants.{index}."))
        except CheckBudgetSpent as exc:
            raise budget_error("variants", exc) from None
        if errors:
            raise serializers.ValidationError(errors)
        return attrs


class SegmentMemberSerializer(serializers.Serializer):
    user_id = serializers.CharField(source="recipient_id")
    added_at = serializers.DateTimeField()


class TemplateVariantOutSerializer(serializers.Serializer):
    locale = serializers.CharField()
    title = serializers.CharField(allow_blank=True)
    body = serializers.CharField()
    html = serializers.CharField(allow_blank=True)


class TemplateOutSerializer(serializers.Serializer):
    """A template as read: ``{template_id, name, default_locale, variants: [{locale, title, body, html}]}``."""

    template_id = serializers.CharField()
    name = serializers.CharField()
    default_locale = serializers.CharField()
    variants = TemplateVariantOutSerializer(many=True)
