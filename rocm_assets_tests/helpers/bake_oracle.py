"""Real bake as the oracle for the builtin resolver, shared by the differential and regression tests.

Real: both buildx binaries (0.29.1, Debian testing's, and 0.13.1, Debian stable's) run
`bake --print` directly as plugin binaries; `--print` needs no engine. test_bake_oracle checks
that the two binaries are there and are the versions the comparisons assume.

`judge` runs the builtin resolver and both bakes on one file and environment and says, per
buildx version, which allowed outcome it was (equal answers, a refusal, both failing, or a bake
too old for a feature the file uses), or fails with the file, the environment and both answers.
"""

import concurrent.futures
import functools
import json
import os
import re
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from rocm_assets.core.bake import BakeError, NeedsBuildx, load_bake, resolve
from rocm_assets.core.bake.features import minimum
from rocm_assets.core.bake.printed import PrintShapeError, canonical

# (env var naming the binary, its default path, the release line it must be of: testing's
# 0.29 or a later one, Debian 13's 0.13).
BUILDX_BINARIES = {
    "new": ("ROCM_TEST_BUILDX_NEW", "/usr/libexec/docker/cli-plugins/docker-buildx", (0, 29)),
    "old": ("ROCM_TEST_BUILDX_OLD", "/opt/rocm-assets/buildx-0.13/docker-buildx", (0, 13)),
}
PRINT_TIMEOUT_S = 60.0
_VERSION = re.compile(r"\bv?(\d+)\.(\d+)\.(\d+)")
_TARGET_LABEL = re.compile(r'^\s*target\s+"([^"]+)"', re.MULTILINE)

# Outcomes a comparison may end in.
EXACT = "exact"
REFUSED = "refused"  # bake answered, the builtin refused
REFUSED_BAKE_FAILED = "refused-bake-failed"
BOTH_FAILED = "both-failed"
TOO_OLD = "bake-too-old"


@dataclass(frozen=True)
class Buildx:
    path: str
    version: tuple[int, int, int]

    @property
    def label(self) -> str:
        return ".".join(map(str, self.version))


@functools.cache
def buildx_binaries() -> tuple[Buildx, ...]:
    """Both buildx binaries, newest first; a missing one fails the test (never skips it)."""
    found = []
    for env, default, want in BUILDX_BINARIES.values():
        path = os.environ.get(env) or default
        if not os.access(path, os.X_OK):
            pytest.fail(f"no buildx at {path} (${env}): run .ci/setup to install it", pytrace=False)
        out = subprocess.run(
            [path, "version"], capture_output=True, text=True, timeout=30, check=False
        )
        match = _VERSION.search(out.stdout)
        version = tuple(map(int, match.groups())) if match else None
        good = version is not None and (
            version[:2] >= want if want >= (0, 29) else version[:2] == want
        )
        if out.returncode != 0 or not good:
            pytest.fail(
                f"{path} (${env}) reports {out.stdout.strip()!r}, not buildx "
                f"{'.'.join(map(str, want))}: run .ci/setup to install it",
                pytrace=False,
            )
        found.append(Buildx(path, version))  # type: ignore[arg-type]
    return tuple(found)


@dataclass(frozen=True)
class BakeAnswer:
    """One bake's `--print`: the targets it printed (canonical), or its error line."""

    targets: dict[str, dict] | None
    error: str = ""


def bake_print(
    buildx: Buildx, path: Path, names: Sequence[str], env: Mapping[str, str]
) -> BakeAnswer:
    argv = [buildx.path, "bake", "-f", path.name, "--print", "--progress=quiet", "--", *names]
    # Only the file's variables and what a process needs: no BUILDX_* or SOURCE_DATE_EPOCH.
    full_env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(path.parent), **env}
    out = subprocess.run(
        argv,
        cwd=path.parent,
        env=full_env,
        capture_output=True,
        text=True,
        errors="replace",
        timeout=PRINT_TIMEOUT_S,
        check=False,
    )
    if out.returncode != 0:
        lines = [line for line in out.stderr.splitlines() if line.strip()]
        return BakeAnswer(None, lines[-1] if lines else f"exit {out.returncode}")
    printed = json.loads(out.stdout).get("target") or {}
    try:
        return BakeAnswer(
            {name: canonical(entry, version=buildx.version) for name, entry in printed.items()}
        )
    except PrintShapeError as exc:
        # 0.13.1 prints cache and output entries as written, parsed or not: no answer to compare.
        return BakeAnswer(None, f"unreadable --print: {exc}")


