"""The followed plan as the daemon stores it for `rocm-assets watch`, and reads it back; and the
builds not of this farm that hold nodes.

The plan lives in the instance's key-value store under PLAN_KEY, as JSON (`plan_json`). Anyone
with the instance can overwrite it, and another version may have written another shape, so a
reader takes it through `read_plan`: the plan, or PlanUnreadable with one line saying why. The
foreign builds live under FOREIGN_KEY (`foreign_json`); `read_foreign` keeps the readable ones.
"""

import json
from typing import Any

from rocm_assets.core.common.text import shown
from rocm_assets.core.nodes.foreign import ForeignBuild
from rocm_assets.core.placement.farm import PlanView

# Where the followed plan is kept: the instance's key-value store.
PLAN_KEY = "rocm/plan"
# Where the builds not of this farm holding nodes are kept, as the daemon last read them.
FOREIGN_KEY = "rocm/foreign_builds"


class PlanUnreadable(ValueError):
    """The stored plan is not JSON, or not the shape `plan_json` writes; one line says how."""


_PLAN_FIELDS: dict[str, type | tuple[type, ...]] = {
    "strategy": str,
    "generation": int,
    "made_at": (int, float),
    "expected_finish": (int, float),
    "reason": str,
    "solver": str,
    "queues": dict,
}


def read_plan(text: str) -> dict[str, Any]:
    """The stored plan (PLAN_KEY) as `plan_json` wrote it; PlanUnreadable if it is not that."""
    try:
        plan = json.loads(text)
    except ValueError as exc:
        raise PlanUnreadable(f"not JSON ({exc})") from None
    if not isinstance(plan, dict):
        raise PlanUnreadable(f"a JSON {type(plan).__name__}, not an object")
    for name, kind in _PLAN_FIELDS.items():
        value = plan.get(name)
        if not isinstance(value, kind) or isinstance(value, bool):
            raise PlanUnreadable(f"{name!r} is {shown(value)}, not {_kind_name(kind)}")
    for node, planned in plan["queues"].items():
        if not isinstance(planned, list) or not all(_planned_build(p) for p in planned):
            raise PlanUnreadable(f"queue of {shown(node)} is not a list of [build, start, finish]")
    return plan


def _kind_name(kind: type | tuple[type, ...]) -> str:
    if isinstance(kind, tuple):
        return "a number"
    return {str: "a string", int: "an integer"}.get(kind, "an object")


def _planned_build(item: object) -> bool:
    return (
        isinstance(item, list)
        and len(item) == 3
        and isinstance(item[0], str)
        and all(isinstance(t, int | float) and not isinstance(t, bool) for t in item[1:])
    )


def plan_json(view: PlanView) -> dict[str, Any]:
    """The followed plan as it is stored (PLAN_KEY)."""
    return {
        "strategy": view.strategy,
        "generation": view.generation,
        "made_at": view.made_s,
        "expected_finish": view.makespan_s,
        "reason": view.reason,
        "solver": view.solver,
        "queues": {
            node: [[str(p.build), p.est_start_s, p.est_finish_s] for p in planned]
            for node, planned in view.queues.items()
        },
    }


def foreign_json(builds: list[ForeignBuild]) -> list[dict[str, Any]]:
    """The foreign builds as they are stored (FOREIGN_KEY)."""
    return [
        {
            "node": b.node,
            "ref": b.ref,
            "name": b.name,
            "named": b.named,
            "started_at": b.started_s,
            "est_end": b.est_end_s,
            "estimated_by": b.estimated_by,
        }
        for b in builds
    ]


def read_foreign(text: str | None) -> list[ForeignBuild]:
    """The stored foreign builds (FOREIGN_KEY); entries not of `foreign_json`'s shape are left
    out (another version wrote them, or a hand)."""
    try:
        items = json.loads(text or "[]")
    except ValueError:
        return []
    found = []
    for item in items if isinstance(items, list) else []:
        try:
            found.append(
                ForeignBuild(
                    str(item["node"]),
                    str(item["ref"]),
                    str(item["name"]),
                    bool(item["named"]),
                    float(item["started_at"]),
                    float(item["est_end"]),
                    str(item["estimated_by"]),
                )
            )
        except (KeyError, TypeError, ValueError):
            continue
    return found
