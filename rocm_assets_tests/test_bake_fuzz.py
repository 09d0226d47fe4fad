"""Property-based tests of the bake evaluator: any input ends in a value or one BakeError line.

Real: python-hcl2 parses and the evaluator runs on every generated file. Two sources of input:
random HCL built from a small grammar (literals, escapes, operators, interpolation, function
calls, for expressions, conditionals, deep nesting, huge ranges) and random mutations of the
shipped rocm-bake.hcl (byte flips, deletions, duplications, inserted bombs). "Never hangs" is
Hypothesis's deadline per example, generous for a shared CI machine; "no memory blow-up" is the
process's peak RSS over the whole module. The slowest legitimate example spends the whole
step budget (about a second on an idle core), so the deadlines (5 s for one evaluation, 10 s for
a graph load of a dozen) hold on a loaded CI machine while a hang would still fail at once.
About 300 + 120 examples: under a minute idle, under two on a loaded machine.
"""

import resource
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from rocm_assets.core.bake import BakeError, load_bake, load_graph, resolve
from rocm_assets.core.bake.functions import FUNCTIONS, UNSUPPORTED
from rocm_assets_tests.helpers import SHIPPED_BAKE_FILE

SHIPPED_TEXT = SHIPPED_BAKE_FILE.read_text()
# Peak RSS may grow this much over the module: a blow-up would take gigabytes.
MAX_RSS_GROWTH_KB = 512 * 1024


@pytest.fixture(scope="module", autouse=True)
def bounded_memory() -> Iterator[None]:
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    yield
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert grown < MAX_RSS_GROWTH_KB, f"peak RSS grew by {grown} kB"


def outcome(run: object) -> None:
    """The property: a value, or our error as one short line; nothing else escapes."""
    try:
        run()  # type: ignore[operator]
    except BakeError as exc:
        message = str(exc)
        assert "\n" not in message
        assert len(message) <= 1200


# ##### RANDOM HCL FROM A SMALL GRAMMAR

# Declared names of each type, an undeclared one, and `target`, which is no value.
PREAMBLE = 'N = 3\nS = "gfx942"\nL = ["a", "b"]\nO = { k = "v", n = 1 }\n'
NAMES = ["N", "S", "L", "O", "N", "S", "L", "O", "NOPE", "target"]
FUNCTION_NAMES = [
    *sorted(FUNCTIONS)[::2],
    "range", "regex_replace", "regexall", "formatdate", "jsonencode", "frob",
    *sorted(UNSUPPORTED)[:2],
]  # fmt: skip

numbers = st.one_of(
    st.integers(-(10**6), 10**6).map(str),
    st.sampled_from(["1e3", "1.5e-3", "1e400", "9" * 400, "0.1", "2.5", "0"]),
)
string_chars = st.sampled_from(
    ["a", "Z", "0", " ", "-", "/", ":", "\\n", "\\t", '\\"', "\\\\", "\\u00e9", "\\U0001F600",
     "\\uZZ", "\\U0001F60", "\\d", "$${x}", "%%{", "é", "😀", "2024-03-05T14:07:09Z", "1h", "YYYY"]
)  # fmt: skip
strings = st.lists(string_chars, max_size=6).map(lambda parts: '"' + "".join(parts) + '"')
leaves = st.one_of(
    numbers,
    strings,
    st.sampled_from(["true", "false", "null", "[]", "{}"]),
    st.sampled_from(NAMES),
    st.sampled_from(["range(10000000)", "range(3)", '"(a+)+$"', '"' + "a" * 50 + 'b"']),
)
OPERATORS = ["+", "-", "*", "/", "%", "==", "!=", "<", ">=", "&&", "||"]


