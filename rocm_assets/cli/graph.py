"""`rocm-assets graph` and `rocm-assets check`: the resolved build graph, its drift checks, and
the bake file against its Dockerfiles."""

import argparse
import json
import os
import sys
from collections.abc import Mapping
from typing import Any

from rocm_assets.cli.common import EXIT_OK, EXIT_PROBLEMS, CliError, add_bake_file, graph_of, out
from rocm_assets.core.bake import BakeError, BakeGraph
from rocm_assets.core.bake.manifest import load_manifest, manifest_path
from rocm_assets.core.build.builds import check_arches
from rocm_assets.core.build.drift import check_drift
from rocm_assets.core.build.recipes import check_recipes, dockerfile_path
from rocm_assets.core.common.constants import (
    ARCH_VAR,
    PARSE_BOOL_FALSE,
    PARSE_BOOL_TRUE,
    PUBLISHED_INPUTS_VAR,
)


def _mode(env: Mapping[str, str]) -> bool:
    """PUBLISHED_INPUTS from the environment as bake reads the file's bool variable."""
    value = env.get(PUBLISHED_INPUTS_VAR, "")
    if value and value not in PARSE_BOOL_TRUE | PARSE_BOOL_FALSE:
        raise CliError(
            f"{PUBLISHED_INPUTS_VAR}={value!r} is not a bool as bake reads one (1, t, true, TRUE, "
            "True, or 0, f, false, FALSE, False)"
        )
    return value in PARSE_BOOL_TRUE


def graph_json(graph: BakeGraph, arch: str | None, published: bool) -> dict[str, Any]:
    """`group` and `target` as `docker buildx bake --print` prints them under this arch (None:
    the file's default) and input mode, then what rocm-assets derives: edges, per-arch, groups."""
    resolved = graph.resolve(arch, published=published)
    return {
        "resolved_by": graph.resolver_label,
        "buildx": graph.resolver_version_text,
        "arch": resolved.env.get(ARCH_VAR) or graph.default_arch,
        "published_inputs": published,
        "arches": list(graph.arches),
        "group": {name: {"targets": list(members)} for name, members in resolved.groups.items()},
        "target": {name: dict(resolved.targets[name].printed) for name in graph.targets},
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
    # As bake: --arch, else $GPU_ARCH, else the file's default; the mode from $PUBLISHED_INPUTS.
    chosen = args.arch or os.environ.get(ARCH_VAR)
    arch = check_arches(graph, [chosen])[0] if chosen else None
    data = graph_json(graph, arch, _mode(os.environ))
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
    # A manifest beside the file must still be bake's answer for it.
    manifest = manifest_path(graph.path, os.environ)
    if manifest.is_file():
        try:
            load_manifest(manifest, graph.outline, os.environ)
        except BakeError as exc:
            problems.append(str(exc))
    for problem in problems:
        sys.stderr.write(f"{problem}\n")
    if problems:
        return EXIT_PROBLEMS
    dockerfiles = {dockerfile_path(graph, graph.resolve(None).targets[t]) for t in graph.targets}
    out(
        f"{graph.path}: ok: {len(graph.targets)} targets, {graph.edge_count} edges, "
        f"{len(graph.groups)} groups, PUB_* references match for {len(graph.arches)} arches, "
        f"{len(dockerfiles)} Dockerfiles take every arg and context in both input modes; "
        f"resolved by {graph.resolver_label}"
    )
    return EXIT_OK


def add_parsers(sub: Any) -> None:
    p = sub.add_parser("graph", help="print the resolved build graph")
    add_bake_file(p)
    p.add_argument(
        "--arch", help="arch to resolve for (default: $GPU_ARCH, else the bake file's default)"
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_graph)

    p = sub.add_parser(
        "check",
        help="drift checks: PUB_* references, published mode, the Dockerfiles against their targets",
    )
    add_bake_file(p)
    p.set_defaults(func=cmd_check)
