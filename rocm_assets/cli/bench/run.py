"""A whole benchmark run: every scenario and overhead, the issue's targets, the files written."""

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rocm_assets.cli.bench.overhead import OVERHEADS, OverheadContext
from rocm_assets.cli.bench.report import markdown_tables
from rocm_assets.cli.bench.results import (
    ALL_STRATEGIES,
    NOISY_STRATEGIES,
    Outcome,
    run_instance,
    summarize,
)
from rocm_assets.cli.bench.scenarios import (
    COORDINATOR_BUDGET_SHARE,
    Instance,
    Settings,
    coordinator_settings,
    scenarios,
)
from rocm_assets.cli.bench.targets import targets_report
from rocm_assets.core.bake import load_graph
from rocm_assets.core.common.settings import bake_file_path
from rocm_assets.core.nodes.fleet import load_fleet
from rocm_assets.core.placement.farm import FollowSettings
from rocm_assets.core.placement.simulate import NOISE_SIGMA

SCHEMA_VERSION = 2


def run_bench(
    *,
    seed: int = 1,
    quick: bool = False,
    out: Path | None = None,
    bake_file: str | None = None,
    fleet_file: str | None = None,
    instances: int | None = None,
    workers: int = 2,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Run every scenario and overhead; write results.json, tables.md and Gantt PNGs under
    `out` when given. Returns the JSON document (schema in docs/benchmarks.md)."""
    started = time.perf_counter()
    settings = Settings.make(seed, quick, workers, instances)
    graph = load_graph(bake_file_path(bake_file), {})
    fleet = load_fleet(fleet_file)
    say = progress or (lambda _: None)
    summaries: list[dict[str, Any]] = []
    charts: list[str] = []
    for scenario in scenarios(graph, fleet, settings):
        t0 = time.perf_counter()
        outcomes = []
        for k, instance in enumerate(scenario.instances):
            outcome = run_instance(
                instance,
                scenario.solver_limit_s,
                settings.workers,
                coordinator_settings(scenario.solver_limit_s),
                [
                    f"{seed}:{instance.name}:{draw}"
                    for draw in range(settings.noise_draws(len(scenario.instances)))
                ],
                scenario.gantt,
            )
            outcomes.append(outcome)
            if scenario.gantt and out is not None:
                charts.extend(_charts(out, scenario.name, instance, outcome))
            if (k + 1) % 25 == 0:
                say(f"{scenario.name}: {k + 1}/{len(scenario.instances)} instances")
        summaries.append(summarize(scenario, outcomes))
        say(f"{scenario.name}: {len(outcomes)} instances in {time.perf_counter() - t0:.0f} s")
    overhead: dict[str, Any] = {}
    ctx = OverheadContext(graph, fleet, settings)
    for name, measure in OVERHEADS.items():
        overhead[name] = measure(ctx)
        say(f"overhead {name}: done")
    doc: dict[str, Any] = {
        "schema": SCHEMA_VERSION,
        "seed": seed,
        "quick": quick,
        "command": _command(seed, quick, out, instances),
        "strategies": list(ALL_STRATEGIES),
        "noisy_strategies": list(NOISY_STRATEGIES),
        "noise": {
            "lognormal_sigma": NOISE_SIGMA,
            "seed": f"{seed}:<instance name>:<draw>",
            "samples_per_scenario_at_least": settings.noise_samples,
        },
        "coordinator": _coordinator_doc(),
        "solver": {
            "workers": settings.workers,
            "named_time_limit_s": settings.named_solver_s,
            "family_time_limit_s": settings.family_solver_s,
            "scale_time_limit_s": settings.scale_solver_s,
            "proof_time_limit_s": settings.proof_solver_s,
        },
        "scenarios": summaries,
        "overhead": overhead,
        "targets": targets_report(summaries, overhead),
        "gantt": charts,
        "wall_s": round(time.perf_counter() - started, 1),
    }
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "bench-results.json").write_text(json.dumps(doc, indent=1) + "\n")
        (out / "bench-tables.md").write_text(markdown_tables(doc))
    return doc


def _coordinator_doc() -> dict[str, Any]:
    daemon = FollowSettings()
    return {
        "first_solve": "the plan at time 0: the scenario's solver limit in wall-clock seconds "
        "on the bench's workers; the solver row is this solve's plan followed blindly",
        "solver": "re-plans: inline, deterministic time, 1 interleaved worker",
        "budget_share": COORDINATOR_BUDGET_SHARE,
        "budget": "re-plans: solver_budget_s(builds) x scenario solver limit / "
        f"{daemon.solver_time_limit_seconds:g} s x budget_share, in deterministic seconds",
        "daemon_settings": {
            "replan_drift_margin": daemon.replan_drift_margin,
            "replan_early_margin": daemon.replan_early_margin,
            "fill_idle_nodes": daemon.fill_idle_nodes,
            "solver_min_seconds": daemon.solver_min_seconds,
            "solver_seconds_per_build": daemon.solver_seconds_per_build,
            "solver_time_limit_seconds": daemon.solver_time_limit_seconds,
            "solver_max_builds": daemon.solver_max_builds,
        },
    }


def _command(seed: int, quick: bool, out: Path | None, instances: int | None) -> str:
    parts = ["rocm-assets", "bench", "--seed", str(seed)]
    if quick:
        parts.append("--quick")
    if instances:
        parts += ["--instances", str(instances)]
    if out is not None:
        parts += ["--out", str(out)]
    return " ".join(parts)


def _charts(out: Path, scenario: str, instance: Instance, outcome: Outcome) -> list[str]:
    from rocm_assets.cli.gantt import write_gantt

    img = out / "img"
    img.mkdir(parents=True, exist_ok=True)
    names = [node.name for node in instance.problem.nodes]
    written = []
    for strategy, schedule in outcome.schedules.items():
        path = img / f"gantt-{scenario}-{strategy}.png"
        write_gantt(schedule, path, names, title=scenario, bound=outcome.bound)
        written.append(str(path.relative_to(out)))
    return written
