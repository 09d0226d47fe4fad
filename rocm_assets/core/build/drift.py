"""The bake file against itself: the half of `rocm-assets check` that compares bake's answers in
the two input modes (its other half, `recipes`, compares them with the Dockerfiles)."""

from rocm_assets.core.bake import BakeGraph
from rocm_assets.core.common.constants import PUBLISHED_INPUTS_VAR


def check_drift(graph: BakeGraph) -> list[str]:
    """Problems where the file contradicts itself; empty when it is consistent.

    - every `PUB_*` value (the registry reference that replaces a `target:` context when
      PUBLISHED_INPUTS=1) must equal, for every arch, a tag of the target it mirrors;
    - a `target:` context must have such a replacement, and none may survive in published mode.

    Group members that do not exist already fail `load_graph`, which expands every group.
    """
    problems: list[str] = []
    for arch in graph.arches:
        for name in graph.targets:
            problems.extend(_target_drift(graph, name, arch))
    return list(dict.fromkeys(problems))


def _target_drift(graph: BakeGraph, name: str, arch: str) -> list[str]:
    problems = []
    arch = graph.build_arch(name, arch)
    linked = graph.resolve(arch).targets[name]
    pub = graph.resolve(arch, published=True)
    published = pub.targets[name]
    for context, producer in published.target_links.items():
        problems.append(
            f"{arch}: target {name!r} keeps context {context!r} = target:{producer} with "
            f"{PUBLISHED_INPUTS_VAR}=1, so bake would rebuild {producer!r}"
        )
    for context, producer in linked.target_links.items():
        args = [a for a, v in linked.args.items() if v == context]
        if not args:
            problems.append(
                f"target {name!r}: context {context!r} (target:{producer}) is passed in no arg, so "
                f"{PUBLISHED_INPUTS_VAR}=1 has no registry reference to use instead"
            )
        want = pub.targets[producer].tags
        for arg in args:
            got = published.args.get(arg)
            if got in want:
                continue
            names = [k for k, v in pub.values.items() if k.startswith("PUB_") and v == got]
            label = names[0] if names else f"arg {arg}"
            problems.append(
                f"{arch}: {label} (target {name!r} arg {arg}) = {got!r} but {producer!r} is tagged "
                f"{', '.join(repr(t) for t in want) or 'nothing'}"
            )
    registry = {ref.split("/", 1)[0] for t in pub.targets.values() for ref in t.tags}
    for context, ref in published.image_contexts.items():
        if ref.split("/", 1)[0] in registry and pub.tag_owner(ref) is None:
            problems.append(
                f"{arch}: target {name!r} context {context!r} = docker-image://{ref} matches no target's tag"
            )
    return problems
