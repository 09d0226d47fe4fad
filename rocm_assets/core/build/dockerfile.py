"""A Dockerfile's stages, ARGs and references with their line numbers, as BuildKit reads them.

The parsing is BuildKit's own: the `dockerfile` package wraps its Go parser, so parser
directives (`# syntax=`, `# escape=`), comments inside continued instructions, continuations and
heredocs read exactly as a build would read them. On top of it, the farm's checks of a file's
shape (a FROM first, `FROM [--platform=P] image [AS name]`), global and per-stage ARGs, and the
places that name an image, a stage or a named context: FROM, `COPY --from=` and
`RUN --mount=...,from=`. `expand` substitutes `$X`, `${X}` and the `${X:-word}` family the way
BuildKit does for a FROM line.
"""

import csv
import re
import shlex
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import dockerfile as dockerfile_parser

# BuildKit's parser names a line in some messages: "dockerfile parse error on line 3: ...".
_EMPTY = "file with no instructions"
_LINE_IN_ERROR = re.compile(r"(?:dockerfile parse error )?on line (\d+): ?", re.IGNORECASE)
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_OPERATORS = (":-", ":+", ":?", "-", "+", "?")


class DockerfileError(Exception):
    """A Dockerfile that cannot be read or parsed: one line naming the file and line."""

    def __init__(self, path: Path, line: int | None, message: str):
        super().__init__(f"{path}:{line}: {message}" if line else f"{path}: {message}")


@dataclass(frozen=True, slots=True)
class Instruction:
    """One instruction: keyword (upper case), its text after continuations, its first line."""

    keyword: str
    text: str
    line: int
    heredocs: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Arg:
    """An `ARG name[=default]` declaration."""

    name: str
    default: str | None
    line: int


@dataclass(frozen=True, slots=True)
class Source:
    """A place that names an image, a stage or a named context, as written (unexpanded)."""

    kind: str  # "FROM", "COPY --from" or "RUN --mount"
    text: str
    line: int
    stage: int


@dataclass(frozen=True, slots=True)
class Stage:
    """One `FROM`: its index, `AS` name (None without one), base as written, and its ARGs."""

    index: int
    name: str | None
    base: str
    line: int
    args: tuple[Arg, ...]


@dataclass(frozen=True)
class Dockerfile:
    path: Path
    instructions: tuple[Instruction, ...]
    global_args: tuple[Arg, ...]
    stages: tuple[Stage, ...]
    sources: tuple[Source, ...]

    @property
    def arg_names(self) -> frozenset[str]:
        """Every ARG declared anywhere: a build arg reaches a stage ARG as well as a global one."""
        return frozenset(
            a.name for a in (*self.global_args, *(a for s in self.stages for a in s.args))
        )

    def global_arg(self, name: str) -> Arg | None:
        """The global ARG a FROM line can use (the last declaration wins, as in BuildKit)."""
        return next((a for a in reversed(self.global_args) if a.name == name), None)

    def stage(self, name: str) -> Stage | None:
        """The stage named `name` (case-insensitive, as BuildKit matches `AS` names)."""
        return next((s for s in self.stages if s.name and s.name.lower() == name.lower()), None)

    def global_values(self, build_args: Mapping[str, str]) -> dict[str, str]:
        """What each global ARG holds for a FROM line: the build arg, else its default expanded."""
        values: dict[str, str] = {}
        for arg in self.global_args:
            if arg.name in build_args:
                values[arg.name] = build_args[arg.name]
            elif arg.default is not None:
                values[arg.name] = expand(arg.default, values)
            else:
                values.pop(arg.name, None)
        return values


