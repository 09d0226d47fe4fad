"""The plan follower: what the run coordinator starts on each daemon tick, and the plan behind it.

A `PlanFollower` keeps one plan for everything pending and follows it: each node takes its
planned builds in plan order, each once its inputs are published and the node is free. A tick
that follows compares the farm with the last tick (set differences) and looks only at what
changed: the node queues' heads and the builds whose inputs moved. It does not schedule.

It re-plans when reality drifts from the plan (`FarmState` is what the caller knows):

- a new pending build (a new request), or a planned build that left the queue without running;
- the usable node set changed (a node disappeared, failed its probe or came back);
- a build running past its estimate by `replan_drift_margin` of it (the plan's ends are then
  pushed out by the same share, so a slow build re-plans a few times, not every tick);
- a build finishing `replan_early_margin` of its estimate early (its node is free before the
  plan expected: with noisy durations re-planning then is what lets the follower match and
  beat re-planning at every event, docs/benchmarks.md);
- an input known not to be published (its run failed or was cancelled) or published again,
  a node held longer than planned by something outside the plan (or freed before its hold's
  estimated end: a build not of this farm, estimated by a default), a build started elsewhere.

A re-plan adopts at once the shortest of the heuristics' plans (`run_default`) and of the old
plan's remainder re-timed (so drift does not throw away a solver plan that still holds), then
hands the problem to a `SolverRunner` for a CP-SAT plan warm-started from it, with a budget that
grows with the builds at stake (`solver_budget_s`). The tick never waits for the solver: when a
result for the current plan generation arrives and is shorter, the follower switches to it; a
result for an older generation is dropped.

Between re-plans, a node that is free while its next planned build waits for an input may take
a ready build planned on another node, when the plan re-timed with that move scores better
(`fill_idle_nodes`, `fill.best_move`).

Times are on the caller's clock (`now_s`, absolute seconds); a plan's times are its estimates.
"""

from collections import deque
from collections.abc import Callable, Mapping, Sequence

from rocm_assets.core.build.builds import Build
from rocm_assets.core.placement.cost import PlacementError
from rocm_assets.core.placement.farm import (
    FarmState,
    FollowSettings,
    PlannedBuild,
    PlanView,
    Running,
    Slot,
    hold_drift,
    solver_budget_s,
)
from rocm_assets.core.placement.fill import best_move
from rocm_assets.core.placement.heuristics import HEURISTICS
from rocm_assets.core.placement.online import Decision, Start, Waiting
from rocm_assets.core.placement.problem import (
    EPS,
    Assignment,
    Index,
    Placed,
    Problem,
    Run,
    Schedule,
    build_key,
)
from rocm_assets.core.placement.robust import Spread, draws, mean_makespan, order_of, retime
from rocm_assets.core.placement.runners import SolveRequest, SolverRunner
from rocm_assets.core.placement.solver import SOLVER_STRATEGY, ortools_missing

# A running build past its estimate is planned to need at least this much more.
# The strategy name of what the run coordinator does with a PlanFollower: in dagster.yaml,
# `rocm-assets plan --strategy` and the bench's tables alike.
COORDINATOR_STRATEGY = "coordinator"
MIN_REMAINING_S = 1.0


