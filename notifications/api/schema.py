"""The OpenAPI schema (drf-spectacular) names the scope of every operation, from the view's own
declaration (``required_scopes``, see :mod:`notifications.api.auth`), so the document and the check
cannot disagree:

* ``x-required-scope: "recipients:write"`` on the operation, and a "Scope" line in its description
  (plus the view's ``scope_notes`` for that method, e.g. what ``priority: high`` needs too);
* a ``403`` response (the Error schema) whose description names the scope, followed by the
  operation's own 403 rules (ownership) when it documents them.
"""

from __future__ import annotations

from drf_spectacular.openapi import AutoSchema

from core.api.errors import ERROR_DESCRIPTIONS, ErrorSerializer
from notifications.api.auth import required_scope

_GENERIC_403 = ERROR_DESCRIPTIONS[403]


class ScopedAutoSchema(AutoSchema):
    def get_operation(self, path, path_regex, path_prefix, method, registry):
        operation = super().get_operation(path, path_regex, path_prefix, method, registry)
        if operation is None:
            return None
        scope = required_scope(self.view, method)
        if scope is None:  # not an API view of ours (none is served undeclared: HasRequiredScope)
            return operation
        note = (getattr(self.view, "scope_notes", None) or {}).get(method.lower(), "")
        line = f"**Scope:** `{scope}`." + (f" {note}" if note else "")
        operation["description"] = f"{operation['description']}\n\n{line}" if operation.get("description") else line
        operation["x-required-scope"] = scope
        refused = f"The API key lacks the scope `{scope}` (`missing_scope`, naming it)."
        if note:
            refused += f" {note}"
        responses = operation["responses"]
        if "403" in responses:
            own = responses["403"].get("description", "")
            responses["403"]["description"] = refused if own in ("", _GENERIC_403) else f"{refused} {own}"
        else:
            ref = self.resolve_serializer(ErrorSerializer, "response").ref
            responses["403"] = {"description": refused, "content": {"application/json": {"schema": ref}}}
        operation["responses"] = dict(sorted(responses.items()))
        return operation
