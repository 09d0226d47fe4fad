"""Where the farm's files come from. Functions, not module constants: nothing is read at import."""

import os
from pathlib import Path

from rocm_assets.core.common.constants import BAKE_FILE_ENV, DEFAULT_BAKE_FILE


def bake_file_path(explicit: str | Path | None = None) -> Path:
    """The bake file: `explicit`, else $ROCM_BAKE_FILE, else ./rocm-bake.hcl (absolute)."""
    chosen = explicit or os.environ.get(BAKE_FILE_ENV) or DEFAULT_BAKE_FILE
    return Path(chosen).expanduser().resolve()
