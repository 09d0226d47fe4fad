"""The on-disk cache of bake's answers and of the file's reading, keyed by all that decides them.

A cache that cannot be read or written is only slower, never wrong: every failure is a miss.
"""

import contextlib
import hashlib
import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

CACHE_DIR_ENV = "ROCM_CACHE_DIR"


def cache_dir(env: Mapping[str, str]) -> Path:
    chosen = env.get(CACHE_DIR_ENV)
    if chosen:
        return Path(chosen)
    xdg = env.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg else Path(env.get("HOME") or "~").expanduser() / ".cache"
    return base / "rocm-assets"


def digest(*parts: str | bytes) -> str:
    """One key for several parts, each ended by a NUL so that no two part lists collide."""
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode() if isinstance(part, str) else part)
        h.update(b"\0")
    return h.hexdigest()


def read_json(path: Path) -> Any:
    with contextlib.suppress(OSError, ValueError):
        return json.loads(path.read_text(encoding="utf-8"))
    return None


def write_json(path: Path, data: Any) -> None:
    """Written whole or not at all: a reader never sees half a file."""
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                json.dump(data, handle)
            os.replace(tmp, path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
