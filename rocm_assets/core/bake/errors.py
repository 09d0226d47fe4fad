"""The one exception the bake layer raises: a single line naming the file and, where known, the line."""

from pathlib import Path


class BakeError(Exception):
    """A bake file that cannot be read, parsed, evaluated or turned into a graph."""

    def __init__(self, message: str, *, path: Path | str | None = None, line: int | None = None):
        self.path = Path(path) if path is not None else None
        self.line = line
        where = ""
        if path is not None:
            where = f"{path}:{line}: " if line else f"{path}: "
        super().__init__(f"{where}{message}")
