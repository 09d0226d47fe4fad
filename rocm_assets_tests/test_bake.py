"""The bake evaluator and graph model, on inline HCL and on the shipped rocm-bake.hcl.

Pure tests: python-hcl2 parses for real; nothing else is involved.
"""

from pathlib import Path

import pytest

from rocm_assets.core.bake import BakeError, check_drift, load_bake, load_graph, resolve
from rocm_assets_tests.helpers import PROJECT_ROOT, with_target
from rocm_assets_tests.helpers.seed import SEED_EDGES, SEED_GROUPS

SHIPPED = PROJECT_ROOT / "rocm-bake.hcl"


def write(tmp_path: Path, text: str, name: str = "bake.hcl") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def evaluate(tmp_path: Path, text: str, env: dict[str, str] | None = None) -> dict:
    bake = load_bake(write(tmp_path, text))
    return resolve(bake, env or {}).values


# ##### EVALUATOR


@pytest.mark.parametrize(
    ("hcl", "env", "name", "expected"),
    [
        # a bool default makes env "1" a bool, as bake's ParseBool does
        ('variable "P" {\n  default = false\n}\nX = P ? "pub" : "ctx"\n', {"P": "1"}, "X", "pub"),
        ('variable "P" {\n  default = false\n}\nX = P ? "pub" : "ctx"\n', {"P": "False"}, "X", "ctx"),
        ('variable "P" {\n  default = false\n}\nX = P ? "pub" : "ctx"\n', {}, "X", "ctx"),
        # an untyped variable without default is the raw env string; "1" converts in a condition
        ('variable "S" {}\nX = S ? "a" : "b"\n', {"S": "1"}, "X", "a"),
        # a number default parses env as a number
        ('variable "N" {\n  default = 3\n}\nX = N + 1\n', {"N": "7"}, "X", 8),
        # a list type reads env as CSV
        ('variable "L" {\n  type = list(string)\n}\nX = L\n', {"L": "a,b"}, "X", ["a", "b"]),
        # a bool is never equal to the string "1": go-cty compares without conversion
        ('variable "P" {\n  default = true\n}\nX = P == "1"\n', {}, "X", False),
        ('X = "${1 + 2 * 3}-${true}-${2.5}"\n', {}, "X", "7-true-2.5"),
        ('A = ["x", "y"]\nX = "${A[1]}:${upper(A[0])}"\n', {}, "X", "y:X"),
        ('X = { "k-1" = "v", k2 = 2 }\n', {}, "X", {"k-1": "v", "k2": 2}),
        ('X = merge({ a = 1 }, { b = 2 }, true ? {} : { c = 3 })\n', {}, "X", {"a": 1, "b": 2}),
        ('X = "%{ if 1 == 1 }yes%{ else }no%{ endif }"\n', {}, "X", "yes"),
        ('X = "$${NOT_INTERPOLATED}"\n', {}, "X", "${NOT_INTERPOLATED}"),
        ('X = [for s in ["a", "b"] : "${s}!" if s != "b"]\n', {}, "X", ["a!"]),
        ('X = { for k, v in { a = 1 } : upper(k) => v }\n', {}, "X", {"A": 1}),
        ('X = join(",", concat(["a"], ["b"]))\n', {}, "X", "a,b"),
        ('X = contains(["gfx942"], "gfx942") && !contains([], "x")\n', {}, "X", True),
        ('X = replace("a-b-c", "-", "_")\n', {}, "X", "a_b_c"),
        ('X = format("%s/%d", "v", 3)\n', {}, "X", "v/3"),
        ('X = coalesce("", "z")\n', {}, "X", ""),  # go-cty skips nulls only, not ""
        ('X = try(nope_unknown, "fallback")\n', {}, "X", "fallback"),
        ('X = <<-EOT\n    a ${1 + 1}\n    b\n  EOT\n', {}, "X", "a 2\nb\n"),
        ('function "f" {\n  params = [a]\n  variadic_params = r\n  result = "${a}${length(r)}"\n}\nX = f("x", 1, 2)\n', {}, "X", "x2"),
        ('X = -(2 - 5) % 2\n', {}, "X", 1),
        ('Y = "b"\nX = "a${Y}"\n', {}, "X", "ab"),
    ],
)  # fmt: skip
def test_evaluator_values(tmp_path: Path, hcl: str, env: dict, name: str, expected: object) -> None:
    assert evaluate(tmp_path, hcl, env)[name] == expected


