"""The code location: assets, jobs and resources assembled from rocm-bake.hcl and fleet.yaml."""

import dagster as dg

from rocm_assets.core.bake import load_graph
from rocm_assets.core.common.settings import bake_file_path
from rocm_assets.defs.alerts import freshness_alert_sensor
from rocm_assets.defs.assets import build_bake_assets, build_jobs
from rocm_assets.defs.automation import build_automation_sensor
from rocm_assets.defs.checks import GpuTestResource, build_gpu_test_checks, build_gpu_test_jobs
from rocm_assets.defs.registry_checks import build_registry_checks
from rocm_assets.defs.resources.bake import BakeResource
from rocm_assets.defs.resources.registry import RegistryResource
from rocm_assets.defs.sensors import build_registry_observation_sensor


@dg.definitions
def defs() -> dg.Definitions:
    graph = load_graph(bake_file_path())
    return dg.Definitions(
        assets=build_bake_assets(graph),
        asset_checks=[*build_registry_checks(graph), *build_gpu_test_checks(graph)],
        jobs=[*build_jobs(graph), *build_gpu_test_jobs(graph)],
        sensors=[
            build_registry_observation_sensor(graph),
            build_automation_sensor(graph),
            freshness_alert_sensor,
        ],
        resources={
            "bake": BakeResource(),
            "registry": RegistryResource.from_env(),
            "gpu_test": GpuTestResource(),
        },
        # One bake at a time per run, in dependency order: concurrent builds on one node each
        # derive MAX_JOBS as though alone and oversubscribe it.
        executor=dg.in_process_executor,
    )
