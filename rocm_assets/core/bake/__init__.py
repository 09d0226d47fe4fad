"""Parse and evaluate rocm-bake.hcl into a build graph. Pure Python: no Dagster imports."""

from rocm_assets.core.bake.errors import BakeError as BakeError
from rocm_assets.core.bake.model import (
    BakeGraph as BakeGraph,
    PublishedInput as PublishedInput,
    ResolvedBake as ResolvedBake,
    Target as Target,
    check_drift as check_drift,
    load_graph as load_graph,
    resolve as resolve,
)
from rocm_assets.core.bake.parse import BakeFile as BakeFile, load_bake as load_bake
