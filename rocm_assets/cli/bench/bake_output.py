"""What a chatty bake costs the run's event log: `rocm-assets bench`'s `bake_output` overhead.

Run as `python -m rocm_assets.cli.bench.bake_output LINES` (the bench starts it in a fresh
interpreter: Dagster mirrors the captured output to this process's stdout). One Dagster run on
a throwaway sqlite instance bakes through the build resource's own path (`run_logged_bake`: bake's
guard, `run_bake`, the output sink); the bake is a command that prints LINES lines of
`--progress=plain` output at full speed and writes bake's metadata file, so no builder is
needed. The last line printed is the figures as JSON. A real buildx bake of 100k lines is
rocm_assets_tests/test_materialize.py's.
"""

import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import dagster as dg

from rocm_assets.core.build.invocation import BakeInvocation
from rocm_assets.defs.resources.bake import run_logged_bake

# The bake stand-in: plain progress of a one-step build whose RUN prints argv[2] lines, then
# the metadata file run_bake reads (argv[1]).
_PRINTER = """
import json, sys
path, lines = sys.argv[1], int(sys.argv[2])
out = sys.stdout
out.write("#1 [internal] load build definition from bench.Dockerfile\\n#1 DONE 0.0s\\n")
out.write("#2 [1/1] RUN make -j8\\n")
for k in range(1, lines - 5):
    out.write(f"#2 {k / 1e4:.3f} [{100 * k // lines:3d}%] Building CXX object unit{k}.o\\n")
out.write("#2 DONE 10.0s\\n#3 exporting to image\\n#3 DONE 0.1s\\n")
digest = "sha256:" + "0" * 64
with open(path, "w") as f:
    json.dump({"bench": {"buildx.build.ref": "bench/bench/bench", "containerimage.digest": digest}}, f)
"""


def measure(lines: int) -> dict[str, Any]:
    """Event records and compute-log lines of one run whose bake prints `lines` lines."""
    with tempfile.TemporaryDirectory(prefix="rocm-bench-bake-") as tmp:
        metadata = Path(tmp) / "metadata.json"
        inv = BakeInvocation(
            target="bench",
            arch="bench",
            partition=None,
            builder="bench",
            max_jobs=1,
            run_id="bench",
            name="bench",
            metadata_file=metadata,
            argv=(sys.executable, "-c", _PRINTER, str(metadata), str(lines)),
            env=dict(os.environ),
            cwd=Path(tmp),
        )

        @dg.asset(name="bench")
        def bench(context: dg.AssetExecutionContext) -> None:
            run_logged_bake(inv, context.log)

        with dg.DagsterInstance.local_temp(tmp) as instance:
            result = dg.materialize([bench], instance=instance)
            records = instance.all_logs(result.run_id)
            [captured] = instance.all_logs(result.run_id, of_type=dg.DagsterEventType.LOGS_CAPTURED)
            assert captured.dagster_event is not None
            manager = instance.compute_log_manager
            key = manager.build_log_key_for_run(
                result.run_id, captured.dagster_event.logs_captured_data.file_key
            )
            stdout = manager.get_log_data(key).stdout or b""
    return {
        "bake_lines": lines,
        "event_records": len(records),
        "compute_log_lines": stdout.count(b"\n"),
    }


if __name__ == "__main__":
    figures = measure(int(sys.argv[1]))
    sys.stdout.write(json.dumps(figures) + "\n")
