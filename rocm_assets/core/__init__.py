"""The farm's core: no Dagster here, and nothing here imports Dagster, even lazily.

Rooms by concern:
- `bake/`: the bake file as the build graph (targets, edges, arches, groups), from bake's own
  answer: `docker buildx bake --print`, or the manifest it wrote where buildx is not installed.
- `build/`: one bake of one target on one node (invocation, guard, history), build selections,
  Dockerfiles and their checks against the bake file, code versions.
- `nodes/`: the fleet manifest, live SSH probes, known_hosts.
- `placement/`: cost model, heuristics, bounds, the online choice and the CP-SAT solver.
- `registry/`: image references, the HTTP client and its deadline transport, preflight.
- `common/`: names and settings every room shares, the buildx binary, the on-disk cache, text
  and time formatting.

Modules here import each other and third-party libraries (httpx, fabric, python-hcl2,
pydantic, OR-Tools, dockerfile), never `rocm_assets.defs`, `rocm_assets.instance`,
`rocm_assets.cli` or `dagster`, so the CLI and the benchmarks start without Dagster and every
rule is tested without an instance.
"""
