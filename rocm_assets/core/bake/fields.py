"""A target's fields as bake decodes, merges, normalises and prints them (bake/bake.go Target).

`decode` converts an attribute's value to its Go field type as bake's HCL decoder does (numbers
and bools to strings, "true" to a bool), `merge` is Target.Merge, `normalize` Target.normalize,
`entry` the --print entry. The builtin writes buildx 0.29's answer; where 0.13.1 prints another
(a duplicate cache entry, an empty dockerfile) it refuses rather than pick one.
"""

from collections.abc import Callable
from typing import Any

from rocm_assets.core.bake.errors import Unfollowed
from rocm_assets.core.bake.evaluator import Evaluator
from rocm_assets.core.bake.limits import quote
from rocm_assets.core.bake.printed import PrintShapeError, cache_entry, canonical, output_entry
from rocm_assets.core.bake.values import to_bool, to_string, type_name

Value = Any

# Field kinds, by bake's Go type and merge rule.
STRINGS = ("context", "dockerfile", "dockerfile-inline", "target", "shm-size")
REPLACED_LISTS = ("tags", "platforms", "cache-to", "output")
APPENDED_LISTS = ("annotations", "cache-from", "no-cache-filter", "ulimits", "inherits")
NULLABLE_MAPS = ("args", "labels")
BOOLS = ("pull", "no-cache")
# Fields bake reads but this resolver does not follow: their parsing moves between releases, or
# buildx 0.13.1 ignores them silently (it ignores any attribute it does not know) where 0.29
# reads them, so the two print different targets.
UNFOLLOWED = (
    "attest", "secret", "ssh", "description", "call", "entitlements", "network", "extra-hosts",
    "policy", "resources",
)  # fmt: skip
CACHES = ("cache-from", "cache-to")
# Fields `target.<name>.<field>` is followed for, with what they decode to.
REFERABLE = frozenset({*STRINGS, "tags", "platforms", "args", "labels", "contexts", "inherits"})
# Every attribute a bake reads; the others (a typo) bake ignores without evaluating them.
KNOWN = frozenset(
    {*STRINGS, *REPLACED_LISTS, *APPENDED_LISTS, *NULLABLE_MAPS, *BOOLS, *UNFOLLOWED, "contexts"}
)


def _string(value: Value, what: str) -> str:
    if isinstance(value, list | dict):
        raise ValueError(f"{what}: string required, not a {type_name(value)}")
    return to_string(value)


def _strings(value: Value, what: str) -> list[str]:
    if not isinstance(value, list):
        raise ValueError(f"{what}: list of string required, not a {type_name(value)}")
    if any(v is None for v in value):
        raise Unfollowed(f"{what} with a null element")
    return [_string(v, what) for v in value]


def _map(value: Value, what: str, nullable: bool) -> dict[str, str | None]:
    if not isinstance(value, dict):
        raise ValueError(f"{what}: map of string required, not a {type_name(value)}")
    if not nullable and any(v is None for v in value.values()):
        raise Unfollowed(f"{what} with a null value")
    return {k: None if v is None else _string(v, what) for k, v in value.items()}


def _bool(value: Value, what: str) -> bool:
    if isinstance(value, str | bool):
        return to_bool(value)
    raise ValueError(f"{what}: bool required, not a {type_name(value)}")


def _entries(value: Value, what: str, attr: str) -> list[str]:
    """A cache or output list: CSV strings only (objects are buildx >= 0.19's form)."""
    if not isinstance(value, list):
        raise ValueError(f"{what}: list required, not a {type_name(value)}")
    out = []
    for item in value:
        if isinstance(item, dict):
            raise Unfollowed(f"{what} entry written as an object")
        text = _string(item, what) if item is not None else ""
        if text == "":
            continue  # both releases drop an empty entry
        if '"' in text or (attr != "output" and "," in text and "=" not in text):
            raise Unfollowed(f"{what} entry {quote(text)} (buildx releases split it differently)")
        try:
            (output_entry if attr == "output" else cache_entry)(text)
        except PrintShapeError as exc:
            raise Unfollowed(f"{what}: {exc} (0.13.1 prints it, 0.29 refuses it)") from None
        out.append(text)
    return out


