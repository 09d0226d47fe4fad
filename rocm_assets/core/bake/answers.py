"""Bake's answers for one bake file: a ResolvedBake per (arch, input mode), asked for in batches.

The first is the file's default arch in the linked mode, asked alone: its values say which arches
there are. Each later batch runs concurrently. Every answer is kept, and the print it was read
from recorded for the manifest.
"""

from collections.abc import Mapping, Sequence
from typing import Any

from rocm_assets.core.bake.errors import BakeError, boundary
from rocm_assets.core.bake.manifest import PrintKey, print_key
from rocm_assets.core.bake.resolvers import Resolver
from rocm_assets.core.bake.source import Outline
from rocm_assets.core.bake.targets import ResolvedBake, resolved_bake
from rocm_assets.core.common.constants import ARCH_VAR, PUBLISHED_INPUTS_VAR
from rocm_assets.core.common.text import quote

# (GPU_ARCH, or the file's default arch, or "" when it names none; PUBLISHED_INPUTS)
AnswerKey = tuple[str, bool]


def _env(base_env: Mapping[str, str], arch: str | None, *, published: bool) -> dict[str, str]:
    env = {**base_env, PUBLISHED_INPUTS_VAR: "1" if published else "0"}
    if arch:
        env[ARCH_VAR] = arch
    return env


def _read(
    outline: Outline,
    resolver: Resolver,
    envs: list[dict[str, str]],
    prints: dict[PrintKey, dict[str, Any]],
) -> list[ResolvedBake]:
    """Bake's answer for each environment, read into targets, groups and values; each print is
    recorded in `prints`."""
    out = []
    for env, data in zip(envs, resolver.prints(envs), strict=True):
        prints[print_key(env)] = data
        with boundary(outline.path):
            out.append(resolved_bake(outline, env, data, resolver.version))
    return out


class BakeAnswers:
    """Every answer asked for so far, by arch and input mode, and the prints they came from."""

    def __init__(
        self,
        outline: Outline,
        resolver: Resolver,
        base_env: Mapping[str, str],
        first: ResolvedBake,
        prints: dict[PrintKey, dict[str, Any]],
    ) -> None:
        self.outline = outline
        self.resolver = resolver
        self.base_env = dict(base_env)
        # The file's default arch in the linked mode (GPU_ARCH unset).
        self.first = first
        default = first.values.get(ARCH_VAR)
        self.default_arch: str | None = default if isinstance(default, str) and default else None
        # Bake's JSON for each call made, by (GPU_ARCH or "", PUBLISHED_INPUTS): the manifest.
        self.prints = prints
        self._resolved: dict[AnswerKey, ResolvedBake] = {self._key(None, False): first}

    @classmethod
    def ask_default(
        cls, outline: Outline, resolver: Resolver, env: Mapping[str, str]
    ) -> "BakeAnswers":
        """Ask for the first answer, the file's default arch in the linked mode, under `env`."""
        # Like bake, variables come from the environment (REGISTRY, SDE_*, ...); the arch and
        # the input mode are set per evaluation instead.
        base_env = {k: v for k, v in env.items() if k not in (ARCH_VAR, PUBLISHED_INPUTS_VAR)}
        prints: dict[PrintKey, dict[str, Any]] = {}
        (first,) = _read(outline, resolver, [_env(base_env, None, published=False)], prints)
        return cls(outline, resolver, base_env, first, prints)

    def _key(self, arch: str | None, published: bool) -> AnswerKey:
        # The file's default arch is also a named arch: resolve it once, not twice.
        return (arch or self.default_arch or "", published)

    def resolve_all(self, arches: Sequence[str | None], published: bool) -> None:
        """Ask for every arch not asked yet (None: the file's default) in one batch."""
        wanted: dict[AnswerKey, str | None] = {}
        for arch in arches:
            key = self._key(arch, published)
            if key not in self._resolved:
                wanted.setdefault(key, arch or self.default_arch)
        if not wanted:
            return
        envs = [_env(self.base_env, arch, published=published) for arch in wanted.values()]
        answered = _read(self.outline, self.resolver, envs, self.prints)
        for key, resolved in zip(wanted, answered, strict=True):
            self._resolved[key] = resolved
            if resolved.targets.keys() != self.first.targets.keys():
                changed = sorted(resolved.targets.keys() ^ self.first.targets.keys())
                raise BakeError(
                    f"the targets differ between evaluations ({', '.join(map(quote, changed[:3]))}"
                    f"{' ...' if len(changed) > 3 else ''} with {ARCH_VAR}={key[0] or 'default'}, "
                    f"{PUBLISHED_INPUTS_VAR}={int(published)}): a matrix or name must not depend on them",
                    path=self.outline.path,
                )

    def get(self, arch: str | None, published: bool) -> ResolvedBake:
        """The answer for one arch (None: the file's default) and input mode, asked if need be."""
        key = self._key(arch, published)
        if key not in self._resolved:
            self.resolve_all([arch], published)
        return self._resolved[key]
