"""The seed's build graph as the tests know it, written down once from its flowchart and table.

The code never holds a copy of the graph (rocm-bake.hcl is the one); the tests hold this one to
check the bake file against the seed.
"""

# The seed's Build Graph flowchart, as (producer, consumer) pairs: 27 edges.
SEED_EDGES = {
    ("rocm-runtime", "pytorch-base"), ("pytorch-src", "pytorch"), ("pytorch-src", "pytorch-wheel"),
    ("rocm-runtime", "pytorch-run"), ("pytorch-base", "triton-wheel"), ("pytorch-base", "cupy-wheel"),
    ("pytorch-base", "pytorch"), ("triton-wheel", "pytorch"), ("pytorch", "pytorch-wheel"),
    ("pytorch", "pytorch-run"), ("pytorch", "pytorch-test"), ("pytorch", "aiter-wheel"),
    ("triton-wheel", "aiter-wheel"), ("pytorch", "torchvision-wheel"), ("pytorch", "nixl-wheel"),
    ("pytorch", "lmcache"), ("triton-wheel", "lmcache"), ("nixl-wheel", "lmcache"),
    ("cupy-wheel", "lmcache"), ("lmcache", "lmcache-wheel"), ("pytorch", "vllm"),
    ("triton-wheel", "vllm"), ("aiter-wheel", "vllm"), ("nixl-wheel", "vllm"),
    ("lmcache-wheel", "vllm"), ("torchvision-wheel", "vllm"), ("vllm", "vllm-wheel"),
}  # fmt: skip
SEED_GROUPS = {
    "default": {
        "rocm-runtime", "pytorch-src", "pytorch-base", "pytorch", "pytorch-wheel", "triton-wheel",
        "aiter-wheel", "torchvision-wheel", "cupy-wheel", "nixl-wheel", "vllm", "vllm-wheel",
        "lmcache", "lmcache-wheel",
    },
    "wheels": {
        "pytorch-wheel", "triton-wheel", "aiter-wheel", "nixl-wheel", "torchvision-wheel",
        "cupy-wheel", "vllm-wheel", "lmcache-wheel",
    },
    "serving": {
        "torchvision-wheel", "cupy-wheel", "nixl-wheel", "vllm", "vllm-wheel", "lmcache", "lmcache-wheel",
    },
}  # fmt: skip


def _default_graph() -> dict[str, tuple[str, ...]]:
    """The default group as target -> the targets it takes contexts from, in dependency order."""
    members = SEED_GROUPS["default"]
    inputs = {t: tuple(sorted(u for u, d in SEED_EDGES if d == t)) for t in members}
    order: list[str] = []
    while len(order) < len(inputs):
        order.extend(
            sorted(t for t in inputs if t not in order and all(u in order for u in inputs[t]))
        )
    return {t: inputs[t] for t in order}


# The seed's default group (its flowchart): target -> the targets it takes contexts from.
SEED_GRAPH: dict[str, tuple[str, ...]] = _default_graph()
