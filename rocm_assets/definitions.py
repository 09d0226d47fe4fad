"""The code location's entry point (workspace.yaml, `dagster ... -m rocm_assets.definitions`)."""

from rocm_assets.defs.definitions import defs as defs
