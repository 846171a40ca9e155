"""Marketing admin for segments, templates and campaigns (the ``marketing`` group's pages; see
:mod:`campaigns.roles`). A recipient's notifications are on the Recipient page.

Segments (member counts, CSV upload, paginated members); templates (per-locale variants, a preview
for one recipient); campaigns (drafts with reach and SMS encoding, launched by a button, read-only
once launched but for the name, cancellable, live progress; launches and cancels in the admin log).
Priority ``high``, and everything that changes what the high tier delivers, needs
``campaigns.send_high_priority`` (:func:`campaigns.forms.can_send_high`, :mod:`campaigns.ownership`).
The pages and who may do what: docs/OPERATIONS.md, "The admin, page by page" and "Staff roles".
"""

from __future__ import annotations

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.utils import flatten_fieldsets, unquote
from django.contrib.admin.views.main import ChangeList
from django.db import transaction
from django.db.models import Count, IntegerField, OuterRef, Subquery, Sum, Value
from django.db.models.functions import Coalesce
from django.urls import path, reverse
from django.utils.html import format_html
from django.views.decorators.http import require_GET, require_POST

from campaigns import admin_views, audience, membership, rules, selectors, send_time, services
from campaigns.admin_recurring import SERIES_FIELDS, RecurringAdminMixin
from campaigns.forms import (
    DEFINITION_FIELDS,
    SNAPSHOT_NOTE,
    CampaignForm,
    MemberUploadForm,
    NamedForm,
    SegmentForm,
    TemplateVariantForm,
    TemplateVariantFormSet,
    can_send_high,
)
from campaigns.models import (
    Campaign,
    CampaignShard,
    CampaignStatus,
    Segment,
    SegmentMember,
    Template,
    TemplateVariant,
)
from campaigns.rules import Context
from core import clock
from notifications.admin.base import HIDDEN
from notifications.admin.clients import ClientByPrefix
from notifications.models import Priority
from notifications.rendering.checking import check_budget
from preferences.admin_guard import ContentLookupGuard


class OwnerColumn:
    """The ``owner`` column of segments and templates: the owning API client; admin-made ones have
    none (only staff change them). Staff set it on the change page (``client``)."""

    @admin.display(description="Owner (API client)", ordering="client__name")
    def owner(self, obj) -> str:
        return obj.client.name if obj.client_id else "— (made in the admin)"


# --- segments --------------------------------------------------------------------------------------

RULES_NOTE = ("Empty for a list segment. A rule (JSON, docs/SEGMENTS.md) makes this a rule segment: its members are "
              'the recipients the rule matches when a campaign starts, e.g. {"and": [{"locale": ["de"]}, '
              '{"has": "email"}]}. A rule segment takes no CSV upload.')

class SegmentChangeList(ChangeList):
    """Counts members for the rows on the page only: a correlated subquery, which Postgres evaluates
    per returned row (an index-only count on the ``(segment, recipient)`` constraint), instead of
    a GROUP BY over every membership in the table."""

    def get_queryset(self, request, exclude_parameters=None):
        members = (SegmentMember.objects.filter(segment=OuterRef("pk")).order_by().values("segment")
                   .annotate(n=Count("*")).values("n"))
        return super().get_queryset(request, exclude_parameters).annotate(
            n_members=Coalesce(Subquery(members, output_field=IntegerField()), Value(0)))


