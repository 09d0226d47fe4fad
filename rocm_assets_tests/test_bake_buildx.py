"""Bake itself resolves the graph: `docker buildx bake --print`, on the buildx people have; and a
host without buildx reads bake's answer from the manifest a host with buildx wrote.

Real: Debian testing's buildx 0.29 (the docker CLI plugin) and Debian 13's buildx 0.13 (unpacked
beside it by .ci/setup), run as the resolver runs them; no engine is needed for --print. "No
buildx" is real too: a private mount namespace (unshare) with tmpfs over every docker CLI plugin
dir and a PATH without docker, so nothing can find the plugin.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rocm_assets.core.bake import BakeError, load_graph
from rocm_assets.core.bake.printed import canonical
from rocm_assets.core.common.buildx import BUILDX_ENV, SYSTEM_PLUGIN_DIRS, find_buildx
from rocm_assets.core.common.cache import CACHE_DIR_ENV
from rocm_assets_tests.helpers import PROJECT_ROOT, SHIPPED_BAKE_FILE, rocm_assets_cli

FARM_BAKE_FILE = PROJECT_ROOT / "examples" / "farm" / "bake.hcl"
SHIPPED_FILES = (SHIPPED_BAKE_FILE, FARM_BAKE_FILE)
REWRITE = "rewrite it with `rocm-assets manifest` where docker buildx is installed"


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
    return {**env, BUILDX_ENV: str(buildx), CACHE_DIR_ENV: str(tmp_path / "cache"), **extra}


@pytest.mark.parametrize("bake_file", SHIPPED_FILES, ids=["rocm-bake", "example-farm"])
def test_the_shipped_files_resolve_every_group_arch_and_mode(
    buildx: Path, bake_file: Path, tmp_path: Path
) -> None:
    graph = load_graph(bake_file, env_for(buildx, tmp_path))
    assert graph.resolver_label.startswith("docker buildx bake 0.")
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


def _bake_print(
    buildx: Path, bake_file: Path, env: dict[str, str], targets: list[str]
) -> dict[str, dict]:
    """What a user sees: `docker buildx bake -f FILE --print TARGETS` under `env`, canonical."""
    done = subprocess.run(
        [str(buildx), "bake", "-f", str(bake_file), "--print", "--progress=quiet", *targets],
        env=env, cwd=bake_file.parent, capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    version = load_graph(bake_file, env).resolver.version
    return {n: canonical(e, version=version) for n, e in json.loads(done.stdout)["target"].items()}


@pytest.mark.parametrize("bake_file", SHIPPED_FILES, ids=["rocm-bake", "example-farm"])
def test_graph_json_is_bakes_print_field_by_field_in_both_modes_and_every_arch(
    buildx: Path, bake_file: Path, tmp_path: Path
) -> None:
    base = env_for(buildx, tmp_path)
    graph = load_graph(bake_file, base)
    for published in ("0", "1"):
        # Unset: the file's default arch, as bake takes it.
        for arch in (None, *graph.arches):
            env = {**base, "PUBLISHED_INPUTS": published}
            if arch:
                env["GPU_ARCH"] = arch
            shown = rocm_assets_cli("graph", "--json", "--bake-file", str(bake_file), env=env)
            assert shown.returncode == 0, shown.stderr
            data = json.loads(shown.stdout)
            assert data["published_inputs"] is (published == "1")
            assert data["arch"] == (arch or graph.default_arch)
            printed = _bake_print(buildx, bake_file, env, list(graph.targets))
            assert list(data["target"]) == list(graph.targets)
            for name in graph.targets:
                # Field by field, in bake's own order.
                assert list(data["target"][name].items()) == list(printed[name].items()), (
                    name,
                    arch,
                    published,
                )


def test_graph_json_in_published_mode_reads_the_registry_not_the_targets(tmp_path: Path) -> None:
    # The mode changes the answer (published inputs are image refs, not `target:` links).
    found = find_buildx()
    assert found is not None
    env = env_for(found.path, tmp_path, GPU_ARCH="gfx942")
    linked = json.loads(rocm_assets_cli("graph", "--json", env=env).stdout)
    published = json.loads(
        rocm_assets_cli("graph", "--json", env={**env, "PUBLISHED_INPUTS": "true"}).stdout
    )
    links = {c for t in linked["target"].values() for c in t.get("contexts", {}).values()}
    assert any(c.startswith("target:") for c in links)
    links = {c for t in published["target"].values() for c in t.get("contexts", {}).values()}
    assert not any(c.startswith("target:") for c in links)
    bad = rocm_assets_cli("graph", "--json", env={**env, "PUBLISHED_INPUTS": "yes"})
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1
    assert "PUBLISHED_INPUTS='yes' is not a bool as bake reads one" in bad.stderr


def test_an_unknown_arch_is_refused_by_bake_where_it_can_and_by_us_otherwise(
    buildx: Path, tmp_path: Path
) -> None:
    graph = load_graph(SHIPPED_BAKE_FILE, env_for(buildx, tmp_path))
    version = graph.resolver.version
    # Ours, on any version: the arch is not in the file's list.
    with pytest.raises(BakeError, match=r"GPU_ARCH=gfx9999 is not one of GPU_ARCHES \(gfx942, "):
        graph.resolve("gfx9999")
    # Bake's own validation (buildx >= 0.19), through the arch check the resolver adds.
    printer = graph.resolver.printer
    env = {**env_for(buildx, tmp_path), "GPU_ARCH": "gfx9999"}
    if version >= (0, 19):
        with pytest.raises(BakeError) as raised:
            printer.print_many([env])
        assert str(raised.value) == (
            f"{SHIPPED_BAKE_FILE}: docker buildx bake: GPU_ARCH=gfx9999: Validation failed; "
            "GPU_ARCH must be one of GPU_ARCHES."
        )
    else:
        # Older bake takes any arch: the check above is the only one.
        [data] = printer.print_many([env])
        assert data["target"]["pytorch"].get("tags")


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


def test_what_an_older_buildx_cannot_read_is_its_own_one_line_error(
    tmp_path: Path, old_buildx: Path
) -> None:
    # A variable's `description` came in buildx 0.16: 0.13 says so itself, at that line.
    newer = tmp_path / "newer.hcl"
    newer.write_text(
        'variable "GPU_ARCHES" {\n  default = ["gfx942"]\n}\n'
        'variable "GPU_ARCH" {\n  description = "one arch"\n  default = "gfx942"\n}\n'
        'target "a" {\n  tags = ["r/a:1"]\n}\n'
    )
    env = env_for(old_buildx, tmp_path)
    out = rocm_assets_cli("check", "--bake-file", str(newer), env=env)
    assert out.returncode == 2
    assert out.stderr.startswith(f"rocm-assets: error: {newer}:5: docker buildx bake: ")
    assert "description" in out.stderr and out.stderr.count("\n") == 1
    # The shipped files read on Debian 13's buildx, and check says who resolved them.
    ok = rocm_assets_cli("check", env=env)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.rstrip().endswith("resolved by docker buildx bake 0.13.1")


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


# ---- a host without buildx: the manifest ----

# Run in a private mount namespace: tmpfs over each plugin dir, then the command, with no shell.
_HIDE_AND_RUN = """
import os, subprocess, sys
for d in sys.argv[1].split(":"):
    if os.path.isdir(d):
        subprocess.run(["/usr/bin/mount", "-t", "tmpfs", "tmpfs", d], check=True)
