"""`rocm-assets stale`: what would rebuild and why, per target and arch.

Reads the Dagster instance in $DAGSTER_HOME (else ./.dagster_home, `make dev`'s) and the bake
file; Dagster's own staleness decides, as in the UI, and each row says why in the farm's words.
Exit 0 whatever it finds (it is a report, not a check); 2 when the instance or the bake file
cannot be read.
"""

import argparse
import json

from rocm_assets.cli.common import EXIT_OK, graph_of, out
from rocm_assets.cli.farm_instance import farm_home, open_instance
from rocm_assets.defs.assets import build_bake_assets
from rocm_assets.defs.staleness import stale_report
from rocm_assets.instance.dagster_internals import AssetGraph


def cmd_stale(args: argparse.Namespace) -> int:
    home = farm_home()
    graph = graph_of(args)
    asset_graph = AssetGraph.from_assets(build_bake_assets(graph))
    with open_instance(home) as instance:
        rows, checked = stale_report(instance, graph, asset_graph)
    if args.json:
        out(json.dumps({"checked": checked, "rebuild": [r.to_json() for r in rows]}, indent=2))
        return EXIT_OK
    width = max((len(r.label) for r in rows), default=0)
    for row in rows:
        out(f"{row.label:<{width}}  {row.status:<10}  {'; '.join(row.reasons)}")
    out(f"{len(rows)} of {checked} asset partitions would rebuild")
    return EXIT_OK
