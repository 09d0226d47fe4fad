"""The Dagster instance `watch` and `stale` read: $DAGSTER_HOME, else the one `make dev` runs."""

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import dagster as dg

from rocm_assets.cli.common import CliError, warn
from rocm_assets.core.common.constants import DAGSTER_HOME_ENV, DEFAULT_DAGSTER_HOME
from rocm_assets.core.common.settings import dagster_home_path


def farm_home() -> Path:
    """The instance directory (`dagster_home_path`), looked up before any slower work.

    Raises:
        CliError: there is none.
    """
    home = dagster_home_path()
    if home is None:
        raise CliError(
            f"{DAGSTER_HOME_ENV} is not set and there is no {DEFAULT_DAGSTER_HOME}/dagster.yaml "
            f"here: set {DAGSTER_HOME_ENV} to the farm's instance, or run from the directory "
            "`make dev` runs in"
        )
    if not home.is_dir():
        raise CliError(f"{DAGSTER_HOME_ENV}={home} is not a directory")
    return home


@contextmanager
def open_instance(home: Path) -> Iterator[dg.DagsterInstance]:
    """The instance in `home`, open for the block. Without $DAGSTER_HOME, one line on stderr
    names it, since it was found rather than given.

    Raises:
        CliError: Dagster cannot read it (a `DagsterError` raised in the block included).
    """
    try:
        with dg.DagsterInstance.from_config(str(home)) as instance:
            if not os.environ.get(DAGSTER_HOME_ENV):
                warn(f"read the Dagster instance at {home} ({DAGSTER_HOME_ENV} is unset)")
            yield instance
    except dg.DagsterError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CliError(f"cannot read the Dagster instance at {home}: {first}") from None
