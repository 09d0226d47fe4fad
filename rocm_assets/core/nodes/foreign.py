"""Builds a node's BuildKit is running that are not this farm's: a sibling project's, a second
rocm-assets farm's, or a bake run by hand. Each holds its node (one build per node: two builds on
one box each derive MAX_JOBS from MemAvailable as though alone), until an estimated end.

A record is this farm's when its name follows the convention `<BUILD_NAME_PREFIX>/<target>/
<arch>/<run id>` and the run id is one this farm knows (`is_ours`). Anything else is foreign: a
record named by the convention under another prefix (a sibling's), or under ours with a run id
nobody here knows (another farm's), or any other name (buildx derives one from the context and
Dockerfile when none is given, so a record is never nameless).

Its end is estimated from its start: for a convention name whose target the cost model knows
(the fleet gives it a cost, or builds of it were measured), by the model on that node; otherwise
by a stated default. A build still running past its estimate is given another step of it, so the
plan is not re-made at every tick while it overruns.
"""

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from rocm_assets.core.build.invocation import HistoryRecord
from rocm_assets.core.common.constants import BUILD_NAME_PREFIX
from rocm_assets.core.common.timefmt import duration, from_rfc3339
from rocm_assets.core.nodes.fleet import Fleet, Node
from rocm_assets.core.placement.cost import CostModel
from rocm_assets.core.placement.farm import Hold

# How long a build the cost model cannot estimate is expected to take (the coordinator's
# `foreign_build_seconds`).
FOREIGN_BUILD_DEFAULT_S = 1800
# A build past its estimate is held this much longer at a time (or a quarter of its estimate).
_OVERRUN_STEP_S = 60.0
RUNNING = "Running"


@dataclass(frozen=True)
class ForeignBuild:
    """A build not of this farm running on `node`: its history record's name and ref, when it
    started, and when it is estimated to end (`estimated_by`: the cost model or the default)."""

    node: str
    ref: str
    name: str
    named: bool
    started_s: float
    est_end_s: float
    estimated_by: str

    @property
    def label(self) -> str:
        """Its name by the convention, or `unnamed build (<buildx's derived name>)`."""
        return self.name if self.named else f"unnamed build ({self.name})"

    def what(self, now_s: float) -> str:
        """`demo-big is building rocm-sibling/pytorch/gfx942/r7 (not this farm's), running 3m,
        est. end in 41m`: what a waiting run's tag and `watch` say of it."""
        return (
            f"{self.node} is building {self.label} (not this farm's), running "
            f"{duration(now_s - self.started_s)}, est. end in {duration(self.est_end_s - now_s)}"
        )

    def hold(self, now_s: float) -> Hold:
        return Hold(self.node, self.started_s, self.est_end_s, self.what(now_s))


def convention_parts(name: str) -> tuple[str, str, str, str] | None:
    """(prefix, target, arch, run id) of a name `<prefix>/<target>/<arch>/<run>`, else None."""
    parts = name.split("/")
    if len(parts) != 4 or not all(parts):
        return None
    return parts[0], parts[1], parts[2], parts[3]


def our_run_id(name: str) -> str | None:
    """The run id of a record named by this project's convention, else None."""
    parts = convention_parts(name)
    return parts[3] if parts is not None and parts[0] == BUILD_NAME_PREFIX else None


def foreign_builds(
    node: Node,
    records: Iterable[HistoryRecord],
    is_ours: Callable[[str], bool],
    cost: CostModel,
    fleet: Fleet,
    now_s: float,
    default_s: float,
) -> list[ForeignBuild]:
    """The running records of `node`'s history that are not this farm's, oldest first."""
    found = []
    for record in records:
        if record.status != RUNNING:
            continue
        run_id = our_run_id(record.name)
        if run_id is not None and is_ours(run_id):
            continue
        started = from_rfc3339(record.created_at)
        started = now_s if started is None else min(started, now_s)
        parts = convention_parts(record.name)
        target = parts[1] if parts is not None else None
        if target is not None and (target in fleet.costs or cost.has_measured(target)):
            estimate = cost.build_s(target, node) + cost.push_s(target, node)
            by = "the cost model"
        else:
            estimate, by = default_s, "the default"
        found.append(
            ForeignBuild(
                node.name,
                record.ref,
                record.name,
                parts is not None,
                started,
                _estimated_end(started, estimate, now_s),
                by,
            )
        )
    return sorted(found, key=lambda b: (b.started_s, b.ref))


def _estimated_end(started_s: float, estimate_s: float, now_s: float) -> float:
    """`started_s + estimate_s`; past that, the end of the step of overrun `now_s` is in."""
    end = started_s + max(estimate_s, 1.0)
    if end > now_s:
        return end
    step = max(_OVERRUN_STEP_S, estimate_s / 4)
    return end + step * (int((now_s - end) // step) + 1)
