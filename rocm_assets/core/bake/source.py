"""The bake file as written, read with python-hcl2: its blocks, names and lines, never its values.

Bake evaluates the file. This says what `--print` cannot: the variables and top-level attributes
it declares (bake is asked for their values), the line of each block, attribute and object key
(for error messages and `check`), which target blocks are matrices, and `inherits` lists written
as literals (to follow an attribute's line to the block that sets it). The reading is cached on
disk by the file's bytes: python-hcl2 takes 0.12 s on the shipped file (`hcl_tree`), and
0.15 s more to import.
"""

import importlib.metadata
import os
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path

from rocm_assets.core.bake.errors import BakeError
from rocm_assets.core.bake.limits import MAX_FILE_BYTES
from rocm_assets.core.bake.outline import (
    Outline as Outline,
    TargetBlock as TargetBlock,
    UnreadableSyntax as UnreadableSyntax,
)
from rocm_assets.core.common.cache import cache_dir, digest, read_json, write_json

_FORMAT = f"outline-2:{importlib.metadata.version('python-hcl2')}"


def _from_json(path: Path, data: dict) -> Outline:
    targets = {n: [TargetBlock(**b) for b in blocks] for n, blocks in data.pop("targets").items()}
    data.pop("path")
    return Outline(path, targets=targets, **data)


def read_outline(path: str | Path, env: Mapping[str, str] | None = None) -> Outline:
    """Read a bake file's outline; a missing, unreadable or unparsable file is one BakeError."""
    path = Path(path)
    try:
        with path.open("rb") as handle:
            data = handle.read(MAX_FILE_BYTES + 1)
    except FileNotFoundError:
        raise BakeError("bake file not found", path=path) from None
    except OSError as exc:
        raise BakeError(f"cannot read bake file: {exc.strerror or exc}", path=path) from None
    if len(data) > MAX_FILE_BYTES:
        raise BakeError(f"bake file is over the limit of {MAX_FILE_BYTES} bytes", path=path)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BakeError(f"cannot read bake file: not UTF-8 (byte {exc.start})", path=path) from None
    sha256 = digest(data)
    memo = (
        cache_dir(os.environ if env is None else env)
        / "outline"
        / f"{digest(_FORMAT, sha256)}.json"
    )
    cached = read_json(memo)
    if isinstance(cached, dict):
        try:
            return _from_json(path, cached)
        except (KeyError, TypeError):
            pass
    # python-hcl2 and lark cost 0.15 s to import: only a file not read before pays it.
    from rocm_assets.core.bake.hcl_tree import read_tree

    outline = read_tree(text, path, sha256)
    write_json(memo, {**asdict(outline), "path": str(path)})
    return outline
