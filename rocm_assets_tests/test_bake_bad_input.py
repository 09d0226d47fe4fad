"""Bad bake files: each ends in one line naming the file, line and cause.

Real: the docker buildx plugin (0.29) answers `bake --print`, python-hcl2 parses, `rocm-assets
check`/`graph` run as a user runs them (a fresh interpreter), and the Dagster code location is
loaded for real where a name is refused for Dagster's sake. Nothing is timed: an input that hung
would hang the test.
"""

import sys
from pathlib import Path

import pytest

from rocm_assets.core.bake import BakeError, load_graph
from rocm_assets.core.build.builds import SelectionError, check_arches
from rocm_assets_tests.helpers import SHIPPED_BAKE_FILE, rocm_assets_cli

# The least a file needs to be a graph: the arch list, the arch variable, the input switch.
HEAD = """GPU_ARCHES = ["gfx942", "gfx1100"]
variable "GPU_ARCH" {
  default = "gfx942"
}
variable "PUBLISHED_INPUTS" {
  default = false
}
"""
HEAD_LINES = HEAD.count("\n")


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "bake.hcl"
    path.write_text(text)
    return path


def refused(tmp_path: Path, text: str) -> str:
    """The one-line error a bad file gets, without the file name."""
    path = write(tmp_path, text)
    with pytest.raises(BakeError) as info:
        load_graph(path, {})
    message = str(info.value)
    assert "\n" not in message and len(message) < 1200
    assert message.startswith(f"{path}:")
    return message.removeprefix(f"{path}:")


# ##### BOUNDED WORK


def test_deep_nesting_is_our_error_even_deep_in_the_callers_stack(tmp_path: Path) -> None:
    """Dagster calls the loader from its own stack (26 frames deep in `dagster definitions
    validate`): python-hcl2's recursive transform is never reached with a tree that deep."""

    def at_depth(frames: int, path: Path) -> str:
        if frames:
            return at_depth(frames - 1, path)
        try:
            load_graph(path, {})
        except BakeError as exc:
            return str(exc)
        return "loaded"

    assert sys.getrecursionlimit() == 1000
    for i, text in enumerate(
        ["X = " + "(" * 500 + "1" + ")" * 500 + "\n", "X = " + "[" * 400 + "]" * 400 + "\n"]
    ):
        path = tmp_path / f"deep{i}.hcl"
        path.write_text(HEAD + text)
        assert "expressions nest deeper than the limit of 120 parse levels" in at_depth(300, path)


def test_file_size_is_bounded(tmp_path: Path) -> None:
    path = write(tmp_path, "# " + "x" * (1 << 20) + "\n")
    with pytest.raises(BakeError, match=r"bake file is over the limit of 1048576 bytes"):
        load_graph(path, {})


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (HEAD.replace('["gfx942", "gfx1100"]', '"gfx942"'), "1: GPU_ARCHES must be a non-empty list of GPU arch names"),
        (HEAD.replace('default = "gfx942"', 'default = "gfx90a"'), "2: GPU_ARCH's default 'gfx90a' is not one of GPU_ARCHES (gfx942, gfx1100)"),
        (HEAD + 'TEST_TARGETS = ["nope"]\n', f"{HEAD_LINES + 1}: TEST_TARGETS: no target named 'nope'"),
        (HEAD + 'target "a" {\n  tags = ["reg/a:${GPU_ARCH}", "reg/A:${PUBLISHED_INPUTS}"]\n}\n', f"{HEAD_LINES + 1}: target 'a': tags: 'reg/A:false' is not a valid image reference"),
    ],
)  # fmt: skip
def test_bakes_values_that_make_no_graph_are_one_line(
    tmp_path: Path, text: str, message: str
) -> None:
    assert refused(tmp_path, text) == message


# ##### NAMES


@pytest.mark.parametrize(
    ("block", "message"),
    [
        ('target "my target" {\n}\n', "target name 'my target' has characters bake refuses"),
        ('target "a.b" {\n}\n', "target name 'a.b' has characters bake refuses"),
        ('target "--print" {\n}\n', "target name '--print' begins with '-', so bake would read it as a flag"),
        ('group "-g" {\n  targets = []\n}\n', "group name '-g' begins with '-'"),
        ('variable "1x" {\n}\n', "variable name '1x' is not an identifier"),
        ('function "f.g" {\n  params = []\n  result = 1\n}\n', "function name 'f.g' is not an identifier"),
        ('target "a" {\n  matrix = { v = ["x.y"] }\n  name = "a-${v}"\n}\n', "docker buildx bake: "),
        ('target "for" {\n  tags = ["r/for:1"]\n}\n', "target 'for' would be the Dagster op 'for', a reserved name"),
        ('target "a-b" {\n  tags = ["r/x:1"]\n}\ntarget "a_b" {\n  tags = ["r/y:1"]\n}\n', "target 'a_b' and target 'a-b' would both be the Dagster op 'a_b'"),
        ('group "in" {\n  targets = []\n}\n', "group 'in' would be the Dagster job 'in', a reserved name"),
        (f'group "{"g" * 64}" {{\n  targets = []\n}}\n', "is over 63 characters (a Dagster tag key)"),
    ],
)  # fmt: skip
def test_names_bake_or_dagster_refuse_are_refused_with_their_line(
    tmp_path: Path, block: str, message: str
) -> None:
    error = refused(tmp_path, HEAD + block)
    line, _, text = error.partition(": ")
    assert HEAD_LINES < int(line) <= HEAD_LINES + 4  # the block's line, or its attribute's
    assert message in text


