"""rocm-assets: the ROCm build farm as a Dagster code location.

The folders are the layers. `core` is the farm itself and never imports Dagster; `defs` is the
code location (assets, checks, sensors, resources); `instance` is the run coordinator, an
instance plugin; `cli` is `rocm-assets`. Dependencies point inwards: everything may use `core`,
`defs` may use `instance`, and only `cli` may use all three.
"""
