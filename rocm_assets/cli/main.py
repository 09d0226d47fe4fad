"""`rocm-assets`: the farm from a terminal, on the same core the code location uses.

Every failure is one line on stderr. Exit status: 0 fine, 1 the check found problems
(drift, missing inputs), 2 bad input or an error reaching something.
"""

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rocm_assets.cli import backfill, buildall
from rocm_assets.cli.gantt import GanttError, write_gantt
from rocm_assets.core.bake import BakeError, BakeGraph, check_drift, load_graph
from rocm_assets.core.constants import (
    DEFAULT_DAGSTER_URL,
    DEFAULT_GROUP,
    FLEET_FILE_ENV,
    REGISTRY_URL_ENV,
    REGISTRY_VAR,
)
from rocm_assets.core.fleet import (
    Fleet,
    FleetError,
    Node,
    NodeProbe,
    best_node,
    fleet_path,
    load_fleet,
    probe_fleet,
)
from rocm_assets.core.placement import (
    STRATEGIES,
    Build,
    CostModel,
    PlacementError,
    Problem,
    plan,
    validate_schedule,
)
from rocm_assets.core.preflight import PreflightError, builds_for, preflight
from rocm_assets.core.registry import RegistryClient, RegistryError
from rocm_assets.core.settings import bake_file_path
from rocm_assets.core.solver import DEFAULT_TIME_LIMIT_S, SOLVER_STRATEGY, SolverError, solve

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


def cmd_preflight(args: argparse.Namespace) -> int:
    with RegistryClient.from_env(url=args.registry) as client:
        # Bake reads REGISTRY (and every other variable) from the environment; --registry
        # points both the check and the graph's image names at one registry.
        env = dict(os.environ)
        if args.registry:
            env[REGISTRY_VAR] = client.host
        graph = load_graph(bake_file_path(args.bake_file), env)
        if args.group is not None:
            if args.group not in graph.groups:
                raise CliError(
                    f"no group {args.group!r} in {graph.path.name} "
                    f"(groups: {', '.join(graph.groups)})"
                )
            targets = graph.select([args.group])
        else:
            unknown = [t for t in args.targets if t not in graph.deps]
            if unknown:
                raise CliError(
                    f"no target {unknown[0]!r} in {graph.path.name} "
                    f"(targets: {', '.join(graph.targets)})"
                )
            targets = graph.select(args.targets)
        report = preflight(graph, builds_for(graph, targets, _arch(graph, args.arch)), client)
    if report.unchecked:
        raise CliError(
            f"input images are not on {client.url} "
            f"(e.g. {report.unchecked[0]}): the bake file's REGISTRY must name the registry "
            f"checked; set {REGISTRY_VAR}={client.host} or pass --registry"
        )
    if args.json:
        _out(json.dumps(report.to_json(), indent=2))
    else:
        for missing in report.missing:
            _out(missing.line())
        _out(report.summary())
    return EXIT_PROBLEMS if report.missing else EXIT_OK


def _plan_builds(
    graph: BakeGraph, args: argparse.Namespace
) -> tuple[list[Build], dict[Build, frozenset[Build]], dict[Build, list[Build]]]:
    """The requested builds, their deps, and the inputs outside the request (-> who needs them)."""
    # Lazily: the coordinator imports dagster, which the other subcommands do not need.
    from rocm_assets.instance import coordinator

    if args.targets:
        for name in args.targets:
            if name not in graph.deps:
                raise CliError(
                    f"no target {name!r} in {graph.path.name} (targets: {', '.join(graph.targets)})"
                )
            if name in graph.test_targets:
                raise CliError(
                    f"{name} is a test target: it runs with make test on a GPU node, not in the "
                    "build graph"
                )
        targets = graph.select(args.targets)
    else:
        group = args.group or DEFAULT_GROUP
        if group not in graph.groups:
            raise CliError(
                f"no group {group!r} in {graph.path.name} (groups: {', '.join(graph.groups)})"
            )
        targets = graph.select([group])
    arches = list(dict.fromkeys(_arch(graph, a) for a in args.arch or [None]))
    builds = coordinator.builds_for(graph, targets, arches)
    deps = {b: coordinator.build_deps(graph, b) for b in builds}
    requested = set(builds)
    outside: dict[Build, list[Build]] = {}
    for b in builds:
        for d in sorted(deps[b]):
            if d not in requested:
                outside.setdefault(d, []).append(b)
    return builds, deps, outside


def _probed_nodes(fleet: Fleet, probe: bool) -> tuple[list[NodeProbe], list[Node]]:
    """Live probes (excluded nodes named on stderr) or none; the nodes a plan may use."""
    if not probe:
        return [], list(fleet.nodes)
    probes = probe_fleet(fleet)
    for p in probes:
        if not p.ok:
            sys.stderr.write(f"rocm-assets: excluded {p.node}: {p.reason}\n")
    usable = {p.node for p in probes if p.ok}
    nodes = [n for n in fleet.nodes if n.name in usable]
    if not nodes:
        raise CliError("every node is excluded by its probe (reasons above): nothing to plan on")
    return [p for p in probes if p.ok], nodes


