"""`rocm-assets plan` (the dry run: what would be built where and when) and `rocm-assets best`."""

import argparse
import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

from rocm_assets.cli.common import (
    EXIT_OK,
    CliError,
    add_bake_file,
    add_fleet,
    add_list,
    graph_of,
    out,
    warn,
)
from rocm_assets.cli.gantt import GanttError, write_gantt
from rocm_assets.core.bake import BakeGraph
from rocm_assets.core.build.builds import (
    Build,
    build_deps,
    builds_for,
    check_arches,
    select_targets,
)
from rocm_assets.core.build.invocation import HistoryUnavailable, history
from rocm_assets.core.common.constants import DEFAULT_GROUP
from rocm_assets.core.common.timefmt import duration
from rocm_assets.core.nodes.fleet import Fleet, Node, fleet_path, load_fleet
from rocm_assets.core.nodes.foreign import FOREIGN_BUILD_DEFAULT_S, ForeignBuild, foreign_builds
from rocm_assets.core.nodes.probes import NodeProbe, best_node, probe_fleet
from rocm_assets.core.placement import (
    STRATEGIES,
    Assignment,
    CostModel,
    PlacementError,
    Problem,
    Schedule,
    plan,
    validate_schedule,
)
from rocm_assets.core.placement.bounds import Bound, best_bound
from rocm_assets.core.placement.farm import (
    FarmState,
    FollowSettings,
    Hold,
    busy_until,
    solver_budget_s,
)
from rocm_assets.core.placement.follow import COORDINATOR_STRATEGY, PlanFollower
from rocm_assets.core.placement.runners import InlineSolver
from rocm_assets.core.placement.solver import (
    DEFAULT_TIME_LIMIT_S,
    SOLVER_STRATEGY,
    SolverError,
    solve,
)


def _plan_builds(
    graph: BakeGraph, args: argparse.Namespace
) -> tuple[list[Build], dict[Build, frozenset[Build]], dict[Build, list[Build]]]:
    """The requested builds, their deps, and the inputs outside the request (-> who needs them)."""
    group = None if args.targets else args.group or DEFAULT_GROUP
    targets = select_targets(graph, group=group, targets=args.targets)
    arches = check_arches(graph, args.arch or [graph.arches[0]])
    builds = builds_for(graph, targets, arches)
    deps = {b: build_deps(graph, b) for b in builds}
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
            warn(f"excluded {p.node}: {p.reason}")
    usable = {p.node for p in probes if p.ok}
    nodes = [n for n in fleet.nodes if n.name in usable]
    if not nodes:
        raise CliError("every node is excluded by its probe (reasons above): nothing to plan on")
    return [p for p in probes if p.ok], nodes


def _running_builds(fleet: Fleet, nodes: list[Node], cost: CostModel) -> list[ForeignBuild]:
    """What each node's BuildKit is building now (a plan is a dry run: whoever's it is, it holds
    its node), estimated as the coordinator estimates a build not of its farm. A node whose
    history cannot be read is named on stderr and planned on as if it built nothing."""
    env = dict(os.environ)

    def read(node: Node) -> list[ForeignBuild]:
        try:
            records = history(node.builder, env, timeout_s=20.0)
        except HistoryUnavailable as exc:
            warn(f"{node.name}: its BuildKit history cannot be read, planned as idle: {exc}")
            return []
        default_s = float(FOREIGN_BUILD_DEFAULT_S)
        return foreign_builds(node, records, lambda _: False, cost, fleet, time.time(), default_s)

    with ThreadPoolExecutor(max_workers=len(nodes)) as pool:
        return [b for found in pool.map(read, nodes) for b in found]


def _holds(running: list[ForeignBuild], now: float) -> list[Hold]:
    """The running builds as holds from the plan's start (0 = now)."""
    return [
        Hold(b.node, b.started_s - now, b.est_end_s - now, f"{b.node} is building {b.label}")
        for b in running
    ]


