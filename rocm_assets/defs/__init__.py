"""The code location: one asset per bake target, its checks, sensors, alerts and resources.

A thin Dagster layer over `rocm_assets.core`: it turns the bake graph into asset specs, jobs and
checks, and gives runs their resources. It may import `rocm_assets.core`, and of
`rocm_assets.instance` only the placement authority (runs hold their machine through it) and
`dagster_internals`; never `rocm_assets.cli`. `rocm_assets.definitions` re-exports `defs` for workspace.yaml and `-m`.
"""
