"""Where the farm's files come from. Functions, not module constants: nothing is read at import."""

import os
from pathlib import Path

from rocm_assets.core.common.constants import (
    BAKE_FILE_ENV,
    DAGSTER_HOME_ENV,
    DEFAULT_BAKE_FILE,
    DEFAULT_DAGSTER_HOME,
)


def bake_file_path(explicit: str | Path | None = None) -> Path:
    """The bake file: `explicit`, else $ROCM_BAKE_FILE, else ./rocm-bake.hcl (absolute)."""
    chosen = explicit or os.environ.get(BAKE_FILE_ENV) or DEFAULT_BAKE_FILE
    return Path(chosen).expanduser().resolve()


def dagster_home_path() -> Path | None:
    """The Dagster instance directory: $DAGSTER_HOME, else ./.dagster_home when it holds a
    dagster.yaml (the instance `make dev` runs, from this directory), else None (absolute)."""
    chosen = os.environ.get(DAGSTER_HOME_ENV)
    if chosen:
        return Path(chosen).expanduser().resolve()
    local = Path(DEFAULT_DAGSTER_HOME).resolve()
    return local if (local / "dagster.yaml").is_file() else None