@admin.register(Segment)
class SegmentAdmin(ContentLookupGuard, ClientByPrefix, OwnerColumn, admin_views.SegmentUploadViews, admin.ModelAdmin):
    """Segments with member counts; the change page adds members from a CSV upload and links to the
    paginated member list (members are never all rendered: segments can be huge)."""

    form = SegmentForm
    list_display = ["segment_id", "name", "member_count", "owner", "updated_at"]
    list_select_related = ["client"]
    search_fields = ["segment_id", "name"]
    ordering = ["segment_id"]
    show_full_result_count = False
    fieldsets = [(None, {"fields": ["segment_id", "name", "description", "client", "member_count", "members_link",
                                    "created_at", "updated_at"],
                         "description": SNAPSHOT_NOTE}),
                 ("Rule segment", {"fields": ["rules", "rule_preview"], "description": RULES_NOTE})]
    change_form_template = "admin/campaigns/segment/change_form.html"

    def get_changelist(self, request, **kwargs):
        return SegmentChangeList

    def get_readonly_fields(self, request, obj=None):
        fixed = ["member_count", "members_link", "rule_preview", "created_at", "updated_at"]
        if obj is not None and admin_views.high_priority_lock(request, obj):
            fixed.append("rules")  # who an active high-priority campaign reaches, as members are
        return ["segment_id", *fixed] if obj is not None else fixed

    @admin.display(description="Count now")
    def rule_preview(self, obj):
        """The rule's count now (bounded: SEGMENT_PREVIEW_TIMEOUT_MS, then the planner's estimate)."""
        if obj.pk is None or not obj.is_rule:
            return "—"
        needs_channel = rules.validate(obj.rules)
        context = Context(now=clock.now(), channel="email" if needs_channel else "", category="marketing")
        counted = membership.preview(obj.rules, context)
        text = f"{counted.count:,}" if counted.exact else f"about {counted.count:,} (estimate: counting took too long)"
        if needs_channel:
            text += "; subscribed counted for email, category marketing: a draft campaign's page shows its own reach"
        return text

    @admin.display(description="Members")
    def member_count(self, obj):
        if obj.pk is None:
            return 0
        if obj.is_rule:
            return "rule"
        n = getattr(obj, "n_members", None)
        return obj.members.count() if n is None else n

    @admin.display(description="Member list")
    def members_link(self, obj):
        if obj.pk is None:
            return "—"
        url = reverse("admin:campaigns_segmentmember_changelist")
        return format_html('<a href="{}?segment__segment_id__exact={}">Browse members (paginated)</a>', url, obj.pk)

    def get_urls(self):
        upload = path("<path:object_id>/upload-members/", self.admin_site.admin_view(self.upload_members_view),
                      name="campaigns_segment_upload_members")
        return [upload, *super().get_urls()]

    def change_view(self, request, object_id, form_url="", extra_context=None):
        extra = {"upload_form": MemberUploadForm(),
                 "upload_url": reverse("admin:campaigns_segment_upload_members", args=[object_id])}
        segment = self.get_object(request, unquote(object_id))
        if segment is not None:
            extra["members_locked"] = admin_views.high_priority_lock(request, segment)
        return super().change_view(request, object_id, form_url, {**extra, **(extra_context or {})})


@admin.register(SegmentMember)
class SegmentMemberAdmin(ContentLookupGuard, admin.ModelAdmin):
    """Members, one page at a time (reached from a segment's page, filtered to it)."""

    list_display = ["recipient_id", "segment_id", "added_at"]
    search_fields = ["=recipient__user_id"]
    search_help_text = "Exact user id."
    raw_id_fields = ["recipient"]
    ordering = ["segment", "recipient"]  # the unique constraint's index
    show_full_result_count = False

    # Members of a segment an active high-priority campaign uses: only with campaigns.send_high_priority.
    def has_change_permission(self, request, obj=None):
        return super().has_change_permission(request, obj) and not (
            obj is not None and admin_views.high_priority_lock(request, obj.segment))

    def has_delete_permission(self, request, obj=None):
        return super().has_delete_permission(request, obj) and not (
            obj is not None and admin_views.high_priority_lock(request, obj.segment))

    def get_form(self, request, obj=None, change=False, **kwargs):
        base = super().get_form(request, obj, change, **kwargs)

        class MemberForm(base):
            def clean(self):
                cleaned = super().clean()
                segment = cleaned.get("segment")
                locked = segment is not None and admin_views.high_priority_lock(request, segment)
                if locked:
                    self.add_error("segment", locked)
                return cleaned

        return MemberForm


# --- templates -------------------------------------------------------------------------------------

class TemplateVariantInline(admin.StackedInline):
    """A template's per-locale variants, each part checked as a sandboxed Jinja2 template."""

    model = TemplateVariant
    form = TemplateVariantForm
    formset = TemplateVariantFormSet
    fields = ["locale", "title", "body", "html"]
    extra = 0
    min_num = 1