def cmd_plan(args: argparse.Namespace) -> int:
    graph = _graph(args)
    builds, deps, outside = _plan_builds(graph, args)
    fleet = load_fleet(args.fleet)
    probes, nodes = _probed_nodes(fleet, args.probe)
    problem = Problem(tuple(builds), deps, tuple(nodes), CostModel(fleet, probes=probes))
    extra: dict[str, Any] = {}
    try:
        if args.strategy == SOLVER_STRATEGY:
            result = solve(problem, args.time_limit)
            schedule = result.schedule
            bound = max(schedule.lower_bound_s, result.proven_bound_s)
            extra["solver"] = {
                "status": result.status,
                "proven_bound_s": round(result.proven_bound_s, 3),
                "gap": round(result.gap, 5),
                "time_limit_s": args.time_limit,
                "kept_hint": result.kept_hint,
            }
        else:
            schedule = plan(problem, args.strategy)
            bound = schedule.lower_bound_s
        errors = validate_schedule(problem, schedule)
        if errors:
            raise CliError(f"the {schedule.strategy} plan is invalid: {errors[0]}")
        if args.gantt:
            write_gantt(
                schedule, args.gantt, [n.name for n in fleet.nodes], title="rocm-assets plan"
            )
            sys.stderr.write(f"rocm-assets: wrote {args.gantt}\n")
    except (PlacementError, SolverError, GanttError) as exc:
        raise CliError(str(exc)) from None
    published = [
        {
            "target": d.target,
            "arch": d.arch,
            "image": (graph.tags(d.target, d.arch) or ("",))[0],
            "needed_by": [str(b) for b in needers],
        }
        for d, needers in sorted(outside.items())
    ]
    if args.json:
        data = {
            "strategy": schedule.strategy,
            "makespan_s": round(schedule.makespan_s, 3),
            "lower_bound_s": round(bound, 3),
            "builds": [
                {
                    "target": a.build.target,
                    "arch": a.build.arch,
                    "node": a.node,
                    "start_s": round(a.start_s, 3),
                    "end_s": round(a.end_s, 3),
                }
                for a in schedule.assignments
            ],
            "must_be_published": published,
            **extra,
        }
        _out(json.dumps(data, indent=2))
        return EXIT_OK
    width = max((len(a.node) for a in schedule.assignments), default=4)
    _out(f"{'start':>9}  {'end':>9}  {'node':<{width}}  build")
    for a in schedule.assignments:
        _out(f"{_hms(a.start_s):>9}  {_hms(a.end_s):>9}  {a.node:<{width}}  {a.build}")
    ratio = schedule.makespan_s / bound if bound > 0 else 1.0
    _out(
        f"{len(schedule.assignments)} builds on {len(nodes)} nodes, strategy {schedule.strategy}: "
        f"makespan {_hms(schedule.makespan_s)}, lower bound {_hms(bound)} ({ratio:.3f}x)"
    )
    if "solver" in extra:
        _out(f"solver: {extra['solver']['status']}, gap {100 * extra['solver']['gap']:.1f}%")
    for item in published:
        _out(
            f"must already be published: {item['image']} (needed by {', '.join(item['needed_by'])})"
        )
    return EXIT_OK


def _hms(seconds: float) -> str:
    whole = round(seconds)
    return f"{whole // 3600}:{whole % 3600 // 60:02d}:{whole % 60:02d}"


def cmd_best(args: argparse.Namespace) -> int:
    fleet = load_fleet(args.fleet)
    probes = probe_fleet(fleet)
    for p in probes:
        if not p.ok:
            sys.stderr.write(f"rocm-assets: excluded {p.node}: {p.reason}\n")
    best = best_node(probes)
    if best is None:
        raise CliError(f"no node of {fleet_path(args.fleet)} is reachable (reasons above)")
    source = "probed" if best.probed else "fleet figures, no ssh"
    if args.json:
        data = {
            "node": best.node,
            "builder": fleet.node(best.node).builder,
            "score": round(best.score, 2),
            "mem_available_gb": round(best.mem_available_gb, 2),
            "idle_cores": round(best.idle_cores, 2),
            "cores": best.cores,
            "probed": best.probed,
            "nodes": [
                {
                    "node": p.node,
                    "ok": p.ok,
                    "reason": p.reason,
                    "score": round(p.score, 2),
                    "probed": p.probed,
                }
                for p in probes
            ],
        }
        _out(json.dumps(data, indent=2))
        return EXIT_OK
    _out(
        f"{best.node}: score {best.score:.1f} ({best.mem_available_gb:.1f} GB free + "
        f"{best.idle_cores:.1f} idle cores of {best.cores}; {source})"
    )
    return EXIT_OK


