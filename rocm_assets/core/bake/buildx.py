"""Bake itself resolves the file: `docker buildx bake --print`, once per environment, in parallel.

The seed's depgraph asks bake, and so does this: bake is the only evaluator of the file.

One call answers everything the graph needs for one environment. A second file (the probe) is
passed after the farm's: a group of every target and group the file declares, and a target whose
args are bake's `jsonencode` of every top-level value (GPU_ARCHES, TEST_TARGETS, PUB_*), so no
value is ever computed here. Answers are cached on disk by everything that decides them (the
buildx binary, the files' bytes, the variables' values from the environment).
"""

import concurrent.futures
import contextlib
import json
import os
import re
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rocm_assets.core.bake.errors import BakeError
from rocm_assets.core.bake.source import Outline
from rocm_assets.core.common.buildx import Buildx
from rocm_assets.core.common.cache import cache_dir, digest, read_json, write_json
from rocm_assets.core.common.constants import ARCH_LIST_ATTR, ARCH_VAR
from rocm_assets.core.common.text import quote

# Variable validation arrived in buildx 0.19 (bake: basic variable validation).
VALIDATION_SINCE = (0, 19)
# The arch check bake runs where it can: a variable whose validation refuses an unknown GPU_ARCH.
# A separate file, because older buildx rejects `validation` (and the shipped files must load).
ARCH_CHECK_FILE = Path(__file__).with_name("arch_check.hcl")
PRINT_TIMEOUT_S = 30.0
# bake's error line: `ERROR: file.hcl:21,30-40: Summary; detail`.
_ERROR = re.compile(r"^ERROR: (?:(?P<file>[^\s:][^:]*):(?P<line>\d+)(?:,[\d-]+)*: )?(?P<msg>.*)$")
# Functions whose results change from call to call: a file using them is never cached.
_UNSTABLE = re.compile(r"\b(timestamp|uuidv4|uuid)\s*\(")
# Environment bake reads besides the file's own variables.
_BAKE_ENV_PREFIXES = ("BUILDX_BAKE_", "BAKE_")
# What must not reach a --print: it would add files or a remote definition to the invocation.
_DROPPED_ENV = ("BUILDX_BAKE_FILE", "BUILDX_BAKE_PATH_SEPARATOR")


def error_line(stderr: str, path: Path, env: Mapping[str, str]) -> BakeError:
    """Bake's own `ERROR:` line as one BakeError naming the file and line it names."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    found = next((m for m in map(_ERROR.match, reversed(lines)) if m), None)
    if found is None:
        last = lines[-1] if lines else "no output"
        return BakeError(f"docker buildx bake --print failed: {quote(last, 300)[1:-1]}", path=path)
    named = Path(found["file"]).name if found["file"] else path.name
    if named == ARCH_CHECK_FILE.name:
        # The arch check's own file and line mean nothing to the user: the arch is what to fix.
        arch = env.get(ARCH_VAR, "")
        return BakeError(f"docker buildx bake: {ARCH_VAR}={arch}: {found['msg']}", path=path)
    line = int(found["line"]) if found["line"] and named == path.name else None
    if line is None and not found["file"]:
        line = _locate(found["msg"], path)
    return BakeError(f"docker buildx bake: {found['msg']}", path=path, line=line)


# Bake errors that name no line, and what in the file they are about.
# A missing target is a `target:` link, else a group's member.
_ABOUT = (
    (re.compile(r"failed to find target (\S+)"), lambda m: (f'"target:{m[1]}"', f'"{m[1]}"')),
    (re.compile(r"infinite loop from (\S+) to (\S+)"), lambda m: (f'target "{m[1]}"',)),
)


def _locate(message: str, path: Path) -> int | None:
    """The line of the file that a line-less bake error is about, where it says."""
    for pattern, needle in _ABOUT:
        match = pattern.search(message)
        if match:
            with contextlib.suppress(OSError, UnicodeDecodeError):
                lines = path.read_text().splitlines()
                for wanted in needle(match):
                    for number, text in enumerate(lines, start=1):
                        if wanted in text:
                            return number
    return None


# The probe's names: a file that declares either is refused (`model`).
VALUES_TARGET = "rocm-assets-values"
ALL_GROUP = "rocm-assets-all"


def bake_env(outline: Outline, env: Mapping[str, str]) -> dict[str, str]:
    """The environment values bake reads: the file's variables, bake's own settings, HOME."""
    return {
        k: v
        for k, v in env.items()
        if k in outline.variables or k.startswith(_BAKE_ENV_PREFIXES) or k == "HOME"
    }


def requested(outline: Outline) -> list[str]:
    """The names asked for: the probe's group, and the empty groups, which must not be nested."""
    return [ALL_GROUP, *outline.empty_groups]


