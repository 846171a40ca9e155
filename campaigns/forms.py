"""Admin forms: CSV member uploads, template variants and the campaign definition.

The campaign form applies the same rules as ``POST /v1/campaigns`` where they are cheap to check
(content per channel, template syntax, content XOR template, one kind of schedule); see
:mod:`campaigns.api.serializers`.
"""

from __future__ import annotations

import csv
import io
import json
from datetime import UTC, timedelta

import tablib
from django import forms
from django.core.exceptions import ValidationError
from django.forms.models import BaseInlineFormSet
from django.utils import timezone

from campaigns import recurrence, send_time
from campaigns.api.serializers import MAX_SPREAD_SECONDS
from campaigns.models import Campaign, MissedPolicy, TemplateVariant
from campaigns.selectors import content_check, template_problem
from campaigns.send_time import earliest_wall_time
from campaigns.services import local_time_problem
from core import clock
from core.forms import BlankNullJSONField
from core.identifiers import problem_code, text_problem, user_id_problem
from core.vocabulary import CATEGORY_PATTERN, TEMPLATE_LOCALE_PATTERN
from notifications.acceptance.rules import bulk_send_problem
from notifications.api.serializers import (
    MAX_SCHEDULE_AHEAD,
    MAX_SCHEDULE_BEHIND,
    channel_content_errors,
)
from notifications.content_limits import MAX_TTL_SECONDS
from notifications.quiet_hours_policy import campaign_category_problem, priority_category_problem
from notifications.rendering.checking import MAX_VARIANTS, CheckBudgetSpent
from preferences.models import Channel
from providers.registry import unavailable_channel_problem

MAX_UPLOAD_IDS = 100_000
# 100,000 ids of 255 ASCII characters with line ends, plus room for a header and other columns.
MAX_UPLOAD_BYTES = 32 * 1024 * 1024
MAX_REPORTED_ROWS = 10
SNAPSHOT_NOTE = ("Membership is read as a snapshot when a campaign starts fanning out: "
                 "members added later are not included.")


# --- segments --------------------------------------------------------------------------------------

def _record_lines(text: str) -> list[int]:
    """File line of each non-blank CSV record (tablib skips blank lines), to name rows in errors."""
    reader = csv.reader(io.StringIO(text))
    return [reader.line_num for row in reader if row]


def parse_user_ids(text: str) -> list[str]:
    """User ids from CSV ``text``: a header row with a ``user_id`` column, or a single unnamed column.

    Ids are stripped of surrounding spaces (U+0020 only: any other character, a line separator or a
    C1 control included, is part of the id, and the rule refuses the controls); blank lines are
    skipped. Each id must follow the
    ``/v1/users/{user_id}`` rule (:func:`preferences.validation.user_id_problem`). Raises
    ValidationError (listing the offending rows by their line in the file) for an id that does not
    (empty, overlong, a control character),
    a row of the wrong width, more than MAX_UPLOAD_IDS ids, or no ids at all.
    """
    try:
        rows = [tuple(row) for row in tablib.Dataset().load(text, format="csv", headers=False)]
    except tablib.InvalidDimensions:
        lines, reader = _record_lines(text), csv.reader(io.StringIO(text))
        widths = [len(row) for row in reader if row]
        bad = next((i for i, w in enumerate(widths) if w > widths[0]), 0)
        raise ValidationError(f"Row {lines[bad]}: {widths[bad]} values where row {lines[0]} has {widths[0]}; "
                              "give one user id per row, or a header row with a user_id column.") from None
    except csv.Error as exc:
        raise ValidationError(f"Not a readable CSV file: {exc}.") from None
    if not rows:
        raise ValidationError("The file is empty: give one user id per row.")
    header = [cell.strip().lower() for cell in rows[0]]
    if "user_id" in header:
        column, first = header.index("user_id"), 1
    elif len(header) == 1:
        column, first = 0, 0
    else:
        raise ValidationError(f"Row 1 has {len(header)} columns and no user_id header: give a single column of "
                              "user ids, or a header row naming the user_id column.")
    if len(rows) - first > MAX_UPLOAD_IDS:
        raise ValidationError(f"{len(rows) - first:,} rows; at most {MAX_UPLOAD_IDS:,} user ids per upload.")
    ids, problems = [], []
    for index in range(first, len(rows)):
        value = rows[index][column].strip(" ")
        problem = user_id_problem(value)
        if problem:
            problems.append((index, "empty user id" if not value else f"user id {problem}"))
        else:
            ids.append(value)
    if problems:
        lines = _record_lines(text)
        errors = [f"Row {lines[i]}: {problem}." for i, problem in problems[:MAX_REPORTED_ROWS]]
        if len(problems) > MAX_REPORTED_ROWS:
            errors.append(f"… and {len(problems) - MAX_REPORTED_ROWS} more rows with problems.")
        raise ValidationError(errors)
    if not ids:
        raise ValidationError("The file has a header but no user ids.")
    return ids


