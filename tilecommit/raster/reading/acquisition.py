"""When a source's pixels were acquired, where GDAL keeps it: ``ACQUISITIONDATETIME`` in the
``IMAGERY`` metadata domain.

GDAL's sensor metadata readers (DigitalGlobe, GeoEye, Landsat, Pleiades, SPOT...) fill that key
from a product's sidecar files, always as ``YYYY-MM-DD HH:MM:SS`` in UTC (``MD_DATETIMEFORMAT``
in ``gdal_mdreader.h``, whose comment says the time is UTC). A GeoTIFF keeps it in its
``GDAL_METADATA`` tag when its writer sets it (``SetMetadataItem``, rasterio's ``update_tags``);
the job reads it from there, never from a sidecar. Other writers set the key by hand: RFC 3339
with ``T``, ``Z`` or an offset, and fractional seconds, are taken as well.

``TIFFTAG_DATETIME`` is not an acquisition time: by the TIFF specification it is when the file
was written (rio-stac falls back to it; this module does not).
"""

from __future__ import annotations

import logging
import re
from datetime import UTC, datetime, timedelta, timezone
from typing import NamedTuple

IMAGERY_DOMAIN = "IMAGERY"
ACQUISITION_KEY = "ACQUISITIONDATETIME"

#: GDAL's ``YYYY-MM-DD HH:MM:SS`` and RFC 3339's date-time (``T`` or a space between date and
#: time, as RFC 3339 allows), with optional fractional seconds and zone; nothing looser (no date
#: alone, no basic format), so a value read here is a time to the second.
DATE_TIME = re.compile(
    r"(?P<year>\d{4})-(?P<month>\d{2})-(?P<day>\d{2})[Tt ]"
    r"(?P<hour>\d{2}):(?P<minute>\d{2}):(?P<second>\d{2})(?:\.(?P<fraction>\d+))?"
    r"(?P<zone>[Zz]|[+-]\d{2}:\d{2})?",
    re.ASCII,  # digits 0-9 only, not every script's
)
#: What GDAL's readers write when they could not read the sensor's date: their parser returns 0
#: (the Unix epoch) and they format it anyway (a Landsat MTL whose SCENE_CENTER_TIME is quoted,
#: as USGS writes it, gives ``1970-01-01 00:00:00`` with GDAL 3.10).
UNIX_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
#: At most this much of a value that is not a time is quoted back: a tag can be any length.
QUOTED_CHARS = 64

logger = logging.getLogger(__name__)


class Acquisition(NamedTuple):
    """The acquisition time a source gives (RFC 3339, UTC) or None, and, when it has an
    ``ACQUISITIONDATETIME`` that is not one, why it was not taken ("" otherwise)."""

    time: str | None
    note: str = ""


def _zone(text: str | None) -> timezone:
    # No zone: GDAL's readers write UTC, and the key is defined as UTC.
    if text is None or text in ("Z", "z"):
        return UTC
    sign = -1 if text[0] == "-" else 1
    hours, minutes = int(text[1:3]), int(text[4:6])
    if minutes > 59:
        raise ValueError(f"the zone offset {text} has {minutes} minutes")
    return timezone(sign * timedelta(hours=hours, minutes=minutes))


def rfc3339_utc(moment: datetime) -> str:
    """``moment`` as RFC 3339 in UTC, as pystac writes an item's times (``Z``; microseconds only
    when there are some), so the item's ``datetime`` is this string exactly."""
    utc = moment.astimezone(UTC)
    return utc.isoformat(timespec="microseconds" if utc.microsecond else "seconds").replace("+00:00", "Z")


def parse_acquisition_time(text: str) -> str:
    """An ``ACQUISITIONDATETIME`` value as RFC 3339 in UTC; ``ValueError`` saying why it is not one.

    Fractional seconds beyond the microsecond are cut (Landsat gives seven digits).
    """
    match = DATE_TIME.fullmatch(text.strip())
    if match is None:
        raise ValueError("it is not a date and time as YYYY-MM-DD HH:MM:SS (GDAL's form, UTC) or RFC 3339")
    fraction = (match["fraction"] or "").ljust(6, "0")[:6]
    year, month, day, hour, minute, second = (
        int(match[part]) for part in ("year", "month", "day", "hour", "minute", "second")
    )
    moment = datetime(year, month, day, hour, minute, second, int(fraction), tzinfo=_zone(match["zone"]))
    if moment == UNIX_EPOCH:
        raise ValueError(
            "it is the Unix epoch, what GDAL's sensor metadata readers write for a date they could not read"
        )
    try:
        return rfc3339_utc(moment)
    except OverflowError as exc:  # year 1 or 9999 moved across midnight by its zone
        raise ValueError(f"in UTC it is outside the years 1 to 9999 ({exc})") from exc


def acquisition_of(src, path: str) -> Acquisition:
    """The acquisition time ``src`` (an open dataset) gives. A value that is not a time is
    logged and treated as none, with a note saying why: it never fails the job."""
    value = src.get_tag_item(ACQUISITION_KEY, IMAGERY_DOMAIN)
    if value is None:
        return Acquisition(None)
    try:
        return Acquisition(parse_acquisition_time(value))
    except ValueError as exc:
        quoted = value if len(value) <= QUOTED_CHARS else value[:QUOTED_CHARS] + "..."
        note = f"{IMAGERY_DOMAIN} {ACQUISITION_KEY} {quoted!r} not used: {exc}"
        logger.warning("%s: %s", path, note)
        return Acquisition(None, note)