def _coordinator_plan(
    problem: Problem,
    deps: dict[Build, frozenset[Build]],
    time_limit_s: float | None,
    holds: list[Hold],
) -> tuple[Schedule, Bound, dict[str, Any]]:
    """The plan the run coordinator would follow for this request on an idle farm: its first
    plan, the solver's part included within its budget (wall-clock seconds here), capped by
    `time_limit_s` when given; and the best bound known, its solve's when that proved more."""
    settings = FollowSettings()
    if time_limit_s is not None:
        settings = replace(
            settings,
            solver_min_seconds=min(settings.solver_min_seconds, time_limit_s),
            solver_time_limit_seconds=min(settings.solver_time_limit_seconds, time_limit_s),
        )
    follower = PlanFollower(InlineSolver(deterministic=False, workers=None), settings)
    pending = {b: deps[b] for b in problem.builds}
    follower.tick(FarmState(0.0, pending, {}, problem.nodes, problem.cost, holds=holds))
    for note in follower.notes():
        warn(note)
    view = follower.plan()
    if view is None:
        raise CliError("the coordinator made no plan")
    assignments = sorted(
        (
            Assignment(p.build, p.node, p.est_start_s, p.est_finish_s)
            for queue in view.queues.values()
            for p in queue
        ),
        key=lambda a: (a.start_s, a.node, a.build),
    )
    # The farm is idle at 0, so the view's absolute bound is one from the plan's start.
    bound = best_bound(problem, view.proven_bound_s, view.makespan_s)
    schedule = Schedule(view.strategy, tuple(assignments), view.makespan_s, bound.value_s)
    budget = solver_budget_s(len(problem.builds), settings)
    proven = None if view.proven_bound_s is None else round(view.proven_bound_s, 3)
    return (
        schedule,
        bound,
        {"solver": view.solver, "solver_budget_s": round(budget, 3), "proven_bound_s": proven},
    )


def cmd_plan(args: argparse.Namespace) -> int:
    graph = graph_of(args)
    builds, deps, outside = _plan_builds(graph, args)
    fleet = load_fleet(args.fleet)
    probes, nodes = _probed_nodes(fleet, args.probe)
    problem = Problem(tuple(builds), deps, tuple(nodes), CostModel(fleet, probes=probes))
    now = time.time()
    running = _running_builds(fleet, nodes, problem.cost) if args.probe else []
    holds = _holds(running, now)
    held = {n: t for n, t in busy_until(holds).items() if t > 0}
    extra: dict[str, Any] = {}
    solver_line = ""
    try:
        if args.strategy == COORDINATOR_STRATEGY:
            schedule, bound, extra[COORDINATOR_STRATEGY] = _coordinator_plan(
                problem, deps, args.time_limit, holds
            )
        elif args.strategy == SOLVER_STRATEGY:
            limit = DEFAULT_TIME_LIMIT_S if args.time_limit is None else args.time_limit
            result = solve(problem, limit, held)
            bound = best_bound(problem, result.proven_bound_s, result.schedule.makespan_s)
            schedule = replace(result.schedule, lower_bound_s=bound.value_s)
            solver_line = f"solver: {result.summary}"
            extra["solver"] = {
                "status": result.status,
                "proven_bound_s": round(result.proven_bound_s, 3),
                # In real seconds, as lower_bound_s: 0 only when the plan is proven optimal.
                "gap": round(result.real_gap, 5),
                "time_limit_s": limit,
                "kept_hint": result.kept_hint,
            }
        else:
            schedule = plan(problem, args.strategy, held)
            bound = best_bound(problem, makespan_s=schedule.makespan_s)
        errors = validate_schedule(problem, schedule)
        if errors:
            raise CliError(f"the {schedule.strategy} plan is invalid: {errors[0]}")
        if args.gantt:
            write_gantt(
                schedule,
                args.gantt,
                [n.name for n in fleet.nodes],
                title="rocm-assets plan",
                bound=bound,
                holds=[
                    (h.node, max(0.0, h.since_s), h.until_s, b.label)
                    for h, b in zip(holds, running, strict=True)
                ],
            )
            warn(f"wrote {args.gantt}")
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
            "lower_bound_s": round(bound.value_s, 3),
            # What proved it: path, work or stage (placement's static bounds) or solver (CP-SAT).
            "lower_bound_source": bound.source,
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
            # What the nodes' BuildKit runs now (--probe): it holds its node until est_end_s.
            "held": [
                {
                    "node": b.node,
                    "name": b.name,
                    "named": b.named,
                    "running_s": round(now - b.started_s, 3),
                    "est_end_s": round(b.est_end_s - now, 3),
                    "estimated_by": b.estimated_by,
                }
                for b in running
            ],
            **extra,
        }
        out(json.dumps(data, indent=2))
        return EXIT_OK
    width = max((len(a.node) for a in schedule.assignments), default=4)
    out(f"{'start':>9}  {'end':>9}  {'node':<{width}}  build")
    for a in schedule.assignments:
        out(f"{duration(a.start_s):>9}  {duration(a.end_s):>9}  {a.node:<{width}}  {a.build}")
    ratio = schedule.makespan_s / bound.value_s if bound.value_s > 0 else 1.0
    out(
        f"{len(schedule.assignments)} builds on {len(nodes)} nodes, strategy {schedule.strategy}: "
        f"makespan {duration(schedule.makespan_s)}, lower bound {duration(bound.value_s)} "
        f"({bound.label}; {ratio:.3f}x)"
    )
    for b in running:
        out(
            f"held: {b.node} is building {b.label}, running {duration(now - b.started_s)}, "
            f"est. end in {duration(b.est_end_s - now)} (by {b.estimated_by})"
        )
    if solver_line:
        out(solver_line)
    if COORDINATOR_STRATEGY in extra:
        out(f"coordinator's solver: {extra[COORDINATOR_STRATEGY]['solver']}")
    for item in published:
        out(
            f"must already be published: {item['image']} (needed by {', '.join(item['needed_by'])})"
        )
    return EXIT_OK


