"""The graph model on bake's answer, on inline HCL and on the shipped rocm-bake.hcl.

Real: the docker buildx plugin (Debian testing's 0.29) answers every `bake --print`; python-hcl2
reads the files for their names and lines.
"""

import re
from pathlib import Path

import pytest

from rocm_assets.core.bake import BakeError, load_graph, read_outline
from rocm_assets.core.build.drift import check_drift
from rocm_assets_tests.helpers import PROJECT_ROOT, with_target
from rocm_assets_tests.helpers.seed import SEED_EDGES, SEED_GROUPS

SHIPPED = PROJECT_ROOT / "rocm-bake.hcl"


def write(tmp_path: Path, text: str, name: str = "bake.hcl") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


GRAPH_HEAD = """
GPU_ARCHES = ["gfx942", "gfx1100"]
variable "GPU_ARCH" {
  default = "gfx942"
}
variable "PUBLISHED_INPUTS" {
  default = false
}
"""


# ##### BAKE'S ANSWER, READ


def test_values_targets_and_groups_are_bakes(tmp_path: Path) -> None:
    """Inheritance, merged args, a null arg, `target.<name>.<attr>`, nested groups, a matrix and
    env-typed variables: bake resolves them all, and the graph reads its answer."""
    path = write(
        tmp_path,
        GRAPH_HEAD
        + """
variable "TAG" {
  default = "1"
}
TEST_TARGETS = []
target "_common" {
  args = { A = "common", B = "common" }
  platforms = ["linux/amd64"]
}
target "base" {
  inherits = ["_common"]
  args = { B = "base", N = null, MODE = PUBLISHED_INPUTS ? "pub" : "ctx" }
  tags = ["reg/base:${TAG}-${GPU_ARCH}"]
}
target "app" {
  inherits = ["base"]
  tags = ["reg/app:${TAG}-${GPU_ARCH}", target.base.tags[0]]
  contexts = { base = "target:base" }
}
target "wheel" {
  matrix = { py = ["3.11", "3.12"] }
  name = "wheel-${replace(py, ".", "")}"
  contexts = { app = "target:app" }
  tags = ["reg/wheel:${py}-${GPU_ARCH}"]
}
group "default" {
  targets = ["all"]
}
group "all" {
  targets = ["app", "base"]
}
""",
    )
    graph = load_graph(path, {"TAG": "9", "PATH": "/usr/bin:/bin"})
    app = graph.resolve("gfx1100").targets["app"]
    assert app.args == {"A": "common", "B": "base", "MODE": "ctx"}  # merged; null dropped
    assert app.tags == ("reg/app:9-gfx1100", "reg/base:9-gfx1100")
    assert graph.resolve("gfx942", published=True).targets["base"].args["MODE"] == "pub"
    assert graph.resolve(None).values["TAG"] == "9"
    assert graph.resolve(None).values["GPU_ARCHES"] == ["gfx942", "gfx1100"]
    assert graph.targets == ("base", "app", "wheel-311", "wheel-312")
    assert graph.deps["wheel-312"] == ("app",)
    # A matrix target's line is its block's; its label is a group of what it made.
    line = path.read_text().splitlines().index('target "wheel" {') + 1
    assert graph.resolve(None).targets["wheel-311"].line == line
    assert graph.groups["wheel"] == ("wheel-311", "wheel-312")
    assert graph.select(["default"]) == ("base", "app")


def test_the_outline_says_where_the_file_writes_each_key(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        'target "_c" {\n  args = { A = "1" }\n}\ntarget "t" {\n  inherits = ["_c"]\n'
        '  contexts = true ? {} : {\n    x = "target:y"\n  }\n}\n',
    )
    outline = read_outline(path, {})
    assert outline.key_line("t", "args", "A") == 2  # through inherits
    assert outline.key_line("t", "contexts", "x") == 7  # inside a conditional's branch
    assert outline.attr_line("t", "contexts") == 6


# ##### BAD INPUT: one line each, naming file and line


