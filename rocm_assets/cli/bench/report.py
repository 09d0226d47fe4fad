"""The benchmark document as text (`rocm-assets bench`) and as Markdown tables (docs/)."""

import json
from collections.abc import Mapping, Sequence
from typing import Any

from rocm_assets.core.timefmt import duration

_COLUMNS = ("median", "worst", "x LB med", "x LB worst", "x greedy med", "x greedy worst")


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


def _line(cells: Sequence[str]) -> str:
    return "  " + "".join(
        c.rjust(w) if k else c.ljust(w) for k, (c, w) in enumerate(zip(cells, _WIDTHS, strict=True))
    )


def text_report(doc: Mapping[str, Any]) -> str:
    lines = []
    for summary in doc["scenarios"]:
        lines.append(_heading(summary))
        lines.append(_line(("strategy", *_COLUMNS)))
        lines.extend(_line(row) for row in _rows(summary))
        lines.append("")
    lines.append("targets:")
    for name, value in doc["targets"].items():
        lines.append(f"  {name}: {json.dumps(value, sort_keys=True)}")
    lines.append("overhead:")
    for name, value in doc["overhead"].items():
        lines.append(f"  {name}: {json.dumps(value, sort_keys=True)}")
    lines.append(f"wall time {doc['wall_s']:.0f} s")
    return "\n".join(lines) + "\n"


def markdown_tables(doc: Mapping[str, Any]) -> str:
    parts = []
    for summary in doc["scenarios"]:
        parts.append(f"**{_heading(summary)}**\n")
        parts.append("| strategy | " + " | ".join(_COLUMNS) + " |")
        parts.append("|---" * (len(_COLUMNS) + 1) + "|")
        parts.extend("| " + " | ".join(row) + " |" for row in _rows(summary))
        parts.append("")
    return "\n".join(parts)
