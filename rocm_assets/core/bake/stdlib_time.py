"""bake's time functions, as go-cty implements them: RFC 3339 timestamps, Go durations, and
formatdate's own format spec (Terraform's `YYYY-MM-DD'T'hh:mm:ssZ`, not strftime)."""

import re
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

from rocm_assets.core.bake.limits import quote
from rocm_assets.core.bake.values import to_string

_RFC3339 = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2}):(\d{2})(\.\d{1,9})?(Z|[+-]\d{2}:\d{2})"
)
_DURATION_PART = re.compile(r"(\d+\.?\d*|\.\d+)(ns|us|µs|μs|ms|s|m|h)")
_UNIT_SECONDS = {
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,
    "μs": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
}
# Go's time.Duration is an int64 of nanoseconds: about 292 years either way.
_MAX_DURATION_S = (1 << 63) / 1e9
_MONTHS = [
    "January", "February", "March", "April", "May", "June",
    "July", "August", "September", "October", "November", "December",
]  # fmt: skip
_DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]


def parse_timestamp(text: Any, fn: str) -> datetime:
    text = to_string(text)
    match = _RFC3339.fullmatch(text)
    if not match:
        raise ValueError(f"{fn}(): {quote(text)} is not an RFC 3339 timestamp")
    year, month, day, hour, minute, second, fraction, zone = match.groups()
    offset = timedelta(0)
    if zone != "Z":
        sign = -1 if zone[0] == "-" else 1
        offset = sign * timedelta(hours=int(zone[1:3]), minutes=int(zone[4:6]))
    try:
        return datetime(
            int(year),
            int(month),
            int(day),
            int(hour),
            int(minute),
            int(second),
            int(float(fraction or 0) * 1_000_000),
            tzinfo=UTC if zone == "Z" else timezone(offset),
        )
    except ValueError as exc:
        raise ValueError(f"{fn}(): {quote(text)}: {exc}") from None


def rfc3339(moment: datetime) -> str:
    """Go's time.RFC3339 layout: whole seconds, Z for UTC."""
    offset = moment.utcoffset() or timedelta(0)
    return moment.strftime("%Y-%m-%dT%H:%M:%S") + _offset(offset, colon=True, z=True)


def _offset(offset: timedelta, *, colon: bool, z: bool) -> str:
    if z and not offset:
        return "Z"
    minutes = int(offset.total_seconds()) // 60
    sign = "-" if minutes < 0 else "+"
    hours, minutes = divmod(abs(minutes), 60)
    return f"{sign}{hours:02d}{':' if colon else ''}{minutes:02d}"


def parse_duration(text: Any) -> timedelta:
    """Go's time.ParseDuration: e.g. "1h30m", "-1.5h", "300ms"."""
    raw = to_string(text)
    body = raw.lstrip("+-")
    sign = -1 if raw.startswith("-") else 1
    if body == "0":
        return timedelta(0)
    parts = _DURATION_PART.findall(body)
    if not body or "".join(n + u for n, u in parts) != body:
        raise ValueError(f"timeadd(): {quote(raw)} is not a Go duration such as 1h30m")
    seconds = sum(float(n) * _UNIT_SECONDS[u] for n, u in parts)
    if seconds > _MAX_DURATION_S:
        raise ValueError(f"timeadd(): duration {quote(raw)} is out of range")
    return sign * timedelta(seconds=seconds)


def timeadd(timestamp: Any, duration: Any) -> str:
    try:
        return rfc3339(parse_timestamp(timestamp, "timeadd") + parse_duration(duration))
    except OverflowError:
        raise ValueError("timeadd(): the result is outside years 1 to 9999") from None


def _part(seq: str, moment: datetime) -> str:
    hour12 = moment.hour % 12 or 12
    offset = moment.utcoffset() or timedelta(0)
    parts = {
        "YYYY": f"{moment.year:04d}",
        "YY": f"{moment.year % 100:02d}",
        "MMMM": _MONTHS[moment.month - 1],
        "MMM": _MONTHS[moment.month - 1][:3],
        "MM": f"{moment.month:02d}",
        "M": str(moment.month),
        "DD": f"{moment.day:02d}",
        "D": str(moment.day),
        "EEEE": _DAYS[moment.weekday()],
        "EEE": _DAYS[moment.weekday()][:3],
        "hh": f"{moment.hour:02d}",
        "h": str(moment.hour),
        "HH": f"{hour12:02d}",
        "H": str(hour12),
        "AA": "PM" if moment.hour >= 12 else "AM",
        "aa": "pm" if moment.hour >= 12 else "am",
        "mm": f"{moment.minute:02d}",
        "m": str(moment.minute),
        "ss": f"{moment.second:02d}",
        "s": str(moment.second),
        "ZZZZZ": _offset(offset, colon=True, z=False),
        "ZZZZ": _offset(offset, colon=False, z=False),
        "ZZZ": "UTC" if not offset else _offset(offset, colon=False, z=False),
        "Z": _offset(offset, colon=True, z=True),
    }
    if seq not in parts:
        raise ValueError(f"formatdate(): invalid date format sequence {quote(seq)}")
    return parts[seq]


def formatdate(spec: Any, timestamp: Any) -> str:
    """Terraform's formatdate: letter runs are fields, 'quoted' text is literal, '' is a quote."""
    fmt, moment = to_string(spec), parse_timestamp(timestamp, "formatdate")
    out: list[str] = []
    i = 0
    while i < len(fmt):
        ch = fmt[i]
        if ch == "'":
            if fmt.startswith("''", i):
                out.append("'")
                i += 2
                continue
            j = i + 1
            while True:
                if j >= len(fmt):
                    raise ValueError("formatdate(): a quoted literal is not closed")
                if fmt.startswith("''", j):
                    out.append("'")
                    j += 2
                elif fmt[j] == "'":
                    break
                else:
                    out.append(fmt[j])
                    j += 1
            i = j + 1
        elif ch.isascii() and ch.isalpha():
            j = i
            while j < len(fmt) and fmt[j] == ch:
                j += 1
            out.append(_part(fmt[i:j], moment))
            i = j
        else:
            out.append(ch)
            i += 1
    return "".join(out)


TIME_FUNCTIONS = {
    "formatdate": formatdate,
    "timeadd": timeadd,
    "timestamp": lambda: rfc3339(datetime.now(UTC)),
}