def probe_text(outline: Outline) -> str:
    """The second file: one group of everything the file declares, one target of its values."""
    values = "".join(f'    "{name}" = jsonencode({name})\n' for name in outline.values)
    members = [
        VALUES_TARGET,
        *(n for n in outline.targets if not n.startswith("_")),
        *(g for g in outline.groups if g not in outline.empty_groups),
    ]
    return (
        "# Written by rocm-assets for `docker buildx bake --print`: bake's values of the names\n"
        f"# {outline.path.name} declares, and all its targets and groups in one request.\n"
        f'target "{VALUES_TARGET}" {{\n  args = {{\n{values}  }}\n}}\n'
        f'group "{ALL_GROUP}" {{\n  targets = {json.dumps(members)}\n}}\n'
    )


class BakePrinter:
    """Runs `bake --print` for a bake file under several environments, with an on-disk cache."""

    def __init__(self, buildx: Buildx, outline: Outline, *, env: Mapping[str, str] | None = None):
        self.buildx = buildx
        self.outline = outline
        self.env = dict(os.environ if env is None else env)
        text = probe_text(outline)
        probe = cache_dir(self.env) / "probe" / f"{digest(text)}.hcl"
        if not probe.is_file():
            try:
                probe.parent.mkdir(parents=True, exist_ok=True)
                partial = probe.with_name(f".{probe.name}.{os.getpid()}")
                partial.write_text(text, encoding="utf-8")
                os.replace(partial, probe)
            except OSError as exc:
                raise BakeError(
                    f"cannot write bake's probe file {probe}: {exc.strerror or exc} (set "
                    "ROCM_CACHE_DIR to a writable directory)",
                    path=outline.path,
                ) from None
        self.files = [outline.path.resolve()]
        if buildx.version >= VALIDATION_SINCE and {ARCH_VAR, ARCH_LIST_ATTR} <= set(
            outline.variables
        ):
            self.files.append(ARCH_CHECK_FILE)
        self.files.append(probe)
        # Read once: every call of this printer answers for these bytes.
        contents = [f.read_bytes() for f in self.files]
        self._files_digest = digest(*contents)
        self._cacheable = not _UNSTABLE.search(contents[0].decode("utf-8", errors="replace"))

    def _key(self, env: Mapping[str, str]) -> str:
        return digest(
            self.buildx.identity(),
            self._files_digest,
            json.dumps(sorted(bake_env(self.outline, env).items())),
            str(self.outline.path.parent.resolve()),
        )

    def _run(self, given: Mapping[str, str]) -> dict:
        env = {k: v for k, v in given.items() if k not in _DROPPED_ENV}
        memo = cache_dir(self.env) / "bake-print" / f"{self._key(env)}.json"
        cached = read_json(memo) if self._cacheable else None
        if isinstance(cached, dict):
            return cached
        argv = [str(self.buildx.path), "bake"]
        for file in self.files:
            argv += ["-f", str(file)]
        argv += ["--print", "--progress=quiet", "--", *requested(self.outline)]
        try:
            out = subprocess.run(
                argv,
                env=env,
                cwd=self.outline.path.parent,
                capture_output=True,
                text=True,
                errors="replace",
                timeout=PRINT_TIMEOUT_S,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise BakeError(
                f"docker buildx bake --print did not finish in {PRINT_TIMEOUT_S:.0f} s",
                path=self.outline.path,
            ) from None
        except OSError as exc:
            raise BakeError(
                f"cannot run {self.buildx.path}: {exc.strerror or exc}", path=self.outline.path
            ) from None
        if out.returncode != 0:
            raise error_line(out.stderr, self.outline.path, env)
        try:
            data = json.loads(out.stdout)
        except ValueError:
            raise BakeError(
                "docker buildx bake --print wrote no JSON", path=self.outline.path
            ) from None
        if not isinstance(data, dict) or not isinstance(data.get("target"), dict):
            raise BakeError(
                "docker buildx bake --print wrote JSON of another shape", path=self.outline.path
            )
        if self._cacheable:
            write_json(memo, data)
        return data

    def print_many(self, envs: Sequence[Mapping[str, str]]) -> list[dict[str, Any]]:
        """`--print`'s JSON for each environment (bake's whole environment for that call: PATH,
        HOME, the variables); the calls run concurrently."""
        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, len(envs))) as pool:
            return list(pool.map(self._run, envs))


def bake_verdict(buildx: Buildx, path: Path, env: Mapping[str, str]) -> None:
    """Bake's own verdict on a file python-hcl2 could not parse: its error, if it has one."""
    env = {k: v for k, v in env.items() if k not in _DROPPED_ENV}
    with contextlib.suppress(OSError, subprocess.TimeoutExpired):
        out = subprocess.run(
            [str(buildx.path), "bake", "-f", str(path.resolve()), "--print", "--progress=quiet"],
            env=env,
            cwd=path.parent,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=PRINT_TIMEOUT_S,
            check=False,
        )
        if out.returncode != 0:
            raise error_line(out.stderr, path, env)
