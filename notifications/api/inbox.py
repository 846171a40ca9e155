"""``/v1/users/{user_id}/inbox``: the in-app inbox for the product's backend (docs/APP.md): list the
items, read the badge counts, mark items seen / read / unread / archived.

Scope ``inbox`` on all three (:attr:`core.api.scopes.Scope.INBOX`): the inbox is the user's, across
every sending service, so this scope reads other clients' in-app items. It is the deliberate
exception to "no cross-client read" (docs/SECURITY.md); every mark is in the API audit log.
"""

from __future__ import annotations

import uuid

from drf_spectacular.utils import OpenApiExample, OpenApiParameter, extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from core.api import audit_notes, parameters
from core.api.errors import BODY, error_responses, field_error, response_headers
from core.api.fields import AwareDateTimeField, RejectUnknownFields
from core.api.pagination import read_query
from core.api.scopes import Scope
from notifications import app_receipts
from notifications.inbox import listing, marks
from notifications.inbox.models import InboxItem
from preferences.api.views import _USER_ID, recipient_or_404

_404_USER = "Unknown user_id (no recipient with this id)."
#: The fields a mark of each status can change (what the audit log names).
_MARKED_FIELDS = {"seen": ["seen_at"], "read": ["read_at", "seen_at"], "unread": ["read_at"],
                  "archived": ["archived_at"]}


class InboxItemSerializer(serializers.ModelSerializer):
    id = serializers.UUIDField(source="pk", help_text="The notification's id (as in `GET /v1/notifications/{id}`).")
    type = serializers.CharField(source="type_key", help_text='Its notification type\'s key; "" for single sends '
                                                              'and campaigns.')
    data = serializers.JSONField(allow_null=True, help_text="The notification's data (rendered), or null.")

    class Meta:
        model = InboxItem
        fields = ["id", "type", "category", "title", "body", "data", "created_at", "seen_at", "read_at",
                  "archived_at", "expires_at"]
        extra_kwargs = {
            "created_at": {"help_text": "When it reached the inbox (UTC); the list's order, newest first."},
            "seen_at": {"help_text": "When the user first saw it (UTC), or null."},
            "read_at": {"help_text": "When the user read it (UTC), or null (never read, or marked unread)."},
            "archived_at": {"help_text": "When the user archived it (UTC), or null."},
            "expires_at": {"help_text": "Its TTL (UTC), or null; past it the item is no longer listed."},
        }


class InboxCountsSerializer(serializers.Serializer):
    unseen = serializers.IntegerField(help_text="Items not archived and not seen: the badge.")
    unread = serializers.IntegerField(help_text="Items not archived and not read.")
    total = serializers.IntegerField(help_text="Items not archived.")


class InboxMarkSerializer(RejectUnknownFields, serializers.Serializer):
    """``POST /v1/users/{id}/inbox/mark``: exactly one of ``ids`` and ``all_before``, and a ``status``."""

    #: The one-of rule in the OpenAPI schema too (core.api.fields.RejectUnknownFieldsSchema).
    schema_rules = {"allOf": [{"oneOf": [{"required": ["ids"]}, {"required": ["all_before"]}]}]}

    ids = serializers.ListField(child=serializers.UUIDField(), required=False, min_length=1,
                                max_length=marks.MAX_IDS,
                                help_text=f"The items (notification ids) to mark: 1–{marks.MAX_IDS}. Every id must "
                                          "be one of this user's items, or nothing is marked (404 naming them).")
    all_before = AwareDateTimeField(required=False, help_text="Instead of `ids`: every item created at or before "
                                                              "this instant (with a UTC offset or Z).")
    status = serializers.ChoiceField(choices=marks.STATUSES, help_text=(
        "`seen`: sets seen_at where unset; `read`: sets read_at (and seen_at) where unset; `unread`: clears "
        "read_at (seen stays); `archived`: sets archived_at where unset (the item leaves the default list and "
        "all three counts). Timestamps never move later."))

    def validate(self, attrs):
        if ("ids" in attrs) == ("all_before" in attrs):
            raise serializers.ValidationError({"ids": serializers.ErrorDetail(
                "give exactly one of ids and all_before", code="one_of")})
        return attrs


def _read_query(params) -> dict:
    """The listing's query parameters (the rules of every list, core/api/pagination.py, with the
    inbox's page sizes). Raises QueryError (422) naming a bad one."""
    query = read_query(params, {"status": tuple(listing.STATUSES), "category": parameters.CATEGORY},
                       default_limit=listing.DEFAULT_LIMIT, max_limit=listing.MAX_LIMIT)
    return {"limit": query["limit"], "status": query.get("status", listing.DEFAULT_STATUS),
            "category": query.get("category"), "cursor": query["cursor"]}


