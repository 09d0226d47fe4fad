"""The one exception the bake layer raises: a single line naming the file and, where known, the line."""

import contextlib
from collections.abc import Iterator
from pathlib import Path

# A backstop: messages quote values shortened already, but no message may carry a whole file.
_MAX_MESSAGE = 1000


class BakeError(Exception):
    """A bake file that cannot be read, parsed, evaluated or turned into a graph."""

    def __init__(self, message: str, *, path: Path | str | None = None, line: int | None = None):
        self.path = Path(path) if path is not None else None
        self.line = line
        where = ""
        if path is not None:
            where = f"{path}:{line}: " if line else f"{path}: "
        message = message.replace("\r", "\\r").replace("\n", "\\n")
        if len(message) > _MAX_MESSAGE:
            message = message[: _MAX_MESSAGE - 3] + "..."
        super().__init__(f"{where}{message}")


class NeedsBuildx(BakeError):
    """A construct the builtin resolver does not read exactly as bake would: it refuses rather
    than guess. `construct` names it; the message says buildx is needed for it."""

    def __init__(self, construct: str, *, path: Path | str | None = None, line: int | None = None):
        self.construct = construct
        super().__init__(
            f"{construct}: the builtin resolver cannot read this as bake does; "
            "install docker buildx to resolve this file",
            path=path,
            line=line,
        )


class UnreadableSyntax(NeedsBuildx):
    """A line python-hcl2 cannot parse. Its grammar is narrower than HCL's (it has no `!!x`),
    so this is a refusal too: bake may accept the line."""

    def __init__(self, reason: str, *, path: Path | str | None = None, line: int | None = None):
        self.construct = reason
        BakeError.__init__(
            self,
            f"{reason} (if docker buildx accepts this line, the builtin reader cannot: install "
            "docker buildx to resolve this file)",
            path=path,
            line=line,
        )


class Unfollowed(Exception):
    """Raised deep in an evaluation where bake's answer is not followed exactly (an infinity,
    a float64 function, a construct the buildx releases read differently); the evaluator turns
    it into NeedsBuildx at the line being evaluated. The message names the construct."""


class BakeLimitError(BakeError):
    """A file that asks for more work than the evaluator allows; `try()` does not swallow it."""


@contextlib.contextmanager
def boundary(path: Path) -> Iterator[None]:
    """Turn anything but our own error, raised while reading `path`, into a one-line BakeError.

    The limits are meant to keep Python's own errors (RecursionError, MemoryError, a bug's
    TypeError) from happening at all; this keeps one from escaping as a traceback if they fail.
    """
    try:
        yield
    except BakeError:
        raise
    except Unfollowed as exc:
        raise NeedsBuildx(str(exc), path=path) from exc
    except RecursionError as exc:
        raise BakeError("nesting too deep to evaluate (Python's stack)", path=path) from exc
    except Exception as exc:
        text = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ""
        cause = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
        raise BakeError(f"cannot evaluate: {cause}", path=path) from exc
