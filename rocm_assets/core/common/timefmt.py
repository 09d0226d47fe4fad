"""Time as the farm prints it: one duration format, one timestamp format for run tags."""

import re
from datetime import UTC, datetime

_ISO = "%Y-%m-%dT%H:%M:%SZ"
_RFC3339 = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)$")


def duration(seconds: float) -> str:
    """`45s`, `12m03s`, `2h05m`: compact enough for a line per node or a plan table."""
    s = max(int(seconds), 0)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def to_iso(ts: float) -> str:
    """Epoch seconds as the `rocm/est_*` tags write them (UTC, to the second)."""
    return datetime.fromtimestamp(ts, UTC).strftime(_ISO)


def from_iso(text: str | None) -> float | None:
    """Epoch seconds from an `rocm/est_*` tag; None when absent or unreadable."""
    if not text:
        return None
    try:
        return datetime.strptime(text, _ISO).replace(tzinfo=UTC).timestamp()
    except ValueError:
        return None


def from_rfc3339(text: str | None) -> float | None:
    """Epoch seconds from BuildKit's RFC 3339 time (nanoseconds cut to Python's microseconds);
    None when absent or unreadable."""
    match = _RFC3339.match(text or "")
    if match is None:
        return None
    zone = "+00:00" if match[3] == "Z" else match[3]
    return datetime.fromisoformat(f"{match[1]}.{(match[2] or '')[:6]:0<6}{zone}").timestamp()
