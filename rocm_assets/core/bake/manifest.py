"""Bake's answer written down, for a host without buildx: the way dagster-dbt reads dbt's manifest.

`rocm-assets manifest` runs on a host that has buildx and writes every `--print` the graph reads
(the default arch and every arch, both input modes) beside the bake file. A host without buildx
(a reader's laptop, a webserver container without the plugin) loads the graph from it. It is
bake's answer, not a second copy of the graph: it names the bake file's bytes, the values of the
variables bake read from the environment and the buildx that answered, and is refused the moment
the file or the environment no longer match.
"""

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rocm_assets.core.bake.environment import bake_env
from rocm_assets.core.bake.errors import BakeError
from rocm_assets.core.bake.source import Outline
from rocm_assets.core.common.cache import digest
from rocm_assets.core.common.constants import ARCH_VAR, PUBLISHED_INPUTS_VAR

MANIFEST_ENV = "ROCM_BAKE_MANIFEST"
FORMAT = "rocm-assets-bake-manifest/1"
# Set per evaluation by the graph, so one manifest holds every arch and mode; HOME differs by host.
_PER_CALL = (ARCH_VAR, PUBLISHED_INPUTS_VAR, "HOME")
REWRITE = "rewrite it with `rocm-assets manifest` where docker buildx is installed"

# (GPU_ARCH or "" for the file's default, PUBLISHED_INPUTS) -> that call's --print JSON.
PrintKey = tuple[str, bool]


def manifest_path(bake_file: Path, env: Mapping[str, str]) -> Path:
    """$ROCM_BAKE_MANIFEST, else `<bake file's stem>.manifest.json` beside the bake file."""
    chosen = env.get(MANIFEST_ENV)
    return Path(chosen) if chosen else bake_file.with_name(f"{bake_file.stem}.manifest.json")


def print_key(env: Mapping[str, str]) -> PrintKey:
    return (env.get(ARCH_VAR, ""), env.get(PUBLISHED_INPUTS_VAR) == "1")


def env_digests(outline: Outline, env: Mapping[str, str]) -> dict[str, str]:
    """Each variable bake reads from the environment, by a digest of its value: the manifest says
    which one changed, and holds no value that could be a secret."""
    return {k: digest(v) for k, v in sorted(bake_env(outline, env).items()) if k not in _PER_CALL}


@dataclass(frozen=True)
class Manifest:
    path: Path
    buildx: str
    version: tuple[int, ...]
    prints: dict[PrintKey, dict[str, Any]]


def write_manifest(
    path: Path,
    outline: Outline,
    env: Mapping[str, str],
    buildx: str,
    prints: Mapping[PrintKey, dict[str, Any]],
) -> None:
    data = {
        "format": FORMAT,
        "bake_file": outline.path.name,
        "bake_file_sha256": outline.sha256,
        "env_sha256": env_digests(outline, env),
        "buildx": buildx,
        "prints": [
            {"GPU_ARCH": arch, "PUBLISHED_INPUTS": published, "print": data}
            for (arch, published), data in sorted(prints.items())
        ],
    }
    partial = path.with_name(f".{path.name}.partial")
    try:
        partial.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n", encoding="utf-8")
        partial.replace(path)
    except OSError as exc:
        raise BakeError(f"cannot write the manifest: {exc.strerror or exc}", path=path) from None


def _stale(outline: Outline, data: Mapping[str, Any], env: Mapping[str, str]) -> str | None:
    """Why the manifest no longer answers for this file and environment; None when it does."""
    if data.get("bake_file_sha256") != outline.sha256:
        return f"it was written for another {outline.path.name} (the file changed since)"
    written = data.get("env_sha256")
    now = env_digests(outline, env)
    if written != now:
        written = written if isinstance(written, dict) else {}
        changed = sorted(k for k in written.keys() | now.keys() if written.get(k) != now.get(k))
        return f"the environment differs from the one it was written with ({', '.join(changed)})"
    return None


def load_manifest(path: Path, outline: Outline, env: Mapping[str, str]) -> Manifest:
    """The manifest, if it answers for this file and environment; else one line saying why not."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise BakeError(
            f"cannot read the manifest ({type(exc).__name__}): {REWRITE}", path=path
        ) from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise BakeError(f"not a manifest of this rocm-assets: {REWRITE}", path=path)
    reason = _stale(outline, data, env)
    if reason:
        raise BakeError(f"stale: {reason}; {REWRITE}", path=path)
    try:
        version = tuple(int(p) for p in str(data["buildx"]).split("."))
        prints = {
            (str(p["GPU_ARCH"]), bool(p["PUBLISHED_INPUTS"])): p["print"] for p in data["prints"]
        }
    except (KeyError, TypeError, ValueError):
        raise BakeError(f"the manifest's entries are unreadable: {REWRITE}", path=path) from None
    return Manifest(path, str(data["buildx"]), version, prints)
