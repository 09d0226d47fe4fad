"""`rocm-assets preflight`: which registry inputs of a request are not published yet."""

import argparse
import json
import os
from typing import Any

from rocm_assets.cli.common import EXIT_OK, EXIT_PROBLEMS, CliError, add_bake_file, add_list, out
from rocm_assets.core.bake import load_graph
from rocm_assets.core.build.builds import builds_for, check_arches, select_targets
from rocm_assets.core.common.constants import REGISTRY_URL_ENV, REGISTRY_VAR
from rocm_assets.core.common.settings import bake_file_path
from rocm_assets.core.registry.client import RegistryClient
from rocm_assets.core.registry.preflight import preflight


def cmd_preflight(args: argparse.Namespace) -> int:
    with RegistryClient.from_env(url=args.registry) as client:
        # Bake reads REGISTRY (and every other variable) from the environment; --registry
        # points both the check and the graph's image names at one registry.
        env = dict(os.environ)
        if args.registry:
            env[REGISTRY_VAR] = client.host
        graph = load_graph(bake_file_path(args.bake_file), env)
        targets = select_targets(graph, group=args.group, targets=args.targets, allow_tests=True)
        arches = check_arches(graph, [args.arch])
        report = preflight(graph, builds_for(graph, targets, arches), client)
    if report.unchecked:
        raise CliError(
            f"input images are not on {client.url} "
            f"(e.g. {report.unchecked[0]}): the bake file's REGISTRY must name the registry "
            f"checked; set {REGISTRY_VAR}={client.host} or pass --registry"
        )
    if args.json:
        out(json.dumps(report.to_json(), indent=2))
    else:
        for missing in report.missing:
            out(missing.line())
        out(report.summary())
    return EXIT_PROBLEMS if report.missing else EXIT_OK


def add_parsers(sub: Any) -> None:
    p = sub.add_parser(
        "preflight", help="check that every registry input of a build request is published"
    )
    add_bake_file(p)
    p.add_argument("--arch", required=True, help="the GPU arch (partition) to build")
    what = p.add_mutually_exclusive_group(required=True)
    add_list(what, "--targets", metavar="T", help="bake targets to build")
    what.add_argument("--group", metavar="G", help="a bake group to build")
    p.add_argument("--registry", help=f"registry URL (default: ${REGISTRY_URL_ENV})")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_preflight)