def decode(ev: Evaluator, name: str, attr: str, value: Value, rule: Any) -> Value:
    """An attribute's value as bake's decoder puts it in the Target struct; None when unset."""
    what = f"target {quote(name)}: {attr}"
    if attr in UNFOLLOWED:
        raise Unfollowed(f"target {name!r}: attribute {attr!r}")
    if value is None:
        return None
    try:
        if attr in STRINGS:
            return _string(value, what)
        if attr in ("output", *CACHES):
            return _entries(value, what, attr)
        if attr in REPLACED_LISTS or attr in APPENDED_LISTS:
            return _strings(value, what)
        if attr in NULLABLE_MAPS:
            return _map(value, what, nullable=True)
        if attr == "contexts":
            return _map(value, what, nullable=False)
        if attr in BOOLS:
            return _bool(value, what)
    except ValueError as exc:
        raise ev.error(str(exc), rule) from None
    raise ValueError(f"target {name!r}: {attr} is not a field bake reads")


def referable(ev: Evaluator, name: str, attr: str, value: Value, rule: Any) -> Value:
    """`target.<name>.<attr>`'s value: the decoded field, as bake puts it back in HCL."""
    if attr not in REFERABLE:
        raise Unfollowed(f"target.{name}.{attr}")
    decoded = decode(ev, name, attr, value, rule)
    if isinstance(decoded, dict) and any(v is None for v in decoded.values()):
        raise Unfollowed(f"target.{name}.{attr} with a null value")
    return decoded


def _duplicates(items: list[str], attr: str) -> None:
    """Both releases drop a repeated cache or output entry, but 0.29 compares the parsed
    entries and reorders the rest (removeDupes swaps): refused rather than emulated."""
    parse = output_entry if attr == "output" else cache_entry
    seen = [parse(item) for item in items]
    if any(entry in seen[:i] for i, entry in enumerate(seen)):
        raise Unfollowed(f"a repeated {attr} entry (buildx releases drop different ones)")


def merge(into: dict[str, Value], other: dict[str, Value]) -> None:
    """bake's Target.Merge: `other`'s set fields over `into`'s."""
    for attr, value in other.items():
        if value is None:
            continue
        if attr in ("output", "cache-to") and not value and into.get(attr):
            # 0.29 normalises an empty list away and keeps the inherited one; 0.13.1 does not.
            raise Unfollowed(f"an empty {attr} over an inherited one (buildx releases differ)")
        if attr in NULLABLE_MAPS:
            into[attr] = {**into.get(attr, {}), **{k: v for k, v in value.items() if v is not None}}
        elif attr == "contexts":
            into[attr] = {**into.get(attr, {}), **value}
        elif attr in APPENDED_LISTS:
            into[attr] = [*into.get(attr, []), *value]
            if attr == "cache-from":
                _duplicates(into[attr], attr)
        else:
            into[attr] = value


def _dedupe(items: list[str]) -> list[str]:
    return list(dict.fromkeys(v for v in items if v != ""))


def normalize(target: dict[str, Value]) -> None:
    """bake's Target.normalize: lists without repeats or empty strings, no empty contexts."""
    for attr in ("annotations", "tags", "platforms", "no-cache-filter", "ulimits"):
        if attr in target:
            target[attr] = _dedupe(target[attr])
    for attr in ("output", *CACHES):
        if attr in target:
            _duplicates(target[attr], attr)
    if "contexts" in target:
        target["contexts"] = {k: v for k, v in target["contexts"].items() if v != ""}


_PARSERS: dict[str, Callable[[str], dict]] = {
    "cache-from": cache_entry,
    "cache-to": cache_entry,
    "output": output_entry,
}


def entry(target: dict[str, Value]) -> dict:
    """The target as `--print` prints it (canonical), after ResolveTarget's defaults."""
    printed = {k: v for k, v in target.items() if k != "inherits"}
    if printed.get("dockerfile") == "":
        raise Unfollowed('dockerfile = "" (0.13.1 prints it empty, 0.29 as Dockerfile)')
    printed.setdefault("dockerfile", "Dockerfile")
    if printed.get("context") in (None, ""):
        printed["context"] = "."
    for attr, parse in _PARSERS.items():
        if attr in printed:
            printed[attr] = [parse(text) for text in printed[attr]]
    return canonical(printed)