os.execv(sys.argv[2], sys.argv[2:])
"""
_LIST_ASSETS = """
import json, rocm_assets.definitions as d
defs = d.defs()
graph = defs.resolve_asset_graph()
print(json.dumps({
    "assets": sorted(k.to_user_string() for k in graph.get_all_asset_keys()),
    "checks": sorted(k.to_user_string() for k in graph.asset_check_keys),
    "jobs": sorted(j.name for j in defs.resolve_all_job_defs()),
}))
"""


def without_buildx(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """`argv` where no buildx can be found: every plugin dir empty, no docker on PATH."""
    hidden = {k: v for k, v in env.items() if k != BUILDX_ENV}
    hidden["PATH"] = str(Path(sys.executable).parent)
    done = subprocess.run(
        ["/usr/bin/unshare", "--mount", "--propagation", "private", "--", sys.executable, "-c",
         _HIDE_AND_RUN, ":".join(SYSTEM_PLUGIN_DIRS), *argv],
        env=hidden, capture_output=True, text=True, timeout=300, check=False, cwd=PROJECT_ROOT,
    )  # fmt: skip
    return done


@pytest.fixture
def bare_host(tmp_path: Path) -> dict[str, str]:
    """A copy of the shipped bake file and an env whose HOME and docker config hold no plugin."""
    shutil.copy(SHIPPED_BAKE_FILE, tmp_path / "rocm-bake.hcl")
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("GPU_ARCH", "PUBLISHED_INPUTS")}
    env.pop("DOCKER_CONFIG", None)
    return {
        **env,
        "HOME": str(home),
        "ROCM_BAKE_FILE": str(tmp_path / "rocm-bake.hcl"),
        CACHE_DIR_ENV: str(tmp_path / "cache"),
        "DAGSTER_HOME": str(tmp_path),
    }


def test_without_buildx_the_code_location_loads_the_same_assets_from_the_manifest(
    buildx: Path, bare_host: dict[str, str]
) -> None:
    bake_file = Path(bare_host["ROCM_BAKE_FILE"])
    with_buildx = {**bare_host, BUILDX_ENV: str(buildx)}
    # Where buildx is: the assets as bake resolves them, and the manifest written.
    listed = subprocess.run(
        [sys.executable, "-c", _LIST_ASSETS], env=with_buildx,
        capture_output=True, text=True, check=True, cwd=PROJECT_ROOT,
    )  # fmt: skip
    assets = json.loads(listed.stdout)
    # The shipped file's 16 targets: 15 image assets and one GPU test (an asset check).
    assert len(assets["assets"]) == 15 and "pytorch:pytorch_test" in assets["checks"]
    wrote = rocm_assets_cli("manifest", env=with_buildx)
    assert wrote.returncode == 0, wrote.stderr
    manifest = bake_file.with_name("rocm-bake.manifest.json")
    assert wrote.stdout.startswith(f"{manifest}: bake's answer for rocm-bake.hcl")
    # No buildx at all, but the manifest: the same assets, checks and jobs, the same graph.
    shutil.rmtree(bare_host[CACHE_DIR_ENV])
    listed = without_buildx([sys.executable, "-c", _LIST_ASSETS], bare_host)
    assert listed.returncode == 0, listed.stderr
    assert json.loads(listed.stdout) == assets
    for published in ("0", "1"):
        argv = [sys.executable, "-m", "rocm_assets.cli", "graph", "--json"]
        env = {**bare_host, "PUBLISHED_INPUTS": published, "GPU_ARCH": "gfx950"}
        shown = without_buildx(argv, env)
        assert shown.returncode == 0, shown.stderr
        data = json.loads(shown.stdout)
        assert data.pop("resolved_by").endswith(", read from rocm-bake.manifest.json")
        same = json.loads(rocm_assets_cli("graph", "--json", env={**with_buildx, **env}).stdout)
        assert same.pop("resolved_by").startswith("docker buildx bake ")
        assert data == same
    # Proof the hiding is real: without the manifest, it is the install line.
    manifest.unlink()
    none = without_buildx([sys.executable, "-m", "rocm_assets.cli", "graph"], bare_host)
    assert none.returncode == 2 and none.stderr.count("\n") == 1
    assert none.stderr == (
        f"rocm-assets: error: {bake_file}: docker buildx is not installed here (no docker-buildx "
        "in the docker CLI's cli-plugins dirs) and there is no manifest of bake's answer "
        "(rocm-bake.manifest.json): install docker-buildx (Debian: apt-get install docker-buildx), "
        "or run `rocm-assets manifest` where it is installed and bring the manifest here\n"
    )


def test_a_stale_manifest_is_refused_in_one_line_naming_the_command(
    bare_host: dict[str, str],
) -> None:
    found = find_buildx()
    assert found is not None
    bake_file = Path(bare_host["ROCM_BAKE_FILE"])
    manifest = bake_file.with_name("rocm-bake.manifest.json")
    wrote = rocm_assets_cli("manifest", env={**bare_host, BUILDX_ENV: str(found.path)})
    assert wrote.returncode == 0, wrote.stderr
    graph = [sys.executable, "-m", "rocm_assets.cli", "graph"]
    assert without_buildx(graph, bare_host).returncode == 0
    # A variable bake reads from the environment, changed: named, its value never shown.
    moved = without_buildx(graph, {**bare_host, "REGISTRY": "other.example:5000"})
    assert moved.returncode == 2
    assert moved.stderr == (
        f"rocm-assets: error: {manifest}: stale: the environment differs from the one it was "
        f"written with (REGISTRY); {REWRITE}\n"
    )
    # `check` on the host with buildx says so too, before a laptop finds out.
    checked = rocm_assets_cli(
        "check", env={**bare_host, BUILDX_ENV: str(found.path), "REGISTRY": "other.example:5000"}
    )
    assert checked.returncode == 1 and f"{manifest}: stale: " in checked.stderr
    # The file edited (one default changed): refused, whatever the edit.
    bake_file.write_text(bake_file.read_text().replace('"v0.13.0"', '"v0.14.0"', 1))
    edited = without_buildx(graph, bare_host)
    assert edited.returncode == 2
    assert edited.stderr == (
        f"rocm-assets: error: {manifest}: stale: it was written for another rocm-bake.hcl (the "
        f"file changed since); {REWRITE}\n"
    )
    # Not a manifest at all: refused the same way.
    manifest.write_text("{")
    broken = without_buildx(graph, bare_host)
    assert broken.returncode == 2 and broken.stderr.count("\n") == 1
    assert broken.stderr.endswith(f"{REWRITE}\n")
    # And `rocm-assets manifest` itself needs buildx: one line.
    refused = without_buildx([*graph[:-1], "manifest"], bare_host)
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1
    assert "needs docker buildx: install docker-buildx" in refused.stderr
