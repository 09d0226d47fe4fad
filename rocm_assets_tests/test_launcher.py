"""The warm run launcher (rocm_assets/instance/launcher.py) without a farm: what it refuses.

Its real runs are every build of the farms the other tests start (dagster.yaml names it, and
helpers/daemon_farm.py copies that), including a terminate from another process than the
daemon (test_materialize's UI terminate) and the fault tests' killed workers.
Real here: a SQLite instance and an unrelated process standing for a reused pid.
"""

import subprocess

import dagster as dg
from dagster._core.test_utils import create_run_for_test, instance_for_test

from rocm_assets.instance.launcher import WORKER_PID_TAG, WarmRunLauncher

LAUNCHER = {"run_launcher": {"module": "rocm_assets.instance.launcher", "class": "WarmRunLauncher"}}


def test_the_shipped_instance_config_loads_the_warm_launcher() -> None:
    with instance_for_test(overrides=LAUNCHER) as instance:
        assert isinstance(instance.run_launcher, WarmRunLauncher)


def test_terminate_signals_only_a_forkserver_worker_never_a_reused_pid() -> None:
    # A run tagged with the pid of a process that is not a forkserver's worker (the worker ended
    # and the pid was reused): terminate says it could not, and the process is left alone.
    stranger = subprocess.Popen(["sleep", "60"])
    try:
        with instance_for_test(overrides=LAUNCHER) as instance:
            run = create_run_for_test(instance, job_name="j", status=dg.DagsterRunStatus.STARTED)
            instance.add_run_tags(run.run_id, {WORKER_PID_TAG: str(stranger.pid)})
            assert instance.run_launcher.terminate(run.run_id) is False
            assert stranger.poll() is None
            # A finished run is never signalled, whatever its tag says.
            done = create_run_for_test(instance, job_name="j", status=dg.DagsterRunStatus.SUCCESS)
            instance.add_run_tags(done.run_id, {WORKER_PID_TAG: str(stranger.pid)})
            assert instance.run_launcher.terminate(done.run_id) is False
            assert stranger.poll() is None
    finally:
        stranger.kill()
        stranger.wait()
