"""Who resolves the bake file: bake itself where buildx is installed, else the builtin evaluator.

Both answer the same question (every target of the file under one environment, as `--print`
prints it), so the graph does not know which one answered. What `--print` does not say comes
from the static reading (python-hcl2 and the builtin evaluator, lazily): the top-level values the
farm reads (the arch list, the test targets, `PUB_*` labels), group members and line numbers.
"""

import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Protocol

from rocm_assets.core.bake import blocks
from rocm_assets.core.bake.buildx import BakePrinter, Buildx, find_buildx
from rocm_assets.core.bake.errors import BakeError, boundary
from rocm_assets.core.bake.evaluate import Evaluation
from rocm_assets.core.bake.features import minimum
from rocm_assets.core.bake.limits import Budget
from rocm_assets.core.bake.parse import BakeFile
from rocm_assets.core.bake.targets import ResolvedBake, Target, check_tags, resolve

BAKE, BUILTIN = "bake", "builtin"
RESOLVERS = (BAKE, BUILTIN)
# `bake`, `builtin`, or unset for bake where buildx is installed.
RESOLVER_ENV = "ROCM_BAKE_RESOLVER"


class Resolver(Protocol):
    name: str

    def resolve_many(
        self, envs: Sequence[Mapping[str, str]], budget: Budget
    ) -> list[ResolvedBake]: ...


class StaticValues(Mapping[str, Any]):
    """The file's top-level values, each evaluated by the builtin reader when first asked for."""

    def __init__(self, ev: Evaluation):
        self._ev = ev
        self._names = ev.names()

    def __getitem__(self, name: str) -> Any:
        if name not in self._names:
            raise KeyError(name)
        return self._ev.value(name)

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)


class BuiltinResolver:
    """The builtin evaluator: bake's answer, or a refusal naming what needs buildx."""

    name = BUILTIN

    def __init__(self, bake: BakeFile):
        self.bake = bake

    def resolve_many(self, envs: Sequence[Mapping[str, str]], budget: Budget) -> list[ResolvedBake]:
        return [_checked(resolve(self.bake, env, budget)) for env in envs]


def _checked(resolved: ResolvedBake) -> ResolvedBake:
    """The farm's own check on what either resolver answered: every tag a valid reference,
    before any build or registry lookup uses it."""
    for target in resolved.targets.values():
        check_tags(target, resolved.path)
    return resolved


class BuildxResolver:
    """`docker buildx bake --print` for every environment at once."""

    name = BAKE

    def __init__(self, bake: BakeFile, buildx: Buildx, env: Mapping[str, str]):
        self.bake = bake
        self.buildx = buildx
        self.printer = BakePrinter(buildx, bake, env=env)

    def _line(self, ev: Evaluation, name: str) -> int | None:
        if name in self.bake.targets:
            return self.bake.targets[name][0].line
        # A matrix target: its block's line, if the static reading can expand the matrix.
        try:
            parts = ev.expansion.targets.get(name)
        except BakeError:
            return None
        return parts[0].block.line if parts else None

    def resolve_many(self, envs: Sequence[Mapping[str, str]], budget: Budget) -> list[ResolvedBake]:
        needs = minimum(self.bake)
        if needs is not None and needs.version > self.buildx.version:
            # Said before bake says `Unsupported argument`: what to install, not what is wrong.
            raise BakeError(
                f"{needs}, and the installed buildx is {self.buildx.version_text}: install "
                f"docker-buildx {needs.version_text} or later (Debian testing has 0.29)",
                path=self.bake.path,
                line=needs.line,
            )
        names = [n for n in self.bake.targets if not n.startswith("_")]
        printed = self.printer.print_many(envs, names)
        out = []
        for env, entries in zip(envs, printed, strict=True):
            ev = Evaluation(self.bake, dict(env), budget)
            with boundary(self.bake.path):
                found = [Target(name, self._line(ev, name), e) for name, e in entries.items()]
                # In the file's order, as the builtin gives them (bake prints them sorted).
                found.sort(key=lambda t: t.line or len(self.bake.text))
                targets = {t.name: t for t in found}
                groups = {name: tuple(blocks.group(ev, name)) for name in blocks.group_names(ev)}
                lines = {name: blocks.group_line(ev, name) for name in groups}
            resolved = ResolvedBake(
                self.bake.path, dict(env), StaticValues(ev), targets, groups, lines
            )
            out.append(_checked(resolved))
        return out


def choose(
    bake: BakeFile, env: Mapping[str, str] | None = None, name: str | None = None
) -> Resolver:
    """`name` (else $ROCM_BAKE_RESOLVER): bake, builtin, or bake where buildx is installed."""
    env = os.environ if env is None else env
    name = name or env.get(RESOLVER_ENV) or None
    if name is not None and name not in RESOLVERS:
        raise BakeError(
            f"unknown resolver {name!r} (from --resolver or ${RESOLVER_ENV}): use bake or builtin"
        )
    if name == BUILTIN:
        return BuiltinResolver(bake)
    buildx = find_buildx(env)
    if buildx is not None:
        return BuildxResolver(bake, buildx, env)
    if name == BAKE:
        raise BakeError(
            "--resolver bake needs docker buildx, and none is installed here (the docker CLI's "
            "cli-plugins dirs have no docker-buildx): install it, or use --resolver builtin",
            path=bake.path,
        )
    return BuiltinResolver(bake)
