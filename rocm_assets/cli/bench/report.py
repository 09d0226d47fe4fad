"""The benchmark document as text (`rocm-assets bench`) and as Markdown tables (docs/)."""

import json
from collections.abc import Mapping, Sequence
from typing import Any

from rocm_assets.core.common.timefmt import duration
from rocm_assets.core.placement.bounds import BOUND_SOURCES

_COLUMNS = ("median", "worst", "x LB med", "x LB worst", "x greedy med", "x greedy worst")
# With noise the bounds (of the estimates) do not hold: ratios to noisy greedy only.
# The last: the coordinator's makespan over the row's, run by run (same instance and draw):
# median (runs where the coordinator was shorter, longer).
_NOISY_COLUMNS = (
    "median",
    "worst",
    "x greedy med",
    "x greedy worst",
    "x greedy best",
    "coord/it by run",
)


def _rows(summary: Mapping[str, Any]) -> list[tuple[str, ...]]:
    rows = []
    for strategy, t in summary["table"].items():
        rows.append(
            (
                strategy,
                duration(t["median_s"]),
                duration(t["worst_s"]),
                f"{t['median_ratio_lb']:.3f}",
                f"{t['worst_ratio_lb']:.3f}",
                f"{t['median_ratio_greedy']:.3f}",
                f"{t['worst_ratio_greedy']:.3f}",
            )
        )
    return rows


def _paired(summary: Mapping[str, Any], strategy: str) -> str:
    p = summary["noisy_paired"].get(strategy)
    return f"{p['median_ratio']:.3f} ({p['shorter']},{p['longer']})" if p else "-"


def _noisy_rows(summary: Mapping[str, Any]) -> list[tuple[str, ...]]:
    return [
        (
            strategy,
            duration(t["median_s"]),
            duration(t["worst_s"]),
            f"{t['median_ratio_greedy']:.3f}",
            f"{t['worst_ratio_greedy']:.3f}",
            f"{t['best_ratio_greedy']:.3f}",
            _paired(summary, strategy),
        )
        for strategy, t in summary["noisy_table"].items()
    ]


def _heading(summary: Mapping[str, Any]) -> str:
    lo, hi = summary["builds"]
    builds = f"{lo}" if lo == hi else f"{lo}-{hi}"
    nlo, nhi = summary["nodes"]
    nodes = f"{nlo}" if nlo == nhi else f"{nlo}-{nhi}"
    sol = summary["solver"]
    return (
        f"{summary['name']}: {summary['description']}; {summary['instances']} instance(s), "
        f"{builds} builds, {nodes} nodes; solver limit {summary['solver_time_limit_s']:g} s, "
        f"{sol['optimal']}/{summary['instances']} proven optimal, median gap "
        f"{100 * sol['median_gap']:.1f}%"
    )


_WIDTHS = (18, 11, 11, 10, 12, 14, 16)
_NOISY_WIDTHS = (18, 11, 11, 14, 16, 15, 17)


def _line(cells: Sequence[str], widths: Sequence[int] = _WIDTHS) -> str:
    return "  " + "".join(
        c.rjust(w) if k else c.ljust(w) for k, (c, w) in enumerate(zip(cells, widths, strict=True))
    )


def _noisy_heading(summary: Mapping[str, Any]) -> str:
    c = summary["coordinator"]
    return (
        f"{summary['name']} with noise: real durations = estimate x lognormal(0, "
        f"sigma 0.3); coordinator re-planned a median {c['noisy_median_replans']:g} times "
        f"(at most {c['noisy_max_replans']})"
    )


def _bound_line(summary: Mapping[str, Any]) -> str:
    """Which bound "x LB" divides by, per instance: the best known, as `plan` reports it."""
    counts = ", ".join(f"{BOUND_SOURCES[k]} {n}" for k, n in summary["bound_sources"].items())
    return f"  x LB: over each instance's best bound ({counts})"


def text_report(doc: Mapping[str, Any]) -> str:
    lines = []
    for summary in doc["scenarios"]:
        lines.append(_heading(summary))
        lines.append(_line(("strategy", *_COLUMNS)))
        lines.extend(_line(row) for row in _rows(summary))
        lines.append(_bound_line(summary))
        lines.append(_noisy_heading(summary))
        lines.append(_line(("strategy", *_NOISY_COLUMNS), _NOISY_WIDTHS))
        lines.extend(_line(row, _NOISY_WIDTHS) for row in _noisy_rows(summary))
        lines.append("")
    lines.append("targets:")
    for name, value in doc["targets"].items():
        lines.append(f"  {name}: {json.dumps(value, sort_keys=True)}")
    lines.append("overhead:")
    for name, value in doc["overhead"].items():
        lines.append(f"  {name}: {json.dumps(value, sort_keys=True)}")
    lines.append(f"wall time {doc['wall_s']:.0f} s")
    return "\n".join(lines) + "\n"


def _markdown(heading: str, columns: Sequence[str], rows: list[tuple[str, ...]]) -> list[str]:
    return [
        f"**{heading}**\n",
        "| strategy | " + " | ".join(columns) + " |",
        "|---" * (len(columns) + 1) + "|",
        *("| " + " | ".join(row) + " |" for row in rows),
        "",
    ]


def markdown_tables(doc: Mapping[str, Any], noisy: bool | None = None) -> str:
    """Every scenario's tables; `noisy` True or False for only those with or without noise."""
    parts = []
    for summary in doc["scenarios"]:
        if noisy is not True:
            parts += _markdown(_heading(summary), _COLUMNS, _rows(summary))
        if noisy is not False:
            parts += _markdown(_noisy_heading(summary), _NOISY_COLUMNS, _noisy_rows(summary))
    return "\n".join(parts)
