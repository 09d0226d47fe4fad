"""bake's stdlib functions and literals, as the evaluator computes them.

Pure tests: python-hcl2 parses for real and the evaluator runs for real. The expected values are
the examples of the Terraform and go-cty documentation for these functions (bake links the same
go-cty and go-cty-funcs code), or what Go's implementation gives where noted.
"""

from pathlib import Path

import pytest

from rocm_assets.core.bake import BakeError, load_bake, resolve


def value(tmp_path: Path, expression: str, env: dict[str, str] | None = None) -> object:
    path = tmp_path / "bake.hcl"
    path.write_text(f"X = {expression}\n")
    return resolve(load_bake(path), env or {}).values["X"]


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        # literals: an exponent float is a number, \U takes 8 hex digits
        ("1e3", 1000),
        ('"${1e3}"', 1000),  # one interpolation alone is its value (HCL's TemplateWrapExpr)
        ('"x${1e3}"', "x1000"),
        ("1.5e-3", 0.0015),
        ('"${1e20}-${0.1}-${2.5}"', "100000000000000000000-0.1-2.5"),
        ('"\\U0001F600 \\u00e9 \\t|"', "\U0001f600 \u00e9 \t|"),
        ('"$${X} %%{y}"', "${X} %{y}"),
        # time: Terraform's formatdate spec, Go's durations
        ('formatdate("DD MMM YYYY hh:mm ZZZ", "2018-01-02T23:12:01Z")', "02 Jan 2018 23:12 UTC"),
        ('formatdate("EEEE, DD-MMM-YY hh:mm:ss ZZZ", "2018-01-02T23:12:01Z")', "Tuesday, 02-Jan-18 23:12:01 UTC"),
        ('formatdate("EEE, DD MMM YYYY hh:mm:ss ZZZ", "2018-01-02T23:12:01-08:00")', "Tue, 02 Jan 2018 23:12:01 -0800"),
        ('formatdate("MMM DD, YYYY", "2018-01-02T23:12:01Z")', "Jan 02, 2018"),
        ('formatdate("HH:mmaa", "2018-01-02T23:12:01Z")', "11:12pm"),
        ("formatdate(\"h'h'mm\", \"2018-01-02T23:12:01-08:00\")", "23h12"),
        ("formatdate(\"YYYY-MM-DD'T'hh:mm:ssZ\", \"2024-03-05T14:07:09+01:00\")", "2024-03-05T14:07:09+01:00"),
        ('timeadd("2017-11-22T00:00:00Z", "10m")', "2017-11-22T00:10:00Z"),
        ('timeadd("2017-11-22T00:00:00+01:00", "-1.5h")', "2017-11-21T22:30:00+01:00"),
        # hashes and encodings
        ('md5("hello world")', "5eb63bbbe01eeed093cb22bb8f5acdc3"),
        ('sha1("hello world")', "2aae6c35c94fcfb415dbe95f408b9ce91ee846ed"),
        ('sha256("hello world")', "b94d27b9934d3e08a52e52d7da7dabfac484efe37a5380ee9088f7ace2efcde9"),
        ('substr(sha512("hello world"), 0, 16)', "309ecc489c12d6eb"),
        ('base64encode("Hello World")', "SGVsbG8gV29ybGQ="),
        ('base64decode("SGVsbG8gV29ybGQ=")', "Hello World"),
        ('urlencode("Hello World!/é")', "Hello+World%21%2F%C3%A9"),
        ('uuidv5("dns", "www.terraform.io")', "a5008fae-b28c-5ba5-96cd-82b4c53552d6"),
        # strings
        ('indent(2, "[\\n  foo,\\n  bar,\\n]\\n")', "[\n    foo,\n    bar,\n  ]\n  "),
        ('title("hello wORLD")', "Hello WORLD"),  # Go's strings.Title keeps the rest
        ('sanitize("My App! v1.0-rc")', "My_App__v1_0-rc"),
        ('replace("a/b/", "/b/", "x")', "ax"),  # go-cty's replace has no /regex/ form
        ('format("Hello, %s! %d lights, %05.1f, %x, %q, %t", "Ander", 4, 3.14159, 255, "q", true)', 'Hello, Ander! 4 lights, 003.1, ff, "q", true'),
        ('formatlist("%s=%s", ["a", "b"], "v")', ["a=v", "b=v"]),
        ('join("-", ["a"], ["b", "c"])', "a-b-c"),
        # RE2 regexes with Go's result shapes
        ('regex("[a-z]+", "53453453.345345aaabbbccc23454")', "aaabbbccc"),
        ('regex("(\\\\d\\\\d\\\\d\\\\d)-(\\\\d\\\\d)-(\\\\d\\\\d)", "2019-02-01")', ["2019", "02", "01"]),
        ('regex("^(?:(?P<scheme>[^:/?#]+):)?(?://(?P<authority>[^/?#]*))?", "https://terraform.io/docs/")', {"scheme": "https", "authority": "terraform.io"}),
        ('regexall("[a-z]+", "1234abcd5678efgh9")', ["abcd", "efgh"]),
        ('regex_replace("abxd", "x*", "-")', "-a-b-d-"),  # Go: no empty match right after a match
        ('regex_replace("2019-02-01", "(\\\\d+)-(?P<m>\\\\d+)", "$${m}/$1 $$")', "02/2019 $-01"),
        # numbers and collections
        ("range(4, 1)", [4, 3, 2]),
        ("range(0, 1, 0.25)", [0, 0.25, 0.5, 0.75]),
        ('setunion(["a", "b"], ["b", "c"], ["d"])', ["a", "b", "c", "d"]),
        ('setintersection(["a", "b"], ["b", "c"], ["b", "d"])', ["b"]),
        ('setproduct(["a", "b"], [1])', [["a", 1], ["b", 1]]),
        ('cidrsubnet("172.16.0.0/12", 4, 2)', "172.18.0.0/16"),
        ('cidrhost("10.12.112.0/20", 16)', "10.12.112.16"),
        ('cidrnetmask("172.16.0.0/12")', "255.240.0.0"),
        ('cidrsubnets("10.1.0.0/16", 4, 4, 8, 4)', ["10.1.0.0/20", "10.1.16.0/20", "10.1.32.0/24", "10.1.48.0/20"]),
        ('chunklist(["a", "b", "c"], 2)', [["a", "b"], ["c"]]),
        ('flatten([["a", ["b"]], [], ["c"]])', ["a", "b", "c"]),
        ('jsondecode("{\\"a\\": [1, 2.5, true]}")', {"a": [1, 2.5, True]}),
        ('jsonencode({ b = [1, "x"] })', '{"b":[1,"x"]}'),
        ('distinct(["1", 1, "a", "1"])', ["1", "a"]),  # unified to strings first, as in go-cty
        ("pow(2, 10)", 1024),
        ('"x${1/3}"', "x0." + "3" * 154 + "5"),  # go-cty's numbers are 512-bit floats
        ("-7 % 3", -1),  # go-cty's modulo truncates
        ('coalesce("", "x")', ""),  # null is skipped, "" is not
    ],
)  # fmt: skip
def test_function_values(tmp_path: Path, expression: str, expected: object) -> None:
    assert value(tmp_path, expression) == expected


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ('bcrypt("secret")', r"function bcrypt\(\): its salt is random: the builtin resolver cannot"),
        ('rsadecrypt("x", "k")', r"function rsadecrypt\(\): it needs a private key: the builtin"),
        ('formatdate("YYYY QQ", "2018-01-02T23:12:01Z")', r"formatdate\(\): invalid date format sequence 'QQ'"),
        ('formatdate("YYYY", "yesterday")', r"formatdate\(\): 'yesterday' is not an RFC 3339 timestamp"),
        ('timeadd("2017-11-22T00:00:00Z", "10 minutes")', r"timeadd\(\): '10 minutes' is not a Go duration"),
        ('base64decode("%%%")', r"base64decode\(\): not valid base64"),
        ('regex("x", "abc")', r"regex\(\): pattern did not match"),
        ('regex("(?<=a)b", "ab")', r"regex\(\): invalid regular expression '\(\?<=a\)b'"),
        ('upper()', r"upper\(\): wrong number of arguments \(0\)"),
        ('range(1, 5, 0)', r"range\(\): more than 1024 values were generated"),  # go-cty's own
    ],
)  # fmt: skip
def test_function_errors_name_the_function(tmp_path: Path, expression: str, message: str) -> None:
    with pytest.raises(BakeError, match=rf"bake\.hcl:1: {message}") as info:
        value(tmp_path, expression)
    assert "\n" not in str(info.value)


def test_try_catches_bakes_own_errors_but_not_our_limits(tmp_path: Path) -> None:
    # go-cty's range() refuses over 1024 values itself, so try() falls back as in bake ...
    assert value(tmp_path, 'try(range(5000), "fallback")') == "fallback"
    # ... but a limit of this evaluator is not bake's error to hide.
    with pytest.raises(BakeError, match=r"over the limit of 1048576"):
        value(tmp_path, 'try(join("", [for i in range(1000) : format("%1100s", "x")]), "no")')
