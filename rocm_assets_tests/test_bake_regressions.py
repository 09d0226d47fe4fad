"""Each way the builtin resolver and real bake once disagreed, as one small file, against both bakes.

Real: both buildx binaries (0.29.1 and 0.13.1) run `bake --print` on each file (see
`test_bake_oracle.judge`, which fails on any disagreement); each case also pins which allowed
outcome it is, so a construct made exact cannot silently become a refusal, or the reverse.
Outcomes: exact (the builtin gives bake's answer), refused (NeedsBuildx where bake answers),
refused-bake-failed, both-failed, bake-too-old (a bake older than `features` says the file needs).
"""

import pytest

from rocm_assets_tests.helpers.bake_oracle import (
    BOTH_FAILED,
    EXACT,
    REFUSED,
    REFUSED_BAKE_FAILED,
    TOO_OLD,
    judge,
)

pytestmark = pytest.mark.real

NEW, OLD = "0.29.1", "0.13.1"


def outcome(text: str, env: dict[str, str] | None = None, names: list[str] | None = None) -> dict:
    return judge(text, env or {}, names)


def both(result: str) -> dict[str, str]:
    return {NEW: result, OLD: result}


def target(args: str, extra: str = "") -> str:
    """A file whose target `t` prints `args`, after `extra` declarations."""
    return f'{extra}\ntarget "t" {{\n  args = {{ {args} }}\n}}\n'


