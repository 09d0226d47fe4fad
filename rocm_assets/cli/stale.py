"""`rocm-assets stale`: what would rebuild and why, per target and arch.

Reads the Dagster instance in $DAGSTER_HOME and the bake file; Dagster's own staleness decides,
as in the UI, and each row says why in the farm's words. Exit 0 whatever it finds (it is a
report, not a check); 2 when the instance or the bake file cannot be read.
"""

import argparse
import json
import os
import sys

import dagster as dg

from rocm_assets.cli.common import EXIT_ERROR, EXIT_OK, graph_of, out
from rocm_assets.defs.assets import build_bake_assets
from rocm_assets.defs.staleness import stale_report
from rocm_assets.instance.dagster_internals import AssetGraph


def cmd_stale(args: argparse.Namespace) -> int:
    if not os.environ.get("DAGSTER_HOME"):
        sys.stderr.write(
            "rocm-assets: error: DAGSTER_HOME is not set: point it at the farm's instance "
            "(`make dev` uses .dagster_home)\n"
        )
        return EXIT_ERROR
    graph = graph_of(args)
    asset_graph = AssetGraph.from_assets(build_bake_assets(graph))
    try:
        with dg.DagsterInstance.get() as instance:
            rows, checked = stale_report(instance, graph, asset_graph)
    except dg.DagsterError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        sys.stderr.write(
            f"rocm-assets: error: cannot read the Dagster instance in "
            f"DAGSTER_HOME={os.environ['DAGSTER_HOME']}: {first}\n"
        )
        return EXIT_ERROR
    if args.json:
        out(json.dumps({"checked": checked, "rebuild": [r.to_json() for r in rows]}, indent=2))
        return EXIT_OK
    width = max((len(r.label) for r in rows), default=0)
    for row in rows:
        out(f"{row.label:<{width}}  {row.status:<10}  {'; '.join(row.reasons)}")
    out(f"{len(rows)} of {checked} asset partitions would rebuild")
    return EXIT_OK
