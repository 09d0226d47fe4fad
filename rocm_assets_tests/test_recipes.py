"""`rocm-assets check` against the Dockerfiles: args, contexts, stages and FROM values.

Real: the shipped rocm-bake.hcl and docker/ (copied to a temporary directory and drifted there),
small bake files written here, and the `rocm-assets` console script in a subprocess.
"""

import shutil
from pathlib import Path

import pytest

from rocm_assets.core.bake import load_graph
from rocm_assets.core.build.recipes import check_recipes, exempt
from rocm_assets.core.common.buildx import find_buildx
from rocm_assets_tests.helpers import PROJECT_ROOT, SHIPPED_BAKE_FILE, rocm_assets_cli


def line_of(path: Path, text: str) -> int:
    """The 1-based line of the one line of `path` that contains `text`."""
    found = [n for n, line in enumerate(path.read_text().splitlines(), 1) if text in line]
    assert len(found) == 1, f"{text!r} is on lines {found} of {path}"
    return found[0]


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert text.count(old) == 1, f"{old!r} is not in {path} exactly once"
    path.write_text(text.replace(old, new))


@pytest.fixture
def farm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of rocm-bake.hcl and docker/, the working directory, so lines print relative."""
    shutil.copy(SHIPPED_BAKE_FILE, tmp_path / "rocm-bake.hcl")
    shutil.copytree(PROJECT_ROOT / "docker", tmp_path / "docker")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_the_shipped_files_are_clean() -> None:
    assert check_recipes(load_graph(SHIPPED_BAKE_FILE, {})) == []
    out = rocm_assets_cli("check")
    assert out.returncode == 0, out.stderr
    buildx = find_buildx()
    assert buildx is not None, ".ci/setup installs docker-buildx"
    assert out.stdout == (
        f"{SHIPPED_BAKE_FILE}: ok: 16 targets, 27 edges, 3 groups, PUB_* references match for 5 "
        "arches, 16 Dockerfiles take every arg and context in both input modes; resolved by "
        f"docker buildx bake {buildx.version_text}\n"
    )


def test_an_arg_the_dockerfile_lost_names_both_files(farm: Path) -> None:
    dockerfile = farm / "docker" / "vllm.Dockerfile"
    edit(dockerfile, "FROM base AS build\nARG VLLM_REF\n", "FROM base AS build\n")
    edit(dockerfile, "ARG VLLM_REF\n", "")
    bake = line_of(farm / "rocm-bake.hcl", "    VLLM_REF                = SDE_VLLM_REF")
    first_from = line_of(dockerfile, "FROM ${TRITON_WHEEL_IMAGE} AS in-triton")
    assert check_recipes(load_graph("rocm-bake.hcl", {})) == [
        f"rocm-bake.hcl:{bake}: target 'vllm' arg VLLM_REF: no ARG VLLM_REF in "
        f"docker/vllm.Dockerfile (declare it before the first FROM, docker/vllm.Dockerfile:{first_from})"
    ]


def test_an_inherited_arg_is_named_at_the_parent_that_sets_it(farm: Path) -> None:
    dockerfile = farm / "docker" / "pytorch-src.Dockerfile"
    edit(dockerfile, "ARG SCCACHE_LOG\n", "")
    bake = line_of(farm / "rocm-bake.hcl", "    SCCACHE_LOG      = SCCACHE_LOG")  # in _common
    first_from = line_of(dockerfile, "FROM debian:trixie-slim AS fetch")
    assert check_recipes(load_graph("rocm-bake.hcl", {})) == [
        f"rocm-bake.hcl:{bake}: target 'pytorch-src' arg SCCACHE_LOG: no ARG SCCACHE_LOG in "
        "docker/pytorch-src.Dockerfile (declare it before the first FROM, "
        f"docker/pytorch-src.Dockerfile:{first_from})"
    ]


def test_a_context_the_dockerfile_stopped_using_names_both_files(farm: Path) -> None:
    dockerfile = farm / "docker" / "vllm.Dockerfile"
    edit(dockerfile, "FROM ${AITER_WHEEL_IMAGE} AS in-aiter", "FROM ${AITER_IMAGE} AS in-aiter")
    hcl = farm / "rocm-bake.hcl"
    context = line_of(hcl, '    "aiter-wheel"       = "target:aiter-wheel"')
    args = line_of(hcl, "    PYTORCH_IMAGE           = USE_PUB ? PUB_PYTORCH") - 1
    declared = line_of(dockerfile, "ARG AITER_WHEEL_IMAGE=aiter-wheel")
    from_line = line_of(dockerfile, "FROM ${AITER_IMAGE} AS in-aiter")
    assert check_recipes(load_graph("rocm-bake.hcl", {})) == [
        f"rocm-bake.hcl:{context}: target 'vllm' context 'aiter-wheel': "
        f"docker/vllm.Dockerfile:{declared} declares ARG AITER_WHEEL_IMAGE (= 'aiter-wheel'), but "
        "no FROM, COPY --from or RUN --mount from= resolves to it (PUBLISHED_INPUTS=0 only)",
        f"rocm-bake.hcl:{args}: target 'vllm': docker/vllm.Dockerfile:{from_line} FROM "
        "${AITER_IMAGE}: AITER_IMAGE is no ARG before the first FROM, so it is empty there",
    ]
    # The same drift through the command: exit 1, one line each, after nothing on stdout.
    out = rocm_assets_cli("check", "--bake-file", "rocm-bake.hcl", cwd=farm)
    assert out.returncode == 1
    assert out.stdout == ""
    assert out.stderr.splitlines() == check_recipes(load_graph("rocm-bake.hcl", {}))


def test_a_context_named_only_by_a_mount_counts_as_used(farm: Path) -> None:
    dockerfile = farm / "docker" / "pytorch-wheel.Dockerfile"
    edit(dockerfile, "FROM ${SRC_IMAGE} AS in-src\n", "")
    edit(dockerfile, "--mount=type=bind,from=in-src,", "--mount=type=bind,from=pytorch-src,")
    assert check_recipes(load_graph("rocm-bake.hcl", {})) == []
    edit(dockerfile, "--mount=type=bind,from=pytorch-src,", "--mount=type=bind,from=in-pytorch,")
    context = line_of(farm / "rocm-bake.hcl", '    "pytorch-src" = "target:pytorch-src"')
    assert check_recipes(load_graph("rocm-bake.hcl", {})) == [
        f"rocm-bake.hcl:{context}: target 'pytorch-wheel' context 'pytorch-src': "
        f"docker/pytorch-wheel.Dockerfile:{line_of(dockerfile, 'ARG SRC_IMAGE=')} declares ARG "
        "SRC_IMAGE (= 'pytorch-src'), but no FROM, COPY --from or RUN --mount from= resolves to "
        "it (PUBLISHED_INPUTS=0 only)"
    ]


def test_an_input_arg_set_in_one_mode_only(farm: Path) -> None:
    hcl = farm / "rocm-bake.hcl"
    edit(
        hcl,
        '    PYTORCH_IMAGE       = USE_PUB ? PUB_PYTORCH : "pytorch"\n    UCX_REF',
        '    PYTORCH_IMAGE       = USE_PUB ? null : "pytorch"\n    UCX_REF',
    )
    bake = line_of(hcl, '    PYTORCH_IMAGE       = USE_PUB ? null : "pytorch"')
    from_line = line_of(farm / "docker" / "nixl-wheel.Dockerfile", "FROM ${PYTORCH_IMAGE} AS build")
    assert check_recipes(load_graph("rocm-bake.hcl", {})) == [
        f"rocm-bake.hcl:{bake}: target 'nixl-wheel': docker/nixl-wheel.Dockerfile:{from_line} "
        "FROM ${PYTORCH_IMAGE}: bake sets PYTORCH_IMAGE only with PUBLISHED_INPUTS=0, so this mode "
        "gets its default 'pytorch' (PUBLISHED_INPUTS=1 only)"
    ]


def test_a_context_removed_from_the_bake_file_leaves_a_bare_name(farm: Path) -> None:
    hcl = farm / "rocm-bake.hcl"
    edit(hcl, '  contexts = USE_PUB ? {} : {\n    "lmcache" = "target:lmcache"\n  }\n', "")
    bake = line_of(hcl, '    LMCACHE_IMAGE       = USE_PUB ? PUB_LMCACHE : "lmcache"')
    from_line = line_of(
        farm / "docker" / "lmcache-wheel.Dockerfile", "FROM ${LMCACHE_IMAGE} AS in-lmcache"
    )
    assert check_recipes(load_graph("rocm-bake.hcl", {})) == [
        f"rocm-bake.hcl:{bake}: target 'lmcache-wheel': docker/lmcache-wheel.Dockerfile:{from_line} "
        "FROM ${LMCACHE_IMAGE}: resolves to 'lmcache', which is no stage and no named context of "
        "the target, so BuildKit would pull docker.io/library/lmcache (PUBLISHED_INPUTS=0 only)"
    ]


def test_a_missing_dockerfile_and_a_missing_stage(farm: Path) -> None:
    hcl = farm / "rocm-bake.hcl"
    edit(
        hcl,
        '  dockerfile = "docker/cupy-wheel.Dockerfile"',
        '  dockerfile = "docker/cupy-wheel.Dockerfile"\n  target     = "fin"',
    )
    (farm / "docker" / "vllm-wheel.Dockerfile").unlink()
    cupy = line_of(hcl, '  target     = "fin"')
    vllm = line_of(hcl, '  dockerfile = "docker/vllm-wheel.Dockerfile"')
    dockerfile = farm / "docker" / "cupy-wheel.Dockerfile"
    build = line_of(dockerfile, "FROM ${BASE_IMAGE} AS build")
    final = line_of(dockerfile, "FROM scratch AS final")
    assert check_recipes(load_graph("rocm-bake.hcl", {})) == [
        f"rocm-bake.hcl:{cupy}: target 'cupy-wheel' builds stage 'fin': "
        "docker/cupy-wheel.Dockerfile has no stage 'fin' (its stages: build (line "
        f"{build}), final (line {final}))",
        f"rocm-bake.hcl:{vllm}: target 'vllm-wheel': dockerfile docker/vllm-wheel.Dockerfile "
        "does not exist",
    ]


# ##### Small bake files: defaults, exemptions, arch-limited problems

BAKE = """
GPU_ARCHES = ["gfx942", "gfx1100"]
variable "GPU_ARCH" {
  default = "gfx942"
}
variable "PUBLISHED_INPUTS" {
  default = false
}
USE_PUB = PUBLISHED_INPUTS

