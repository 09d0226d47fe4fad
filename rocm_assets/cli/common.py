"""What every `rocm-assets` command shares: exit codes, the one-line error, common options."""

import argparse
import sys

from rocm_assets.core.bake import BakeGraph, load_graph
from rocm_assets.core.constants import FLEET_FILE_ENV
from rocm_assets.core.settings import bake_file_path

# 0 fine, 1 the check found problems (drift, missing inputs), 2 bad input or an error reaching
# something.
EXIT_OK, EXIT_PROBLEMS, EXIT_ERROR = 0, 1, 2


class CliError(Exception):
    """A one-line error for the user; exit status 2."""


def out(text: str = "") -> None:
    sys.stdout.write(text + "\n")


def warn(text: str) -> None:
    sys.stderr.write(f"rocm-assets: {text}\n")


def graph_of(args: argparse.Namespace) -> BakeGraph:
    """The bake file `--bake-file` names (else $ROCM_BAKE_FILE, else ./rocm-bake.hcl)."""
    return load_graph(bake_file_path(args.bake_file))


def add_bake_file(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--bake-file", help="bake file (default: $ROCM_BAKE_FILE, else ./rocm-bake.hcl)"
    )


def add_fleet(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--fleet", help=f"fleet manifest (default: ${FLEET_FILE_ENV}, else ./fleet.yaml)"
    )