def test_targets_inherit_merge_and_reference(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
variable "TAG" {
  default = "1"
}
target "_common" {
  args = { A = "common", B = "common" }
  platforms = ["linux/amd64"]
}
target "base" {
  inherits = ["_common"]
  args = { B = "base", N = null }
  tags = ["reg/base:${TAG}"]
}
target "app" {
  inherits = ["base"]
  tags = ["reg/app:${TAG}", target.base.tags[0]]
  contexts = { base = "target:base" }
}
group "default" {
  targets = ["all"]
}
group "all" {
  targets = ["app", "base"]
}
""",
    )
    resolved = resolve(load_bake(path), {"TAG": "9"})
    app = resolved.targets["app"]
    assert app.args == {"A": "common", "B": "base"}  # merged by key; a null arg is dropped
    assert app.tags == ("reg/app:9", "reg/base:9")  # tags replace; target.<n>.<attr> resolves
    assert app.platforms == ("linux/amd64",)
    assert app.dockerfile == "Dockerfile" and app.context == "."  # bake's defaults
    assert app.target_links == {"base": "base"}
    assert resolved.expand(["default"]) == ("app", "base")  # nested groups


def test_target_references_follow_bake(tmp_path: Path) -> None:
    """bake's TestHCLTargetAttrName and TestHCLTargetAttrEmptyChain: a name, and null if unset."""
    path = write(
        tmp_path,
        'target "foo" {\n  dockerfile = target.foo.name\n  context = target.foo.target\n}\n',
    )
    foo = resolve(load_bake(path), {}).targets["foo"]
    assert (foo.dockerfile, foo.context) == ("foo", ".")  # null context: bake's default


# ##### BAD INPUT: one line each, naming file and line


@pytest.mark.parametrize(
    ("hcl", "message"),
    [
        # a syntax error: file:line and what was expected
        ('target "a" {\n  tags = ["x" "y"]\n}\n', r"bake\.hcl:2: syntax error at column 15: unexpected '\"'; expected .*','.*']'"),
        ('X = \n', r"bake\.hcl:1: syntax error"),
        # an unknown variable: its name and line
        ('X = 1\ntarget "a" {\n  tags = [NOPE]\n}\n', r"bake\.hcl:3: unknown variable 'NOPE'"),
        # an unknown function: its name and line
        ('target "a" {\n\n  tags = [frob("x")]\n}\n', r"bake\.hcl:3: unknown function 'frob'"),
        # a variable cycle
        ('A = B\nB = A\n', r"variable cycle: A -> B -> A"),
        # a bad env value for a bool
        ('variable "P" {\n  default = false\n}\n', r"bake\.hcl:1: failed to parse P as bool: 'yes'"),
        # a string where a condition must be a bool
        ('X = "yes" ? 1 : 2\n', r"bake\.hcl:1: incorrect condition type"),
        # bake has no locals block
        ('locals {\n  a = 1\n}\n', r"bake\.hcl:1: unknown block type 'locals'"),
    ],
)  # fmt: skip
def test_bad_hcl_one_line(tmp_path: Path, hcl: str, message: str) -> None:
    path = write(tmp_path, hcl)
    with pytest.raises(BakeError, match=message) as info:
        resolve(load_bake(path), {"P": "yes"})
    assert "\n" not in str(info.value)


GRAPH_HEAD = """
GPU_ARCHES = ["gfx942", "gfx1100"]
variable "GPU_ARCH" {
  default = "gfx942"
}
variable "PUBLISHED_INPUTS" {
  default = false
}
"""


def test_unknown_target_context(tmp_path: Path) -> None:
    path = write(
        tmp_path, GRAPH_HEAD + 'target "a" {\n  contexts = { base = "target:nothere" }\n}\n'
    )
    # Bake's own words, at the line that links the missing target.
    with pytest.raises(BakeError) as info:
        load_graph(path)
    assert str(info.value) == f"{path}:10: docker buildx bake: failed to find target nothere"
    # The builtin resolver's, where bake is not installed.
    with pytest.raises(BakeError) as info:
        load_graph(path, resolver="builtin")
    assert str(info.value) == f"{path}: failed to find target 'nothere'"


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
    with pytest.raises(BakeError, match=r"bake\.hcl: infinite loop from 'c' to 'a'$"):
        load_graph(path, resolver="builtin")


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        ("missing", r"missing\.hcl: bake file not found"),
        ("directory", r"cannot read bake file: Is a directory"),
        ("binary", r"cannot read bake file: .*utf-8"),
    ],
)
def test_missing_or_unreadable_file(tmp_path: Path, setup: str, message: str) -> None:
    path = tmp_path / "missing.hcl"
    if setup == "directory":
        path.mkdir()
    elif setup == "binary":
        path.write_bytes(b"\xff\xfe\x00bad")
    with pytest.raises(BakeError, match=message):
        load_bake(path)


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
    with pytest.raises(
        BakeError, match=r"no target or group named 'lmcache-whl' \(in group 'wheels'\)"
    ):
        load_graph(write(tmp_path, text), {})


# ##### GO HCL: the parser bake itself uses


@pytest.mark.parametrize(
    "path", [SHIPPED, PROJECT_ROOT / "rocm_assets_tests/fixtures/e2e/bake.hcl"]
)
def test_go_hcl_parses_the_bake_files(path: Path) -> None:
    """buildx cannot be installed here; pygohcl wraps hashicorp/hcl, the parser bake uses."""
    import pygohcl

    parsed = pygohcl.loads(path.read_text())
    assert "target" in parsed and "variable" in parsed


def test_go_hcl_and_ours_reject_the_same_syntax_error(tmp_path: Path) -> None:
    import pygohcl

    text = 'target "a" {\n  tags = ["x" "y"]\n}\n'
    with pytest.raises(pygohcl.HCLParseError, match=r":2,"):
        pygohcl.loads(text)
    with pytest.raises(BakeError, match=r":2: syntax error"):
        load_bake(write(tmp_path, text))