def cmd_bench(args: argparse.Namespace) -> int:
    from rocm_assets.cli.bench import BenchError, run_bench, text_report

    def progress(line: str) -> None:
        sys.stderr.write(f"rocm-assets bench: {line}\n")

    try:
        doc = run_bench(
            seed=args.seed,
            quick=args.quick,
            out=Path(args.out) if args.out else None,
            bake_file=args.bake_file,
            fleet_file=args.fleet,
            instances=args.instances,
            progress=progress,
        )
    except (BenchError, PlacementError, SolverError, GanttError) as exc:
        raise CliError(str(exc)) from None
    if args.json:
        _out(json.dumps(doc, indent=1))
    else:
        sys.stdout.write(text_report(doc))
    return EXIT_OK


def _add_bake_file(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--bake-file", help="bake file (default: $ROCM_BAKE_FILE, else ./rocm-bake.hcl)"
    )


def cmd_watch(args: argparse.Namespace) -> int:
    # Only this command reads the Dagster instance: the others start without importing dagster.
    from rocm_assets.cli.watch import cmd_watch as watch

    return watch(args)


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

    p = sub.add_parser(
        "preflight", help="check that every registry input of a build request is published"
    )
    _add_bake_file(p)
    p.add_argument("--arch", required=True, help="the GPU arch (partition) to build")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--targets", nargs="+", metavar="T", help="bake targets to build")
    what.add_argument("--group", metavar="G", help="a bake group to build")
    p.add_argument("--registry", help=f"registry URL (default: ${REGISTRY_URL_ENV})")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_preflight)

    p = sub.add_parser("plan", help="dry run: what would be scheduled, where and when")
    _add_bake_file(p)
    what = p.add_mutually_exclusive_group()
    what.add_argument("--group", metavar="G", help=f"a bake group (default: {DEFAULT_GROUP})")
    what.add_argument("--targets", nargs="+", metavar="T", help="bake targets, only these")
    p.add_argument(
        "--arch", nargs="+", metavar="A", help="GPU arches (default: the first in the bake file)"
    )
    p.add_argument(
        "--fleet", help=f"fleet manifest (default: ${FLEET_FILE_ENV}, else ./fleet.yaml)"
    )
    p.add_argument(
        "--strategy",
        choices=[*STRATEGIES, SOLVER_STRATEGY],
        default="default",
        help="placement strategy (default: default, the best heuristic plan)",
    )
    p.add_argument(
        "--time-limit",
        type=float,
        default=DEFAULT_TIME_LIMIT_S,
        metavar="S",
        help=f"solver time limit in seconds (default: {DEFAULT_TIME_LIMIT_S:g})",
    )
    p.add_argument(
        "--probe", action="store_true", help="use live SSH probes, not the fleet figures"
    )
    p.add_argument("--json", action="store_true")
    p.add_argument("--gantt", metavar="FILE", help="also draw the plan: .svg, .png or .html")
    p.set_defaults(func=cmd_plan)

    p = sub.add_parser("best", help="the strongest node now, by probe score")
    p.add_argument(
        "--fleet", help=f"fleet manifest (default: ${FLEET_FILE_ENV}, else ./fleet.yaml)"
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_best)

    p = sub.add_parser("bench", help="simulate the placement strategies; measure the overhead")
    _add_bake_file(p)
    p.add_argument(
        "--fleet", help=f"fleet manifest (default: ${FLEET_FILE_ENV}, else ./fleet.yaml)"
    )
    p.add_argument("--seed", type=int, default=1, help="random families' seed (default: 1)")
    p.add_argument("--quick", action="store_true", help="a CI-sized run: 20 instances per family")
    p.add_argument("--instances", type=int, metavar="N", help="instances per random family")
    p.add_argument("--out", metavar="DIR", help="write bench-results.json, bench-tables.md, img/")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_bench)

    backfill.add_parser(sub)
    p = sub.add_parser(
        "watch",
        help="follow the farm live: a line per node, then the queue",
        description="Follow the farm from the Dagster instance in $DAGSTER_HOME.",
    )
    p.add_argument(
        "--interval", type=float, default=2.0, metavar="S", help="seconds between frames"
    )
    p.add_argument("--once", action="store_true", help="print one frame and exit")
    p.add_argument("--fleet", help="fleet file (default: $ROCM_FLEET_FILE, else ./fleet.yaml)")
    p.add_argument(
        "--url",
        default=DEFAULT_DAGSTER_URL,
        help=f"the Dagster UI, linked in the header (default: {DEFAULT_DAGSTER_URL})",
    )
    p.set_defaults(func=cmd_watch)
    buildall.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        return func(args)
    except (BakeError, CliError, FleetError, PreflightError, RegistryError) as exc:
        sys.stderr.write(f"rocm-assets: error: {exc}\n")
        return EXIT_ERROR
    except KeyboardInterrupt:
        return 130
