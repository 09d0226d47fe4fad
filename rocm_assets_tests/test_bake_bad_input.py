"""Bad bake files: each class of issue 13 ends in one line naming the file, line and cause.

Real: python-hcl2 parses, the builtin evaluator runs (these are its hostile inputs; bake's own
answers to bad files are in test_bake_buildx and the differential tests), `rocm-assets
check`/`graph --resolver builtin` run as a user runs them (a fresh interpreter), and the Dagster
code location is loaded for real where a name is refused for Dagster's sake. Nothing is timed:
an input that hung would hang the test.
"""

import sys
from pathlib import Path

import pytest

from rocm_assets.core.bake import BakeError, load_bake, load_graph, resolve
from rocm_assets.core.bake.limits import MAX_DEPTH, MAX_PARSE_DEPTH, MAX_STEPS, MAX_VALUE_DEPTH
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


def evaluated(tmp_path: Path, text: str) -> dict:
    return resolve(load_bake(write(tmp_path, text)), {}).values


def refused(tmp_path: Path, text: str, *, graph: bool = False) -> str:
    """The one-line error a bad file gets, without the file name."""
    path = write(tmp_path, text)
    with pytest.raises(BakeError) as info:
        if graph:
            load_graph(path, {}, resolver="builtin")
        else:
            resolve(load_bake(path), {})
    message = str(info.value)
    assert "\n" not in message and len(message) < 1200
    assert message.startswith(f"{path}:")
    return message.removeprefix(f"{path}:")


def deep_ref_chain(n: int) -> str:
    return "".join(f"A{i} = A{i + 1}\n" for i in range(n)) + f"A{n} = 1\n"


# ##### BOUNDED WORK


def test_backtracking_regex_returns_at_once(tmp_path: Path) -> None:
    # Python's re takes exponential time on this; RE2, like Go's regexp, is linear.
    text = "a" * 100_000 + "b"
    values = evaluated(
        tmp_path,
        f'X = regex_replace("{text}", "(a+)+$", "x")\nY = can(regex("(a+)+$", "{text}"))\n',
    )
    assert values["X"] == text and values["Y"] is False


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("X = range(10000000)\n", "1: range(): more than 1024 values were generated"),  # go-cty's
        ('A = join("", [for i in range(1000) : "0123456789"])\nX = replace(A, "", A)\n', "2: replace() would make 100020000 characters, over the limit of 1048576"),
        ('X = format("%9999s", "a")\nY = join("", [for i in range(200) : X])\n', "2: join() would make 1999800 characters, over the limit of 1048576"),
        ('X = setproduct(range(1000), range(1000))\n', "1: setproduct() would make 1000000 elements, over the limit of 100000"),
        ("X = [for i in range(1000) : [for j in range(1000) : [for k in range(10) : k]]]\n", f"1: evaluation took over {MAX_STEPS} steps, the limit"),
        (deep_ref_chain(200), f"{MAX_DEPTH + 1}: expressions, references and calls nest deeper than the limit of {MAX_DEPTH}"),
        ("X = " + "(" * 500 + "1" + ")" * 500 + "\n", f"1: expressions nest deeper than the limit of {MAX_PARSE_DEPTH} parse levels"),
        ("A0 = 1\n" + "".join(f"A{i} = [A{i - 1}]\n" for i in range(1, 100)), f"{MAX_VALUE_DEPTH + 2}: values nest over {MAX_VALUE_DEPTH} deep, the limit"),
        ('A0 = ["x"]\n' + "".join(f"A{i} = [A{i - 1}, A{i - 1}]\n" for i in range(1, 40)) + "X = jsonencode(A39)\n", "41: jsonencode(): the value is over 1048576 elements when expanded"),
        ('function "f" {\n  params = [x]\n  result = f(x)\n}\nX = f(1)\n', "3: function cycle: f -> f"),
    ],
)  # fmt: skip
def test_work_is_bounded(tmp_path: Path, text: str, message: str) -> None:
    assert refused(tmp_path, text) == message


