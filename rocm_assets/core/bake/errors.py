"""The one exception the bake layer raises: a single line naming the file and, where known, the line."""

import contextlib
from collections.abc import Iterator
from pathlib import Path

from rocm_assets.core.common.buildx import BuildxError

# A backstop: messages quote values shortened already, but no message may carry a whole file.
_MAX_MESSAGE = 1000


class BakeError(Exception):
    """A bake file that cannot be read, that bake refuses, or that makes no graph."""

    def __init__(self, message: str, *, path: Path | str | None = None, line: int | None = None):
        self.path = Path(path) if path is not None else None
        self.line = line
        self.message = message
        where = ""
        if path is not None:
            where = f"{path}:{line}: " if line else f"{path}: "
        message = message.replace("\r", "\\r").replace("\n", "\\n")
        if len(message) > _MAX_MESSAGE:
            message = message[: _MAX_MESSAGE - 3] + "..."
        super().__init__(f"{where}{message}")


@contextlib.contextmanager
def boundary(path: Path) -> Iterator[None]:
    """Turn anything but our own error, raised while reading `path`, into a one-line BakeError.

    Bake's answer is read defensively already; this keeps a bug's TypeError from reaching a
    daemon as a traceback.
    """
    try:
        yield
    except BakeError:
        raise
    except BuildxError as exc:
        raise BakeError(str(exc), path=path) from None
    except RecursionError as exc:
        raise BakeError("nesting too deep to evaluate (Python's stack)", path=path) from exc
    except Exception as exc:
        text = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ""
        cause = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
        raise BakeError(f"cannot read: {cause}", path=path) from exc
