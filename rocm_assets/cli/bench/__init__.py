"""`rocm-assets bench`: schedule quality by discrete-event simulation, and the farm's own overhead.

Nothing here re-implements placement: `rocm_assets.core.placement.simulate` plays each strategy
out event by event. An online strategy asks `placement.choose_placements` what to start, with the
same arguments the run coordinator passes, and a static plan (the solver's, the baselines') is
followed node by node in its order, each build starting once its node is free and its inputs are
pushed.

Scenarios (issue 6): the shipped fleet.yaml with the shipped bake graph; a skewed fleet (the
seed's 16-core/15 GB box beside a 32-core/122 GB box, uplinks spanning 25x); each for 1 arch and
for 5 arches at once; seeded random families on the real graph and on random DAGs of a similar
shape (a serial neck, then fan-out and joins), with fleets of 2-12 nodes; a calibration family
drawn the same way where the solver gets long enough to prove most optima (so the distance to
the true optimum, not only to a lower bound, is known); and 100 builds on 12 nodes.

Strategies: the four of `placement.STRATEGIES` run online, `coordinator` (the run
coordinator's `PlanFollower`: one plan followed, re-planned on drift, CP-SAT inline within the
daemon's budget function scaled to the scenario), `solver` (CP-SAT, warm-started from the best
heuristic plan, then followed), `buildx-default` (everything on the fleet's first node, in
dependency order: the seed's complaint) and `single-best-node` (everything on the node that
finishes the serial list soonest). Two diagnostics of `default`: online with locality (the node
each finished build is on) and its static plan followed. Every scenario runs again with noise:
each build really takes its estimate times a seeded lognormal factor (sigma 0.3), which the
strategies do not see; the static plans are then followed blindly.

The issues' targets are judged in `targets.py`; the command exits 1 naming each one not met.

Overheads (`overhead.py`): the placement decision for 1,000 queued builds on 50 nodes (the
coordinator's following tick, and each strategy's whole-DAG decision), the
code location's load (parse + evaluate the bake file + build Definitions) over a bare
`import dagster`, in fresh interpreters, and the event records of one run whose bake prints
100,000 lines (`bake_output`). The registry observation tick is a pytest-benchmark
(`rocm_assets_tests/bench_registry_tick.py`), beside the registries it needs.
"""

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from rocm_assets.cli.common import (
    EXIT_OK,
    EXIT_PROBLEMS,
    CliError,
    add_bake_file,
    add_fleet,
    out,
    warn,
)
from rocm_assets.cli.gantt import GanttError
from rocm_assets.core.placement import PlacementError
from rocm_assets.core.placement.simulate import SimulationError
from rocm_assets.core.placement.solver import SolverError


def cmd_handoff(args: argparse.Namespace) -> int:
    """`bench handoff`: the example farm run for real; exit 1 when a goal is not met."""
    from rocm_assets.cli.bench.handoff import run_demo, text_report

    def progress(line: str) -> None:
        sys.stderr.write(f"rocm-assets bench handoff: {line}\n")

    doc = run_demo(hold_s=args.hold, timeout_s=args.timeout, progress=progress)
    if args.json:
        out(json.dumps(doc, indent=1))
    else:
        sys.stdout.write(text_report(doc))
    failed = []
    if doc["median_s"] is None or doc["median_s"] >= doc["target_median_s"]:
        failed.append(f"median handoff {doc['median_s']} s is not under {doc['target_median_s']} s")
    if doc["max_s"] is None or doc["max_s"] >= doc["target_max_s"]:
        failed.append(f"max handoff {doc['max_s']} s is not under {doc['target_max_s']} s")
    for line in failed:
        warn(f"bench handoff: {line}")
    return EXIT_PROBLEMS if failed else EXIT_OK


def cmd_bench(args: argparse.Namespace) -> int:
    if args.scenario == "handoff":
        return cmd_handoff(args)
    # The run pulls in the solver and the scenarios: loaded for this command only.
    from rocm_assets.cli.bench.report import text_report
    from rocm_assets.cli.bench.run import run_bench
    from rocm_assets.cli.bench.targets import not_judged, not_met

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
    except (SimulationError, PlacementError, SolverError, GanttError) as exc:
        raise CliError(str(exc)) from None
    if args.json:
        out(json.dumps(doc, indent=1))
    else:
        sys.stdout.write(text_report(doc))
    failed = not_met(doc["targets"])
    for line in (*failed, *not_judged(doc["targets"])):
        warn(f"bench: {line}")
    return EXIT_PROBLEMS if failed else EXIT_OK


def add_parsers(sub: Any) -> None:
    p = sub.add_parser("bench", help="simulate the placement strategies; measure the overhead")
    p.add_argument(
        "scenario",
        nargs="?",
        choices=["handoff"],
        help="handoff: run the example farm for real and split each build's handoff "
        "(input pushed -> dependent's bake) from BuildKit's history",
    )
    p.add_argument(
        "--hold", type=float, default=10.0, help="handoff: seconds each build holds (default 10)"
    )
    p.add_argument(
        "--timeout", type=float, default=900.0, help="handoff: seconds to wait for the farm"
    )
    add_bake_file(p)
    add_fleet(p)
    p.add_argument("--seed", type=int, default=1, help="random families' seed (default: 1)")
    p.add_argument("--quick", action="store_true", help="a CI-sized run: 20 instances per family")
    p.add_argument("--instances", type=int, metavar="N", help="instances per random family")
    p.add_argument("--out", metavar="DIR", help="write bench-results.json, bench-tables.md, img/")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_bench)
