"""The Dockerfile reader `rocm-assets check` uses: stages, ARGs, references and their lines.

Real: the parser on text written here and on every shipped docker/*.Dockerfile; no Docker.
"""

from pathlib import Path

import pytest

from rocm_assets.core.build.dockerfile import (
    Arg,
    DockerfileError,
    Source,
    expand,
    load,
    parse,
    variables,
)
from rocm_assets_tests.helpers import PROJECT_ROOT

HERE = Path("Dockerfile")


def test_stages_args_and_references_with_their_lines() -> None:
    df = parse(
        "\n".join(
            [
                "# syntax=docker/dockerfile:1",  # 1
                "# check=skip=InvalidDefaultArgInFrom",  # 2
                "",  # 3
                "# A comment, then the global ARGs.",  # 4
                "ARG BASE_IMAGE=base-img TOOL_IMAGE",  # 5
                'ARG VERSION="1.0 beta"',  # 6
                "FROM --platform=$BUILDPLATFORM ${TOOL_IMAGE} as in-tool",  # 7
                "FROM ${BASE_IMAGE} AS build",  # 8
                "ARG VERSION",  # 9
                "RUN --mount=type=cache,target=/root/.cache \\",  # 10
                "    --mount=type=bind,from=in-tool,source=/wheels,target=/tmp/w \\",  # 11
                "    --mount=from=${TOOL_IMAGE},target=/t \\",  # 12
                "    make",  # 13
                "FROM scratch",  # 14
                "COPY --from=build --chmod=644 /out /out",  # 15
                "copy --from=0 /x /x",  # 16
            ]
        ),
        HERE,
    )
    # The parser directives are BuildKit's to read: none of them is an instruction.
    assert df.instructions[0].keyword == "ARG"
    assert df.global_args == (
        Arg("BASE_IMAGE", "base-img", 5),
        Arg("TOOL_IMAGE", None, 5),
        Arg("VERSION", "1.0 beta", 6),
    )
    assert [(s.index, s.name, s.base, s.line) for s in df.stages] == [
        (0, "in-tool", "${TOOL_IMAGE}", 7),
        (1, "build", "${BASE_IMAGE}", 8),
        (2, None, "scratch", 14),
    ]
    assert df.stages[1].args == (Arg("VERSION", None, 9),)
    assert df.sources == (
        Source("FROM", "${TOOL_IMAGE}", 7, 0),
        Source("FROM", "${BASE_IMAGE}", 8, 1),
        Source("RUN --mount", "in-tool", 10, 1),
        Source("RUN --mount", "${TOOL_IMAGE}", 10, 1),
        Source("FROM", "scratch", 14, 2),
        Source("COPY --from", "build", 15, 2),
        Source("COPY --from", "0", 16, 2),
    )
    assert df.arg_names == {"BASE_IMAGE", "TOOL_IMAGE", "VERSION"}
    assert df.stage("BUILD") is df.stages[1]  # AS names match case-insensitively, as in BuildKit
    assert df.stage("in-src") is None


def test_comments_and_blank_lines_inside_a_continuation_do_not_end_it() -> None:
    df = parse(
        "FROM scratch\n"  # 1
        "RUN a \\\n"  # 2
        "  # a comment BuildKit drops\n"  # 3
        "\n"  # 4
        "  && b \\  \n"  # 5: trailing blanks after the escape still continue
        "  && c\n"  # 6
        "COPY x /x\n",  # 7
        HERE,
    )
    assert [(i.keyword, i.line) for i in df.instructions] == [("FROM", 1), ("RUN", 2), ("COPY", 7)]
    assert df.instructions[1].text == "a   && b   && c"


def test_the_escape_directive_changes_the_continuation_character() -> None:
    df = parse("# escape=`\nFROM scratch\nCOPY a `\n  b /dir/\nCOPY c\\\nCOPY d /e\n", HERE)
    # A trailing backslash continues nothing here: line 6 is an instruction of its own.
    assert [(i.keyword, i.line, i.text) for i in df.instructions] == [
        ("FROM", 2, "scratch"),
        ("COPY", 3, "a   b /dir/"),
        ("COPY", 5, "c\\"),
        ("COPY", 6, "d /e"),
    ]


def test_a_directive_after_a_comment_is_only_a_comment() -> None:
    # The escape directive after a comment is a comment: a backtick continues nothing.
    df = parse("# hello\n# escape=`\nFROM scratch\nCOPY a `\nCOPY b /c/\n", HERE)
    assert [(i.keyword, i.line) for i in df.instructions] == [("FROM", 3), ("COPY", 4), ("COPY", 5)]