class NamedForm(forms.ModelForm):
    """A segment's, template's or campaign's admin form: its ``name`` keeps to the API's rule for
    names (:class:`core.api.fields.LabelField`, :func:`core.identifiers.text_problem`): any script, no
    invisible character (a bidirectional override would show ``admin\u202egpj.exe`` as
    ``adminexe.jpg``)."""

    def clean_name(self) -> str:
        name = self.cleaned_data.get("name") or ""
        problem = text_problem(name)
        if problem:
            raise ValidationError(f"The name {problem}.", code=problem_code(problem))
        return name

    def clean_description(self) -> str:
        """A segment's description: the API's rule (:class:`core.api.fields.TextField`)."""
        text = self.cleaned_data.get("description") or ""
        problem = text_problem(text, multiline=True)
        if problem:
            raise ValidationError(f"The description {problem}.", code=problem_code(problem))
        return text


class SegmentForm(NamedForm):
    """A segment's admin form: ``rules`` is validated by the API's rule (:func:`campaigns.rules.validate`,
    the error naming the rule's path) and refused on a list segment with members."""

    def clean_rules(self):
        from campaigns.rules import RuleError, validate
        from campaigns.services import rules_problem

        value = self.cleaned_data.get("rules")
        if value is None:
            return None
        try:
            validate(value)
        except RuleError as exc:
            raise ValidationError(f"{exc.path}: {exc.message} ({exc.code}).", code=exc.code) from None
        problem = rules_problem(self.instance, value)
        if problem:
            raise ValidationError(f"Not saved: {problem}.", code="list_segment")
        return value


class MemberUploadForm(forms.Form):
    """A CSV file of user ids to add to a segment; ``cleaned_data["user_ids"]`` holds them."""

    file = forms.FileField(
        label="CSV of user ids",
        help_text=f"One user id per row (a single column, or a header row with a user_id column); UTF-8; at most "
                  f"{MAX_UPLOAD_IDS:,} ids. Unknown user ids are created as recipients without contacts. "
                  + SNAPSHOT_NOTE)

    def clean_file(self):
        upload = self.cleaned_data["file"]
        if upload.size > MAX_UPLOAD_BYTES:
            raise ValidationError(f"The file is {upload.size:,} bytes; at most {MAX_UPLOAD_BYTES:,} (32 MB).")
        try:
            text = upload.read().decode("utf-8-sig")
        except UnicodeDecodeError:
            raise ValidationError("The file is not UTF-8 text: save the CSV as UTF-8.") from None
        self.cleaned_data["user_ids"] = parse_user_ids(text)
        return upload


# --- templates -------------------------------------------------------------------------------------

