"""`rocm-assets graph` and `check`, run as the installed console script (a real subprocess).

Real: the CLI, and docker buildx bake (Debian's 0.29 plugin) resolving the files.
"""

import json
from pathlib import Path

from rocm_assets_tests.helpers import PROJECT_ROOT, rocm_assets_cli
from rocm_assets_tests.helpers.seed import SEED_EDGES, SEED_GROUPS

SHIPPED = PROJECT_ROOT / "rocm-bake.hcl"


def test_graph_json_is_the_seeds() -> None:
    out = rocm_assets_cli("graph", "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert list(data) == [
        "resolved_by", "buildx", "arch", "published_inputs", "arches", "group", "target", "graph",
    ]  # fmt: skip
    assert data["resolved_by"] == f"docker buildx bake {data['buildx']}"
    assert (data["arch"], data["published_inputs"]) == ("gfx942", False)
    assert data["buildx"].startswith("0.")
    assert len(data["target"]) == len(data["graph"]) == 16
    edges = {(d, n) for n, t in data["graph"].items() for d in t["deps"]}
    assert edges == SEED_EDGES
    assert {g: set(m["targets"]) for g, m in data["group"].items()} == SEED_GROUPS
    vllm = data["graph"]["vllm-wheel"]
    assert (
        vllm["deps"] == ["vllm"]
        and vllm["arch"] is True
        and vllm["groups"] == ["default", "wheels", "serving"]
    )
    assert data["graph"]["triton-wheel"]["arch"] is False
    # Each target as --print prints it: bake's fields, in bake's order, the empty ones left out.
    printed = data["target"]["vllm"]
    assert list(printed) == [
        "context", "contexts", "dockerfile", "args", "tags", "cache-from", "cache-to", "platforms",
    ]  # fmt: skip
    assert printed["tags"] == ["zot.snoc.lan:5000/rocm-pytorch/vllm:2.15.0-10.1.0-full-gfx942"]
    assert printed["dockerfile"] == "docker/vllm.Dockerfile"
    assert printed["contexts"]["lmcache-wheel"] == "target:lmcache-wheel"
    assert printed["cache-from"] == [
        {"ref": "zot.snoc.lan:5000/rocm-pytorch/cache:vllm-gfx942", "type": "registry"}
    ]
    assert printed["cache-to"][0]["mode"] == "max"
    assert printed["platforms"] == ["linux/amd64"]


def test_bake_is_asked_for_and_missing(tmp_path: Path) -> None:
    # $ROCM_BUILDX names a binary that is not there: one line naming it, not a search elsewhere.
    env = {
        "PATH": "/nonexistent",
        "HOME": str(tmp_path),
        "DOCKER_CONFIG": str(tmp_path / "docker"),
        "ROCM_BUILDX": str(tmp_path / "no-buildx"),
    }
    out = rocm_assets_cli("graph", env=env)
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1 and "no-buildx is not a working buildx binary" in out.stderr


def test_graph_arch_and_bake_file_from_env(tmp_path: Path) -> None:
    copy = tmp_path / "copy.hcl"
    copy.write_text(SHIPPED.read_text())
    env = {"PATH": "/usr/bin:/bin", "ROCM_BAKE_FILE": str(copy), "HOME": str(tmp_path)}
    out = rocm_assets_cli("graph", "--json", "--arch", "gfx1250", cwd=tmp_path, env=env)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["target"]["pytorch"]["tags"][0].endswith("-gfx1250")


def test_unknown_arch_is_one_line_exit_2() -> None:
    out = rocm_assets_cli("graph", "--arch", "gfx9000")
    assert out.returncode == 2
    assert (
        out.stderr
        == "rocm-assets: error: unknown arch 'gfx9000': rocm-bake.hcl builds gfx942, gfx950, gfx1100, "
        "gfx1201, gfx1250 (add it to GPU_ARCHES there to make it a partition)\n"
    )


def test_bad_file_is_one_line_exit_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.hcl"
    bad.write_text('GPU_ARCHES = ["gfx942"]\ntarget "a" {\n  tags = [frob()]\n}\n')
    out = rocm_assets_cli("graph", "--bake-file", str(bad))
    assert out.returncode == 2
    # Bake's own diagnosis, at bake's line.
    assert out.stderr.startswith(
        f"rocm-assets: error: {bad}:3: docker buildx bake: Call to unknown function; There is no "
        'function named "frob".'
    )
    assert out.stderr.count("\n") == 1
    missing = rocm_assets_cli("check", "--bake-file", str(tmp_path / "nope.hcl"))
    assert (
        missing.returncode == 2
        and missing.stderr.count("\n") == 1
        and "bake file not found" in missing.stderr
    )


def test_check_passes_then_fails_on_drift(tmp_path: Path) -> None:
    ok = rocm_assets_cli("check")
    assert ok.returncode == 0, ok.stderr
    assert "ok: 16 targets, 27 edges, 3 groups" in ok.stdout
    drifted = tmp_path / "drifted.hcl"
    drifted.write_text(
        SHIPPED.read_text().replace(
            'PUB_BASE    = img("pytorch-base", ROCM_TAG)',
            'PUB_BASE    = img("pytorch-base", SDE_ROCM_VERSION)',
        )
    )
    out = rocm_assets_cli("check", "--bake-file", str(drifted))
    assert out.returncode == 1
    lines = out.stderr.splitlines()
    assert lines[0] == (
        f"{drifted}: gfx942: PUB_BASE (target 'triton-wheel' arg BASE_IMAGE) = "
        "'zot.snoc.lan:5000/rocm-pytorch/pytorch-base:10.1.0' but 'pytorch-base' is tagged "
        "'zot.snoc.lan:5000/rocm-pytorch/pytorch-base:10.1.0-full-gfx942'"
    )