@pytest.mark.parametrize("arch", ["gfx942;rm -rf /", "../x", "-x", "", "a" * 64])
def test_bad_arch_names_are_refused_in_the_file_and_on_the_cli(tmp_path: Path, arch: str) -> None:
    text = HEAD.replace('"gfx1100"', f'"{arch}"')
    error = refused(tmp_path, text)
    assert error.startswith("1: GPU_ARCHES")
    with pytest.raises(SelectionError, match=r"GPU arch .* must be|is over 63"):
        check_arches(load_graph(SHIPPED_BAKE_FILE, {}), [arch or "-"])


def test_matrix_targets_are_assets_named_as_bake_names_them(tmp_path: Path) -> None:
    text = HEAD + (
        'target "wheel" {\n'
        '  matrix = { py = ["3.11", "3.12"], flavor = ["slim"] }\n'
        '  name = "wheel-${flavor}-py${replace(py, ".", "")}"\n'
        "  args = { PY = py }\n"
        '  tags = ["reg/wheel:${flavor}-${py}-${GPU_ARCH}"]\n'
        "}\n"
    )
    graph = load_graph(write(tmp_path, text), {})
    assert graph.targets == ("wheel-slim-py311", "wheel-slim-py312")
    assert graph.groups["wheel"] == ("wheel-slim-py311", "wheel-slim-py312")
    assert graph.resolve("gfx1100").targets["wheel-slim-py312"].args == {"PY": "3.12"}
    assert graph.tags("wheel-slim-py311", "gfx1100") == ("reg/wheel:slim-3.11-gfx1100",)


def test_dagster_refuses_what_we_refuse_and_loads_what_we_accept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Our Dagster rules match Dagster 1.13's own: checked on the real code location."""
    import dagster as dg

    from rocm_assets.definitions import defs

    def load(block: str) -> None:
        path = tmp_path / "dagster.hcl"
        path.write_text(SHIPPED_BAKE_FILE.read_text() + block)
        monkeypatch.setenv("ROCM_BAKE_FILE", str(path))
        defs().get_repository_def().get_all_jobs()

    accepted = 'target "9-lives_x" {\n  inherits = ["_common"]\n  tags = [img("x", TORCH_TAG)]\n}\n'
    load(accepted)
    for block in (
        'target "type" {\n  tags = ["r/t:1"]\n}\n',
        'group "pytorch-run_job" {\n  targets = []\n}\n',
    ):
        with pytest.raises(BakeError):
            load(block)
        # Without our check, Dagster itself would refuse the same name at load.
        monkeypatch.setattr("rocm_assets.core.bake.model.dagster_problems", lambda *a: [])
        with pytest.raises(dg.DagsterInvalidDefinitionError):
            load(block)
        monkeypatch.undo()


# ##### THE CLI: exit 2, one line


@pytest.mark.parametrize(
    ("command", "text", "expected"),
    [
        ("check", HEAD + 'X = regex_replace("aaaa", "(", "x")\n', f"bake.hcl:{HEAD_LINES + 1}: docker buildx bake: "),
        ("check", HEAD + 'target "--print" {\n}\n', "begins with '-', so bake would read it as a flag"),
        ("graph", HEAD + 'X = "\\uZZZZ"\n', f"bake.hcl:{HEAD_LINES + 1}: docker buildx bake: "),
        ("graph", "X = " + "[" * 1000 + "]" * 1000 + "\n", "expressions nest deeper than the limit"),
    ],
)  # fmt: skip
def test_cli_prints_one_line_and_exits_2(
    tmp_path: Path, command: str, text: str, expected: str
) -> None:
    path = write(tmp_path, text)
    out = rocm_assets_cli(command, "--bake-file", str(path))
    assert out.returncode == 2, out.stderr
    assert out.stderr.count("\n") == 1 and "Traceback" not in out.stderr
    assert expected in out.stderr


def test_cli_refuses_a_bad_arch_before_looking_it_up() -> None:
    out = rocm_assets_cli("graph", "--bake-file", str(SHIPPED_BAKE_FILE), "--arch", "gfx942;id")
    assert out.returncode == 2
    assert out.stderr == (
        "rocm-assets: error: GPU arch 'gfx942;id' must be letters, digits, '-' and '_', "
        "beginning with a letter or digit\n"
    )