@pytest.mark.parametrize(
    ("hcl", "message"),
    [
        # a syntax error: bake's words win over python-hcl2's, at the line
        ('target "a" {\n  tags = ["x" "y"]\n}\n', r"bake\.hcl:2: docker buildx bake: Missing item separator"),
        # bake's own words for what it refuses, at its line
        ('X = 1\ntarget "a" {\n  tags = [NOPE]\n}\n', r"bake\.hcl:3: docker buildx bake: .*Unknown variable.*NOPE"),
        ('target "a" {\n\n  tags = [frob("x")]\n}\n', r"bake\.hcl:3: docker buildx bake: .*frob"),
        ('variable "P" {\n  default = false\n}\n', r"bake\.hcl:1: docker buildx bake: Invalid value; failed to parse P as bool"),
        ('X = "yes" ? 1 : 2\n', r"bake\.hcl:1: docker buildx bake: .*condition"),
        # bake would ignore it silently: refused with why
        ('locals {\n  a = 1\n}\n', r"bake\.hcl:1: unknown block type 'locals'"),
        # the probe's names are the farm's
        ('target "rocm-assets-values" {\n}\n', r"bake\.hcl:1: 'rocm-assets-values' is the name rocm-assets"),
    ],
)  # fmt: skip
def test_bad_hcl_one_line(tmp_path: Path, hcl: str, message: str) -> None:
    path = write(tmp_path, GRAPH_HEAD + hcl)
    with pytest.raises(BakeError) as info:
        load_graph(path, {"P": "yes"})
    text = str(info.value)
    assert "\n" not in text
    # The messages' lines are the snippet's: shift them past the head.
    shift = GRAPH_HEAD.count("\n")

    expected = re.sub(r"hcl:(\d+)", lambda m: f"hcl:{int(m[1]) + shift}", message)
    assert re.search(expected, text), text


def test_unknown_target_context(tmp_path: Path) -> None:
    path = write(
        tmp_path, GRAPH_HEAD + 'target "a" {\n  contexts = { base = "target:nothere" }\n}\n'
    )
    # Bake's own words, at the line that links the missing target.
    with pytest.raises(BakeError) as info:
        load_graph(path)
    assert str(info.value) == f"{path}:10: docker buildx bake: failed to find target nothere"


def test_dependency_cycle_in_order(tmp_path: Path) -> None:
    body = "".join(
        f'target "{a}" {{\n  contexts = {{ x = "target:{b}" }}\n  tags = ["r/{a}:${{GPU_ARCH}}"]\n}}\n'
        for a, b in [("a", "b"), ("b", "c"), ("c", "a")]
    )
    path = write(tmp_path, GRAPH_HEAD + body)
    with pytest.raises(
        BakeError, match=r"bake\.hcl:\d+: docker buildx bake: infinite loop from \w to \w$"
    ):
        load_graph(path)


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        ("missing", r"missing\.hcl: bake file not found"),
        ("directory", r"cannot read bake file: Is a directory"),
        ("binary", r"cannot read bake file: not UTF-8"),
    ],
)
def test_missing_or_unreadable_file(tmp_path: Path, setup: str, message: str) -> None:
    path = tmp_path / "missing.hcl"
    if setup == "directory":
        path.mkdir()
    elif setup == "binary":
        path.write_bytes(b"\xff\xfe\x00bad")
    with pytest.raises(BakeError, match=message):
        load_graph(path)


# ##### THE SHIPPED FILE


@pytest.fixture(scope="module")
def shipped():
    return load_graph(SHIPPED, {})


def test_shipped_graph_is_the_seeds(shipped) -> None:
    assert len(shipped.targets) == 16
    edges = {(dep, name) for name in shipped.targets for dep in shipped.deps[name]}
    assert edges == SEED_EDGES
    assert {g: set(m) for g, m in shipped.groups.items()} == SEED_GROUPS
    assert shipped.arches[:1] == ("gfx942",)
    assert {"gfx942", "gfx950", "gfx1100", "gfx1201", "gfx1250"} <= set(shipped.arches)


def test_shipped_noarch_and_tags(shipped) -> None:
    assert set(shipped.targets) - shipped.per_arch == {"pytorch-src", "triton-wheel"}
    for name in shipped.targets:
        for arch in shipped.arches:
            tags = shipped.tags(name, arch)
            assert tags, name
            assert all((arch in t) == (name in shipped.per_arch) for t in tags), (name, tags)
    assert shipped.test_targets == {"pytorch-test": "pytorch"}


def test_shipped_published_mode_has_no_target_contexts(shipped) -> None:
    for arch in shipped.arches:
        for name, target in shipped.resolve(arch, published=True).targets.items():
            assert not target.target_links, name
    # pytorch-run's pytorch input resolves in both modes, through docker-image://
    for published in (False, True):
        run = shipped.resolve("gfx1250", published=published).targets["pytorch-run"]
        assert run.image_contexts["pytorch"] == shipped.tags("pytorch", "gfx1250")[0]


