"""`rocm-assets`: the farm from a terminal, on the same core the code location uses.

Every failure is one line on stderr. Exit status: 0 fine, 1 the check found problems
(drift, missing inputs), 2 bad input or an error reaching something.
"""

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any

from rocm_assets.bake import BakeError, BakeGraph, check_drift, load_graph
from rocm_assets.fleet import FleetError
from rocm_assets.settings import bake_file_path

EXIT_OK, EXIT_PROBLEMS, EXIT_ERROR = 0, 1, 2


class CliError(Exception):
    """A one-line error for the user; exit status 2."""


def _out(text: str = "") -> None:
    sys.stdout.write(text + "\n")


def _graph(args: argparse.Namespace) -> BakeGraph:
    return load_graph(bake_file_path(args.bake_file))


def _arch(graph: BakeGraph, arch: str | None) -> str:
    if arch is None:
        return graph.arches[0]
    if arch not in graph.arches:
        raise CliError(f"unknown arch {arch!r}: the bake file builds {', '.join(graph.arches)}")
    return arch


def graph_json(graph: BakeGraph, arch: str) -> dict[str, Any]:
    return {
        "arches": list(graph.arches),
        "targets": {
            name: {
                "deps": list(graph.deps[name]),
                "arch": name in graph.per_arch,
                "tags": list(graph.tags(name, arch)),
                "dockerfile": graph.resolve(graph.build_arch(name, arch)).targets[name].dockerfile,
                "groups": list(graph.groups_of(name)),
            }
            for name in graph.targets
        },
        "groups": {name: list(members) for name, members in graph.groups.items()},
    }


def cmd_graph(args: argparse.Namespace) -> int:
    graph = _graph(args)
    arch = _arch(graph, args.arch)
    data = graph_json(graph, arch)
    if args.json:
        _out(json.dumps(data, indent=2))
        return EXIT_OK
    _out(
        f"{graph.path}: {len(graph.targets)} targets, {graph.edge_count} edges, arches {', '.join(graph.arches)}"
    )
    width = max(len(n) for n in graph.targets)
    for name, info in data["targets"].items():
        kind = "arch  " if info["arch"] else "noarch"
        test = f"  (tests {graph.test_targets[name]})" if name in graph.test_targets else ""
        deps = ", ".join(info["deps"]) or "-"
        _out(f"  {name:<{width}}  {kind}  <- {deps}{test}")
    for name, members in graph.groups.items():
        _out(f"  group {name}: {' '.join(members)}")
    return EXIT_OK


def cmd_check(args: argparse.Namespace) -> int:
    graph = _graph(args)
    problems = check_drift(graph)
    for problem in problems:
        sys.stderr.write(f"{graph.path}: {problem}\n")
    if problems:
        return EXIT_PROBLEMS
    _out(
        f"{graph.path}: ok: {len(graph.targets)} targets, {graph.edge_count} edges, "
        f"{len(graph.groups)} groups, PUB_* references match for {len(graph.arches)} arches"
    )
    return EXIT_OK


def _add_bake_file(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--bake-file", help="bake file (default: $ROCM_BAKE_FILE, else ./rocm-bake.hcl)"
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rocm-assets", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("graph", help="print the resolved build graph")
    _add_bake_file(p)
    p.add_argument("--arch", help="arch to resolve tags for (default: the first in the bake file)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_graph)

    p = sub.add_parser("check", help="drift checks: PUB_* references, groups, published mode")
    _add_bake_file(p)
    p.set_defaults(func=cmd_check)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        return func(args)
    except (BakeError, CliError, FleetError) as exc:
        sys.stderr.write(f"rocm-assets: error: {exc}\n")
        return EXIT_ERROR
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
