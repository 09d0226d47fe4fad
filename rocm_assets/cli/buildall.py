"""`rocm-assets build-all`: bake a whole group on ONE builder in one invocation, without pushing.

The seed's `make build-all BUILDER=<node>`: one `docker buildx bake` of the group, so `target:`
contexts resolve in-process and every stage builds on what the stage before it produced. It is
refused for the pool (the seed's `snoc-pool`, or any name that is not one node's builder in the
fleet file): there every target would be its own bake invocation, so stage 2 would silently build
against whatever is in the registry. For the same reason it refuses PUBLISHED_INPUTS=1. Every
other setting bake reads (SCCACHE_LOG, RUN_ID, CACHE_TAG_SUFFIX, SDE_*, REGISTRY) reaches it from
the caller's environment unchanged.
"""

import argparse
import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rocm_assets.cli.common import EXIT_ERROR, add_list
from rocm_assets.core.bake import BakeGraph, load_graph
from rocm_assets.core.build.builds import SelectionError, check_arches, check_group
from rocm_assets.core.build.invocation import builder_env
from rocm_assets.core.common.constants import (
    ARCH_VAR,
    DEFAULT_GROUP,
    PARSE_BOOL_FALSE,
    POOL_BUILDER,
    PUBLISHED_INPUTS_VAR,
)
from rocm_assets.core.common.settings import bake_file_path
from rocm_assets.core.nodes.fleet import Fleet, fleet_path, load_fleet

_POOL_REASON = (
    "every target would be its own bake invocation, so stage 2 would silently build against "
    "whatever is in the registry rather than what stage 1 produced"
)


class BuildAllError(Exception):
    """A build-all that must not run as asked; the message is one line saying what to do."""


@dataclass(frozen=True)
class BuildAll:
    """The one bake: argv, environment and working directory."""

    argv: tuple[str, ...]
    env: Mapping[str, str] = field(repr=False)
    cwd: Path

    def command(self) -> str:
        shown = {k: self.env[k] for k in ("DOCKER_CONTEXT", ARCH_VAR) if self.env.get(k)}
        prefix = "".join(f"{k}={shlex.quote(v)} " for k, v in shown.items())
        return prefix + shlex.join(self.argv)


def check_builder(builder: str, fleet: Fleet, fleet_file: Path) -> None:
    """Only one node's builder will do: the pool, or a name the fleet does not know, is refused."""
    builders = [n.builder for n in fleet.nodes]
    if builder in builders and builder != POOL_BUILDER:
        return
    if builder == POOL_BUILDER:
        refused = f"build-all refuses the pool {builder!r}"
    else:
        refused = f"build-all needs one node's builder, and {builder!r} is none in {fleet_file}"
    raise BuildAllError(
        f"{refused}: on a pool {_POOL_REASON}. Schedule the pool with `make push-all` "
        f"(publishes), or build on one builder: {', '.join(builders)}"
    )


def build_all(
    graph: BakeGraph,
    *,
    builder: str,
    group: str,
    arch: str | None,
    base_env: Mapping[str, str],
    docker: str = "docker",
) -> BuildAll:
    """The bake of `group` on `builder`, inputs resolved in-process (PUBLISHED_INPUTS off)."""
    check_group(graph, group)
    published = base_env.get(PUBLISHED_INPUTS_VAR, "")
    # Unset or empty leaves the file's default (false); anything ParseBool reads as true is refused.
    if published and published not in PARSE_BOOL_FALSE:
        raise BuildAllError(
            f"build-all resolves inputs in-process, but {PUBLISHED_INPUTS_VAR}={published!r} makes "
            "every stage read them from the registry instead of what the stage before it "
            "produced: unset it, or use `make push-all`"
        )
    # A docker-driver node is reached through its context, as buildx requires.
    env = builder_env(builder, base_env, docker)
    if arch is not None:
        (env[ARCH_VAR],) = check_arches(graph, [arch])
    if shutil.which(docker, path=env.get("PATH")) is None:
        raise BuildAllError(
            f"{docker!r} is not on PATH: install the Docker CLI with the buildx plugin"
        )
    # `--` ends the options, so no group name can be read as a flag.
    argv = (docker, "buildx", "bake", "-f", str(graph.path), "--builder", builder, "--", group)
    # Bake resolves relative `context` paths against its working directory, not the file's.
    return BuildAll(argv, env, graph.path.parent)


def run(invocation: BuildAll) -> int:
    """Run bake with this terminal's output; its exit status (128+N when killed by signal N)."""
    try:
        proc = subprocess.Popen(list(invocation.argv), env=dict(invocation.env), cwd=invocation.cwd)
    except OSError as exc:
        raise BuildAllError(
            f"cannot start {shlex.join(invocation.argv[:3])}: {exc.strerror or exc}"
        ) from None
    while True:
        try:
            rc = proc.wait()
        except KeyboardInterrupt:
            # Ctrl-C reached bake too (same process group): wait for it to stop.
            continue
        return 128 - rc if rc < 0 else rc


def cmd_build_all(args: argparse.Namespace) -> int:
    try:
        check_builder(args.builder, load_fleet(args.fleet), fleet_path(args.fleet).resolve())
        graph = load_graph(bake_file_path(args.bake_file))
        # One bake per arch (bake builds one GPU_ARCH per invocation), all checked up front.
        invocations = [
            build_all(
                graph,
                builder=args.builder,
                group=args.group,
                arch=arch,
                base_env=os.environ,
                docker=args.docker,
            )
            for arch in args.arch or [None]
        ]
        for invocation in invocations:
            sys.stderr.write(f"rocm-assets build-all: {invocation.command()}\n")
            sys.stderr.flush()
            status = run(invocation)
            if status != 0:
                return status
        return 0
    except (BuildAllError, SelectionError) as exc:
        sys.stderr.write(f"rocm-assets: error: {exc}\n")
        return EXIT_ERROR


def add_parser(subparsers: Any) -> None:
    """Register `build-all` on the `rocm-assets` subcommand parser."""
    p = subparsers.add_parser(
        "build-all",
        help="bake a whole group on one builder in one invocation, no push",
        description=__doc__.split("\n\n")[1].replace("\n", " "),
    )
    p.add_argument("--builder", required=True, help="one node's buildx builder (fleet.yaml)")
    p.add_argument("--group", default=DEFAULT_GROUP, help=f"bake group (default: {DEFAULT_GROUP})")
    add_list(
        p,
        "--arch",
        metavar="A",
        help="GPU arches, one bake each, in order (default: $GPU_ARCH, else the file's default)",
    )
    p.add_argument("--bake-file", help="bake file (default: $ROCM_BAKE_FILE, else ./rocm-bake.hcl)")
    p.add_argument("--fleet", help="fleet file (default: $ROCM_FLEET_FILE, else ./fleet.yaml)")
    p.add_argument("--docker", default="docker", help="the docker CLI to run")
    p.set_defaults(func=cmd_build_all)
