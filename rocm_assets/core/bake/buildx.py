"""Bake itself resolves the file: `docker buildx bake --print`, once per environment, in parallel.

The seed's depgraph asks bake, and so does this: a hand-written evaluator chasing bake release by
release always lags. The buildx plugin binary is run directly (what `docker buildx` runs, found
where the docker CLI finds plugins), since `--print` needs no engine and the CLI's own start-up
doubles the cost. Results are cached on disk by everything that decides them (the buildx binary,
the files' bytes, the variables' values from the environment), so only the first load after a
change pays for the calls.
"""

import concurrent.futures
import contextlib
import hashlib
import json
import os
import re
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rocm_assets.core.bake.errors import BakeError
from rocm_assets.core.bake.limits import quote
from rocm_assets.core.bake.parse import BakeFile
from rocm_assets.core.bake.printed import PrintShapeError, canonical
from rocm_assets.core.common.constants import ARCH_LIST_ATTR, ARCH_VAR

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
CACHE_DIR_ENV = "ROCM_CACHE_DIR"
# Variable validation arrived in buildx 0.19 (bake: basic variable validation).
VALIDATION_SINCE = (0, 19)
# The arch check bake runs where it can: a variable whose validation refuses an unknown GPU_ARCH.
# A separate file, because older buildx rejects `validation` (and the shipped files must load).
ARCH_CHECK_FILE = Path(__file__).with_name("arch_check.hcl")
PRINT_TIMEOUT_S = 30.0
_VERSION_TIMEOUT_S = 20.0
# bake's error line: `ERROR: file.hcl:21,30-40: Summary; detail`.
_ERROR = re.compile(r"^ERROR: (?:(?P<file>[^\s:][^:]*):(?P<line>\d+)(?:,[\d-]+)*: )?(?P<msg>.*)$")
_VERSION = re.compile(r"\bv?(\d+)\.(\d+)(?:\.(\d+))?")
# Functions whose results change from call to call: a file using them is never cached.
_UNSTABLE = re.compile(r"\b(timestamp|uuidv4|uuid)\s*\(")
# Environment bake reads besides the file's own variables.
_BAKE_ENV_PREFIXES = ("BUILDX_BAKE_", "BAKE_")
# What must not reach a --print: it would add files or a remote definition to the invocation.
_DROPPED_ENV = ("BUILDX_BAKE_FILE", "BUILDX_BAKE_PATH_SEPARATOR")


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
        / hashlib.sha256(
            f"{path.resolve()}:{stat.st_ino}:{stat.st_size}:{stat.st_mtime_ns}".encode()
        ).hexdigest()
    )
    with contextlib.suppress(OSError, UnicodeDecodeError):
        return memo.read_text(encoding="utf-8")
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
    with contextlib.suppress(OSError):
        memo.parent.mkdir(parents=True, exist_ok=True)
        partial = memo.with_name(f".{memo.name}.{os.getpid()}")
        partial.write_text(text, encoding="utf-8")
        os.replace(partial, memo)
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
        raise BakeError(f"{BUILDX_ENV}={chosen} is not a working buildx binary")
    return None


def cache_dir(env: Mapping[str, str]) -> Path:
    chosen = env.get(CACHE_DIR_ENV)
    if chosen:
        return Path(chosen)
    xdg = env.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg else Path(env.get("HOME") or "~").expanduser() / ".cache"
    return base / "rocm-assets"


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
_ABOUT = (
    (re.compile(r"failed to find target (\S+)"), lambda m: f'"target:{m[1]}"'),
    (re.compile(r"infinite loop from (\S+) to (\S+)"), lambda m: f'target "{m[1]}"'),
)


def _locate(message: str, path: Path) -> int | None:
    """The line of the file that a line-less bake error is about, where it says."""
    for pattern, needle in _ABOUT:
        match = pattern.search(message)
        if match:
            with contextlib.suppress(OSError, UnicodeDecodeError):
                for number, text in enumerate(path.read_text().splitlines(), start=1):
                    if needle(match) in text:
                        return number
    return None