class PlanFollower:
    """Follows a plan for the pending builds; re-plans on drift (module docstring).

    `tick(state)` returns which builds start now (at most one per free node) and why each other
    pending build waits; `plan()` the plan being followed; `notes()` one-line messages for the
    caller to log once (the solver is missing, or failed). No tick raises on ordinary drift.
    `runner` None plans with the heuristics alone.
    """

    def __init__(
        self, runner: SolverRunner | None = None, settings: FollowSettings | None = None
    ) -> None:
        self._runner = runner
        self.settings = settings or FollowSettings()
        self._notes: list[str] = []
        self._said: set[str] = set()
        self._solver_off: str | None = None
        if runner is not None:
            missing = ortools_missing()
            if missing:
                self._solver_off = missing
                self._note(f"placement plans with the heuristics alone: {missing}")
        self.replans = 0
        self._generation = 0
        self._has_plan = False
        self._label = ""
        self._reason = ""
        self._solver_status = "off" if runner is None else (self._solver_off or "idle")
        # Where the asked solve's problem starts, and the bound its answer proved (absolute).
        self._solve_origin = 0.0
        self._proven_s: float | None = None
        self._error: str | None = None
        self._made_s = 0.0
        self._makespan_s = 0.0
        self._ix: Index | None = None
        self._avail0: list[float] = []
        self._run = Run([], [], [])
        # How far finished builds strayed from their estimates, and the estimate each build
        # the plan started had then.
        self._spread = Spread()
        self._estimate: dict[Build, float] = {}
        self._moved = False
        # The plan came from the solver or the solver found nothing shorter.
        self._solved = False
        self._slots: dict[Build, Slot] = {}
        self._prev: dict[Build, Build] = {}
        self._queues: dict[str, deque[Build]] = {}
        self._queued: set[Build] = set()
        self._known: set[Build] = set()
        self._emitted: set[Build] = set()
        self._blocked: dict[Build, Waiting] = {}
        self._inputs: set[Build] = set()
        self._blocking: frozenset[Build] = frozenset()
        self._dependents: dict[Build, list[Build]] = {}
        self._node_names: frozenset[str] = frozenset()
        self._busy: dict[str, float] = {}
        self._assumed_end: dict[Build, float] = {}
        self._waiting: dict[Build, Waiting] = {}
        self._last_pending: set[Build] = set()
        self._last_running: dict[Build, Running] = {}
        # What the last idle-node check saw: it runs again only when this changes.
        self._fill_seen: tuple[int, frozenset[Build], frozenset[Build]] | None = None
        self._forced: str | None = None  # why the next tick re-plans (`replan`)

    # ---- the tick ----
    def tick(self, state: FarmState) -> Decision:
        why = self._drift(state)
        if why is not None:
            self._replan(state, why)
        self._take_solver_result(state)
        if self.settings.fill_idle_nodes:
            self._fill_idle(state)
        decision = self._follow(state)
        for b in self._finished(state):
            r = self._last_running[b]
            estimate = self._estimate.pop(b, r.est_end_s - r.started_s)
            if b not in state.unpublished:
                self._spread.add(state.now_s - r.started_s, estimate)
        self._last_pending = set(state.pending)
        # What the plan started counts as running from now, even before the caller says so:
        # a build may start and end between two ticks.
        self._last_running = dict(state.running)
        for start in decision.starts:
            self._last_running.setdefault(
                start.build, Running(start.node, state.now_s, start.est_finish_s)
            )
        return decision

    def _finished(self, s: FarmState) -> list[Build]:
        """Builds running at the last tick and neither running nor waiting now."""
        return [b for b in self._last_running.keys() - s.running.keys() if b not in s.pending]

    def notes(self) -> list[str]:
        """Messages not yet handed out, each said once: log them."""
        out, self._notes = self._notes, []
        return out

    def close(self) -> None:
        if self._runner is not None:
            self._runner.close()

    def plan(self) -> PlanView | None:
        if not self._has_plan:
            return None
        queues = {
            node: tuple(PlannedBuild(b, node, *self._slots[b][1:]) for b in q)
            for node, q in sorted(self._queues.items())
            if q
        }
        return PlanView(
            self._label or "none",
            self._generation,
            self._made_s,
            self._makespan_s,
            self._reason,
            self._solver_status,
            round(self._spread.sigma, 4),
            queues,
            self._proven_s,
        )

    def next_check_s(self) -> float | None:
        """The earliest time a running build would count as overdue (for a simulator's clock)."""
        margin = self.settings.replan_drift_margin
        times = [
            end + margin * max(0.0, end - r.started_s)
            for b, r in self._last_running.items()
            if (end := self._assumed_end.get(b)) is not None
        ]
        return min(times, default=None)

    def replan(self, why: str) -> None:
        """Make the next tick re-plan from scratch, with `why` as the plan's reason."""
        self._forced = why

    def _note(self, message: str) -> None:
        if message not in self._said:
            self._said.add(message)
            self._notes.append(message)

    # ---- drift ----
    def _drift(self, s: FarmState) -> str | None:
        """Why the plan no longer holds, or None: checks only what changed."""
        if self._forced is not None:
            why, self._forced = self._forced, None
            return why
        if not self._has_plan:
            return "first plan"
        now, pending, running = s.now_s, s.pending, s.running
        names = frozenset(node.name for node in s.nodes)
        if names != self._node_names:
            change = [f"-{n}" for n in sorted(self._node_names - names)]
            change += [f"+{n}" for n in sorted(names - self._node_names)]
            return f"nodes changed: {' '.join(change)}"
        new = pending.keys() - self._known
        if new:
            more = f" and {len(new) - 1} more" if len(new) > 1 else ""
            return f"new request: {min(new, key=build_key)}{more}"
        for b in self._queued - pending.keys():
            r = running.get(b)
            if r is not None:
                if r.node != self._slots[b].node:
                    return f"{b} started on {r.node}, planned on {self._slots[b].node}"
            elif b in s.unpublished:
                return f"{b} was not published: {s.unpublished[b]}"
            elif b not in self._emitted:
                return f"{b} left the queue without running"
        margin = self.settings.replan_drift_margin
        for b, r in running.items():
            slot = self._slots.get(b)
            if slot is not None and slot.node != r.node:
                return f"{b} runs on {r.node}, planned on {slot.node}"
            end = self._assumed_end.get(b)
            if end is None:
                if slot is None and b not in pending:
                    return f"{b} runs on {r.node} outside the plan"
                end = r.est_end_s
            if now >= end + margin * max(0.0, end - r.started_s):
                return f"{b} on {r.node} ran {margin:.0%} past its estimate"
        early = self.settings.replan_early_margin
        if early is not None:
            for b in self._finished(s):
                r = self._last_running[b]
                end = self._assumed_end.get(b, r.est_end_s)
                if now < end - early * max(0.0, end - r.started_s):
                    return f"{b} finished {early:.0%} before its estimate"
        if self._blocked_inputs(s) != self._blocking:
            return "inputs known not to be published changed"
        return hold_drift(s.busy, self._busy, self._made_s, now, margin, names)

    def _blocked_inputs(self, s: FarmState) -> frozenset[Build]:
        unpublished = s.unpublished.keys() & self._inputs
        return frozenset(d for d in unpublished if d not in s.pending and d not in s.running)

    # ---- re-planning ----
    def _replan(self, s: FarmState, why: str) -> None:
        now, pending, running = s.now_s, s.pending, s.running
        old_slots, old_label, old_solved = self._slots, self._label, self._solved
        self._solved = False
        self._proven_s = None
        self._generation += 1
        self.replans += 1
        self._has_plan = True
        self._reason = why
        self._error = None
        self._made_s = now
        self._moved = False
        self._node_names = frozenset(node.name for node in s.nodes)
        self._known = set(pending)
        self._inputs = set().union(*pending.values()) if pending else set()
        self._blocking = self._blocked_inputs(s)
        self._busy = {node: t for node, t in s.busy.items() if t > now + EPS}
        self._emitted = set()
        self._dependents = {}
        for b, deps in pending.items():
            for d in deps:
                self._dependents.setdefault(d, []).append(b)
        self._blocked = self._find_blocked(s)
        margin = self.settings.replan_drift_margin
        assumed: dict[Build, float] = {}
        for b, r in running.items():
            end = self._assumed_end.get(b, r.est_end_s)
            if now > end:
                # Overdue: expect it to run the margin's share of its elapsed time longer.
                end = r.started_s + (1 + margin) * (now - r.started_s)
            assumed[b] = max(end, now + MIN_REMAINING_S)
        self._assumed_end = assumed
        self._set_plan(None, [], Run([], [], []), "", now)
        builds = tuple(b for b in pending if b not in running and b not in self._blocked)
        if builds and s.nodes:
            try:
                problem, busy_until = self._problem(s, builds)
                ix = problem.index
            except PlacementError as exc:
                self._error = str(exc)
                self._note(f"placement cannot plan: {exc}")
            else:
                avail0 = ix.avail(busy_until)
                candidates = [
                    (f"default({name})", heuristic(ix, avail0), False)
                    for name, heuristic in HEURISTICS.items()
                ]
                kept = retime(ix, avail0, old_slots)
                if kept is not None:
                    # First: on a tie the plan being followed stays.
                    candidates.insert(0, (old_label, kept, old_solved))
                score = self._scorer(ix, avail0)
                label, run, solved = min(candidates, key=lambda c: score(c[1]))
                self._set_plan(ix, avail0, run, label, now)
                self._solved = solved
                if solved:
                    # Only the times moved and the solver's plan, re-timed, is still the
                    # shortest: a new solve would start from it again, at the same cost.
                    self._solver_status = "not asked: the solver's plan still holds, re-timed"
                else:
                    self._ask_solver(problem, busy_until, run, label)
        self._waiting = {b: self._why(b, s) for b in pending}

    def _problem(self, s: FarmState, builds: tuple[Build, ...]) -> tuple[Problem, dict[str, float]]:
        """`builds` as a problem from now: running builds placed until their assumed ends,
        finished ones on the node they were built on."""
        now = s.now_s
        placed = {
            b: Placed(node, 0.0)
            for b, node in s.built_on.items()
            if b not in s.pending and b not in s.running
        }
        for b, r in s.running.items():
            placed[b] = Placed(r.node, self._assumed_end.get(b, r.est_end_s) - now)
        busy_until = {node: t - now for node, t in s.busy.items() if t > now}
        return Problem(builds, dict(s.pending), tuple(s.nodes), s.cost, placed), busy_until

    def _scorer(self, ix: Index, avail0: Sequence[float]) -> Callable[[Run], float]:
        """How plans of `ix` compare: by makespan, or once builds were seen to stray from their
        estimates, by mean makespan over draws of that spread (`robust`). Rounded to the
        microsecond, so float noise never breaks a tie."""
        sigma, samples = self._spread.sigma, self.settings.robust_samples
        if not sigma or not samples or len(ix.builds) > self.settings.solver_max_builds:
            return lambda run: round(run.makespan, 6)
        factors = draws(len(ix.builds), sigma, samples, self._generation)
        return lambda run: round(
            mean_makespan(ix, avail0, run.node_of, order_of(ix, run), factors), 6
        )

    def _find_blocked(self, s: FarmState) -> dict[Build, Waiting]:
        """Pending builds that cannot start until an unpublished input is built again, and the
        pending builds below them; and builds already running (a duplicate request)."""
        blocked: dict[Build, Waiting] = {}
        # The unpublished input at the root of each blocked build, and why: named in the reason
        # of every build below it, so a reason never grows with the depth.
        roots: dict[Build, str] = {}
        for b, deps in s.pending.items():
            r = s.running.get(b)
            if r is not None:
                blocked[b] = Waiting(f"{b} is already running on {r.node}", node=r.node)
                continue
            bad = sorted(
                (
                    d
                    for d in deps
                    if d in s.unpublished and d not in s.pending and d not in s.running
                ),
                key=build_key,
            )
            if bad:
                roots[b] = f"{bad[0]}: not published ({s.unpublished[bad[0]]})"
                blocked[b] = Waiting(f"waits for {roots[b]}", deps=(bad[0],))
        todo = list(roots)
        while todo:
            b = todo.pop()
            for c in self._dependents.get(b, ()):
                if c not in blocked:
                    roots[c] = roots[b]
                    blocked[c] = Waiting(f"waits for {b}, which waits for {roots[c]}", deps=(b,))
                    todo.append(c)
        return blocked

    def _set_plan(
        self, ix: Index | None, avail0: Sequence[float], run: Run, label: str, origin: float
    ) -> None:
        """Adopt `run` (times from `origin`, nodes free at `avail0`) for the builds of `ix`."""
        self._ix = ix
        self._avail0 = list(avail0)
        self._label = label
        self._made_s = origin
        self._run = run
        self._slots, self._prev, self._queues = {}, {}, {}
        if ix is not None:
            for i in order_of(ix, run):
                b, node = ix.builds[i], ix.names[run.node_of[i]]
                queue = self._queues.setdefault(node, deque())
                if queue:
                    self._prev[b] = queue[-1]
                queue.append(b)
                self._slots[b] = Slot(node, origin + run.start[i], origin + run.end[i])
        self._queued = set(self._slots)
        self._makespan_s = max([origin + run.makespan, *self._assumed_end.values()])

    # ---- the solver ----
    def _ask_solver(
        self, problem: Problem, busy_until: Mapping[str, float], run: Run, label: str
    ) -> None:
        if self._runner is None or self._solver_off:
            return
        ix, n = problem.index, len(problem.builds)
        if n < 2:
            # One build: the earliest finish the heuristics pick is optimal.
            self._solver_status = "not needed for one build"
            return
        if n > self.settings.solver_max_builds:
            self._solver_status = (
                f"skipped: {n} builds, over solver_max_builds={self.settings.solver_max_builds}"
            )
            return
        hint = Schedule(
            label,
            tuple(
                Assignment(b, ix.names[run.node_of[i]], run.start[i], run.end[i])
                for i, b in enumerate(ix.builds)
            ),
            run.makespan,
            0.0,
        )
        budget = solver_budget_s(n, self.settings)
        self._solver_status = f"solving {n} builds for up to {budget:.3g} s"
        self._solve_origin = self._made_s
        self._runner.submit(SolveRequest(self._generation, problem, busy_until, hint, budget))

    def _take_solver_result(self, s: FarmState) -> None:
        if self._runner is None:
            return
        outcome = self._runner.poll()
        if outcome is None or outcome.generation != self._generation:
            return
        if outcome.result is None:
            message = outcome.error or "no result"
            self._solver_status = f"failed: {message}"
            self._note(f"placement solver failed, the heuristics' plan stands: {message}")
            if message == ortools_missing():
                self._solver_off = message
            return
        result = outcome.result
        self._proven_s = self._solve_origin + result.proven_bound_s
        solved = {a.build: Slot(a.node, a.start_s, a.end_s) for a in result.schedule.assignments}
        if not self._moved and self._ix is not None:
            # Nothing started since the plan was made: both plans start from its origin.
            ix, avail0, origin, current = self._ix, self._avail0, self._made_s, self._run
        else:
            # Builds started meanwhile: compare what is left of both plans from now.
            builds = tuple(b for b in self._queued if b in s.pending and b not in s.running)
            if not builds or not s.nodes:
                return
            try:
                problem, busy_until = self._problem(s, builds)
                ix = problem.index
            except PlacementError:
                return
            avail0, origin = ix.avail(busy_until), s.now_s
            current = retime(ix, avail0, self._slots)
        theirs = retime(ix, avail0, solved)
        proof = result.summary
        self._solved = True
        score = self._scorer(ix, avail0)
        mine = score(current) if current is not None else float("inf")
        if theirs is not None and score(theirs) < mine:
            # The solver's own plan, or the warm start it could not better (the rollout's).
            label = result.hint.strategy if result.kept_hint else SOLVER_STRATEGY
            self._set_plan(ix, avail0, theirs, label, origin)
            self._solver_status = (
                f"adopted: {proof}, {100 * (1 - score(theirs) / mine):.1f}% shorter"
            )
            self._waiting = {b: self._why(b, s) for b in s.pending}
        else:
            self._solver_status = f"kept {self._label}: {proof}, nothing shorter"

    def _fill_idle(self, s: FarmState) -> None:
        """Move a ready build onto a node left idle now, when the plan gains by it (`fill`)."""
        # Above solver_max_builds a check would cost a re-plan's time at every change.
        if len(self._queued) > self.settings.solver_max_builds:
            return
        now, pending, running = s.now_s, s.pending, s.running
        seen = (self._generation, frozenset(pending), frozenset(running))
        if seen == self._fill_seen:
            return
        self._fill_seen = seen
        held = {r.node for r in running.values()}
        held.update(node for node, t in s.busy.items() if t > now + EPS)
        todo = [b for b in self._queued if b in pending and b not in running]
        idle, starting = [], set()
        for node in sorted(self._node_names - held):
            head = next(
                (b for b in self._queues.get(node, ()) if b in pending and b not in running), None
            )
            if head is not None and s.ready(head):
                starting.add(head)
            else:
                idle.append(node)
        ready = sorted(
            (b for b in todo if b not in starting and s.ready(b)),
            key=lambda b: (self._slots[b].start_s, build_key(b)),
        )
        if not idle or not ready:
            return
        try:
            problem, busy_until = self._problem(s, tuple(todo))
            ix = problem.index
        except PlacementError:
            return
        avail0 = ix.avail(busy_until)
        run = best_move(ix, avail0, self._slots, idle, ready, self._scorer(ix, avail0))
        if run is not None:
            self._set_plan(ix, avail0, run, self._label, now)
            self._moved = False
            self._waiting = {b: self._why(b, s) for b in pending}

    # ---- following ----
    def _follow(self, s: FarmState) -> Decision:
        now, pending, running = s.now_s, s.pending, s.running
        left = self._last_pending - pending.keys()
        self._known.difference_update(left)
        touched: set[Build] = set()
        for b in left | (self._last_running.keys() ^ running.keys()):
            touched.update(self._dependents.get(b, ()))
        held = {r.node for r in running.values()}
        held.update(node for node, t in s.busy.items() if t > now + EPS)
        starts: list[Start] = []
        for node, queue in self._queues.items():
            if queue and queue[0] not in pending:
                while queue and queue[0] not in pending:
                    self._queued.discard(queue.popleft())
                self._moved = True
                if queue:
                    touched.add(queue[0])
            if not queue or node in held or node not in self._node_names:
                continue
            head = queue[0]
            if head in running or not s.ready(head):
                continue
            slot = self._slots[head]
            finish = now + (slot.end_s - slot.start_s)
            starts.append(Start(head, node, now, finish))
            self._assumed_end[head] = finish
            self._estimate[head] = finish - now
            self._emitted.add(head)
            self._moved = True
        # The build next on a held node says what holds it, as that hold stands now.
        for node, until in s.busy.items():
            queue = self._queues.get(node)
            if until > now + EPS and queue and queue[0] in pending:
                touched.add(queue[0])
        for b in left:
            self._waiting.pop(b, None)
        for b in touched:
            if b in pending:
                self._waiting[b] = self._why(b, s)
        waiting = dict(self._waiting)
        for start in starts:
            waiting.pop(start.build, None)
        starts.sort(key=lambda x: (x.node, build_key(x.build)))
        return Decision(self._label or "none", tuple(starts), waiting)

    def _why(self, b: Build, s: FarmState) -> Waiting:
        blocked = self._blocked.get(b)
        if blocked is not None:
            return blocked
        slot = self._slots.get(b)
        if slot is None:
            return Waiting(self._error or "no usable build node")
        unfinished = tuple(
            sorted(
                (d for d in s.pending.get(b, ()) if d in s.pending or d in s.running),
                key=build_key,
            )
        )
        if unfinished:
            reason = f"waits for {', '.join(map(str, unfinished))}"
        else:
            queue = self._queues.get(slot.node)
            prev = self._prev.get(b)
            if prev is None or (queue and queue[0] == b):
                reason = f"next on {slot.node} once it is free"
                hold = s.hold_on(slot.node)
                if hold is not None:
                    reason += f": {hold.what}"
            else:
                reason = f"planned on {slot.node} after {prev}"
        return Waiting(reason, deps=unfinished, node=slot.node, est_start_s=slot.start_s)