def cmd_best(args: argparse.Namespace) -> int:
    """The strongest node by probe score; a node nobody probed wins only when it says so.

    A node with no ssh address is never probed: its fleet figures (every core idle) stand in.
    When some nodes have ssh but every one of them failed its probe, no node is picked: the only
    candidates left would be ones nobody could look at (exit 2, naming the failed nodes).
    """
    fleet = load_fleet(args.fleet)
    probes = probe_fleet(fleet)
    for p in probes:
        if not p.ok:
            warn(f"excluded {p.node}: {p.reason}")
    probed = [p for p in probes if p.probed]
    unprobed = [p.node for p in probes if not p.probed]
    if probed and not any(p.ok for p in probed):
        one = len(unprobed) == 1
        blind = (
            f"; {', '.join(unprobed)} {'has' if one else 'have'} no ssh address, so nobody could "
            f"probe {'it' if one else 'them'}, and fleet figures are no live state to pick on"
            if unprobed
            else ""
        )
        raise CliError(
            f"no node of {fleet_path(args.fleet)} is reachable: "
            f"{', '.join(p.node for p in probed)} failed their probes (reasons above){blind}"
        )
    best = best_node(probes)
    # Unprobed nodes are always usable, and some probed node answered if any was probed.
    assert best is not None
    best_probed = best_node(probed) if not best.probed else None
    if args.json:
        data = {
            "node": best.node,
            "builder": fleet.node(best.node).builder,
            "score": round(best.score, 2),
            "mem_available_gb": round(best.mem_available_gb, 2),
            "idle_cores": round(best.idle_cores, 2),
            "cores": best.cores,
            "probed": best.probed,
            # The strongest node that answered, when a node nobody probed is ahead of it.
            "best_probed": best_probed.node if best_probed else None,
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
        out(json.dumps(data, indent=2))
        return EXIT_OK
    if best.probed:
        source = "probed"
    else:
        source = "fleet figures, not probed: no ssh address, so its load now is unknown"
        if best_probed:
            source += (
                f"; the strongest probed node is {best_probed.node}, score {best_probed.score:.1f}"
            )
    out(
        f"{best.node}: score {best.score:.1f} ({best.mem_available_gb:.1f} GB free + "
        f"{best.idle_cores:.1f} idle cores of {best.cores}; {source})"
    )
    return EXIT_OK


def add_parsers(sub: Any) -> None:
    p = sub.add_parser("plan", help="dry run: what would be scheduled, where and when")
    add_bake_file(p)
    what = p.add_mutually_exclusive_group()
    what.add_argument("--group", metavar="G", help=f"a bake group (default: {DEFAULT_GROUP})")
    add_list(what, "--targets", metavar="T", help="bake targets, only these")
    add_list(p, "--arch", metavar="A", help="GPU arches (default: the first in the bake file)")
    add_fleet(p)
    p.add_argument(
        "--strategy",
        choices=[COORDINATOR_STRATEGY, *STRATEGIES, SOLVER_STRATEGY],
        default=COORDINATOR_STRATEGY,
        help="placement strategy (default: coordinator, the plan the run coordinator would "
        "follow: the best heuristic plan, then CP-SAT within its budget)",
    )
    follow = FollowSettings()
    p.add_argument(
        "--time-limit",
        type=float,
        metavar="S",
        help=f"solver seconds: the solver strategy's limit (default {DEFAULT_TIME_LIMIT_S:g}), "
        f"a cap on the coordinator's budget (default: its budget, "
        f"{follow.solver_seconds_per_build:g} s a build, at least "
        f"{follow.solver_min_seconds:g} s, at most {follow.solver_time_limit_seconds:g} s)",
    )
    p.add_argument(
        "--probe",
        action="store_true",
        help="use live SSH probes, not the fleet figures, and plan around what each node's "
        "BuildKit is building now",
    )
    p.add_argument("--json", action="store_true")
    p.add_argument("--gantt", metavar="FILE", help="also draw the plan: .svg, .png or .html")
    p.set_defaults(func=cmd_plan)

    p = sub.add_parser("best", help="the strongest node now, by probe score")
    add_fleet(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_best)