def composite(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    return st.one_of(
        st.tuples(inner, st.sampled_from(OPERATORS), inner).map(" ".join),
        st.tuples(st.sampled_from(["!", "-"]), inner).map("".join),
        st.tuples(inner, inner, inner).map(lambda t: f"{t[0]} ? {t[1]} : {t[2]}"),
        st.lists(inner, max_size=4).map(lambda xs: "[" + ", ".join(xs) + "]"),
        st.lists(st.tuples(st.sampled_from(["a", "b", '"k-1"']), inner), max_size=3).map(
            lambda kv: "{" + ", ".join(f"{k} = {v}" for k, v in kv) + "}"
        ),
        st.tuples(st.sampled_from(FUNCTION_NAMES), st.lists(inner, max_size=3)).map(
            lambda f: f"{f[0]}({', '.join(f[1])})"
        ),
        st.tuples(inner, inner).map(lambda t: f"[for x in {t[0]} : {t[1]}]"),
        st.tuples(inner, inner).map(lambda t: f"{{ for k, v in {t[0]} : k => {t[1]} }}"),
        inner.map(lambda e: f'"pre-${{{e}}}-post"'),
        st.tuples(inner, inner).map(
            lambda t: f'"%{{ if {t[0]} }}y%{{ else }}n%{{ endif }}${{{t[1]}}}"'
        ),
        st.tuples(inner, inner).map(lambda t: f"{t[0]}[{t[1]}]"),
        inner.map(lambda e: f"({e})"),
    )


# Deep nesting is its own rare case, so most examples get to evaluate something.
deep = st.tuples(leaves, st.sampled_from([20, 60, 400])).map(
    lambda t: "(" * t[1] + t[0] + ")" * t[1]
)
shallow = st.recursive(leaves, composite, max_leaves=10)
expressions = st.integers(0, 9).flatmap(lambda i: deep if i == 0 else shallow)


@st.composite
def bake_files(draw: st.DrawFn) -> str:
    lines = [PREAMBLE + f"X = {draw(expressions)}"]
    if draw(st.booleans()):
        lines.append(f'variable "V" {{\n  default = {draw(expressions)}\n}}')
    if draw(st.booleans()):
        lines.append(
            f'function "f" {{\n  params = [x]\n  result = {draw(expressions)}\n}}\nF = f(N)'
        )
    if draw(st.booleans()):
        name = draw(st.sampled_from(["app", "app-x", "app", "a.b", "--print", "for"]))
        tags, args = draw(expressions), draw(expressions)
        lines.append(f'target "{name}" {{\n  tags = [{tags}]\n  args = {{ X = {args} }}\n}}')
    if draw(st.booleans()):
        values = draw(expressions)
        lines.append(f'target "m" {{\n  matrix = {{ v = {values} }}\n  name = "m-${{v}}"\n}}')
    return "\n".join(lines) + "\n"


FUZZ = settings(
    database=None,  # nothing written into the work tree; CI runs the same examples each time
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


@settings(FUZZ, max_examples=300, deadline=5000)
@given(
    text=bake_files(),
    env=st.dictionaries(st.sampled_from(["V", "N"]), st.sampled_from(["1", "", "x", "1e400"])),
)
def test_random_hcl_evaluates_or_fails_in_one_line(
    tmp_path: Path, text: str, env: dict[str, str]
) -> None:
    path = tmp_path / "random.hcl"
    path.write_text(text)
    outcome(lambda: resolve(load_bake(path), env))


# ##### MUTATIONS OF THE SHIPPED FILE

BOMBS = [
    "range(10000000)",
    "(" * 400 + "1" + ")" * 400,
    'regex_replace("' + "a" * 5000 + 'b", "(a+)+$", "")',
    "[for i in range(1000) : [for j in range(1000) : j]]",
    '"\\uZZ"',
    "1e400",
    "[for x in 5 : x]",
]


@st.composite
def mutations(draw: st.DrawFn) -> str:
    text = SHIPPED_TEXT
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["flip", "delete", "duplicate", "bomb"]))
        at = draw(st.integers(0, len(text)))
        if kind == "flip":
            char = draw(st.sampled_from(list('{}[]()"\\$%=,.:?!-_ab09\n#<')))
            text = text[:at] + char + text[at + 1 :]
        elif kind == "delete":
            text = text[:at] + text[at + draw(st.integers(1, 400)) :]
        elif kind == "duplicate":
            piece = text[at : at + draw(st.integers(1, 2000))]
            where = draw(st.integers(0, len(text)))
            text = text[:where] + piece + text[where:]
        else:
            name = draw(st.sampled_from(["PUB_ROCM", "ROCM_TAG", "TEST_TARGETS", "GPU_ARCHES"]))
            text = text.replace(
                f"\n{name} ", f"\n{name} = {draw(st.sampled_from(BOMBS))}\nX_{name} ", 1
            )
    return text


@settings(FUZZ, max_examples=120, deadline=10_000)
@given(text=mutations())
def test_mutated_shipped_file_loads_or_fails_in_one_line(tmp_path: Path, text: str) -> None:
    path = tmp_path / "mutated.hcl"
    path.write_text(text)
    outcome(lambda: load_graph(path, {}, resolver="builtin"))
