"""The forms of the notification-type admin (:mod:`notifications.admin.types`): the type, its
templates (an inline formset), and the preview form.

One rule set: saving validates the type and every template row together with the serializer of
``PUT /v1/notification-types/{key}`` and :func:`notifications.events.validation.type_problems`, so
the admin refuses and saves exactly what the API would, in its words, each problem on its field,
row and part, or above the rows. Django's own checks that would say the same in other words are
left to those rules. ``channels`` (and ``required_data``) are a typed comma list, not checkboxes:
the channels' order is the fallback order.
"""

from __future__ import annotations

import json

from django import forms
from django.contrib.postgres.forms import SimpleArrayField
from django.forms.models import BaseInlineFormSet
from django.utils.html import escape

from core.api.parameters import TYPE_KEY
from core.forms import BlankNullJSONField
from core.vocabulary import CHANNELS
from notifications.api.typed import DATA_MAX_BYTES, data_errors
from notifications.api.types import NotificationTypeSerializer
from notifications.events.models import NotificationType, TypeTemplate
from notifications.events.services import TEMPLATE_FIELDS, TYPE_FIELDS
from preferences.models import Recipient


class CommaListField(SimpleArrayField):
    """A list typed as ``push, email``: items trimmed, empty ones (a trailing comma) dropped, shown
    back joined by ``", "``. Item rules are the caller's (here: :func:`type_problems`)."""

    def __init__(self, **kwargs) -> None:
        super().__init__(forms.CharField(required=False), delimiter=",", required=False, **kwargs)

    def to_python(self, value):
        return [item for item in super().to_python(value) if item]

    def clean(self, value):
        return [item for item in super().clean(value) if item]

    def prepare_value(self, value):
        return ", ".join(str(v) for v in value) if isinstance(value, list) else value


class TypeForm(forms.ModelForm):
    """A type's own fields. Its rules are checked with its templates, by :class:`TemplateFormSet`
    (which reaches this form through the instance they share and puts the type's problems here);
    the key by the API's rule for the key in its URL."""

    key = forms.CharField(strip=False, widget=forms.TextInput(attrs={"maxlength": 64}),
                          help_text='e.g. "order_shipped"; it cannot change later.')
    channels = CommaListField(help_text="In order, comma-separated: " + ", ".join(CHANNELS) + ". The order is the "
                                        "fallback order (routing fallback).",
                              widget=forms.TextInput(attrs={"size": 30}))
    required_data = CommaListField(label="Required data", widget=forms.TextInput(attrs={"size": 60}),
                                   help_text="data keys every event must carry (else the API answers 422 naming "
                                             "it), comma-separated, e.g. tracking_url, order_id.")

    class Meta:
        model = NotificationType
        fields = ["key", *TYPE_FIELDS]
        field_classes = {"digest": BlankNullJSONField}  # empty, not "null", when there is none
        widgets = {"description": forms.Textarea(attrs={"rows": 2})}
        labels = {"ttl_seconds": "Default TTL (seconds)", "sms_from": "SMS sender", "email_from": "Email From",
                  "email_reply_to": "Email Reply-To"}
        # The admin renders help texts as HTML: the model's "<addr>" would vanish as a tag.
        help_texts = {"email_from": escape('Email From ("Shop <shop@example.com>"); empty: the provider\'s.')}

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.instance._type_form = self  # the templates formset validates both (see TemplateFormSet.clean)

    def clean_key(self) -> str:
        """The rule of the key in ``/v1/notification-types/{key}``, in its words."""
        key = self.cleaned_data["key"]
        problem = TYPE_KEY.problem(key)
        if problem:
            raise forms.ValidationError(f"{problem}; {TYPE_KEY.description}")
        return key


class TemplateForm(forms.ModelForm):
    """One template row (a channel and locale). ``body`` is checked by :func:`type_problems` (its
    message names the variant), so the form does not require it itself; ``body`` and ``html`` are
    not trimmed (the API keeps them as given)."""

    class Meta:
        model = TypeTemplate
        fields = list(TEMPLATE_FIELDS)
        widgets = {"title": forms.TextInput(attrs={"size": 80}), "body": forms.Textarea(attrs={"rows": 3}),
                   "html": forms.Textarea(attrs={"rows": 3}), "data": forms.Textarea(attrs={"rows": 2})}
        help_texts = {"data": 'Push only: a JSON object of templates, e.g. {"url": "{{ data.tracking_url }}"}.'}

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.fields["body"].required = False
        for name in ("body", "html"):  # kept as typed, as the API keeps them (a trailing newline is content)
            field = self.fields[name]
            assert isinstance(field, forms.CharField), field  # the model's TextFields
            field.strip = False

    def validate_unique(self):
        """Two rows for one channel and locale: :func:`type_problems` says so (case-insensitively,
        naming the variant); the rows are replaced as a whole on save (no swap can collide)."""