CASES = {
    # ---- the kinds the issue listed ----
    "cache-from appends through inherits": (
        'target "_base" {\n  cache-from = ["type=registry,ref=r/c:base"]\n}\n'
        'target "t" {\n  inherits = ["_base"]\n  cache-from = ["user/app:cache"]\n'
        '  cache-to = ["type=inline"]\n}\n',
        {},
        both(EXACT),
    ),
    "1/3 has 512 bits": (target('A = 1/3, B = "${1/3}"'), {}, both(EXACT)),
    "pow(2,63) is a float64": (
        target("A = pow(2, 63), B = pow(3, 4), C = pow(2, -2)"),
        {},
        both(EXACT),
    ),
    "pow(0, -1) is an infinity": (target("A = pow(0, -1)"), {}, both(REFUSED)),
    "pow(0, 3) and pow(-0, 3)": (
        target("A = pow(0, 3), B = pow(-0, 3), C = pow(-2, 3)"),
        {},
        both(EXACT),
    ),
    "0.1 + 0.2 at 512 bits": (target("A = 0.1 + 0.2, B = 1e300 * 1e10"), {}, both(EXACT)),
    "an env float64 plus a literal": (
        target("A = N + 1, B = N * 3", 'variable "N" {\n  default = 1\n}'),
        {"N": "0.1"},
        both(EXACT),
    ),
    "negative %": (target("A = -7 % 3, B = -7.5 % 2, C = 7 % -3, D = 5 % 0"), {}, both(EXACT)),
    'coalesce("", "x")': (
        target('A = coalesce("", "x"), B = coalesce(null, 1, "x")'),
        {},
        both(EXACT),
    ),
    'length("abc") is an error': (target('A = length("abc")'), {}, both(BOTH_FAILED)),
    "signum(0.5) is an error": (target("A = signum(0.5)"), {}, both(BOTH_FAILED)),
    "reverse() takes a string": (target('A = reverse(["a", "b"])'), {}, both(BOTH_FAILED)),
    "reverse() of a string": (target('A = reverse("abc")'), {}, both(EXACT)),
    "a heredoc with ${} and quotes": (
        target(
            "A = H", 'X = "q"\nH = <<EOT\nv ${upper("x")} "${X}" %{ if X == "q" }y%{ endif }\nEOT'
        ),
        {},
        both(EXACT),
    ),
    "!!true": (target("A = !!true, B = - -1"), {}, both(EXACT)),
    "a heredoc as a call argument": (
        target('A = join("-", [<<EOT\nx\nEOT\n, "y"]), B = upper(<<EOT\nz\nEOT\n)'),
        {},
        both(EXACT),
    ),
    "a heredoc as an object value": (
        target("A = O.a", 'O = { a = <<EOT\nx\nEOT\n  b = "y" }'),
        {},
        both(EXACT),
    ),
    "a list variable overridden from env": (
        target("A = V[0]", 'variable "V" {\n  default = ["a"]\n}'),
        {"V": "x,y"},
        both(BOTH_FAILED),
    ),
    "a number env value 1_000": (
        target("A = N + 1", 'variable "N" {\n  default = 1\n}'),
        {"N": "1_000"},
        both(EXACT),
    ),
    "a number env value 0x10": (
        target("A = N", 'variable "N" {\n  default = 1\n}'),
        {"N": "0x10"},
        both(BOTH_FAILED),
    ),
    "variadic_params = [rest]": (
        target(
            'A = f("a", "b")',
            'function "f" {\n  params = []\n  variadic_params = [rest]\n'
            '  result = join("-", rest)\n}',
        ),
        {},
        both(BOTH_FAILED),
    ),
    "variadic_params = rest": (
        target(
            'A = f("a", "b", "c"), B = f("a")',
            'function "f" {\n  params = [x]\n'
            '  variadic_params = rest\n  result = "${x}:${join("-", rest)}"\n}',
        ),
        {},
        both(EXACT),
    ),
    "a matrix over an empty list is no group": (
        'target "m" {\n  matrix = { item = [] }\n  name = "m-${item}"\n}\n' + target('A = "1"'),
        {},
        both(BOTH_FAILED),
    ),
    "a matrix over an empty list makes no target": (
        'target "m" {\n  matrix = { item = [] }\n  name = "m-${item}"\n}\n' + target('A = "1"'),
        {},
        both(EXACT),
    ),
    "substr past the end": (
        target('A = substr("abc", 5, 2), B = substr("abc", -1, 0), C = substr("abc", -5, 2)'),
        {},
        both(EXACT),
    ),
    # ---- what the differential tests found ----
    '"${x}" keeps its type': (
        target("A = jsonencode(X), B = jsonencode(Y)", 'X = "${1 + 1}"\nY = "v${1 + 1}"'),
        {},
        both(EXACT),
    ),
    '"${number}" default reads env as a number': (
        target("A = V", 'variable "N" {\n  default = -2\n}\nvariable "V" {\n  default = "${N}"\n}'),
        {"V": ""},
        both(BOTH_FAILED),
    ),
    "%{for} over a set iterates its elements": (
        target('A = "%{ for k, v in setunion(["b", "a"], ["b"]) }${k}=${v};%{ endfor }"'),
        {},
        both(EXACT),
    ),
    "%{for} names the key first": (
        target('A = "%{ for i, x in ["a", "b"] }${i}=${x};%{ endfor }"'),
        {},
        both(EXACT),
    ),
    "strip markers trim the literal beside them": (
        target('A = "a %{~ for x in ["1", "2"] ~} ${x} %{~ endfor ~} b"'),
        {},
        both(EXACT),
    ),
    "an object's for iterates by key": (
        target('A = join(",", [for k, v in { b = "2", a = "1" } : "${k}${v}"])'),
        {},
        both(EXACT),
    ),
    "an empty cache-to over an inherited one": (
        'target "_p" {\n  cache-to = ["type=gha"]\n}\n'
        'target "t" {\n  inherits = ["_p"]\n  cache-to = []\n}\n',
        {},
        both(REFUSED),
    ),
    "a repeated cache-from entry": (
        'target "t" {\n  cache-from = ["type=registry,ref=r/c:1", "r/c:1"]\n}\n',
        {},
        both(REFUSED),
    ),
    "an inherited context links to the target itself": (
        'target "t1" {\n  contexts = { base = "target:t0" }\n}\n'
        'target "t0" {\n  inherits = ["t1"]\n}\n',
        {},
        both(BOTH_FAILED),
    ),
    "an unused private target with a missing parent": (
        'target "_p" {\n  inherits = ["missing"]\n}\n' + target('A = "1"'),
        {},
        both(EXACT),
    ),
    "a typed variable without a value": (
        target("A = V", 'variable "V" {\n  type = bool\n}'),
        {},
        {NEW: REFUSED_BAKE_FAILED, OLD: REFUSED_BAKE_FAILED},
    ),
    "element() with a negative index": (
        target('A = element(["a", "b"], -1)'),
        {},
        both(BOTH_FAILED),
    ),
    "&& with an error on the other side": (
        target('A = false && length("x") > 0'),
        {},
        both(REFUSED_BAKE_FAILED),
    ),
    "a target attribute 0.13.1 ignores": (
        'target "t" {\n  description = "d"\n  network = "host"\n}\n',
        {},
        both(REFUSED),
    ),
    "an attribute no bake knows": ('target "t" {\n  foo = 1\n  target = "s"\n}\n', {}, both(EXACT)),
    'dockerfile = ""': ('target "t" {\n  dockerfile = ""\n}\n', {}, both(REFUSED)),
    "length() of an object": (target("A = length({ a = 1 })"), {}, both(REFUSED_BAKE_FAILED)),
    "a variable's description": (
        target("A = V", 'variable "V" {\n  default = "x"\n  description = "d"\n}'),
        {},
        {NEW: EXACT, OLD: TOO_OLD},
    ),
    "format %v of a number": (
        target('A = format("%v|%v|%05.1f|%x", 1000000, 0.5, 3.14159, 255)'),
        {},
        both(EXACT),
    ),
    "-0": (target("A = -0, B = 0 * -1"), {}, both(EXACT)),
    "a user function named as a stdlib one": (
        target('A = upper("x")', 'function "upper" {\n  params = [s]\n  result = "mine"\n}'),
        {},
        both(EXACT),
    ),
    "a user function named as a newer stdlib one": (
        target(
            'A = basename("a/b")', 'function "basename" {\n  params = [s]\n  result = "mine"\n}'
        ),
        {},
        both(REFUSED),
    ),
    "BAKE_LOCAL_PLATFORM and BAKE_CMD_CONTEXT": (
        target("A = BAKE_LOCAL_PLATFORM, B = BAKE_CMD_CONTEXT"),
        {},
        both(EXACT),
    ),
    "a conditional unifies its results": (
        target('A = true ? 1 : "x", B = jsonencode(true ? [1] : ["a", "b"])'),
        {},
        both(EXACT),
    ),
    "a heredoc inside a conditional": (
        target("A = X", 'X = true ? <<EOT\nl\nEOT\n : "y"'),
        {},
        both(REFUSED_BAKE_FAILED),
    ),
    "a newer stdlib function": (target('A = sanitize("a.b")'), {}, {NEW: EXACT, OLD: TOO_OLD}),
}
# The matrix case that requests only the other target.
NAMES = {"a matrix over an empty list makes no target": ["t"]}


@pytest.mark.parametrize("case", list(CASES))
def test_regression(case: str) -> None:
    text, env, expected = CASES[case]
    assert outcome(text, env, NAMES.get(case)) == expected