def test_heredoc_bodies_are_not_instructions() -> None:
    df = parse(
        "\n".join(
            [
                "FROM scratch AS a",  # 1
                "RUN <<EOF bash",  # 2
                "FROM evil AS not-a-stage",  # 3
                "COPY --from=nowhere / /",  # 4
                "EOF",  # 5
                "COPY <<-'ONE' /one <<\"TWO\" /two",  # 6
                "\tfirst",  # 7
                "\tONE",  # 8
                "second",  # 9
                "TWO",  # 10
                "RUN cat <<<here-string && echo '<<NOTHEREDOC'",  # 11
                "FROM a",  # 12
            ]
        ),
        HERE,
    )
    assert [(i.keyword, i.line) for i in df.instructions] == [
        ("FROM", 1),
        ("RUN", 2),
        ("COPY", 6),
        ("RUN", 11),
        ("FROM", 12),
    ]
    assert df.instructions[1].heredocs == ("FROM evil AS not-a-stage\nCOPY --from=nowhere / /",)
    assert df.instructions[2].heredocs == ("\tfirst", "second")
    assert [s.name for s in df.stages] == ["a", None]


def test_an_unclosed_heredoc_is_one_line_naming_its_instruction() -> None:
    with pytest.raises(DockerfileError) as caught:
        parse("FROM scratch\nRUN <<EOF\necho hi\n", Path("docker/x.Dockerfile"))
    assert str(caught.value) == ("docker/x.Dockerfile:2: unterminated heredoc")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "COPY a b\nFROM scratch\n",
            "Dockerfile:1: COPY before the first FROM (only ARG may come first)",
        ),
        ("ARG A\n", "Dockerfile: no FROM: a Dockerfile needs at least one stage"),
        ("FROM a b\n", "Dockerfile:1: FROM 'a b': expected `FROM [--platform=P] image [AS name]`"),
        ("# escape=x\nFROM a\n", "Dockerfile:1: invalid escape token 'x' does not match ` or \\"),
        (
            "# syntax=a\n# syntax=b\nFROM a\n",
            "Dockerfile:2: only one syntax parser directive can be used",
        ),
    ],
)
def test_unparseable_files_are_one_line(text: str, message: str) -> None:
    with pytest.raises(DockerfileError) as caught:
        parse(text, HERE)
    assert str(caught.value) == message


def test_load_names_a_missing_file(tmp_path: Path) -> None:
    with pytest.raises(DockerfileError) as caught:
        load(tmp_path / "nope.Dockerfile")
    assert str(caught.value) == f"{tmp_path / 'nope.Dockerfile'}: no such file"


@pytest.mark.parametrize(
    ("text", "values", "expanded"),
    [
        ("${A}", {"A": "x"}, "x"),
        ("$A/b", {"A": "x"}, "x/b"),
        ("${A}", {}, ""),
        ("${A:-d}", {"A": ""}, "d"),
        ("${A-d}", {"A": ""}, ""),
        ("${A-d}", {}, "d"),
        ("${A:+alt}", {"A": "x"}, "alt"),
        ("${A:+alt}", {"A": ""}, ""),
        ("${A+alt}", {"A": ""}, "alt"),
        ("${A:-${B}}", {"B": "b"}, "b"),
        ("${A:?unset}", {}, ""),
        ("${A%-*}", {"A": "x-y"}, "x-y"),
        ("\\$A", {"A": "x"}, "$A"),
        ("${A:-${B:-${C}}}x", {"C": "c"}, "cx"),
        ("$", {}, "$"),
        ("reg/${REPO}:${TAG}", {"REPO": "r", "TAG": "t"}, "reg/r:t"),
    ],
)
def test_expand_substitutes_like_buildkit(text: str, values: dict, expanded: str) -> None:
    assert expand(text, values) == expanded


def test_variables_and_global_values() -> None:
    assert variables("${A}/$B:${A:-${C}}") == ("A", "B")
    df = parse("ARG REG=r.io\nARG IMG=${REG}/img\nARG NONE\nFROM ${IMG}\n", HERE)
    assert df.global_values({}) == {"REG": "r.io", "IMG": "r.io/img"}
    assert df.global_values({"REG": "l:5000", "NONE": ""}) == {
        "REG": "l:5000",
        "IMG": "l:5000/img",
        "NONE": "",
    }
    assert df.global_arg("IMG") == Arg("IMG", "${REG}/img", 2)
    assert df.global_arg("OTHER") is None


def test_every_shipped_dockerfile_parses_with_a_final_stage() -> None:
    files = sorted((PROJECT_ROOT / "docker").glob("*.Dockerfile"))
    assert len(files) == 16
    for path in files:
        df = load(path)
        assert df.stages[-1].name == "final", path.name
        assert path.read_text().splitlines()[0] == "# syntax=docker/dockerfile:1", path.name
