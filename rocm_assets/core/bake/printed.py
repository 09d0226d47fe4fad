"""Targets in the shape `docker buildx bake --print` prints them, whichever buildx printed them.

Bake 0.13 and 0.29 print the same answer in different shapes; `canonical` reads either, so
`rocm-assets graph --json` and the graph itself see one shape. Representation only is normalised:

- `cache-from`, `cache-to` and `output` are objects (buildx >= 0.19 prints them so; older ones
  print the CSV strings they were written as, which are parsed as buildx parses them);
- `args`, `labels`, `annotations`, `extra-hosts` and `dockerfile-inline` hold the values
  themselves (buildx >= 0.23 prints `${` as `$${` and `%{` as `%%{` there, so the JSON can be fed
  back to bake);
- keys come in `--print`'s order, and empty fields are left out, as buildx leaves them out.
"""

import csv
from collections.abc import Mapping
from typing import Any

# buildx's Target struct, in its JSON field order (bake/bake.go).
PRINT_KEYS = (
    "description", "annotations", "attest", "context", "contexts", "dockerfile",
    "dockerfile-inline", "args", "labels", "tags", "cache-from", "cache-to", "target", "secret",
    "ssh", "platforms", "output", "pull", "no-cache", "network", "no-cache-filter", "shm-size",
    "ulimits", "resources", "call", "entitlements", "extra-hosts", "policy",
)  # fmt: skip
# Fields whose string values buildx >= 0.23 escapes in --print (Target.MarshalJSON).
ESCAPED_MAPS = ("args", "labels", "extra-hosts")
ESCAPED_LISTS = ("annotations",)
ESCAPED_STRINGS = ("dockerfile-inline",)
ESCAPING_SINCE = (0, 23)
# Printed as objects since buildx 0.19; CSV strings before.
OBJECT_LISTS = ("cache-from", "cache-to", "output")


class PrintShapeError(ValueError):
    """A --print entry this module cannot read: the message names the field."""


def _fields(text: str) -> list[str]:
    """A CSV line split as Go's encoding/csv (buildx's csvvalue) splits it: quotes group."""
    try:
        return next(csv.reader([text], strict=True))
    except (csv.Error, StopIteration) as exc:
        raise PrintShapeError(f"cannot split {text!r} as CSV: {exc}") from None


def cache_entry(text: str) -> dict[str, str]:
    """A `cache-from`/`cache-to` string as buildx's CacheOptionsEntry.UnmarshalText reads it."""
    fields = _fields(text)
    if len(fields) == 1 and "=" not in fields[0]:
        return {"ref": fields[0], "type": "registry"}
    entry: dict[str, str] = {}
    for field in fields:
        key, eq, value = field.partition("=")
        if not eq:
            raise PrintShapeError(f"cache entry {text!r}: field {field!r} has no '='")
        entry[key.lower()] = value
    if not entry.get("type"):
        raise PrintShapeError(f"cache entry {text!r} has no type")
    return dict(sorted(entry.items()))


def output_entry(text: str) -> dict[str, str]:
    """An `output` string as buildx's ExportEntry.UnmarshalText reads it."""
    fields = _fields(text)
    if len(fields) == 1 and fields[0] == text and not text.startswith("type="):
        return {"dest": text, "type": "tar" if text == "-" else "local"}
    entry: dict[str, str] = {}
    for field in fields:
        key, eq, value = field.partition("=")
        if not eq:
            raise PrintShapeError(f"output {text!r}: field {field!r} has no '='")
        entry[key.strip().lower()] = value
    return dict(sorted(entry.items()))


def _objects(key: str, value: Any) -> list[dict[str, str]]:
    if not isinstance(value, list):
        raise PrintShapeError(f"{key} is not a list")
    parse = output_entry if key == "output" else cache_entry
    out = []
    for item in value:
        if isinstance(item, str):
            out.append(parse(item))
        elif isinstance(item, dict):
            out.append({str(k): str(v) for k, v in sorted(item.items())})
        else:
            raise PrintShapeError(f"{key} holds a {type(item).__name__}")
    return out


def _unescape(text: str) -> str:
    return text.replace("$${", "${").replace("%%{", "%{")


def canonical(entry: Mapping[str, Any], *, version: tuple[int, ...] | None = None) -> dict:
    """One target of `--print`'s JSON, printed by buildx `version` (None: the newest shape)."""
    escaped = version is None or version >= ESCAPING_SINCE
    out: dict[str, Any] = {}
    for key in PRINT_KEYS:
        value = entry.get(key)
        if value is None or value in ("", [], {}):
            continue
        if key in OBJECT_LISTS:
            value = _objects(key, value)
        elif escaped and key in ESCAPED_MAPS and isinstance(value, dict):
            value = {k: _unescape(v) if isinstance(v, str) else v for k, v in value.items()}
        elif escaped and key in ESCAPED_LISTS and isinstance(value, list):
            value = [_unescape(v) if isinstance(v, str) else v for v in value]
        elif escaped and key in ESCAPED_STRINGS and isinstance(value, str):
            value = _unescape(value)
        if isinstance(value, dict) and key in ("args", "labels", "extra-hosts"):
            # A null arg is no arg: the Dockerfile's own default applies.
            value = {k: v for k, v in sorted(value.items()) if v is not None}
            if not value:
                continue
        elif isinstance(value, dict):
            value = dict(sorted(value.items()))
        out[key] = value
    return out
