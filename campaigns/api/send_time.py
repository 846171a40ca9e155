"""``send_time`` of ``POST /v1/campaigns`` and of a campaign's detail (docs/SEND_TIME.md): the option
in, normalised as stored, and the groups' comparison out."""

from __future__ import annotations

from rest_framework import serializers

from campaigns import send_time
from campaigns.recurrence import RECIPIENT_ZONE
from core.api.fields import RejectUnknownFields, WallTimeSecondsField


class WindowSerializer(RejectUnknownFields, serializers.Serializer):
    start = WallTimeSecondsField(help_text="Earliest local wall time (HH:MM) in each member's zone.")
    end = WallTimeSecondsField(help_text="Local wall time (HH:MM) the window ends before; earlier than start: "
                                         "it wraps past midnight.")


class SendTimeSerializer(RejectUnknownFields, serializers.Serializer):
    """Send each member at their best local hour (h:00) inside ``window`` on the campaign's date; a
    ``holdout_percent`` share, and members without history, at the campaign's own time."""

    optimise = serializers.BooleanField(help_text="true: optimise (false: the same as leaving send_time out).")
    window = WindowSerializer(required=False, help_text="Required when optimise is true.")
    holdout_percent = serializers.IntegerField(required=False, default=0, min_value=0,
                                               max_value=send_time.MAX_HOLDOUT_PERCENT,
                                               help_text=f"0–{send_time.MAX_HOLDOUT_PERCENT}: members drawn "
                                                         "(by a hash of campaign and user) to get the fixed time.")

    def validate(self, attrs):
        if "window" not in attrs:
            if attrs["optimise"]:
                raise serializers.ValidationError({"window": serializers.ErrorDetail(
                    "required when optimise is true: the local hours members may be sent in", code="required")})
            return attrs
        problems = send_time.option_problems(attrs["window"]["start"], attrs["window"]["end"],
                                             attrs["holdout_percent"])
        if problems:
            raise serializers.ValidationError({name: serializers.ErrorDetail(text, code="invalid")
                                               for name, text in problems.items()})
        return attrs


def stored_option(attrs: dict) -> dict | None:
    """The model's ``send_time`` from a validated request (``None``: off)."""
    given = attrs.get("send_time")
    if not given or not given["optimise"]:
        return None
    w = given["window"]
    return send_time.Option(w["start"], w["end"], given["holdout_percent"]).as_stored()


def send_time_errors(attrs: dict) -> dict[str, serializers.ErrorDetail]:
    """The option needs a campaign date in each member's zone: ``local_time`` or a recipient-zone schedule."""
    if not (attrs.get("send_time") or {}).get("optimise"):
        return {}  # off: the same as leaving it out
    schedule = attrs.get("schedule")
    if attrs.get("local_time") or (schedule and schedule["timezone"] == RECIPIENT_ZONE):
        return {}
    return {"send_time": serializers.ErrorDetail(
        "applies to local_time campaigns (or a schedule in each recipient's zone) only: the best hour is "
        "chosen on the campaign's date in each member's zone", code="local_time_only")}


class GroupSerializer(serializers.Serializer):
    group = serializers.ChoiceField(choices=send_time.Group.choices)
    members = serializers.IntegerField()
    sent = serializers.IntegerField(help_text="Notifications a provider accepted (counts.outcome's sent).")
    opened = serializers.IntegerField(help_text="Opened in the app, or an email open/click receipt.")
    open_rate = serializers.FloatField(allow_null=True, help_text="opened ÷ sent; null while nothing was sent.")


class SendTimeOutSerializer(serializers.Serializer):
    window = WindowSerializer()
    holdout_percent = serializers.IntegerField()
    groups = GroupSerializer(many=True)


def earliest_wall_time(local_time, attrs: dict):
    """The earliest wall time a member may be sent at (:func:`campaigns.send_time.earliest_wall_time`)."""
    stored = stored_option(attrs)
    w = attrs["send_time"]["window"] if stored else None
    option = send_time.Option(w["start"], w["end"], 0) if w else None
    return send_time.earliest_wall_time(local_time, option)