class BakePrinter:
    """Runs `bake --print` for a bake file under several environments, with an on-disk cache."""

    def __init__(self, buildx: Buildx, bake: BakeFile, *, env: Mapping[str, str] | None = None):
        self.buildx = buildx
        self.bake = bake
        self.env = dict(os.environ if env is None else env)
        self.files = [bake.path.resolve()]
        if buildx.version >= VALIDATION_SINCE and {ARCH_VAR, ARCH_LIST_ATTR} <= set(bake.variables):
            self.files.append(ARCH_CHECK_FILE)
        self._cacheable = not _UNSTABLE.search(bake.text)

    def _key(self, env: Mapping[str, str], names: Sequence[str]) -> str:
        relevant = {
            k: v
            for k, v in env.items()
            if k in self.bake.variables or k.startswith(_BAKE_ENV_PREFIXES) or k == "HOME"
        }
        digest = hashlib.sha256()
        for part in (
            self.buildx.identity(),
            *(f.read_bytes().hex() for f in self.files),
            json.dumps(sorted(relevant.items())),
            json.dumps(list(names)),
            str(self.bake.path.parent.resolve()),
        ):
            digest.update(part.encode())
            digest.update(b"\0")
        return digest.hexdigest()

    def _cached(self, key: str) -> dict | None:
        if not self._cacheable:
            return None
        with contextlib.suppress(OSError, ValueError):
            data = json.loads((cache_dir(self.env) / "bake-print" / f"{key}.json").read_text())
            if isinstance(data, dict):
                return data
        return None

    def _store(self, key: str, data: dict) -> None:
        if not self._cacheable:
            return
        folder = cache_dir(self.env) / "bake-print"
        # A cache that cannot be written is only slower, never wrong.
        with contextlib.suppress(OSError):
            folder.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-")
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                json.dump(data, handle)
            os.replace(tmp, folder / f"{key}.json")

    def _run(self, given: Mapping[str, str], names: Sequence[str]) -> dict:
        env = {k: v for k, v in given.items() if k not in _DROPPED_ENV}
        key = self._key(env, names)
        cached = self._cached(key)
        if cached is not None:
            return cached
        argv = [str(self.buildx.path), "bake"]
        for file in self.files:
            argv += ["-f", str(file)]
        argv += ["--print", "--progress=quiet", "--", *names]
        try:
            out = subprocess.run(
                argv,
                env=env,
                cwd=self.bake.path.parent,
                capture_output=True,
                text=True,
                errors="replace",
                timeout=PRINT_TIMEOUT_S,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise BakeError(
                f"docker buildx bake --print did not finish in {PRINT_TIMEOUT_S:.0f} s",
                path=self.bake.path,
            ) from None
        except OSError as exc:
            raise BakeError(
                f"cannot run {self.buildx.path}: {exc.strerror or exc}", path=self.bake.path
            ) from None
        if out.returncode != 0:
            raise error_line(out.stderr, self.bake.path, env)
        try:
            data = json.loads(out.stdout)
        except ValueError:
            raise BakeError(
                "docker buildx bake --print wrote no JSON", path=self.bake.path
            ) from None
        if not isinstance(data, dict) or not isinstance(data.get("target", {}), dict):
            raise BakeError(
                "docker buildx bake --print wrote JSON of another shape", path=self.bake.path
            )
        self._store(key, data)
        return data

    def print_many(
        self, envs: Sequence[Mapping[str, str]], names: Sequence[str]
    ) -> list[dict[str, dict[str, Any]]]:
        """Each environment's targets, in --print's canonical shape; the calls run concurrently.

        Each environment is bake's whole environment for that call (PATH, HOME, the variables).
        """
        if not names:
            return [{} for _ in envs]
        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, len(envs))) as pool:
            results = list(pool.map(lambda env: self._run(env, names), envs))
        out = []
        for data in results:
            targets: dict[str, dict[str, Any]] = {}
            for name, entry in (data.get("target") or {}).items():
                if not isinstance(entry, dict):
                    raise BakeError(
                        f"docker buildx bake --print: target {quote(name)} is not an object",
                        path=self.bake.path,
                    )
                try:
                    targets[name] = canonical(entry, version=self.buildx.version)
                except PrintShapeError as exc:
                    raise BakeError(
                        f"docker buildx bake --print: target {quote(name)}: {exc}",
                        path=self.bake.path,
                    ) from None
            out.append(targets)
        return out