class TemplateFormSet(BaseInlineFormSet):
    """The type's template rows, validated together with the type's form by the API's serializer
    (module docstring). After a valid ``clean``, :attr:`validated` holds what to save: the type's
    fields and its templates as the API would save them from the same body."""

    validated: tuple[dict, list[dict]]

    def validate_unique(self):
        """Left to :func:`type_problems` (see :meth:`TemplateForm.validate_unique`)."""

    def clean(self):
        super().clean()
        rows = [f for f in self.forms if not self._should_delete_form(f) and (f.instance.pk or f.has_changed())]
        templates = []
        for f in rows:
            given = getattr(f, "cleaned_data", {})
            templates.append({name: given.get(name) if given.get(name) is not None else ({} if name == "data" else "")
                              for name in TEMPLATE_FIELDS})
        type_form = getattr(self.instance, "_type_form", None)
        fields = {name: getattr(self.instance, name) for name in TYPE_FIELDS}
        serializer = NotificationTypeSerializer(data={**fields, "templates": templates},
                                                context={"client": self.instance.client})
        if serializer.is_valid():
            validated = dict(serializer.validated_data)
            self.validated = (validated, validated.pop("templates"))
            return
        # A field Django already refused (a choice not offered, a value too long) keeps its own error.
        refused = {id(f): set(f.errors) for f in [*rows, *([type_form] if type_form is not None else [])]}
        above, placed_on_rows = [], False
        for path, message in error_paths(serializer.errors):
            parts = path.split(".") if path else ["templates"]
            if parts[0] == "templates" and len(parts) >= 2:
                form = rows[int(parts[1])]
                part = parts[2] if len(parts) > 2 and parts[2] in form.fields else None
                if part not in refused[id(form)]:
                    form.add_error(part, message)
                placed_on_rows = True
            elif parts[0] == "templates":
                above.append(message)
            elif type_form is not None:
                _place_on_type_form(type_form, parts, message, fields, refused[id(type_form)])
        if not above and not placed_on_rows:
            # The type's own fields have problems: the page shows them there; this keeps the save off.
            above = ["Not saved: correct the type's fields marked above."]
        raise forms.ValidationError(above)


def error_paths(detail, path: tuple[str, ...] = ()):
    """``(path, message)`` for each message of a DRF error structure (``serializer.errors``), paths as
    the API's answer names fields (``channels.1``, ``templates.2.body``; ``""``: the whole body)."""
    if isinstance(detail, dict):
        for key, value in detail.items():
            yield from error_paths(value, path if key == "non_field_errors" else (*path, str(key)))
    elif isinstance(detail, list) and all(isinstance(item, str) for item in detail):
        for item in detail:
            yield ".".join(path), str(item)
    elif isinstance(detail, list):
        for index, item in enumerate(detail):
            yield from error_paths(item, (*path, str(index)))
    else:
        yield ".".join(path), str(detail)


def _place_on_type_form(form: forms.Form, parts: list[str], message: str, fields: dict, refused: set) -> None:
    """Put a type-level problem (path ``channels``, ``channels.1``, ``required_data.0``,
    ``digest.key``) on its field of ``form`` (unless Django refused that field already: ``refused``);
    an item's problem names the item, an object's the key."""
    name = parts[0]
    if len(parts) > 1 and isinstance(fields.get(name), list) and parts[1].isdigit():
        index = int(parts[1])
        message = f"{fields[name][index]!r} (item {index + 1}): {message}"
    elif len(parts) > 1 and name in form.fields:  # a key of an object field (digest.window_seconds)
        message = f"{'.'.join(parts[1:])}: {message}"
    field = name if name in form.fields else None
    if field is None:
        message = f"{'.'.join(parts)}: {message}"
    if field not in refused:
        form.add_error(field, message)


class PreviewForm(forms.Form):
    """The type page's preview: a recipient by user id and sample event data (a JSON object, the
    API's rules for an event's data: at most 16 KB, the type's required keys present)."""

    preview_user = forms.CharField(label="User id", max_length=255, strip=False)
    preview_data = forms.CharField(label="Sample data (JSON object)", required=False, initial="{}",
                                   widget=forms.Textarea(attrs={"rows": 4, "cols": 80}))

    def __init__(self, *args, kind: NotificationType, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.kind = kind

    def clean_preview_user(self) -> Recipient:
        user_id = self.cleaned_data["preview_user"]
        recipient = Recipient.objects.filter(pk=user_id).first()
        if recipient is None:
            raise forms.ValidationError(f"No recipient with user id {user_id!r}.")
        return recipient

    def clean_preview_data(self) -> dict:
        text = self.cleaned_data["preview_data"].strip() or "{}"
        if len(text.encode()) > 4 * DATA_MAX_BYTES:
            raise forms.ValidationError(f"Sample data: at most {DATA_MAX_BYTES} bytes as JSON.")
        try:
            data = json.loads(text, parse_constant=_no_constant)
        except (ValueError, RecursionError) as exc:
            raise forms.ValidationError(f"Sample data is not valid JSON: {exc}") from None
        if not isinstance(data, dict):
            raise forms.ValidationError(f"Sample data must be a JSON object ({{...}}), not {type(data).__name__}.")
        errors = data_errors(self.kind, data)
        if errors:
            raise forms.ValidationError([f"{path}: {message}" for path, message in errors.items()])
        return data


def _no_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")