@dataclass(frozen=True)
class BuiltinAnswer:
    """The builtin resolver's targets for the requested names, or the error it raised."""

    targets: dict[str, dict] | None
    error: BakeError | None = None


def builtin_print(path: Path, names: Sequence[str], env: Mapping[str, str]) -> BuiltinAnswer:
    try:
        resolved = resolve(load_bake(path), env)
        wanted = resolved.expand(names)
    except BakeError as exc:
        return BuiltinAnswer(None, exc)
    return BuiltinAnswer({name: dict(resolved.targets[name].printed) for name in wanted})


def target_names(text: str) -> list[str]:
    """The non-private target block labels, as the farm asks bake for them."""
    return list(dict.fromkeys(n for n in _TARGET_LABEL.findall(text) if not n.startswith("_")))


def _linked(targets: Mapping[str, dict]) -> set[str]:
    return {
        value.removeprefix("target:")
        for entry in targets.values()
        for value in (entry.get("contexts") or {}).values()
        if value.startswith("target:")
    }


def outcome(buildx: Buildx, builtin: BuiltinAnswer, bake: BakeAnswer, needs: Any) -> str | None:
    """The allowed outcome of one comparison, or None for a disagreement."""
    if isinstance(builtin.error, NeedsBuildx):
        return REFUSED if bake.targets is not None else REFUSED_BAKE_FAILED
    if bake.targets is None:
        if builtin.targets is None:
            return BOTH_FAILED
        return TOO_OLD if needs is not None and needs.version > buildx.version else None
    if builtin.targets is None:
        return None
    # Bake adds the targets the requested ones link to (output cacheonly): not compared.
    extra = set(bake.targets) - set(builtin.targets)
    if builtin.targets != {k: v for k, v in bake.targets.items() if k in builtin.targets}:
        return None
    return EXACT if extra <= _linked(bake.targets) else None


def judge(text: str, env: Mapping[str, str], names: Sequence[str] | None = None) -> dict[str, str]:
    """Per buildx version, the allowed outcome for this file and environment; fails otherwise."""
    binaries = buildx_binaries()
    names = list(names) if names is not None else target_names(text)
    with tempfile.TemporaryDirectory(prefix="bake-diff-") as tmp:
        path = Path(tmp) / "docker-bake.hcl"
        path.write_text(text)
        with concurrent.futures.ThreadPoolExecutor(len(binaries)) as pool:
            answers = list(pool.map(lambda b: bake_print(b, path, names, env), binaries))
        builtin = builtin_print(path, names, env)
        try:
            needs = minimum(load_bake(path))
        except BakeError:
            needs = None
        results = {}
        for buildx, bake in zip(binaries, answers, strict=True):
            result = outcome(buildx, builtin, bake, needs)
            if result is None:
                pytest.fail(report(text, env, names, buildx, builtin, bake, needs), pytrace=False)
            results[buildx.label] = result
    return results


def report(
    text: str,
    env: Mapping[str, str],
    names: Sequence[str],
    buildx: Buildx,
    builtin: BuiltinAnswer,
    bake: BakeAnswer,
    needs: Any,
) -> str:
    mine = builtin.targets if builtin.targets is not None else f"ERROR {builtin.error}"
    theirs = bake.targets if bake.targets is not None else f"ERROR {bake.error}"
    return (
        f"builtin and bake {buildx.label} disagree (features minimum: {needs})\n"
        f"--- file ---\n{text}\n--- env: {json.dumps(dict(env))}  targets: {list(names)}\n"
        f"--- builtin ---\n{json.dumps(mine, indent=1, sort_keys=True, default=str)}\n"
        f"--- bake {buildx.label} ---\n{json.dumps(theirs, indent=1, sort_keys=True)}"
    )
