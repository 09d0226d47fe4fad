"""`rocm-assets`: the farm from a terminal, one module per command.

The outermost layer: it may import `rocm_assets.core`, `rocm_assets.defs` and
`rocm_assets.instance`, and nothing imports it. Commands that need Dagster (watch, backfill's
workspace reads, bench's load overhead) import it lazily, so graph, check, plan and the rest
start without it.
"""
