"""Bake itself resolves the graph: `docker buildx bake --print`, on the buildx people have.

Real: Debian testing's buildx 0.29 (the docker CLI plugin) and Debian 13's buildx 0.13 (unpacked
beside it by .ci/setup), run as the resolver runs them; no engine is needed for --print.
"""

import os
from pathlib import Path

import pytest

from rocm_assets.core.bake import BakeError, load_graph
from rocm_assets.core.bake.buildx import BUILDX_ENV, CACHE_DIR_ENV, find_buildx
from rocm_assets.core.bake.resolvers import RESOLVER_ENV
from rocm_assets_tests.helpers import PROJECT_ROOT, SHIPPED_BAKE_FILE, rocm_assets_cli

FARM_BAKE_FILE = PROJECT_ROOT / "examples" / "farm" / "bake.hcl"
SHIPPED_FILES = (SHIPPED_BAKE_FILE, FARM_BAKE_FILE)


@pytest.fixture(params=["new", "old"])
def buildx(request: pytest.FixtureRequest, old_buildx: Path) -> Path:
    """Each test runs on both: the plugin the docker CLI runs, and Debian 13's 0.13."""
    if request.param == "old":
        return old_buildx
    found = find_buildx()
    if found is None:
        pytest.fail("no docker buildx plugin is installed: .ci/setup installs docker-buildx")
    return found.path


def env_for(buildx: Path, tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("GPU_ARCH", "PUBLISHED_INPUTS")}
    return {
        **env,
        BUILDX_ENV: str(buildx),
        CACHE_DIR_ENV: str(tmp_path / "cache"),
        RESOLVER_ENV: "bake",
        **extra,
    }


@pytest.mark.parametrize("bake_file", SHIPPED_FILES, ids=["rocm-bake", "example-farm"])
def test_the_shipped_files_resolve_every_group_arch_and_mode(
    buildx: Path, bake_file: Path, tmp_path: Path
) -> None:
    graph = load_graph(bake_file, env_for(buildx, tmp_path))
    assert graph.resolver.name == "bake"
    for published in (False, True):
        graph.prefetch(published=published)
        for arch in graph.arches:
            resolved = graph.resolve(arch, published=published)
            for group in graph.groups:
                # Every member resolved, and no target: context survives in published mode.
                for name in resolved.expand([group]):
                    target = resolved.targets[name]
                    assert target.tags, name
                    if published:
                        assert not target.target_links, (name, arch)


def test_an_unknown_arch_is_refused_by_bake_where_it_can_and_by_us_otherwise(
    buildx: Path, tmp_path: Path
) -> None:
    graph = load_graph(SHIPPED_BAKE_FILE, env_for(buildx, tmp_path))
    version = graph.resolver.buildx.version
    # Ours, on any version: the arch is not in the file's list.
    with pytest.raises(BakeError, match=r"GPU_ARCH=gfx9999 is not one of GPU_ARCHES \(gfx942, "):
        graph.resolve("gfx9999")
    # Bake's own validation (buildx >= 0.19), through the arch check the resolver adds.
    printer = graph.resolver.printer
    env = {**env_for(buildx, tmp_path), "GPU_ARCH": "gfx9999"}
    if version >= (0, 19):
        with pytest.raises(BakeError) as raised:
            printer.print_many([env], ["pytorch"])
        assert str(raised.value) == (
            f"{SHIPPED_BAKE_FILE}: docker buildx bake: GPU_ARCH=gfx9999: Validation failed; "
            "GPU_ARCH must be one of GPU_ARCHES."
        )
    else:
        # Older bake takes any arch: the check above is the only one.
        [targets] = printer.print_many([env], ["pytorch"])
        assert targets["pytorch"].get("tags")


def test_bakes_answers_are_cached_by_what_decides_them(buildx: Path, tmp_path: Path) -> None:
    copy = tmp_path / "rocm-bake.hcl"
    copy.write_text(SHIPPED_BAKE_FILE.read_text())
    env = env_for(buildx, tmp_path)
    first = load_graph(copy, env)
    cached = sorted((tmp_path / "cache" / "bake-print").glob("*.json"))
    # One answer per arch: the default arch is one of them.
    assert len(cached) == len(first.arches)
    again = load_graph(copy, env)
    assert sorted((tmp_path / "cache" / "bake-print").glob("*.json")) == cached
    assert again.resolve("gfx950").targets["vllm"].printed == (
        first.resolve("gfx950").targets["vllm"].printed
    )
    # A pin from the environment is a different answer, so a different entry.
    bumped = load_graph(copy, {**env, "SDE_VLLM_REF": "v9.9.9"})
    assert bumped.resolve("gfx950").targets["vllm"].args["VLLM_REF"] == "v9.9.9"
    # So is an edit of the file.
    copy.write_text(copy.read_text().replace('default = "v0.13.0"', 'default = "v0.14.0"'))
    edited = load_graph(copy, env)
    assert edited.resolve("gfx950").targets["vllm"].args["VLLM_REF"] == "v0.14.0"
    # A cache entry that is not JSON is only a miss.
    for entry in (tmp_path / "cache" / "bake-print").glob("*.json"):
        entry.write_text("{broken")
    assert load_graph(copy, env).resolve("gfx950").targets["vllm"].args["VLLM_REF"] == "v0.14.0"


def test_a_file_bake_rejects_is_bakes_one_line_at_its_line(buildx: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad.hcl"
    bad.write_text(
        'variable "GPU_ARCHES" {\n  default = ["gfx942"]\n}\n'
        'target "a" {\n  tags = ["r/a:${NOPE}"]\n}\n'
    )
    with pytest.raises(BakeError) as raised:
        load_graph(bad, env_for(buildx, tmp_path))
    message = str(raised.value)
    assert message.startswith(f"{bad}:5: docker buildx bake: ")
    assert "NOPE" in message and "\n" not in message


def test_check_names_the_buildx_a_file_needs_when_the_installed_one_is_older(
    tmp_path: Path, old_buildx: Path
) -> None:
    newer = tmp_path / "newer.hcl"
    newer.write_text(
        'variable "GPU_ARCHES" {\n  default = ["gfx942"]\n}\n'
        'variable "GPU_ARCH" {\n  description = "one arch"\n  default = "gfx942"\n}\n'
        'target "a" {\n  tags = ["r/a:1"]\n}\n'
    )
    env = env_for(old_buildx, tmp_path)
    out = rocm_assets_cli("check", "--bake-file", str(newer), env=env)
    assert out.returncode == 2
    assert out.stderr == (
        f"rocm-assets: error: {newer}:5: variable 'GPU_ARCH': description (line 5) needs buildx "
        ">= 0.16.0, and the installed buildx is 0.13.1: install docker-buildx 0.16.0 or later "
        "(Debian testing has 0.29)\n"
    )
    # The shipped files need nothing newer than Debian 13's buildx, and check says so.
    ok = rocm_assets_cli("check", env=env)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.rstrip().endswith(
        "resolved by docker buildx bake 0.13.1, reads on buildx 0.13 and later"
    )


def test_the_print_is_the_same_on_both_versions(tmp_path: Path, old_buildx: Path) -> None:
    found = find_buildx()
    assert found is not None
    new = load_graph(SHIPPED_BAKE_FILE, env_for(found.path, tmp_path / "new"))
    old = load_graph(SHIPPED_BAKE_FILE, env_for(old_buildx, tmp_path / "old"))
    for published in (False, True):
        for arch in new.arches:
            a = new.resolve(arch, published=published).targets
            b = old.resolve(arch, published=published).targets
            assert {n: t.printed for n, t in a.items()} == {n: t.printed for n, t in b.items()}
