"""Where the plan follower's CP-SAT solves run: inline (the bench, `plan`, tests) or in a thread.

The follower hands a runner a `SolveRequest` for the problem of its current plan generation and
later `poll`s for the outcome; a result for an older generation is dropped by the follower, so a
runner only has to hand back what it finished. Both runners keep one request at a time: a newer
`submit` replaces (and, in the thread, stops) an older one.

A request is worked in two steps, both off the daemon's tick in the thread: the `default`
decision played out over the estimates (`simulate.rollout`), which is often shorter than the
follower's static heuristic plan, replaces the warm start when it is; then CP-SAT.
"""

import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from rocm_assets.core.placement.problem import EPS, Problem, Schedule
from rocm_assets.core.placement.simulate import rollout
from rocm_assets.core.placement.solver import SolverError, SolveResult, SolveStop, solve

# How long `ThreadSolver.close` waits for a stopped solve to return before leaving the (daemon)
# thread behind; a solve notices a stop within milliseconds once its search has started.
CLOSE_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class SolveRequest:
    """A problem of plan generation `generation`, its warm start and its time budget.

    `busy_until` is seconds from the problem's origin until each node is free, as `solve` takes.
    """

    generation: int
    problem: Problem
    busy_until: Mapping[str, float]
    hint: Schedule
    time_limit_s: float


@dataclass(frozen=True)
class SolveOutcome:
    """What a solve gave for `generation`: a result, or the one-line reason there is none."""

    generation: int
    result: SolveResult | None
    error: str | None = None


class SolverRunner(Protocol):
    def submit(self, request: SolveRequest) -> None:
        """Start solving `request`; it replaces any request not yet answered."""

    def poll(self) -> SolveOutcome | None:
        """The newest finished outcome not yet handed out, or None."""

    def close(self) -> None:
        """Stop any solve and release the runner's thread, if it has one."""


def run_request(
    request: SolveRequest,
    *,
    deterministic: bool,
    workers: int | None,
    stop: SolveStop | None = None,
) -> SolveOutcome:
    """Roll out, then solve one request; a missing OR-Tools becomes the outcome's error."""
    hint = request.hint
    played = rollout(request.problem, request.busy_until)
    if played.makespan_s < hint.makespan_s - EPS:
        hint = played
    try:
        result = solve(
            request.problem,
            request.time_limit_s,
            request.busy_until,
            workers=workers,
            hint=hint,
            deterministic=deterministic,
            stop=stop,
        )
    except SolverError as exc:
        return SolveOutcome(request.generation, None, str(exc))
    return SolveOutcome(request.generation, result)


class InlineSolver:
    """Solves at `submit`, so the result is there at the same (simulated) instant.

    `deterministic` (the bench, tests) makes the budget CP-SAT's deterministic time with a fixed
    worker count, so a seeded run reproduces; `rocm-assets plan` uses wall-clock seconds.
    """

    def __init__(self, *, deterministic: bool = True, workers: int | None = 1) -> None:
        self._deterministic = deterministic
        self._workers = workers
        self._outcome: SolveOutcome | None = None

    def submit(self, request: SolveRequest) -> None:
        self._outcome = run_request(
            request, deterministic=self._deterministic, workers=self._workers
        )

    def poll(self) -> SolveOutcome | None:
        outcome, self._outcome = self._outcome, None
        return outcome

    def close(self) -> None:
        self._outcome = None


class ThreadSolver:
    """Solves in one background thread, for the daemon: its tick never waits for CP-SAT.

    One solve at a time; a newer `submit` stops the running solve (its result would be for an
    outdated plan) and replaces any request still waiting. The thread starts at the first
    `submit`, so a process that never plans never starts it. `close` stops the solve and joins.
    """

    def __init__(self, *, workers: int | None = None) -> None:
        self._workers = workers
        self._cond = threading.Condition()
        self._request: SolveRequest | None = None
        self._stop: SolveStop | None = None
        self._outcome: SolveOutcome | None = None
        self._closed = False
        self._thread: threading.Thread | None = None

    def submit(self, request: SolveRequest) -> None:
        with self._cond:
            if self._closed:
                return
            self._request = request
            if self._stop is not None:
                self._stop.stop()
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._loop, name="rocm-assets-solver", daemon=True
                )
                self._thread.start()
            self._cond.notify()

    def poll(self) -> SolveOutcome | None:
        with self._cond:
            outcome, self._outcome = self._outcome, None
            return outcome

    @property
    def busy(self) -> bool:
        """A request is waiting or being solved."""
        with self._cond:
            return self._request is not None or self._stop is not None

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._request = None
            self._cond.notify()
            thread = self._thread
        if thread is None:
            return
        waited = 0.0
        while thread.is_alive() and waited < CLOSE_TIMEOUT_S:
            # Repeated: a stop that lands while CP-SAT is still building its search is lost.
            with self._cond:
                if self._stop is not None:
                    self._stop.stop()
            thread.join(0.05)
            waited += 0.05

    def _loop(self) -> None:
        while True:
            with self._cond:
                while self._request is None and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                request, self._request = self._request, None
                stop = self._stop = SolveStop()
            try:
                outcome = run_request(
                    request, deterministic=False, workers=self._workers, stop=stop
                )
            except Exception as exc:
                # A solver bug must not end the thread: the heuristics' plan stands.
                outcome = SolveOutcome(request.generation, None, f"{type(exc).__name__}: {exc}")
            with self._cond:
                self._stop = None
                if not self._closed:
                    self._outcome = outcome
