"""Gantt charts of placement plans: one lane per node, one bar per build (pulls + build + push).

matplotlib (the `bench` extra) is imported only when a chart is drawn, with the Agg backend so
no display is needed. The file suffix picks the format: .svg and .png are matplotlib's own;
.html is a self-contained page with the chart as inline SVG and the plan as a table.
"""

import html
import io
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rocm_assets.core.placement import Bound, Schedule

FORMATS = (".svg", ".png", ".html")
# (node, start s, end s, label): a node held outside the plan, in the plan's seconds.
HeldBlock = tuple[str, float, float, str]


class GanttError(ValueError):
    """A chart that cannot be written; the message names the file and what to change."""


def _pyplot(path: Path) -> Any:
    try:
        import matplotlib
    except ImportError:
        raise GanttError(
            f"{path}: drawing a Gantt chart needs matplotlib: pip install 'rocm_assets[bench]'"
        ) from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _hours(seconds: float) -> str:
    whole = round(seconds)
    return f"{whole // 3600}:{whole % 3600 // 60:02d}:{whole % 60:02d}"


def _bound_text(schedule: Schedule, bound: Bound | None) -> str:
    if bound is None:
        return f"lower bound {_hours(schedule.lower_bound_s)}"
    return f"lower bound {_hours(bound.value_s)} ({bound.label})"


def _figure(
    schedule: Schedule,
    nodes: Sequence[str],
    title: str,
    path: Path,
    bound: Bound | None,
    holds: Sequence[HeldBlock],
) -> tuple[Any, Any]:
    """The pyplot module and the drawn figure."""
    plt = _pyplot(path)
    lanes = list(nodes) + sorted({a.node for a in schedule.assignments} - set(nodes))
    row = {name: k for k, name in enumerate(lanes)}
    span_h = max(schedule.makespan_s, *(end for _, _, end, _ in holds), 1.0) / 3600
    fig, ax = plt.subplots(figsize=(13, 0.55 * len(lanes) + 1.8), dpi=80)
    # Colours by sorted target name: the same builds get the same colours in every strategy's
    # chart of one problem.
    targets = sorted({a.build.target for a in schedule.assignments})
    cmap = plt.get_cmap("tab20" if len(targets) <= 20 else "turbo")
    color = {
        t: cmap(k / max(1, len(targets) - 1) if len(targets) > 20 else k)
        for k, t in enumerate(targets)
    }
    for a in schedule.assignments:
        left, width = a.start_s / 3600, (a.end_s - a.start_s) / 3600
        y = row[a.node]
        ax.barh(
            y,
            width,
            left=left,
            height=0.7,
            color=color[a.build.target],
            edgecolor="black",
            linewidth=0.4,
        )
        # Only labels that fit: about 0.6% of the span per character at this size.
        label = a.build.arch or "noarch"
        if width > span_h * 0.006 * len(label):
            ax.text(left + width / 2, y, label, ha="center", va="center", fontsize=6)
    # What holds a node outside the plan (a build not of this farm): grey, hatched, named.
    for node, start_s, end_s, label in holds:
        if node not in row:
            continue
        left, width = start_s / 3600, (end_s - start_s) / 3600
        ax.barh(
            row[node],
            width,
            left=left,
            height=0.7,
            color="lightgrey",
            hatch="//",
            edgecolor="dimgrey",
            linewidth=0.4,
        )
        if width > span_h * 0.006 * len(label):
            ax.text(left + width / 2, row[node], label, ha="center", va="center", fontsize=6)
    line_s = schedule.lower_bound_s if bound is None else bound.value_s
    if line_s > 0:
        ax.axvline(line_s / 3600, color="grey", linestyle="--", linewidth=0.8)
    ax.set_yticks(range(len(lanes)), lanes)
    ax.invert_yaxis()
    ax.set_xlim(0, span_h * 1.01)
    ax.set_xlabel("hours from the start (dashed: lower bound)")
    ax.set_title(
        f"{title}: {schedule.strategy}, makespan {_hours(schedule.makespan_s)}, "
        f"{_bound_text(schedule, bound)}",
        fontsize=10,
    )
    ax.grid(axis="x", linewidth=0.3)
    handles = [plt.Rectangle((0, 0), 1, 1, color=color[t]) for t in targets]
    ax.legend(
        handles, targets, loc="upper left", bbox_to_anchor=(1.005, 1), fontsize=7, frameon=False
    )
    fig.tight_layout()
    return plt, fig


def write_gantt(
    schedule: Schedule,
    path: str | Path,
    nodes: Sequence[str],
    title: str = "plan",
    bound: Bound | None = None,
    holds: Sequence[HeldBlock] = (),
) -> Path:
    """Draw `schedule` with one lane per node of `nodes` (idle ones too) into `path`, with
    `bound` and its source as the lower bound (default: the schedule's, unnamed), and `holds`
    (node, start, end, label) as grey blocks: what holds a node outside the plan.

    Raises:
        GanttError: the suffix is not .svg/.png/.html, matplotlib is missing, or the file cannot
            be written.
    """
    target = Path(path)
    suffix = target.suffix.lower()
    if suffix not in FORMATS:
        raise GanttError(
            f"{target}: unknown chart format {suffix or '(none)'}; use .svg, .png or .html"
        )
    plt, fig = _figure(schedule, nodes, title, target, bound, holds)
    try:
        if suffix == ".html":
            buffer = io.StringIO()
            fig.savefig(buffer, format="svg", metadata={"Date": None})
            page = _html(schedule, title, buffer.getvalue(), _bound_text(schedule, bound))
            target.write_text(page, encoding="utf-8")
        else:
            # No date stamp: a chart redrawn from the same plan is the same file.
            fig.savefig(target, format=suffix[1:], metadata={"Date": None})
    except OSError as exc:
        raise GanttError(f"{target}: cannot write chart: {exc.strerror or exc}") from None
    finally:
        plt.close(fig)
    return target


def _html(schedule: Schedule, title: str, svg: str, bound_text: str) -> str:
    # matplotlib's SVG starts with an XML prolog and DOCTYPE, which are not allowed inline.
    inline = svg[svg.index("<svg") :]
    rows = "\n".join(
        f"<tr><td>{_hours(a.start_s)}</td><td>{_hours(a.end_s)}</td>"
        f"<td>{html.escape(a.node)}</td><td>{html.escape(str(a.build))}</td></tr>"
        for a in schedule.assignments
    )
    name = html.escape(f"{title}: {schedule.strategy}")
    return (
        "<!DOCTYPE html>\n<html><head><meta charset='utf-8'>"
        f"<title>{name}</title>"
        "<style>body{font-family:sans-serif}td,th{padding:2px 10px;text-align:left}</style>"
        f"</head><body><h1>{name}</h1>\n{inline}\n"
        f"<p>makespan {_hours(schedule.makespan_s)}, {html.escape(bound_text)}</p>\n"
        "<table><tr><th>start</th><th>end</th><th>node</th><th>build</th></tr>\n"
        f"{rows}\n</table></body></html>\n"
    )
