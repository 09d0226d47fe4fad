"""The buildx installed here: the binary `docker buildx` runs, and its version.

Bake's `--print` (core/bake) and every build (core/build) run it directly, found where the docker
CLI finds plugins, since the CLI's own start-up doubles the cost of a call.
"""

import contextlib
import json
import os
import re
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from rocm_assets.core.common.cache import cache_dir, digest, read_json, write_json

# Where the docker CLI looks for plugins after the config dir's cli-plugins (docker/cli's
# cli-plugins/manager: defaultSystemPluginDirs), in its order.
SYSTEM_PLUGIN_DIRS = (
    "/usr/local/lib/docker/cli-plugins",
    "/usr/local/libexec/docker/cli-plugins",
    "/usr/lib/docker/cli-plugins",
    "/usr/libexec/docker/cli-plugins",
)
PLUGIN_NAME = "docker-buildx"
# Set to a buildx binary to use that one instead of the docker CLI's plugin.
BUILDX_ENV = "ROCM_BUILDX"
_VERSION_TIMEOUT_S = 20.0
_VERSION = re.compile(r"\bv?(\d+)\.(\d+)(?:\.(\d+))?")


class BuildxError(ValueError):
    """$ROCM_BUILDX names no working buildx."""


@dataclass(frozen=True)
class Buildx:
    """One buildx binary and the version it reports."""

    path: Path
    version: tuple[int, int, int]
    text: str

    @property
    def version_text(self) -> str:
        return ".".join(map(str, self.version))

    def identity(self) -> str:
        """What the cache keys on: a replaced binary is a different resolver."""
        stat = self.path.stat()
        return f"{self.path}:{stat.st_size}:{stat.st_mtime_ns}:{self.text}"


def parse_version(text: str) -> tuple[int, int, int] | None:
    """(major, minor, patch) from `docker buildx version` (`github.com/docker/buildx 0.29.1+ds1 ...`)."""
    for word in text.split()[1:] or text.split():
        match = _VERSION.match(word)
        if match:
            return (int(match[1]), int(match[2]), int(match[3] or 0))
    return None


def plugin_dirs(env: Mapping[str, str]) -> list[Path]:
    """The docker CLI's plugin search path: the config dir's, its extra dirs, then the system's."""
    config = Path(env.get("DOCKER_CONFIG") or Path(env.get("HOME") or "~").expanduser() / ".docker")
    dirs = [config / "cli-plugins"]
    with contextlib.suppress(OSError, ValueError):
        extra = json.loads((config / "config.json").read_text(encoding="utf-8"))
        dirs += [Path(d) for d in extra.get("cliPluginsExtraDirs") or () if isinstance(d, str)]
    return dirs + [Path(d) for d in SYSTEM_PLUGIN_DIRS]


def _version_text(path: Path, env: Mapping[str, str]) -> str | None:
    """`buildx version`'s answer, remembered per binary (path, inode, size, mtime) in the cache
    dir: asking costs a process start (50 ms) on every code-location load."""
    try:
        stat = path.stat()
    except OSError:
        return None
    memo = (
        cache_dir(env)
        / "buildx-version"
        / f"{digest(str(path.resolve()), *map(str, (stat.st_ino, stat.st_size, stat.st_mtime_ns)))}.json"
    )
    remembered = read_json(memo)
    if isinstance(remembered, str):
        return remembered
    try:
        out = subprocess.run(
            [str(path), "version"],
            capture_output=True,
            text=True,
            timeout=_VERSION_TIMEOUT_S,
            check=False,
            env=dict(env),
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    text = out.stdout.strip()
    if out.returncode != 0 or parse_version(text) is None:
        return None
    write_json(memo, text)
    return text


def find_buildx(env: Mapping[str, str] | None = None) -> Buildx | None:
    """The buildx `docker buildx` would run here (or $ROCM_BUILDX), or None when there is none."""
    env = os.environ if env is None else env
    chosen = env.get(BUILDX_ENV)
    candidates = [Path(chosen)] if chosen else [d / PLUGIN_NAME for d in plugin_dirs(env)]
    for path in candidates:
        if not os.access(path, os.X_OK):
            continue
        text = _version_text(path, env)
        version = parse_version(text) if text else None
        if text and version:
            return Buildx(path, version, text)
    if chosen:
        raise BuildxError(f"{BUILDX_ENV}={chosen} is not a working buildx binary")
    return None