def test_deep_nesting_is_our_error_even_deep_in_the_callers_stack(tmp_path: Path) -> None:
    """Dagster calls the loader from its own stack (26 frames deep in `dagster definitions
    validate`): the limits leave room for ten times that."""
    files = [
        deep_ref_chain(200),
        "X = " + "(" * 500 + "1" + ")" * 500 + "\n",
        "".join(f"A{i} = A{i + 1}\n" for i in range(70))
        + ("A70 = <<EOT\n${" + "[" * 40 + "1" + "]" * 40 + "}\nEOT\n"),
        "".join(f'target "t{i}" {{\n  inherits = ["t{i + 1}"]\n}}\n' for i in range(300)),
    ]

    def at_depth(frames: int, path: Path) -> str:
        if frames:
            return at_depth(frames - 1, path)
        try:
            resolve(load_bake(path), {})
        except BakeError as exc:
            return str(exc)
        return "evaluated"

    assert sys.getrecursionlimit() == 1000
    for i, text in enumerate(files):
        path = tmp_path / f"deep{i}.hcl"
        path.write_text(text)
        assert "nest deeper than the limit" in at_depth(300, path)


def test_file_size_is_bounded(tmp_path: Path) -> None:
    path = write(tmp_path, "# " + "x" * (1 << 20) + "\n")
    with pytest.raises(BakeError, match=r"bake file is over the limit of 1048576 bytes"):
        load_bake(path)


def test_limits_leave_the_shipped_file_far_below_them() -> None:
    graph = load_graph(SHIPPED_BAKE_FILE, {})
    for arch in graph.arches:
        graph.resolve(arch, published=True)
    # 11 evaluations of the whole file take about 16k steps (1.6% of the budget) and nest 5 deep:
    # at least ten times below each limit, so a growing file has room.
    assert graph.budget.used < MAX_STEPS // 10
    assert graph.budget.deepest <= MAX_DEPTH // 10


# ##### ONE LINE, NEVER A TRACEBACK


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('X = "\\uZZ"\n', "1: invalid escape '\\\\uZZ': \\u takes exactly 4 hex digits"),
        ('\nX = "a\\U0001F60"\n', "2: invalid escape '\\\\U0001F60': \\U takes exactly 8 hex digits"),
        ('X = "\\uD800"\n', "1: invalid escape \\uD800: not a Unicode character"),
        ('X = "\\d"\n', "1: invalid escape '\\\\d' in a quoted string"),
        # bake makes +Inf here, and reads a 5000-digit literal: both refused, not guessed.
        ("X = pow(10, 1000000000)\n", "1: pow() with a non-integer or huge exponent"),
        ("X = " + "9" * 5000 + "\n", "1: a number written with over 1000 digits"),
        ("X = [for x in 5 : x]\n", "1: cannot iterate over a number"),
        ('X = "%{ for x in 5 }${x}%{ endfor }"\n', "1: %{for} cannot iterate over a number"),
        ('X = jsondecode("' + "[" * 5000 + "]" * 5000 + '")\n', "1: jsondecode(): the JSON nests too deep"),
        ("X = target\n", "1: cannot access target as a value"),
    ],
)  # fmt: skip
def test_bad_values_are_one_line(tmp_path: Path, text: str, message: str) -> None:
    assert refused(tmp_path, text).startswith(message)


def test_exponent_floats_and_long_escapes_evaluate_as_in_bake(tmp_path: Path) -> None:
    values = evaluated(tmp_path, 'A = 1e3\nB = "v${1e3}"\nC = "\\U0001F600"\n')
    assert values == {"A": 1000, "B": "v1000", "C": "\U0001f600"}
    # bake's numbers are 512-bit floats: far beyond a double's range is still a number.
    values = evaluated(tmp_path, 'A = "v${1e400}"\nB = "v${1e300 * 1e300}"\n')
    assert values["A"] == "v1" + "0" * 400
    assert len(values["B"]) == 602


# ##### VARIABLES


def test_undefined_variable_is_an_error(tmp_path: Path) -> None:
    assert refused(tmp_path, 'target "a" {\n  tags = ["r/a:${NOPE}"]\n}\n').startswith(
        "2: unknown variable 'NOPE': no variable block or top-level attribute declares it"
    )