@admin.register(Template)
class TemplateAdmin(ContentLookupGuard, ClientByPrefix, OwnerColumn, admin.ModelAdmin):
    """Templates with their variants; ``?preview_user=<user id>`` on the change page renders the saved
    template for that recipient (html shown as escaped source and in a sandboxed iframe)."""

    form = NamedForm
    list_display = ["template_id", "name", "default_locale", "locales", "owner", "updated_at"]
    list_select_related = ["client"]
    search_fields = ["template_id", "name"]
    ordering = ["template_id"]
    inlines = [TemplateVariantInline]
    change_form_template = "admin/campaigns/template/change_form.html"

    def get_queryset(self, request):
        return super().get_queryset(request).prefetch_related("variants")

    def get_readonly_fields(self, request, obj=None):
        return ["template_id", "used_by"] if obj is not None else []

    # A template an active high-priority campaign uses: only with campaigns.send_high_priority.
    def has_change_permission(self, request, obj=None):
        return super().has_change_permission(request, obj) and not (
            obj is not None and admin_views.high_priority_lock(request, obj))

    def has_delete_permission(self, request, obj=None):
        return super().has_delete_permission(request, obj) and not (
            obj is not None and admin_views.high_priority_lock(request, obj))

    def get_fields(self, request, obj=None):
        return ["template_id", "name", "default_locale", "client", *(["used_by"] if obj is not None else [])]

    @admin.display(description="Locales")
    def locales(self, obj):
        return ", ".join(sorted(v.locale for v in obj.variants.all()))

    @admin.display(description="Used by active campaigns")
    def used_by(self, obj):
        n = obj.campaigns.filter(status__in=admin_views.ACTIVE_CAMPAIGN_STATUSES).count()
        return (f"{n} — edits apply to every notification of theirs not yet sent (rendered at send time)"
                if n else "none")

    def changeform_view(self, request, object_id=None, form_url="", extra_context=None):
        with check_budget():  # one template-check budget for every variant of this save
            return super().changeform_view(request, object_id, form_url, extra_context)

    def change_view(self, request, object_id, form_url="", extra_context=None):
        extra = {}
        user_id = request.GET.get("preview_user", "").strip()
        template = self.get_object(request, unquote(object_id)) if request.method == "GET" else None
        if user_id and template is not None:
            extra["preview"] = admin_views.template_preview(template, user_id)
        locked = template is not None and admin_views.high_priority_lock(request, template)
        if locked:
            messages.warning(request, f"Read-only. {locked}")
        return super().change_view(request, object_id, form_url, {**extra, **(extra_context or {})})


# --- campaigns -------------------------------------------------------------------------------------

#: While a campaign is active, the campaign list reloads itself this often (seconds).
LIST_REFRESH_SECONDS = 5
STATUS_FIELDS = ["status", "created_by", "created_at", "fanout_utc"]
RUN_FIELDS = ["snapshot_at", "member_count", "created_count", "default_zone_count", "missed_count", "started_at",
              "fanned_out_at", "completed_at", "cancelled_at", "fanout_failures", "last_error", "last_error_at",
              "unsubscribes", "send_time_groups"]


class CampaignChangeList(ChangeList):
    """Adds the notifications created so far (the shards' counters: ``created_count`` is only set
    once fan-out finishes) for the rows on the page."""

    def get_results(self, request):
        """Also the outcome (sent vs not sent) of the campaigns on this page (``selectors.counts_for``:
        from their tallies, not their rows, however often the page reloads)."""
        super().get_results(request)
        page = list(self.result_list)  # evaluated once; the template iterates the cached rows
        counts = selectors.counts_for(page)
        for campaign in page:
            campaign.outcome = counts[campaign.pk]["outcome"]

    def get_queryset(self, request, exclude_parameters=None):
        created = (CampaignShard.objects.filter(campaign=OuterRef("pk")).order_by().values("campaign")
                   .annotate(n=Sum("created")).values("n"))
        return super().get_queryset(request, exclude_parameters).annotate(
            shards_created=Coalesce(Subquery(created, output_field=IntegerField()), Value(0)))


def _sensitive(campaign: Campaign | None) -> bool:
    """A campaign of a sensitive type: its ``data`` is never shown (nor edited) in the admin."""
    return campaign is not None and campaign.notification_type is not None and campaign.notification_type.sensitive


