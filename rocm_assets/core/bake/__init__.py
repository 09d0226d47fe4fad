"""Read rocm-bake.hcl into a build graph: bake resolves it where buildx is installed, the builtin
evaluator otherwise. Pure Python: no Dagster imports."""

from rocm_assets.core.bake.errors import BakeError as BakeError, NeedsBuildx as NeedsBuildx
from rocm_assets.core.bake.model import (
    BakeGraph as BakeGraph,
    PublishedInput as PublishedInput,
    check_drift as check_drift,
    load_graph as load_graph,
)
from rocm_assets.core.bake.parse import BakeFile as BakeFile, load_bake as load_bake
from rocm_assets.core.bake.targets import (
    ResolvedBake as ResolvedBake,
    Target as Target,
    resolve as resolve,
)