def _substitutions(text: str) -> Iterator[tuple[int, int, str, str, str]]:
    """Each top-level `$X` / `${X...}` in `text`: (start, end, name, operator, word).

    The word of `${X:-word}` may itself hold `${...}`: braces are matched, not just found.
    An escaped `\\$` is no substitution.
    """
    i = 0
    while i < len(text):
        if text[i] == "\\" and text[i + 1 : i + 2] == "$":
            i += 2
            continue
        if text[i] != "$":
            i += 1
            continue
        start = i
        braced = text[i + 1 : i + 2] == "{"
        name = _NAME.match(text, i + 2 if braced else i + 1)
        if name is None:
            i += 1
            continue
        i = name.end()
        if not braced:
            yield start, i, name.group(), "", ""
            continue
        op = next((o for o in _OPERATORS if text.startswith(o, i)), "")
        if not op and i < len(text) and text[i] in "#%/":
            op = "pattern"  # ${X#p}, ${X%p}, ${X/p/r}: X itself, for what is checked here
        i += len(op) if op != "pattern" else 0
        depth, word_start = 1, i
        while i < len(text) and depth:
            if text.startswith("${", i):
                depth, i = depth + 1, i + 2
                continue
            depth -= text[i] == "}"
            i += 1
        if depth:
            return  # unclosed: BuildKit refuses the line; nothing more to substitute
        yield start, i, name.group(), op, text[word_start : i - 1]


def variables(text: str) -> tuple[str, ...]:
    """The variables `text` substitutes at its top level, in order, once each (in `${A:-${B}}`,
    A: B only matters when A is empty)."""
    return tuple(dict.fromkeys(name for _, _, name, _, _ in _substitutions(text)))


def required(text: str) -> tuple[str, ...]:
    """The variables `text` needs a value for: top-level ones without a `${X:-word}` or
    `${X-word}` fallback."""
    found = (name for _, _, name, op, _ in _substitutions(text) if op not in (":-", "-"))
    return tuple(dict.fromkeys(found))


def expand(text: str, values: Mapping[str, str]) -> str:
    """`text` with `$X`, `${X}`, `${X:-w}`, `${X-w}`, `${X:+w}`, `${X+w}`, `${X:?m}` and `${X?m}`
    substituted, and `\\$` made a plain `$`. An unset variable is empty (the `?` forms too:
    BuildKit would refuse the line). `${X#p}`, `${X%p}` and `${X/p/r}` give X unchanged: what is
    checked here is whether X has a value, and those forms never take one away."""
    out: list[str] = []
    last = 0
    for start, end, name, op, word in _substitutions(text):
        out.append(text[last:start].replace("\\$", "$"))
        last = end
        is_set, value = name in values, values.get(name, "")
        if op in (":-", "-"):
            out.append(expand(word, values) if (not value if op == ":-" else not is_set) else value)
        elif op in (":+", "+"):
            out.append(expand(word, values) if (value if op == ":+" else is_set) else "")
        else:
            out.append(value)
    out.append(text[last:].replace("\\$", "$"))
    return "".join(out)


def _words(text: str) -> Iterator[str]:
    """Shell-like words, read lazily: a RUN's flags are read without parsing its whole script."""
    lexer = shlex.shlex(text, posix=True)
    lexer.whitespace_split = True
    lexer.commenters = ""
    try:
        yield from lexer
    except ValueError:  # an unbalanced quote further on: the words before it stand
        return


def _flags(text: str) -> dict[str, list[str]]:
    """The leading `--name[=value]` flags of an instruction, by lower-case name."""
    flags: dict[str, list[str]] = {}
    for word in _words(text):
        if not word.startswith("--"):
            break
        name, _, value = word[2:].partition("=")
        flags.setdefault(name.lower(), []).append(value)
    return flags


def _arg_decls(instruction: Instruction) -> list[Arg]:
    decls = []
    for word in _words(instruction.text):
        name, eq, default = word.partition("=")
        decls.append(Arg(name, default if eq else None, instruction.line))
    return decls