@admin.register(Campaign)
class CampaignAdmin(ContentLookupGuard, admin_views.CampaignLifecycleViews, RecurringAdminMixin, admin.ModelAdmin):
    """Campaigns: created as drafts (editable, deletable), launched with a button, then read-only
    except the name; progress and Cancel on the change page, "Cancel selected campaigns" in the list."""

    form = CampaignForm
    list_display = ["__str__", "segment", "channel", "status", "schedule", "fanout_progress", "outcome"]
    list_filter = ["status", "channel"]
    list_select_related = ["segment"]
    search_fields = ["name", "=segment__segment_id"]
    ordering = ["-created_at"]
    show_full_result_count = False
    autocomplete_fields = ["segment", "template"]
    actions = ["cancel_selected", "pause_selected", "resume_selected"]
    change_form_template = "admin/campaigns/campaign/change_form.html"

    def get_changelist(self, request, **kwargs):
        return CampaignChangeList

    # --- form and fields ---

    def get_fieldsets(self, request, obj=None):
        launched = obj is not None and obj.status != CampaignStatus.DRAFT
        schedule = ["scheduled_utc" if launched else "scheduled_at", ("local_date", "local_time"), "missed_policy",
                    "send_time", "spread_seconds", "ttl_seconds"]
        fieldsets = [
            (None, {"fields": ["name", "segment", "channel", "priority", "category"]}),
            ("Content", {"fields": ["template", "title", "body", "html", "data"],
                         "description": "Either a template or inline content (title/body/html), not both. "
                                        "Variables: {{ user_id }}, {{ email }}, {{ locale }}, {{ timezone }} "
                                        "and the recipient's attributes, e.g. {{ first_name }}."}),
            ("Schedule", {"fields": schedule,
                          "description": "An absolute instant, or a local date and time in each recipient's "
                                         "zone, or neither (send when launched). " + SNAPSHOT_NOTE}),
        ]
        fieldsets += self.recurring_fieldsets(obj)
        if obj is not None:
            fieldsets.append(("Status", {"fields": STATUS_FIELDS + (RUN_FIELDS if launched else [])}))
        if _sensitive(obj):
            content = fieldsets[1][1]["fields"]
            content[content.index("data")] = "data_hidden"
        return fieldsets

    @admin.display(description="Send-time groups")
    def send_time_groups(self, obj):
        return send_time.comparison_html(obj)  # per group: members, sent, opened, open rate

    @admin.display(description="Data")
    def data_hidden(self, obj):
        return HIDDEN  # a sensitive type's data: shown nowhere, as on the event and notification pages

    def get_readonly_fields(self, request, obj=None):
        if obj is None:
            return []
        if obj.status == CampaignStatus.DRAFT:
            return STATUS_FIELDS + SERIES_FIELDS + (["data_hidden"] if _sensitive(obj) else [])
        return [f for f in flatten_fieldsets(self.get_fieldsets(request, obj)) if f != "name"]

    def get_form(self, request, obj=None, change=False, **kwargs):
        if obj is not None and obj.status != CampaignStatus.DRAFT:
            kwargs["form"] = forms.ModelForm  # only the name is editable: no definition rules to apply
        return super().get_form(request, obj, change, **kwargs)

    def formfield_for_choice_field(self, db_field, request, **kwargs):
        if db_field.name == "priority" and not can_send_high(request.user):
            kwargs["choices"] = [(Priority.STANDARD, Priority.STANDARD.label)]
        return super().formfield_for_choice_field(db_field, request, **kwargs)

    def get_object(self, request, object_id, from_field=None):
        """The campaign; on a POST (inside the admin's transaction) locked FOR UPDATE."""
        obj = super().get_object(request, object_id, from_field)
        if obj is not None and request.method == "POST" and transaction.get_connection().in_atomic_block:
            # Lock the row for the admin's save: a launch in between cannot slip under a draft edit.
            obj = Campaign.objects.select_for_update().get(pk=obj.pk)
        counted = getattr(request, "_campaign_sent", None)  # what change_view's progress counted
        if obj is not None and counted and counted[0] == obj.pk:
            obj.counted_sent = counted[1]
        return obj

    def save_model(self, request, obj, form, change):
        """New campaigns are drafts with ``fanout_at`` computed; launched ones only save their name."""
        if not change:
            obj.status = CampaignStatus.DRAFT
            obj.created_by = request.user
        if obj.status != CampaignStatus.DRAFT:
            # Only the name is editable; never write back counters the fan-out updates concurrently.
            obj.save(update_fields=["name", "updated_at"])
            return
        obj.fanout_at = services.campaign_fanout_instant(obj, clock.now())
        if change:
            obj.save(update_fields=["name", *DEFINITION_FIELDS, "fanout_at", "updated_at"])
        else:
            obj.save(force_insert=True)

    def has_change_permission(self, request, obj=None):
        """A high-priority campaign: only with campaigns.send_high_priority (edit, launch, cancel)."""
        return super().has_change_permission(request, obj) and (
            obj is None or admin_views.may_change_high(request, obj))

    def has_delete_permission(self, request, obj=None):
        """Only drafts can be deleted (launched campaigns are cancelled); high-priority ones only with
        campaigns.send_high_priority."""
        return super().has_delete_permission(request, obj) and (obj is None or (
            obj.status == CampaignStatus.DRAFT and admin_views.may_change_high(request, obj)))

    def get_actions(self, request):
        actions = super().get_actions(request)
        actions.pop("delete_selected", None)
        return actions

    # --- display ---

    @admin.display(description="Scheduled")
    def schedule(self, obj):
        if obj.is_recurring:
            return format_html("{} ({})<br><small>next run {}</small>", obj.schedule_rule, obj.schedule_timezone,
                               admin_views.utc(obj.next_run_at) if obj.next_run_at else "—")
        if obj.local_date is not None:
            return format_html("{} {} local<br><small>fan-out from {}</small>", obj.local_date,
                               obj.local_time.strftime("%H:%M"), admin_views.utc(obj.fanout_at))
        if obj.scheduled_at is not None:
            return admin_views.utc(obj.scheduled_at)
        return "at launch" if obj.status == CampaignStatus.DRAFT else admin_views.utc(obj.fanout_at)

    @admin.display(description="Fanned out")
    def fanout_progress(self, obj):
        if obj.member_count is None:
            return "—"
        created = max(obj.created_count, getattr(obj, "shards_created", 0))
        return format_html('<progress max="{}" value="{}"></progress> {} / {}', obj.member_count or 1,
                           created, created, obj.member_count)

    @admin.display(description="Outcome")
    def outcome(self, obj):
        outcome = getattr(obj, "outcome", None)
        if outcome is None or obj.member_count is None:
            return "—"
        expired = " · history expired: counts of the notifications left" if selectors.history_expired(obj) else ""
        return format_html('<meter min="0" max="{}" value="{}" title="sent"></meter> {}{}', obj.member_count or 1,
                           outcome["sent"], admin_views.outcome_summary(outcome), expired)

    @admin.display(description="Unsubscribes")
    def unsubscribes(self, obj):
        """Opt-outs through this campaign's unsubscribe links, and their share of its sent emails."""
        # The sent count the page's progress already took (the sampler's while sending), not another.
        stats = selectors.unsubscribe_stats(obj, getattr(obj, "counted_sent", None))
        if stats["unsubscribe_rate"] is None:
            return f"{stats['unsubscribes']} (nothing sent yet)"
        return f"{stats['unsubscribes']} ({100 * stats['unsubscribe_rate']:.1f} % of sent)"

    @admin.display(description="Scheduled at")
    def scheduled_utc(self, obj):
        return admin_views.utc(obj.scheduled_at) if obj.scheduled_at else "—"

    @admin.display(description="Fan-out at")
    def fanout_utc(self, obj):
        return admin_views.utc(obj.fanout_at)

    # --- launch, cancel, progress ---

    def get_urls(self):
        def view(name, func):
            return path(f"<uuid:object_id>/{name}/", self.admin_site.admin_view(func),
                        name=f"campaigns_campaign_{name}")

        return [view("launch", require_POST(self.launch_view)), view("cancel", require_POST(self.cancel_view)),
                view("progress", require_GET(self.progress_view)), *super().get_urls()]

    def changelist_view(self, request, extra_context=None):
        """The list reloads itself while any campaign is active (template ``change_list.html``)."""
        active = Campaign.objects.filter(status__in=admin_views.ACTIVE_CAMPAIGN_STATUSES).exists()
        extra = {"campaigns_active": active, "refresh_seconds": LIST_REFRESH_SECONDS}
        return super().changelist_view(request, {**extra, **(extra_context or {})})

    def change_view(self, request, object_id, form_url="", extra_context=None):
        """Adds the before-launch panel (draft) or the progress panel (launched) to the page."""
        campaign = self._campaign(unquote(object_id))
        extra = {}
        if campaign is not None and self.has_view_permission(request, campaign):
            may_change = self.has_change_permission(request, campaign)
            if request.method == "GET" and not admin_views.may_change_high(request, campaign):
                messages.info(request, "A high-priority campaign is launched, cancelled or changed only by staff with "
                                       "the permission campaigns.send_high_priority.")
            extra = {"campaign": campaign,
                     "launch_url": reverse("admin:campaigns_campaign_launch", args=[campaign.pk]),
                     "cancel_url": reverse("admin:campaigns_campaign_cancel", args=[campaign.pk]),
                     "progress_url": reverse("admin:campaigns_campaign_progress", args=[campaign.pk])}
            if campaign.status == CampaignStatus.DRAFT:
                extra.update(reach=audience.reach(campaign, clock.now()), sms=admin_views.sms_estimates(campaign),
                             local_check=admin_views.local_time_check(campaign),
                             can_launch=may_change and self._may_send(request, campaign))
            else:
                progress = admin_views.progress(campaign)
                request._campaign_sent = (campaign.pk, progress["sent"])  # for the Unsubscribes field
                extra.update(progress=progress,
                             can_cancel=may_change and campaign.status in admin_views.ACTIVE_CAMPAIGN_STATUSES)
        return super().change_view(request, object_id, form_url, {**extra, **(extra_context or {})})
