"""Bake's error text read into one BakeError: bake's own message, at the line it is about."""

import contextlib
import re
from collections.abc import Callable, Mapping
from pathlib import Path

from rocm_assets.core.bake.errors import BakeError
from rocm_assets.core.bake.probe import ARCH_CHECK_FILE
from rocm_assets.core.common.constants import ARCH_VAR
from rocm_assets.core.common.text import quote

# bake's error line: `ERROR: file.hcl:21,30-40: Summary; detail`.
_ERROR = re.compile(r"^ERROR: (?:(?P<file>[^\s:][^:]*):(?P<line>\d+)(?:,[\d-]+)*: )?(?P<msg>.*)$")
# Bake errors that name no line, and what in the file they are about.
# A missing target is a `target:` link, else a group's member.
_ABOUT: tuple[tuple[re.Pattern[str], Callable[[re.Match[str]], tuple[str, ...]]], ...] = (
    (re.compile(r"failed to find target (\S+)"), lambda m: (f'"target:{m[1]}"', f'"{m[1]}"')),
    (re.compile(r"infinite loop from (\S+) to (\S+)"), lambda m: (f'target "{m[1]}"',)),
)


def error_from_stderr(stderr: str, path: Path, env: Mapping[str, str]) -> BakeError:
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