class TemplateVariantForm(forms.ModelForm):
    """One locale of a template; title, body and html must be valid (sandboxed Jinja2) templates
    whose dry render on sample data stays within the render bounds (:func:`notifications.rendering.check_parts`)."""

    class Meta:
        model = TemplateVariant
        fields = ["locale", "title", "body", "html"]

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        for name in ("body", "html"):  # whitespace is content, as in the API
            self.fields[name].strip = False

    def clean_locale(self) -> str:
        locale = self.cleaned_data["locale"].strip()
        if not TEMPLATE_LOCALE_PATTERN.match(locale):
            raise ValidationError('Not a BCP 47 tag such as "en", "de" or "de-AT".')
        return locale

    def clean(self):
        cleaned = super().clean()
        parts = {name: cleaned.get(name) or "" for name in ("title", "body", "html")}
        try:  # the save rule (syntax, a dry render within the bounds, no event data), as the API's
            for name, exc in content_check(parts).items():
                self.add_error(name, str(exc))
        except CheckBudgetSpent as exc:  # the save's one budget, shared by every variant (TemplateAdmin)
            raise ValidationError(str(exc)[:1].upper() + str(exc)[1:] + ".") from None
        return cleaned


class TemplateVariantFormSet(BaseInlineFormSet):
    """At least one variant, and one of them in the template's default locale."""

    def clean(self) -> None:
        super().clean()
        kept = [form for form in self.forms if not (form.cleaned_data or {}).get("DELETE")]
        if len(kept) > MAX_VARIANTS:
            raise ValidationError(f"{len(kept)} variants; at most {MAX_VARIANTS}, one per locale (docs/TYPES.md).")
        if any(form.errors for form in self.forms):
            return
        locales = [form.cleaned_data["locale"] for form in self.forms
                   if form.cleaned_data and not form.cleaned_data.get("DELETE")]
        if not locales:
            raise ValidationError("A template needs at least one variant.")
        default = self.instance.default_locale
        if default and default not in locales:
            raise ValidationError(f"No variant for the default locale {default!r}: add one or change the "
                                  "default locale.")


# --- campaigns -------------------------------------------------------------------------------------

def can_send_high(user) -> bool:
    """Whether ``user`` may give a campaign priority ``high``.

    The rule is the permission ``campaigns.send_high_priority``, created by the migration
    ``campaigns/0002_staff_groups`` (not declared on the model). Superusers hold it; staff get it
    one by one (no group has it: not ``marketing``).
    """
    return user.has_perm("campaigns.send_high_priority")


CONTENT_FIELDS = ["title", "body", "html", "data"]
SEND_TIME_EXAMPLE = '{"window": {"start": "09:00", "end": "21:00"}, "holdout_percent": 10}'
DEFINITION_FIELDS = ["segment", "channel", "priority", "category", "template", *CONTENT_FIELDS,
                     "scheduled_at", "local_date", "local_time", "missed_policy", "send_time", "spread_seconds",
                     "ttl_seconds", "schedule_rule", "schedule_start", "schedule_timezone"]


