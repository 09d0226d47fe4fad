"""The code location: assets, jobs and resources assembled from rocm-bake.hcl and fleet.yaml."""

import dagster as dg

from rocm_assets.assets import build_bake_assets, build_jobs
from rocm_assets.bake import load_graph
from rocm_assets.resources.bake import BakeResource
from rocm_assets.settings import bake_file_path


@dg.definitions
def defs() -> dg.Definitions:
    graph = load_graph(bake_file_path())
    return dg.Definitions(
        assets=build_bake_assets(graph),
        jobs=build_jobs(graph),
        resources={"bake": BakeResource()},
        # One bake at a time per run, in dependency order: concurrent builds on one node each
        # derive MAX_JOBS as though alone and oversubscribe it.
        executor=dg.in_process_executor,
    )
