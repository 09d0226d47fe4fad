"""`rocm-assets graph` and `rocm-assets check`: the resolved build graph, its drift checks, and
the bake file against its Dockerfiles."""

import argparse
import json
import sys
from typing import Any

from rocm_assets.cli.common import EXIT_OK, EXIT_PROBLEMS, add_bake_file, graph_of, out
from rocm_assets.core.bake import BakeGraph, check_drift
from rocm_assets.core.bake.features import minimum
from rocm_assets.core.bake.printed import graph_entry
from rocm_assets.core.build.builds import check_arches
from rocm_assets.core.build.recipes import check_recipes, dockerfile_path


def graph_json(graph: BakeGraph, arch: str) -> dict[str, Any]:
    """`group` and `target` as `docker buildx bake --print` prints them (every target, each for
    the arch it builds with), then what rocm-assets derives: the edges, per-arch, the groups."""
    return {
        "resolver": graph.resolver.name,
        "buildx": graph.resolver_version,
        "arch": arch,
        "arches": list(graph.arches),
        "group": {name: {"targets": list(members)} for name, members in graph.groups.items()},
        "target": {
            name: graph_entry(graph.resolve(graph.build_arch(name, arch)).targets[name].printed)
            for name in graph.targets
        },
        "graph": {
            name: {
                "deps": list(graph.deps[name]),
                "arch": name in graph.per_arch,
                "groups": list(graph.groups_of(name)),
            }
            for name in graph.targets
        },
    }


def cmd_graph(args: argparse.Namespace) -> int:
    graph = graph_of(args)
    (arch,) = check_arches(graph, [args.arch or graph.arches[0]])
    data = graph_json(graph, arch)
    if args.json:
        out(json.dumps(data, indent=2))
        return EXIT_OK
    out(
        f"{graph.path}: {len(graph.targets)} targets, {graph.edge_count} edges, arches "
        f"{', '.join(graph.arches)} (resolved by {graph.resolver_label})"
    )
    width = max(len(n) for n in graph.targets)
    for name, info in data["graph"].items():
        kind = "arch  " if info["arch"] else "noarch"
        test = f"  (tests {graph.test_targets[name]})" if name in graph.test_targets else ""
        deps = ", ".join(info["deps"]) or "-"
        out(f"  {name:<{width}}  {kind}  <- {deps}{test}")
    for name, members in graph.groups.items():
        out(f"  group {name}: {' '.join(members)}")
    return EXIT_OK


def cmd_check(args: argparse.Namespace) -> int:
    graph = graph_of(args)
    # The recipes' lines name the bake file and line themselves; the drift lines only the file.
    problems = [f"{graph.path}: {p}" for p in check_drift(graph)] + check_recipes(graph)
    for problem in problems:
        sys.stderr.write(f"{problem}\n")
    if problems:
        return EXIT_PROBLEMS
    dockerfiles = {dockerfile_path(graph, graph.resolve(None).targets[t]) for t in graph.targets}
    needs = minimum(graph.bake)
    out(
        f"{graph.path}: ok: {len(graph.targets)} targets, {graph.edge_count} edges, "
        f"{len(graph.groups)} groups, PUB_* references match for {len(graph.arches)} arches, "
        f"{len(dockerfiles)} Dockerfiles take every arg and context in both input modes; "
        f"resolved by {graph.resolver_label}, "
        + (
            f"needs buildx >= {needs.version_text} ({needs.construct})"
            if needs
            else "reads on buildx 0.13 and later"
        )
    )
    return EXIT_OK


def add_parsers(sub: Any) -> None:
    p = sub.add_parser("graph", help="print the resolved build graph")
    add_bake_file(p)
    p.add_argument("--arch", help="arch to resolve tags for (default: the first in the bake file)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_graph)

    p = sub.add_parser(
        "check",
        help="drift checks: PUB_* references, published mode, the Dockerfiles against their targets",
    )
    add_bake_file(p)
    p.set_defaults(func=cmd_check)