def _mount_from(value: str) -> str | None:
    """The `from=` of a `--mount=type=bind,from=x,...` value, if any."""
    try:
        fields = next(csv.reader([value]))
    except (csv.Error, StopIteration):
        fields = value.split(",")
    for field in fields:
        key, _, val = field.partition("=")
        if key.strip().lower() == "from":
            return val.strip()
    return None


def _buildkit_error_line(text: str) -> int | None:
    """Where BuildKit's parser gives up, for its messages that name no line: the first line
    after the longest prefix of the file it still accepts."""
    lines = text.split("\n")
    good = 0
    for end in range(1, len(lines) + 1):
        try:
            dockerfile_parser.parse_string("\n".join(lines[:end]))
        except dockerfile_parser.GoParseError as exc:
            if str(exc) != _EMPTY:
                continue
        good = end
    after = good + 1
    while after <= len(lines) and not lines[after - 1].strip():
        after += 1
    return min(after, len(lines)) or None


def _instructions(text: str, path: Path) -> tuple[Instruction, ...]:
    try:
        commands = dockerfile_parser.parse_string(text)
    except dockerfile_parser.GoParseError as exc:
        if str(exc) == _EMPTY:  # our own check says it better: no FROM
            return ()
        message = str(exc).strip()
        line = _LINE_IN_ERROR.search(message)
        where = int(line[1]) if line else _buildkit_error_line(text)
        raise DockerfileError(path, where, _LINE_IN_ERROR.sub("", message)) from None
    return tuple(
        Instruction(
            c.cmd.upper(),
            (c.original.split(None, 1)[1:] or [""])[0].split("\n", 1)[0].strip()
            if c.heredocs
            else (c.original.split(None, 1)[1:] or [""])[0].strip(),
            c.start_line,
            tuple(h.content.removesuffix("\n") for h in c.heredocs),
        )
        for c in commands
    )


def parse(text: str, path: Path) -> Dockerfile:
    """Parse Dockerfile `text` (read from `path`, which errors name)."""
    instructions = _instructions(text, path)
    global_args: list[Arg] = []
    # Per stage: (name, base, line) and its ARGs.
    heads: list[tuple[str | None, str, int]] = []
    args: list[list[Arg]] = []
    sources: list[Source] = []
    for ins in instructions:
        index = len(heads) - 1
        if ins.keyword == "FROM":
            words = [w for w in _words(ins.text) if not w.startswith("--")]
            if len(words) not in (1, 3) or (len(words) == 3 and words[1].lower() != "as"):
                raise DockerfileError(
                    path,
                    ins.line,
                    f"FROM {ins.text!r}: expected `FROM [--platform=P] image [AS name]`",
                )
            heads.append((words[2] if len(words) == 3 else None, words[0], ins.line))
            args.append([])
            sources.append(Source("FROM", words[0], ins.line, index + 1))
        elif ins.keyword == "ARG":
            (args[index] if heads else global_args).extend(_arg_decls(ins))
        elif not heads:
            raise DockerfileError(
                path, ins.line, f"{ins.keyword} before the first FROM (only ARG may come first)"
            )
        elif ins.keyword == "COPY":
            sources.extend(
                Source("COPY --from", v, ins.line, index) for v in _flags(ins.text).get("from", [])
            )
        elif ins.keyword == "RUN":
            for mount in _flags(ins.text).get("mount", []):
                found = _mount_from(mount)
                if found:
                    sources.append(Source("RUN --mount", found, ins.line, index))
    if not heads:
        raise DockerfileError(path, None, "no FROM: a Dockerfile needs at least one stage")
    stages = tuple(
        Stage(i, name, base, line, tuple(args[i])) for i, (name, base, line) in enumerate(heads)
    )
    return Dockerfile(path, instructions, tuple(global_args), stages, tuple(sources))


def load(path: Path) -> Dockerfile:
    """Read and parse the Dockerfile at `path`; DockerfileError (one line) if it cannot."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise DockerfileError(path, None, "no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise DockerfileError(path, None, f"cannot read: {reason}") from None
    return parse(text, path)
