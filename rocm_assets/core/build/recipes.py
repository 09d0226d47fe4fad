"""The bake file against its Dockerfiles: the half of `rocm-assets check` that reads docker/.

For every buildable target, in both input modes (PUBLISHED_INPUTS 0 and 1, as
bake resolves them, `BakeGraph.resolve(arch, published=...)`) and for every arch it builds for:

- its Dockerfile exists (bake resolves `dockerfile` against the target's `context`, and a relative
  `context` against the directory bake runs in: the bake file's, as the farm runs it);
- the stage its `target` attribute names, if any, exists;
- every `args` key is an ARG of the Dockerfile (global or in a stage: a build arg reaches either),
  except BuildKit's own build args, which need no ARG: `BUILDKIT_*` (e.g. BUILDKIT_BUILD_NAME,
  the history name), the predefined proxy args (HTTP_PROXY, HTTPS_PROXY, FTP_PROXY, NO_PROXY,
  ALL_PROXY, each also lower case) and SOURCE_DATE_EPOCH;
- every named context is used: a FROM, `COPY --from=` or `RUN --mount=...,from=` resolves to it;
- every ARG a FROM uses has a value. Bake's value counts; an empty one does not. The ARG's default
  counts only when bake sets that ARG in neither mode: a pinned base the Dockerfile owns. An input
  arg that bake sets in one mode only would fall back to its default (a context's name) in the
  other, where no such context exists, so that is a problem, as is a FROM that resolves to a bare
  name (no registry, tag or digest) which is no stage and no named context of the target: BuildKit
  would pull it from Docker Hub.

Each problem is one line, `<bake file>:<line>: target '<name>' ...`, naming the Dockerfile's line
too where it has one, and ending with the mode or arches it is limited to.
"""

import os
from collections.abc import Iterator, Mapping
from pathlib import Path

from rocm_assets.core.bake import BakeGraph, Target
from rocm_assets.core.bake.source import Outline
from rocm_assets.core.build.dockerfile import (
    Dockerfile,
    DockerfileError,
    expand,
    load,
    required,
    variables,
)
from rocm_assets.core.common.constants import PUBLISHED_INPUTS_VAR

_PROXY_ARGS = ("HTTP_PROXY", "HTTPS_PROXY", "FTP_PROXY", "NO_PROXY", "ALL_PROXY")
EXEMPT_ARGS = frozenset({*_PROXY_ARGS, *(a.lower() for a in _PROXY_ARGS), "SOURCE_DATE_EPOCH"})
EXEMPT_PREFIX = "BUILDKIT_"
_USES = "no FROM, COPY --from or RUN --mount from= resolves to it"


def exempt(arg: str) -> bool:
    """BuildKit's own build args, which reach the build without an ARG."""
    return arg in EXEMPT_ARGS or arg.startswith(EXEMPT_PREFIX)


def shown(path: Path) -> str:
    """A path as the user can open it from here: relative to the working directory if inside it."""
    relative = os.path.relpath(path)
    return str(path) if relative.startswith("..") else relative


def dockerfile_path(graph: BakeGraph, target: Target) -> Path:
    """Where bake finds the target's Dockerfile, run from the bake file's directory."""
    return graph.path.parent / target.context / target.dockerfile


def _bare(image: str) -> bool:
    """A name with no registry, tag or digest: BuildKit reads it as docker.io/library/<name>."""
    return image != "scratch" and not any(c in image for c in "/:@")