class CampaignForm(NamedForm):
    """A campaign definition (new or draft). Exactly one of template / inline content; at most one of
    ``scheduled_at`` / ``local_date`` + ``local_time`` (neither: send when launched)."""

    class Meta:
        model = Campaign
        fields = ["name", *DEFINITION_FIELDS]
        field_classes = {"data": BlankNullJSONField, "send_time": BlankNullJSONField}  # empty, not "null"
        help_texts = {
            "priority": "High uses the OTP queues (never with category marketing): only users with the permission "
                        "campaigns.send_high_priority (superusers; not the marketing group) may choose it.",
            "category": "Matched against recipients' category opt-outs.",
            "template": "Either a template (rendered per recipient at send time)…",
            "title": "…or inline content: email subject / push title (Jinja2 variables allowed).",
            "body": "Plain-text body (SMS text).",
            "html": "Email only.",
            "data": 'Push data / email custom args: a JSON object of strings, e.g. {"screen": "offers"}.',
            "local_date": "Local-time campaign: this date and time in each recipient's own time zone; it must "
                          "still be ahead in the earliest zone (UTC+14) when the campaign is saved and launched.",
            "missed_policy": "Local-time campaigns: members whose wall time had already passed when fan-out reached "
                             "them (e.g. fan-out ran late) are skipped (counted as missed), sent at once, or sent "
                             "at that wall time the next day.",
            "spread_seconds": f"Smear sends uniformly over this many seconds (at most {MAX_SPREAD_SECONDS:,}).",
            "ttl_seconds": "Drop a notification not sent this many seconds after its send time.",
        }

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if "scheduled_at" in self.fields:
            now = timezone.localtime(clock.now())  # the "now" the schedule rules use
            self.fields["scheduled_at"].help_text = (
                f"Absolute send instant, in the admin time zone {timezone.get_current_timezone_name()} "
                f"(now {now:%Y-%m-%d %H:%M} there = {now.astimezone(UTC):%Y-%m-%d %H:%M} UTC); stored in UTC. "
                "Empty (and no local time) or past: sends when launched.")
        for name in ("body", "html"):
            if name in self.fields:
                self.fields[name].strip = False
        if "missed_policy" in self.fields:
            self.fields["missed_policy"].required = False  # absent: the default, skip

    def clean_missed_policy(self) -> str:
        return self.cleaned_data.get("missed_policy") or MissedPolicy.SKIP

    def clean_category(self) -> str:
        category = self.cleaned_data["category"]
        if not CATEGORY_PATTERN.match(category):
            raise ValidationError("Lower-case letters, digits, '_', '.', '-'; at most 64.")
        return category

    def clean_spread_seconds(self) -> int:
        value = self.cleaned_data["spread_seconds"]
        if value > MAX_SPREAD_SECONDS:
            raise ValidationError(f"At most {MAX_SPREAD_SECONDS:,} seconds (24 hours).")
        return value

    def clean_ttl_seconds(self):
        value = self.cleaned_data["ttl_seconds"]
        if value is not None and not 1 <= value <= MAX_TTL_SECONDS:
            raise ValidationError(f"Between 1 and {MAX_TTL_SECONDS:,} seconds (28 days).")
        return value

    def clean_send_time(self):
        """The API's rule (``campaigns.api.send_time.SendTimeSerializer``), stored as the API stores it."""
        from campaigns.api.send_time import SendTimeSerializer, stored_option

        given = self.cleaned_data.get("send_time")
        if given in (None, {}):
            return None
        checked = SendTimeSerializer(data=given if not isinstance(given, dict) else {"optimise": True, **given})
        if not checked.is_valid():
            raise ValidationError(f"{json.dumps(checked.errors)}; e.g. {SEND_TIME_EXAMPLE}")
        return stored_option({"send_time": checked.validated_data})

    def clean_data(self):
        data = self.cleaned_data["data"]
        if data in (None, {}):
            return None
        if not isinstance(data, dict) or not all(isinstance(v, str) for v in data.values()):
            raise ValidationError('A JSON object whose values are strings, e.g. {"screen": "offers"}.')
        return data

    def clean(self):
        cleaned = super().clean()
        problem = unavailable_channel_problem(cleaned.get("channel") or "") if cleaned.get("channel") else ""
        if problem:  # the platform has no provider for it (an empty *_PROVIDERS list)
            self.add_error("channel", problem[:1].upper() + problem[1:] + ".")
        self._clean_content(cleaned)
        self._clean_schedule(cleaned)
        self._clean_priority(cleaned)
        return cleaned

    def _clean_priority(self, cleaned: dict) -> None:
        """Marketing is never high priority; high only with a category that may bypass quiet hours."""
        problem = priority_category_problem(cleaned.get("priority") or "", cleaned.get("category") or "")
        if problem and "priority" not in self.errors:
            self.add_error("priority", problem[1])
        bulk = campaign_category_problem(cleaned.get("priority") or "", cleaned.get("category") or "")
        if bulk and "category" not in self.errors:
            self.add_error("category", bulk[1][:1].upper() + bulk[1][1:] + ".")
        limited = bulk_send_problem(type_key="", category=cleaned.get("category") or "",
                                    channels=[cleaned["channel"]] if cleaned.get("channel") else [])
        if limited and "category" not in self.errors:  # the API's rule (campaigns.api.serializers)
            self.add_error("category", limited[:1].upper() + limited[1:] + ".")

    def _clean_content(self, cleaned: dict) -> None:
        channel, template = cleaned.get("channel"), cleaned.get("template")
        content = {name: cleaned.get(name) for name in CONTENT_FIELDS if cleaned.get(name)}
        if bool(template) == bool({k: v for k, v in content.items() if k != "data"}):
            self.add_error("template", "Give exactly one of a template or inline content (title/body/html).")
            return
        if template is not None:
            if channel == Channel.EMAIL and any(not v.title for v in template.variants.all()):
                self.add_error("template", "Email needs a subject: every variant of this template needs a title.")
            elif problem := template_problem(template):  # saved before the rule: it would fail every send
                self.add_error("template", f"It will not render: {problem}.")
            return
        parts = {name: content.get(name, "") for name in ("title", "body", "html")}
        try:  # the save rule (syntax, a dry render within the bounds, no event data), as the API's
            for name, exc in content_check(parts).items():
                self.add_error(name, str(exc))
        except CheckBudgetSpent as exc:
            self.add_error(None, str(exc)[:1].upper() + str(exc)[1:] + ".")
        if channel:
            for path, detail in channel_content_errors(channel, content).items():
                # "content.data.<key>" (a refused push data key) is the data field's error
                field = path.removeprefix("content").lstrip(".").split(".")[0] or "body"
                if field in self.fields and field not in self.errors:
                    self.add_error(field, str(detail))

    def _clean_schedule(self, cleaned: dict) -> None:
        scheduled_at, local_date, local_time = (cleaned.get(n) for n in ("scheduled_at", "local_date", "local_time"))
        if (local_date is None) != (local_time is None):
            self.add_error("local_time" if local_time is None else "local_date",
                           "A local-time campaign needs both a date and a time.")
        if scheduled_at and (local_date or local_time):
            self.add_error("scheduled_at", "Give either an absolute send instant or a local date and time, not both.")
        now = clock.now()  # the platform clock, as the API's rules use
        if scheduled_at and scheduled_at - now > MAX_SCHEDULE_AHEAD:
            self.add_error("scheduled_at", "At most 366 days ahead.")
        if scheduled_at and now - scheduled_at > MAX_SCHEDULE_BEHIND:
            self.add_error("scheduled_at", "At most 366 days in the past (a past instant means now).")
        if local_date and local_date - now.date() > MAX_SCHEDULE_AHEAD + timedelta(days=1):
            self.add_error("local_date", "At most 366 days ahead.")
        option = cleaned.get("send_time")
        if option and not (local_date and local_time) and cleaned.get("schedule_timezone") != recurrence.RECIPIENT_ZONE:
            self.add_error("send_time", "Send-time optimisation needs a local date and time (or a schedule in each "
                                        "recipient's zone).")
        if local_date and now.date() - local_date > MAX_SCHEDULE_BEHIND:
            self.add_error("local_date", "At most 366 days in the past.")
        elif local_date and local_time:
            wall = earliest_wall_time(local_time, send_time.option_of(Campaign(send_time=option)))
            problem = local_time_problem(local_date, wall, now)
            if problem:
                self.add_error("local_time", problem[0].upper() + problem[1:] + ".")
        self._clean_recurrence(cleaned, now)

    def _clean_recurrence(self, cleaned: dict, now) -> None:
        """A recurring campaign: the schedule rule of the API (:func:`campaigns.recurrence.parse`), each
        error on its field; not with another kind of schedule."""
        rule, start, zone = (cleaned.get(n) or "" for n in ("schedule_rule", "schedule_start", "schedule_timezone"))
        if not (rule or start or zone):
            return
        if cleaned.get("scheduled_at") or cleaned.get("local_date"):
            self.add_error("schedule_rule", "Give a recurring schedule or a send instant or a local date, not both.")
            return
        try:
            recurrence.parse(rule, start, zone, now=now)
        except recurrence.ScheduleError as exc:
            field = {"schedule.start": "schedule_start", "schedule.timezone": "schedule_timezone"}.get(
                exc.field, "schedule_rule")
            self.add_error(field, str(exc)[:1].upper() + str(exc)[1:] + ".")