def test_declared_variable_without_default_is_empty_as_in_bake(tmp_path: Path) -> None:
    # bake's resolveValue: an untyped variable with no default is "" unless the env sets it.
    text = 'variable "V" {}\nX = "a-${V}"\n'
    assert evaluated(tmp_path, text)["X"] == "a-"
    assert resolve(load_bake(write(tmp_path, text)), {"V": "1"}).values["X"] == "a-1"


def test_empty_variable_in_a_tag_is_refused_as_bake_would(tmp_path: Path) -> None:
    text = HEAD + 'variable "TAG" {}\ntarget "a" {\n  tags = ["reg/a:${TAG}"]\n}\n'
    assert refused(tmp_path, text, graph=True) == (
        f"{HEAD_LINES + 2}: target 'a': tags: 'reg/a:' is not a valid image reference"
    )


def test_duplicate_variable_block_is_refused(tmp_path: Path) -> None:
    text = 'variable "REGISTRY" {\n  default = "a"\n}\nvariable "REGISTRY" {\n  default = "b"\n}\n'
    assert refused(tmp_path, text).startswith(
        "4: variable 'REGISTRY' is declared again (first at line 1): bake would use only this block"
    )


def test_attribute_replaces_a_variables_default_as_in_bake(tmp_path: Path) -> None:
    text = 'variable "R" {\n  default = "a"\n}\nR = "b"\n'
    assert evaluated(tmp_path, text)["R"] == "b"
    assert resolve(load_bake(write(tmp_path, text)), {"R": "env"}).values["R"] == "env"


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
        ('target "a" {\n  matrix = { v = ["x.y"] }\n  name = "a-${v}"\n}\n', "matrix target 'a': target name 'a-x.y' has characters bake refuses"),
        ('target "for" {\n  tags = ["r/for:1"]\n}\n', "target 'for' would be the Dagster op 'for', a reserved name"),
        ('target "a-b" {\n  tags = ["r/x:1"]\n}\ntarget "a_b" {\n  tags = ["r/y:1"]\n}\n', "target 'a_b' and target 'a-b' would both be the Dagster op 'a_b'"),
        ('group "in" {\n  targets = []\n}\n', "group 'in' would be the Dagster job 'in', a reserved name"),
        (f'group "{"g" * 64}" {{\n  targets = []\n}}\n', "is over 63 characters (a Dagster tag key)"),
    ],
)  # fmt: skip
def test_names_bake_or_dagster_refuse_are_refused_with_their_line(
    tmp_path: Path, block: str, message: str
) -> None:
    error = refused(tmp_path, HEAD + block, graph=True)
    line, _, text = error.partition(": ")
    assert HEAD_LINES < int(line) <= HEAD_LINES + 4  # the block's line, or its attribute's
    assert message in text


@pytest.mark.parametrize("arch", ["gfx942;rm -rf /", "../x", "-x", "", "a" * 64])
def test_bad_arch_names_are_refused_in_the_file_and_on_the_cli(tmp_path: Path, arch: str) -> None:
    text = HEAD.replace('"gfx1100"', f'"{arch}"')
    error = refused(tmp_path, text, graph=True)
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
        ("check", HEAD + 'X = regex_replace("aaaa", "(", "x")\n', f"bake.hcl:{HEAD_LINES + 1}: regex_replace(): invalid regular expression '('"),
        ("check", HEAD + 'target "--print" {\n}\n', "begins with '-', so bake would read it as a flag"),
        ("graph", HEAD + 'X = "\\uZZZZ"\n', f"bake.hcl:{HEAD_LINES + 1}: invalid escape '\\\\uZZZZ'"),
        ("graph", "X = " + "[" * 1000 + "]" * 1000 + "\n", "expressions nest deeper than the limit"),
    ],
)  # fmt: skip
def test_cli_prints_one_line_and_exits_2(
    tmp_path: Path, command: str, text: str, expected: str
) -> None:
    path = write(tmp_path, text)
    out = rocm_assets_cli(command, "--bake-file", str(path), "--resolver", "builtin")
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
