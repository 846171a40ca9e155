"""SMS encoding and segment count, as a marketer needs to see them before launch.

A body that fits the GSM 03.38 alphabet (checked with the ``gsm0338`` codec; extension characters
such as ``€`` or ``{`` take two septets) is sent as GSM-7: 160 septets in one segment, 153 per
segment when concatenated. Anything else is sent as UCS-2: 70 UTF-16 code units in one segment, 67
per segment when concatenated (emoji take two). Source: Twilio, "What the Heck is a Segment?" and
3GPP TS 23.038 / 23.040.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import gsm0338  # noqa: F401 - registers the "gsm03.38" codec


@dataclass(frozen=True)
class SmsInfo:
    encoding: str  # "GSM-7" or "UCS-2"
    units: int  # septets (GSM-7) or UTF-16 code units (UCS-2)
    segments: int


def sms_info(body: str) -> SmsInfo:
    """Encoding, length in encoding units and number of segments of an SMS ``body``."""
    try:
        units = len(body.encode("gsm03.38"))
        single, multi, encoding = 160, 153, "GSM-7"
    except UnicodeEncodeError:
        units = len(body.encode("utf-16-le")) // 2
        single, multi, encoding = 70, 67, "UCS-2"
    segments = 0 if units == 0 else 1 if units <= single else math.ceil(units / multi)
    return SmsInfo(encoding, units, segments)
