"""WarmRunLauncher: Dagster's DefaultRunLauncher, each run worker forked from a warm process.

The default launcher asks the code server to start a run worker with multiprocessing's spawn: a
new interpreter that imports Dagster, SQLAlchemy and alembic before the run can start, 2-3 s of
CPU at every handoff on a 2-core farm host (issue 36). Here the worker is forked from
multiprocessing's forkserver (a clean single-threaded process the daemon starts once, never the
daemon itself) that imported those once, and runs what the code server's worker runs
(`start_run_in_subprocess`). The code location is not preloaded: each worker imports it afresh,
so an edit or a reload reaches the next run, as with the code server.

Termination works from any process on this host (the UI's Terminate comes from the webserver):
the worker's pid is a run tag, and SIGINT is what the code server's own termination sends to
its worker. A run this launcher did not start (no pid tag) is the default launcher's.
"""

import logging
import multiprocessing
import os
import queue
import signal
import threading
from typing import Any

import dagster as dg

from rocm_assets.instance.dagster_internals import (
    ConfigurableClassData,
    DagsterLaunchFailedError,
    ExecuteExternalJobArgs,
    IPCErrorMessage,
    LaunchRunContext,
    RunInSubprocessComplete,
    recon_job_from_origin,
    start_run_in_subprocess,
)

logger = logging.getLogger("rocm_assets.instance")

# What every run worker imports before its run starts; the code location is not among them.
PRELOAD = (
    "dagster",
    "dagster._grpc.impl",
    "dagster._core.execution.api",
    "dagster._core.storage.runs",
    "dagster._core.storage.event_log",
    "dagster._core.storage.schedules",
    "dagster._core.storage.sqlite_storage",
    "sqlalchemy",
    "alembic.runtime.migration",
    "alembic.script",
    "httpx",
)
WORKER_PID_TAG = "rocm/worker_pid"
# How long a launch waits for its worker to load the instance and the run (the first launch
# also starts the forkserver, about as long as one spawned worker).
_SETUP_TIMEOUT_S = 120.0
_forkserver_lock = threading.Lock()
_context: Any = None


def _forkserver() -> Any:
    """multiprocessing's forkserver context, preloaded; started at the first launch."""
    global _context
    with _forkserver_lock:
        if _context is None:
            ctx = multiprocessing.get_context("forkserver")
            ctx.set_forkserver_preload(list(PRELOAD))
            _context = ctx
        return _context


class WarmRunLauncher(dg.DefaultRunLauncher):
    """DefaultRunLauncher whose workers fork from a warm forkserver (see the module docstring)."""

    def __init__(self, inst_data: ConfigurableClassData | None = None) -> None:
        super().__init__(inst_data=inst_data)
        self._lock = threading.Lock()
        self._events: dict[str, Any] = {}

    # DefaultRunLauncher's builds a DefaultRunLauncher, whatever the subclass.
    @classmethod
    def from_config_value(
        cls, inst_data: ConfigurableClassData, config_value: dict[str, Any]
    ) -> "WarmRunLauncher":
        return cls(inst_data=inst_data)

    def launch_run(self, context: LaunchRunContext) -> None:
        run = context.dagster_run
        origin = run.job_code_origin
        if origin is None or run.remote_job_origin is None:
            super().launch_run(context)
            return
        ctx = _forkserver()
        args = ExecuteExternalJobArgs(
            job_origin=run.remote_job_origin,
            run_id=run.run_id,
            instance_ref=self._instance.get_ref(),
        )
        replies = ctx.Queue()
        stop = ctx.Event()
        worker = ctx.Process(
            target=start_run_in_subprocess,
            args=[dg.serialize_value(args), recon_job_from_origin(origin), replies, stop],
            name=f"run-{run.run_id[:8]}",
        )
        worker.start()
        self._instance.add_run_tags(run.run_id, {WORKER_PID_TAG: str(worker.pid)})
        with self._lock:
            self._events[run.run_id] = stop
            self._run_ids.add(run.run_id)
        first = self._first_reply(worker, replies)
        threading.Thread(
            target=self._drain, args=(run.run_id, worker, replies), daemon=True
        ).start()
        if isinstance(first, IPCErrorMessage):
            raise DagsterLaunchFailedError(
                first.message, serializable_error_info=first.serializable_error_info
            )

    @staticmethod
    def _first_reply(worker: Any, replies: Any) -> Any:
        """The worker's first word: it loaded the run (or why not). A worker that died first is
        a launch failure, as the code server reports it."""
        waited = 0.0
        while waited < _SETUP_TIMEOUT_S:
            try:
                return replies.get(timeout=0.2)
            except queue.Empty:
                waited += 0.2
                if not worker.is_alive():
                    raise DagsterLaunchFailedError(
                        f"the run worker (pid {worker.pid}) exited with {worker.exitcode} before "
                        "its run started"
                    ) from None
        raise DagsterLaunchFailedError(
            f"the run worker (pid {worker.pid}) did not start its run in {_SETUP_TIMEOUT_S:.0f} s"
        )

    def _drain(self, run_id: str, worker: Any, replies: Any) -> None:
        """Read the worker's replies until it is done, so its queue never blocks its exit."""
        while True:
            try:
                if isinstance(replies.get(timeout=1.0), RunInSubprocessComplete):
                    break
            except queue.Empty:
                if not worker.is_alive():
                    break
        worker.join(timeout=5.0)
        with self._lock:
            self._events.pop(run_id, None)

    def terminate(self, run_id: str) -> bool:
        run = self._instance.get_run_by_id(run_id)
        if run is None or run.is_finished:
            return False
        pid = run.tags.get(WORKER_PID_TAG)
        if not pid:
            return super().terminate(run_id)
        self._instance.report_run_canceling(run)
        with self._lock:
            stop = self._events.get(run_id)
        if stop is not None:
            stop.set()
            return True
        # Another process launched it (the daemon; this is the webserver): signal the worker,
        # once sure the pid is still a forkserver's worker and not a reused one.
        try:
            with open(f"/proc/{int(pid)}/cmdline", "rb") as cmdline:
                if b"multiprocessing.forkserver" not in cmdline.read():
                    return False
            os.kill(int(pid), signal.SIGINT)
        except (OSError, ValueError):
            return False
        return True