class InboxView(APIView):
    required_scopes = {"get": Scope.INBOX}

    @extend_schema(
        operation_id="v1_users_inbox_list",
        summary="A user's inbox, newest first (keyset pagination)",
        description="The user's in-app items from every service, newest first (ties by id), never those past "
                    "`expires_at`. `status`: `all` (default: not archived), `unread`, `unseen` (both among the "
                    "not archived) or `archived`. Pass `next_cursor` as `cursor` for the next page; a page "
                    "costs the same however deep (an index range read, no OFFSET).",
        parameters=[
            _USER_ID,
            OpenApiParameter("status", {"type": "string", "enum": list(listing.STATUSES),
                                        "default": listing.DEFAULT_STATUS}, OpenApiParameter.QUERY,
                             description="Which items: all (not archived), unread, unseen, archived."),
            OpenApiParameter("category", dict(parameters.CATEGORY.schema), OpenApiParameter.QUERY,
                             description="Only this category."),
            OpenApiParameter("cursor", {"type": "string", "maxLength": 1000}, OpenApiParameter.QUERY,
                             description="`next_cursor` of the previous page (opaque, signed); omit for the "
                                         "first page. Anything else is 400 naming `cursor`."),
            OpenApiParameter("limit", {"type": "integer", "minimum": 1, "maximum": listing.MAX_LIMIT,
                                       "default": listing.DEFAULT_LIMIT}, OpenApiParameter.QUERY,
                             description=f"Items per page (1–{listing.MAX_LIMIT})."),
            *response_headers()],
        responses={200: inline_serializer("InboxPage", fields={
                       "items": InboxItemSerializer(many=True),
                       "next_cursor": serializers.CharField(allow_null=True, help_text="Pass as `cursor` for the "
                                                            "next page; null on the last page.")}),
                   **error_responses(400, 404, 422, _400="`cursor` is not a `next_cursor` of this inbox "
                                                         "(`invalid_cursor`).",
                                     _404=_404_USER,
                                     _422="A bad query parameter (`limit` over 100, an unknown `status`…) or "
                                          "path id; `field` names it.")})
    def get(self, request, user_id: str):
        recipient = recipient_or_404(user_id)
        query = _read_query(request.query_params)
        try:
            items, next_cursor = listing.page(recipient.pk, status=query["status"], category=query["category"],
                                              cursor=query["cursor"], limit=query["limit"],
                                              erased=recipient.erasure_mark())
        except listing.BadCursor:
            return field_error("cursor", "invalid_cursor", "not a next_cursor of this inbox; omit it for the "
                               "first page", 400, error_code="invalid_cursor")
        return Response({"items": InboxItemSerializer(items, many=True).data, "next_cursor": next_cursor})


class InboxCountsView(APIView):
    required_scopes = {"get": Scope.INBOX}

    @extend_schema(summary="A user's inbox counts (the badge)",
                   description="`unseen`, `unread` and `total` of the items not archived: one primary-key read, "
                               "cheap enough for every app open. Zeros for a user with no inbox yet.",
                   parameters=[_USER_ID, *response_headers()],
                   responses={200: InboxCountsSerializer, **error_responses(404, 422, _404=_404_USER)})
    def get(self, request, user_id: str):
        recipient = recipient_or_404(user_id)
        return Response(listing.counts(recipient.pk))


class InboxMarkView(APIView):
    required_scopes = {"post": Scope.INBOX}
    audit_object = "inbox"

    @extend_schema(
        summary="Mark inbox items seen, read, unread or archived",
        description="Either `ids` (1–1,000 of this user's items) or `all_before` (every item created at or "
                    "before it; at most 10,000 per call, newest first: repeat while `more`), and `status`. "
                    "Idempotent: a repeat changes nothing and answers `changed: 0`. "
                    "The counts move in the same transaction, by what actually changed. An id that is not "
                    "this user's item: 404 listing each such id (`ids.<index>`), and nothing changes.",
        request=InboxMarkSerializer,
        parameters=[_USER_ID, *response_headers()],
        examples=[OpenApiExample("Read two", request_only=True, value={
                      "ids": ["0b5b8f6e-8a84-4c3b-9a3e-6a1f2b7c9d10", "6c1f0e0a-3d2b-4c5e-8f9a-0b1c2d3e4f50"],
                      "status": "read"}),
                  OpenApiExample("All seen", request_only=True, value={
                      "all_before": "2026-12-02T17:00:00Z", "status": "seen"})],
        responses={200: inline_serializer("InboxMarked", fields={
                       "changed": serializers.IntegerField(help_text="Items whose state changed now."),
                       "more": serializers.BooleanField(
                           help_text=f"`all_before` changes at most {marks.MAX_PER_CALL:,} items per call, the "
                                     "newest first: true when it changed that many, so call again (until false).")}),
                   **error_responses(*BODY, 404, 422,
                                     _404="Unknown user_id, or `ids` that are not this user's items (each named "
                                          "`ids.<index>`); nothing changed.")})
    def post(self, request, user_id: str):
        recipient = recipient_or_404(user_id)
        ser = InboxMarkSerializer(data=request.data)
        ser.is_valid(raise_exception=True)
        data = ser.validated_data
        try:
            changed_ids = marks.mark(recipient.pk, data["status"], ids=data.get("ids"),
                                     all_before=data.get("all_before"))
        except marks.UnknownItems as exc:
            return _unknown_ids(data["ids"], exc.ids)
        changed = len(changed_ids)
        if data.get("ids") is not None:
            app_receipts.mirror_inbox_mark(changed_ids, data["status"])
        if changed:
            audit_notes.note_fields(request, _MARKED_FIELDS[data["status"]])
        more = data.get("all_before") is not None and changed >= marks.MAX_PER_CALL
        return Response({"changed": changed, "more": more})


def _unknown_ids(given: list[uuid.UUID], unknown: list[uuid.UUID]) -> Response:
    missing = set(unknown)
    fields = [{"field": f"ids.{i}", "code": "not_found", "message": f"no inbox item {nid} of this user"}
              for i, nid in enumerate(given) if nid in missing]
    response = field_error("ids", "not_found", "", 404, error_code="not_found")
    shown = ", ".join(str(n) for n in unknown[:10]) + (f" and {len(unknown) - 10} more" if len(unknown) > 10 else "")
    response.data["error"]["message"] = f"ids: not this user's inbox items: {shown}"
    response.data["error"]["fields"] = fields
    return response
