"""`rocm-assets manifest`: write bake's answer down for hosts without buildx (core/bake/manifest)."""

import argparse
import os
from pathlib import Path
from typing import Any

from rocm_assets.cli.common import EXIT_OK, CliError, add_bake_file, graph_of, out
from rocm_assets.core.bake.manifest import manifest_path, write_manifest
from rocm_assets.core.common.buildx import BuildxError, find_buildx


def cmd_manifest(args: argparse.Namespace) -> int:
    # Before the graph: without buildx, it would be read from the very manifest this rewrites.
    try:
        found = find_buildx(os.environ)
    except BuildxError as exc:
        raise CliError(str(exc)) from None
    if found is None:
        raise CliError(
            "rocm-assets manifest writes bake's answer, so it needs docker buildx: install "
            "docker-buildx here (Debian: apt-get install docker-buildx), or run it where it is"
        )
    graph = graph_of(args)
    # Every call a load makes: the default, every arch, both input modes.
    graph.prefetch(published=False)
    graph.prefetch(published=True)
    path = Path(args.output) if args.output else manifest_path(graph.path, os.environ)
    write_manifest(path, graph.outline, os.environ, graph.resolver_version_text, graph.prints)
    out(
        f"{path}: bake's answer for {graph.path.name} ({len(graph.prints)} --print calls: "
        f"{len(graph.arches)} arches, both input modes), from docker buildx bake "
        f"{graph.resolver_version_text}"
    )
    return EXIT_OK


def add_parsers(sub: Any) -> None:
    p = sub.add_parser(
        "manifest",
        help="write bake's answer beside the bake file, for hosts without docker buildx",
        description="Write every `docker buildx bake --print` the graph reads to "
        "<bake file>.manifest.json (or $ROCM_BAKE_MANIFEST), keyed by the bake file's bytes, the "
        "variables bake reads from the environment and the buildx version. A host without buildx "
        "loads the graph from it; it is refused once the file or the environment differ.",
    )
    add_bake_file(p)
    p.add_argument("--output", help="where to write it (default: beside the bake file)")
    p.set_defaults(func=cmd_manifest)
