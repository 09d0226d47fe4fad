"""`rocm-assets`: the farm from a terminal, on the same core the code location uses.

Every failure is one line on stderr. Exit status: 0 fine, 1 the check found problems
(drift, missing inputs), 2 bad input or an error reaching something.
"""

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn

from rocm_assets.cli import backfill, bench, buildall, graph, manifest, plan, preflight
from rocm_assets.cli.common import EXIT_ERROR, EXIT_OK, CliError, Parser, add_bake_file, add_fleet
from rocm_assets.core.bake import BakeError
from rocm_assets.core.build.builds import SelectionError
from rocm_assets.core.common.constants import DEFAULT_DAGSTER_URL
from rocm_assets.core.nodes.fleet import FleetError
from rocm_assets.core.registry.client import RegistryError
from rocm_assets.core.registry.preflight import PreflightError

# Commands that only read and print skip the interpreter's teardown once their output is out:
# freeing Dagster's modules takes 0.4-0.5 s on an idle 2-core machine, more under load, and
# Ctrl-C on `watch` must end it within a second.
_NO_TEARDOWN = frozenset({"watch"})


def cmd_watch(args: argparse.Namespace) -> int:
    # Only this command reads the Dagster instance: the others start without importing dagster.
    from rocm_assets.cli.watch import cmd_watch as watch

    return watch(args)


def cmd_stale(args: argparse.Namespace) -> int:
    # Reads the Dagster instance, so Dagster is imported only for this command.
    from rocm_assets.cli.stale import cmd_stale as stale

    return stale(args)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="rocm-assets", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    graph.add_parsers(sub)
    manifest.add_parsers(sub)
    preflight.add_parsers(sub)
    plan.add_parsers(sub)
    bench.add_parsers(sub)
    backfill.add_parser(sub)
    p = sub.add_parser(
        "watch",
        help="follow the farm live: a line per node, then the queue",
        description="Follow the farm from the Dagster instance in $DAGSTER_HOME (else in "
        "./.dagster_home, where `make dev` keeps it).",
    )
    p.add_argument(
        "--interval", type=float, default=2.0, metavar="S", help="seconds between frames"
    )
    p.add_argument("--once", action="store_true", help="print one frame and exit")
    add_fleet(p)
    p.add_argument(
        "--url",
        default=DEFAULT_DAGSTER_URL,
        help=f"the Dagster UI, linked in the header (default: {DEFAULT_DAGSTER_URL})",
    )
    p.set_defaults(func=cmd_watch)
    buildall.add_parser(sub)
    p = sub.add_parser(
        "stale",
        help="what would rebuild and why: missing, code version changed, input rebuilt",
        description="Per target and arch, what Dagster holds out of date and why, from the "
        "instance in $DAGSTER_HOME (else in ./.dagster_home, where `make dev` keeps it) and the "
        "bake file. Exit 0 whatever it finds.",
    )
    add_bake_file(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_stale)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        return func(args)
    except (
        BakeError,
        CliError,
        FleetError,
        PreflightError,
        RegistryError,
        SelectionError,
    ) as exc:
        sys.stderr.write(f"rocm-assets: error: {exc}\n")
        return EXIT_ERROR
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (`rocm-assets graph | head`): nothing of ours failed. Python
        # flushes stdout again at exit, so it points at /dev/null from here on.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK


def entry() -> NoReturn:
    """The `rocm-assets` command (and `python -m rocm_assets.cli`): `main`, then the exit."""
    argv = sys.argv[1:]
    code = main(argv)
    if argv[:1] and argv[0] in _NO_TEARDOWN:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)
    sys.exit(code)
