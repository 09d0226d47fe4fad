"""Where bake's answer comes from: bake itself where buildx is installed, else the manifest bake
wrote on a host that has it. Both give `--print`'s JSON, which `targets.resolved_bake` reads."""

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from rocm_assets.core.bake.errors import BakeError
from rocm_assets.core.bake.manifest import (
    REWRITE,
    Manifest,
    load_manifest,
    manifest_path,
    print_key,
)
from rocm_assets.core.bake.runner import BakePrinter
from rocm_assets.core.bake.source import Outline
from rocm_assets.core.common.buildx import Buildx, find_buildx


class Resolver(Protocol):
    """`--print`'s JSON for each environment, and the buildx version that printed it."""

    version: tuple[int, ...]
    version_text: str
    label: str

    def prints(self, envs: Sequence[Mapping[str, str]]) -> list[dict[str, Any]]: ...


class BuildxResolver:
    def __init__(self, outline: Outline, buildx: Buildx, env: Mapping[str, str]):
        self.buildx = buildx
        self.version = buildx.version
        self.version_text = buildx.version_text
        self.label = f"docker buildx bake {buildx.version_text}"
        self.printer = BakePrinter(buildx, outline, env=env)

    def prints(self, envs: Sequence[Mapping[str, str]]) -> list[dict[str, Any]]:
        return self.printer.print_many(envs)


class ManifestResolver:
    def __init__(self, manifest: Manifest):
        self.manifest = manifest
        self.version = manifest.version
        self.version_text = manifest.buildx
        self.label = f"docker buildx bake {manifest.buildx}, read from {manifest.path.name}"

    def prints(self, envs: Sequence[Mapping[str, str]]) -> list[dict[str, Any]]:
        out = []
        for env in envs:
            key = print_key(env)
            if key not in self.manifest.prints:
                arch, published = key
                raise BakeError(
                    f"holds no answer for GPU_ARCH={arch or '(default)'} "
                    f"PUBLISHED_INPUTS={int(published)}: {REWRITE}",
                    path=self.manifest.path,
                )
            out.append(self.manifest.prints[key])
        return out


def choose(outline: Outline, env: Mapping[str, str]) -> Resolver:
    """Bake where buildx is installed; else a manifest that matches; else one line on buildx."""
    buildx = find_buildx(env)
    if buildx is not None:
        return BuildxResolver(outline, buildx, env)
    path = manifest_path(outline.path, env)
    if path.is_file():
        return ManifestResolver(load_manifest(path, outline, env))
    raise BakeError(
        "docker buildx is not installed here (no docker-buildx in the docker CLI's cli-plugins "
        "dirs) and there is no manifest of bake's answer "
        f"({path.name}): install docker-buildx (Debian: apt-get install docker-buildx), or run "
        "`rocm-assets manifest` where it is installed and bring the manifest here",
        path=outline.path,
    )
