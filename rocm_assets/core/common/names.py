"""The names a bake file gives, checked where they enter: against bake's grammar and Dagster's.

A target or group name becomes an argv word, an asset key, an op name, a job name and a tag key;
a GPU_ARCHES entry becomes a partition key, a tag value, an env value and a path component. Each
is refused here, with its line, when bake or Dagster 1.13 would refuse it or when it could be
read as a flag, so `rocm-assets check` fails instead of the code location.
"""

import keyword
import re

from rocm_assets.core.common.text import quote

# bake's validTargetNameChars (bake/bake.go): every block label and matrix-made target name.
_LABEL = re.compile(r"[A-Za-z0-9_-]+")
# An HCL identifier, ASCII only: a variable or function must be one to be referenced at all.
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")
# Conservative: letters, digits, `-`, `_`, starting with a letter or digit.
_ARCH = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")
# Dagster's tag keys (and the strict tag values a partition key becomes): 63 characters a part.
MAX_TAG_PART = 63
# dagster/_core/definitions/utils.py DISALLOWED_NAMES: refused as op and job names.
_DAGSTER_RESERVED = frozenset(
    {
        "context",
        "conf",
        "config",
        "meta",
        "arg_dict",
        "dict",
        "input_arg_dict",
        "output_arg_dict",
        "int",
        "str",
        "float",
        "bool",
        "input",
        "output",
        "type",
        *keyword.kwlist,
    }
)
# The check every asset target carries (defs/registry_checks.py); its op name ends with it.
_REGISTRY_CHECK_SUFFIX = "_registry_digest_matches"


def label_problem(kind: str, name: str) -> str | None:
    """Why bake (or a shell) would not take `name` as a block label; None when it would."""
    if kind in ("variable", "function"):
        if not _IDENTIFIER.fullmatch(name):
            return (
                f"{kind} name {quote(name)} is not an identifier (a letter or `_`, then letters, "
                "digits, `_` or `-`), so nothing could refer to it"
            )
        return None
    if not _LABEL.fullmatch(name):
        return (
            f"{kind} name {quote(name)} has characters bake refuses: only [a-zA-Z0-9_-] are allowed"
        )
    if name.startswith("-"):
        return f"{kind} name {quote(name)} begins with '-', so bake would read it as a flag"
    return None


def arch_problem(arch: str) -> str | None:
    """Why `arch` cannot be a partition, tag value and env value; None when it can."""
    if not _ARCH.fullmatch(arch):
        return (
            f"GPU arch {quote(arch)} must be letters, digits, '-' and '_', beginning with a letter "
            "or digit"
        )
    if len(arch) > MAX_TAG_PART:
        return f"GPU arch {quote(arch, 20)} is over {MAX_TAG_PART} characters"
    return None


def op_name(target: str) -> str:
    """Dagster's op name for an asset key: every character outside [A-Za-z0-9_] becomes `_`."""
    return re.sub(r"[^A-Za-z0-9_]", "_", target)


def job_name(name: str) -> str:
    """Bake group and target names as Dagster job names (which allow no hyphens)."""
    return name.replace("-", "_")


def dagster_problems(
    asset_targets: dict[str, int],
    test_targets: dict[str, int],
    groups: dict[str, int],
    groupless: set[str],
) -> list[tuple[str, int]]:
    """Names the code location would refuse: (problem, line), in the order found.

    Each argument maps a name to its line. The code location makes: an op per asset target, a
    registry check op per asset, a check op and a job per test target, a job per group, a job
    per asset target in no group, and a tag key `rocm-group/<group>` per group.
    """
    problems: list[tuple[str, int]] = []
    ops: dict[str, str] = {}
    jobs: dict[str, str] = {}

    def claim(seen: dict[str, str], kind: str, derived: str, owner: str, line: int) -> None:
        if derived in _DAGSTER_RESERVED:
            problems.append(
                (f"{owner} would be the Dagster {kind} {quote(derived)}, a reserved name", line)
            )
        elif derived in seen:
            problems.append(
                (
                    f"{owner} and {seen[derived]} would both be the Dagster {kind} {quote(derived)}: "
                    "rename one",
                    line,
                )
            )
        else:
            seen[derived] = owner

    for name, line in asset_targets.items():
        claim(ops, "op", op_name(name), f"target {quote(name)}", line)
        claim(ops, "op", op_name(name) + _REGISTRY_CHECK_SUFFIX, f"target {quote(name)}", line)
    for name, line in test_targets.items():
        claim(ops, "op", job_name(name), f"test target {quote(name)}", line)
        claim(jobs, "job", f"{job_name(name)}_job", f"test target {quote(name)}", line)
    for name, line in groups.items():
        claim(jobs, "job", job_name(name), f"group {quote(name)}", line)
        if len(name) > MAX_TAG_PART:
            problems.append(
                (
                    f"group {quote(name, 20)} is over {MAX_TAG_PART} characters (a Dagster tag key)",
                    line,
                )
            )
    for name, line in asset_targets.items():
        if name in groupless:
            claim(jobs, "job", f"{job_name(name)}_job", f"target {quote(name)}", line)
    return problems
