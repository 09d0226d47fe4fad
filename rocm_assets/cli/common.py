"""What every `rocm-assets` command shares: exit codes, the one-line error, common options."""

import argparse
import sys
from typing import Any, NoReturn

from rocm_assets.core.bake import BakeGraph, load_graph
from rocm_assets.core.common.constants import FLEET_FILE_ENV
from rocm_assets.core.common.settings import bake_file_path

# 0 fine, 1 the check found problems (drift, missing inputs), 2 bad input or an error reaching
# something.
EXIT_OK, EXIT_PROBLEMS, EXIT_ERROR = 0, 1, 2


class CliError(Exception):
    """A one-line error for the user; exit status 2."""


class Parser(argparse.ArgumentParser):
    """argparse with the farm's error shape: one line on stderr, exit 2 (no usage block)."""

    def error(self, message: str) -> NoReturn:
        # prog is "rocm-assets" or "rocm-assets plan": the command goes after the error word.
        tool, _, command = self.prog.partition(" ")
        where = f"{command}: " if command else ""
        sys.stderr.write(f"{tool}: error: {where}{message}\n")
        sys.exit(EXIT_ERROR)


def add_list(parser: Any, *flags: str, **kwargs: Any) -> None:
    """A list option: repeats add (`--arch a --arch b` is `--arch a b`), an empty list is refused."""
    parser.add_argument(*flags, action="extend", nargs="+", **kwargs)


def out(text: str = "") -> None:
    sys.stdout.write(text + "\n")


def warn(text: str) -> None:
    sys.stderr.write(f"rocm-assets: {text}\n")


def graph_of(args: argparse.Namespace) -> BakeGraph:
    """The bake file `--bake-file` names (else $ROCM_BAKE_FILE, else ./rocm-bake.hcl), as bake
    resolves it (or the manifest of bake's answer, where buildx is not installed)."""
    return load_graph(bake_file_path(args.bake_file))


def add_bake_file(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--bake-file", help="bake file (default: $ROCM_BAKE_FILE, else ./rocm-bake.hcl)"
    )


def add_fleet(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--fleet", help=f"fleet manifest (default: ${FLEET_FILE_ENV}, else ./fleet.yaml)"
    )
