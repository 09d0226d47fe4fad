"""Read rocm-bake.hcl into a build graph. Bake is the only evaluator: `docker buildx bake --print`
where buildx is installed, else the manifest bake's answer was written to. Pure Python: no Dagster
imports."""

from rocm_assets.core.bake.errors import BakeError as BakeError
from rocm_assets.core.bake.model import (
    BakeGraph as BakeGraph,
    PublishedInput as PublishedInput,
    load_graph as load_graph,
)
from rocm_assets.core.bake.source import Outline as Outline, read_outline as read_outline
from rocm_assets.core.bake.targets import ResolvedBake as ResolvedBake, Target as Target