class _TargetCheck:
    """One target in one mode and arch, against its parsed Dockerfile."""

    def __init__(
        self,
        graph: BakeGraph,
        lines: Outline,
        target: Target,
        df: Dockerfile,
        other_args: Mapping[str, str],
    ):
        self.bake = shown(graph.path)
        self.lines = lines
        self.target = target
        self.df = df
        self.file = shown(df.path)
        self.other_args = other_args
        self.values = df.global_values(target.args)

    def at(self, line: int | None) -> str:
        return f"{self.bake}:{line or self.target.line}: target {self.target.name!r}"

    def problems(self, published: bool) -> Iterator[str]:
        t, df = self.target, self.df
        if t.stage and df.stage(t.stage) is None:
            stages = ", ".join(f"{s.name or s.index} (line {s.line})" for s in df.stages)
            yield (
                f"{self.at(self.lines.attr_line(t.name, 'target'))} builds stage {t.stage!r}: "
                f"{self.file} has no stage {t.stage!r} (its stages: {stages})"
            )
        for key in t.args:
            if not exempt(key) and key not in df.arg_names:
                yield (
                    f"{self.at(self.lines.key_line(t.name, 'args', key))} arg {key}: no ARG {key} in "
                    f"{self.file} (declare it before the first FROM, {self.file}:{df.stages[0].line})"
                )
        used = {expand(s.text, self.values) for s in df.sources}
        for context in t.contexts:
            if context not in used:
                yield f"{self.at(self.lines.key_line(t.name, 'contexts', context))} context {context!r}: {self._unused(context)}"
        yield from self._from_values(published)

    def _unused(self, context: str) -> str:
        carriers = [a for a, v in self.target.args.items() if v == context]
        declared = [d for d in map(self.df.global_arg, carriers) if d is not None]
        if declared:
            return (
                f"{self.file}:{declared[0].line} declares ARG {declared[0].name} (= {context!r}), "
                f"but {_USES}"
            )
        return f"{_USES} in {self.file} (stages from {self.file}:{self.df.stages[0].line})"

    def _from_values(self, published: bool) -> Iterator[str]:
        t, df = self.target, self.df
        names = {s.name.lower() for s in df.stages if s.name}
        for stage in df.stages:
            where = f"{self.file}:{stage.line} FROM {stage.base}"
            missing = False
            for var in required(stage.base):
                line = (
                    self.lines.key_line(t.name, "args", var)
                    or self.lines.attr_line(t.name, "args")
                    or t.line
                )
                reason = self._no_value(var, published)
                if reason:
                    missing = True
                    yield f"{self.at(line)}: {where}: {reason}"
            image = expand(stage.base, self.values)
            if variables(stage.base) and not missing and _bare(image):
                if image not in t.contexts and image.lower() not in names:
                    line = self.lines.key_line(t.name, "args", variables(stage.base)[0])
                    yield (
                        f"{self.at(line)}: {where}: resolves to {image!r}, which is no stage and "
                        f"no named context of the target, so BuildKit would pull "
                        f"docker.io/library/{image}"
                    )

    def _no_value(self, var: str, published: bool) -> str | None:
        decl = self.df.global_arg(var)
        if decl is None:
            return f"{var} is no ARG before the first FROM, so it is empty there"
        if var in self.target.args:
            return None if self.target.args[var] else f"bake sets {var} to '', an empty image"
        if self.other_args.get(var):
            default = f"its default {decl.default!r}" if decl.default else "no value"
            return (
                f"bake sets {var} only with {PUBLISHED_INPUTS_VAR}={int(not published)}, so this "
                f"mode gets {default}"
            )
        if not decl.default:
            return (
                f"{var} has no value: bake sets no arg {var} and its ARG "
                f"({self.file}:{decl.line}) has no default"
            )
        return None


def check_recipes(graph: BakeGraph) -> list[str]:
    """Problems between the bake file's targets and their Dockerfiles; empty when they agree."""
    lines = graph.outline
    parsed: dict[Path, Dockerfile | DockerfileError] = {}
    found: dict[str, set[tuple[str, bool]]] = {}
    limits: dict[str, tuple[str, ...]] = {}
    for name in graph.targets:
        arches = tuple(dict.fromkeys(graph.build_arch(name, a) for a in graph.arches))
        for arch in arches:
            for published in (False, True):
                target = graph.resolve(arch, published=published).targets[name]
                other = graph.resolve(arch, published=not published).targets[name]
                for problem in _problems(graph, lines, target, other.args, published, parsed):
                    found.setdefault(problem, set()).add((arch, published))
                    limits[problem] = arches
    return [_qualified(p, seen, limits[p]) for p, seen in found.items()]


def _problems(
    graph: BakeGraph,
    lines: Outline,
    target: Target,
    other_args: Mapping[str, str],
    published: bool,
    parsed: dict[Path, Dockerfile | DockerfileError],
) -> Iterator[str]:
    path = dockerfile_path(graph, target)
    where = f"{shown(graph.path)}:{lines.attr_line(target.name, 'dockerfile') or target.line}"
    if not path.is_file():
        yield f"{where}: target {target.name!r}: dockerfile {shown(path)} does not exist"
        return
    if path not in parsed:
        try:
            parsed[path] = load(path)
        except DockerfileError as exc:
            parsed[path] = exc
    df = parsed[path]
    if isinstance(df, DockerfileError):
        yield f"{where}: target {target.name!r}: {df}"
        return
    yield from _TargetCheck(graph, lines, target, df, other_args).problems(published)


def _qualified(problem: str, seen: set[tuple[str, bool]], arches: tuple[str, ...]) -> str:
    """The problem with the mode and arches it is limited to, if it is not everywhere."""
    modes = {p for _, p in seen}
    hit = [a for a in arches if any(a == s for s, _ in seen)]
    parts = []
    if len(modes) == 1:
        parts.append(f"{PUBLISHED_INPUTS_VAR}={int(modes.pop())}")
    if len(hit) < len(arches):
        parts.append(", ".join(hit))
    return f"{problem} ({' '.join(parts)} only)" if parts else problem