def test_shipped_variables(shipped) -> None:
    default = shipped.resolve(None).values
    assert (
        default["RUN_ID"] == "dev"
        and default["MAX_JOBS"] == ""
        and default["CACHE_TAG_SUFFIX"] == ""
    )
    assert default["PUBLISHED_INPUTS"] is False
    assert any(name.startswith("SDE_") for name in default)
    args = shipped.resolve("gfx942").targets["vllm"].args
    assert (
        args["MAX_JOBS"] == ""
        and args["BUILDKIT_BUILD_NAME"] == "rocm-pytorch-build/vllm/gfx942/dev"
    )


def test_registry_from_env() -> None:
    graph = load_graph(SHIPPED, {"REGISTRY": "127.0.0.1:5999"})
    assert graph.tags("pytorch", "gfx950") == (
        "127.0.0.1:5999/rocm-pytorch/pytorch:2.15.0-10.1.0-full-gfx950",
    )


def test_published_inputs_name_producers(shipped) -> None:
    inputs = {i.producer: i.ref for i in shipped.published_inputs("vllm", "gfx1100")}
    assert set(inputs) == set(shipped.deps["vllm"])
    assert inputs["triton-wheel"] == shipped.tags("triton-wheel")[0]
    assert inputs["pytorch"] == shipped.tags("pytorch", "gfx1100")[0]
    run_inputs = {i.producer for i in shipped.published_inputs("pytorch-run", "gfx942")}
    assert run_inputs == {"pytorch", "rocm-runtime"}


def test_appended_target_joins_the_graph(tmp_path: Path) -> None:
    path = with_target(
        tmp_path / "bake.hcl",
        """
target "extra-wheel" {
  inherits = ["_common"]
  dockerfile = "docker/extra-wheel.Dockerfile"
  contexts = USE_PUB ? {} : { "vllm" = "target:vllm", "nixl-wheel" = "target:nixl-wheel" }
  args = {
    VLLM_IMAGE = USE_PUB ? PUB_VLLM : "vllm"
    NIXL_WHEEL_IMAGE = USE_PUB ? PUB_NIXL : "nixl-wheel"
  }
  tags = [img("extra-wheel", TORCH_TAG)]
}
""",
    )
    graph = load_graph(path, {})
    assert graph.deps["extra-wheel"] == ("nixl-wheel", "vllm")
    assert "extra-wheel" in graph.per_arch
    assert graph.edge_count == 29
    assert check_drift(graph) == []


# ##### DRIFT


def test_check_passes_on_shipped(shipped) -> None:
    assert check_drift(shipped) == []


def test_check_names_a_drifted_pub_reference(tmp_path: Path) -> None:
    text = SHIPPED.read_text().replace(
        'PUB_PYTORCH = img("pytorch", TORCH_TAG)',
        'PUB_PYTORCH = img("pytorch", "${SDE_PYTORCH_VERSION}-${GPU_ARCH}")',
    )
    problems = check_drift(load_graph(write(tmp_path, text), {}))
    assert problems
    first = problems[0]
    assert first.startswith("gfx942: PUB_PYTORCH (target 'pytorch-wheel' arg PYTORCH_IMAGE) = ")
    assert "'zot.snoc.lan:5000/rocm-pytorch/pytorch:2.15.0-gfx942'" in first
    assert (
        "'pytorch' is tagged 'zot.snoc.lan:5000/rocm-pytorch/pytorch:2.15.0-10.1.0-full-gfx942'"
        in first
    )
    # the docker-image:// context built from it now matches no tag, and is named too
    assert any("context 'pytorch' = docker-image://" in p for p in problems)


def test_check_names_a_missing_group_member(tmp_path: Path) -> None:
    text = SHIPPED.read_text().replace(
        '"cupy-wheel", "vllm-wheel", "lmcache-wheel",', '"cupy-wheel", "vllm-wheel", "lmcache-whl",'
    )
    path = write(tmp_path, text)
    line = next(n for n, t in enumerate(text.splitlines(), 1) if '"lmcache-whl"' in t)
    with pytest.raises(BakeError) as info:
        load_graph(path, {})
    assert (
        str(info.value) == f"{path}:{line}: docker buildx bake: failed to find target lmcache-whl"
    )
