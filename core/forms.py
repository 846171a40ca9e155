"""Form fields every app's admin shares.

:class:`BlankNullJSONField`: Django's ``forms.JSONField`` shows a ``null`` value as the text
``null``; a nullable JSON field (a campaign's data, a type's digest) then opened pre-filled with
``null`` and showed it again after it was cleared. This one shows nothing for ``null``; an empty
box still saves ``None`` (the fields' default), as before.
"""

from __future__ import annotations

from django import forms


class BlankNullJSONField(forms.JSONField):
    """A JSON form field whose ``None`` (SQL NULL) is shown as an empty box, not ``null``."""

    def prepare_value(self, value):
        if value is None:
            return ""
        return super().prepare_value(value)