target "base" {
  dockerfile = "base.Dockerfile"
  tags       = ["r.io/base:${GPU_ARCH}"]
  args = {
    GPU_ARCH     = GPU_ARCH
    BUILDKIT_SYNTAX = "docker/dockerfile:1"
    HTTP_PROXY   = "http://proxy:3128"
    no_proxy     = "localhost"
  }
}

target "app" {
  dockerfile = "app.Dockerfile"
  tags       = ["r.io/app:${GPU_ARCH}"]
  contexts = USE_PUB ? {} : {
    base-img = "target:base"
  }
  args = {
    BASE_IMAGE = USE_PUB ? (GPU_ARCH == "gfx1100" ? "" : "r.io/base:${GPU_ARCH}") : "base-img"
  }
}
"""


def small_farm(tmp_path: Path, base: str, app: str) -> Path:
    (tmp_path / "bake.hcl").write_text(BAKE)
    (tmp_path / "base.Dockerfile").write_text(base)
    (tmp_path / "app.Dockerfile").write_text(app)
    return tmp_path / "bake.hcl"


def test_buildkit_args_are_exempt_and_a_pinned_default_is_a_value(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    bake = small_farm(
        tmp_path,
        "ARG GPU_ARCH\nARG DEBIAN=debian:trixie-slim\nFROM ${DEBIAN}\nCOPY x /x\n",
        "ARG BASE_IMAGE=base-img\nARG OTHER\nARG MISSING\n"
        "FROM ${BASE_IMAGE}\nFROM ${OTHER:-scratch}\nFROM ${MISSING} AS x\n",
    )
    assert [exempt(a) for a in ("BUILDKIT_SYNTAX", "HTTP_PROXY", "no_proxy", "GPU_ARCH")] == [
        True,
        True,
        True,
        False,
    ]
    # DEBIAN: bake never sets it, so its default is the value. OTHER has the FROM's own fallback.
    # MISSING has neither. BASE_IMAGE is '' for one arch in one mode.
    app_args = line_of(bake, "BASE_IMAGE = USE_PUB") - 1
    assert check_recipes(load_graph(bake, {})) == [
        f"bake.hcl:{app_args}: target 'app': app.Dockerfile:6 FROM ${{MISSING}}: MISSING has "
        "no value: bake sets no arg MISSING and its ARG (app.Dockerfile:3) has no default",
        f"bake.hcl:{app_args + 1}: target 'app': app.Dockerfile:4 FROM ${{BASE_IMAGE}}: bake "
        "sets BASE_IMAGE to '', an empty image (PUBLISHED_INPUTS=1 gfx1100 only)",
    ]
