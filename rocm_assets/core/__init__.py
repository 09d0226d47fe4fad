"""The farm's core: no Dagster here, and nothing here imports Dagster, even lazily.

The bake file's evaluator and graph (`bake`), the fleet manifest and its SSH probes, placement
(cost model, heuristics, bounds, the online choice) and the CP-SAT solver, the registry client,
preflight, and the bake invocation with its runner. Modules here may import each other and
third-party libraries (httpx, fabric, python-hcl2, pydantic, OR-Tools), never `rocm_assets.defs`,
`rocm_assets.instance`, `rocm_assets.cli` or `dagster`, so the CLI and the benchmarks start
without Dagster and every rule is tested without an instance.
"""
