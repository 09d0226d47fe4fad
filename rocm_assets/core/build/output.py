"""Where a bake's output goes: all of it to the raw log, a digest of it to the run's events.

A PyTorch bake prints about 100,000 lines. Sent to the run's event log in batches they made one
event record per batch: 522 records for a 100k-line bake of the e2e farm, every one of them
stored, and paged through by every reader of that run. `BakeLog` writes every line to `raw` (a
run worker's stdout, which Dagster captures per step into the compute log) and keeps as events
only what an operator reads there: each build step once, as it starts; a one-line progress note
at most every `progress_s`; and at the end one summary with the line count, the duration and the
last lines. So the events grow with the Dockerfile's steps and the build's hours, not its output.
"""

import re
import time
from collections import deque
from collections.abc import Callable
from typing import TextIO

from rocm_assets.core.common.timefmt import duration

# A step's first line in `--progress=plain` output (`#6 [base 2/3] RUN ...`); its output lines
# repeat `#6` with a timestamp, and the header comes again when steps interleave.
_STEP = re.compile(r"#(\d+) \[")
# An event line past this is cut: a compiler's command line can run to kilobytes.
_MAX_LINE = 300
PROGRESS_S = 60.0
TAIL_LINES = 40


def _short(line: str) -> str:
    return line if len(line) <= _MAX_LINE else f"{line[:_MAX_LINE]}..."


class BakeLog:
    """`run_bake`'s output sink: every line to `raw`, a digest to `event` (module docstring).

    `event` takes one message per event record; `close` writes the summary.
    """

    def __init__(
        self,
        raw: TextIO,
        event: Callable[[str], None],
        *,
        progress_s: float = PROGRESS_S,
        tail_lines: int = TAIL_LINES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._raw = raw
        self._event = event
        self._progress_s = progress_s
        self._clock = clock
        self._started = self._last_note = clock()
        self._steps: set[str] = set()
        self._tail: deque[str] = deque(maxlen=tail_lines)
        self.lines = 0

    def __call__(self, batch: list[str]) -> None:
        self._raw.write("".join(f"{line}\n" for line in batch))
        self._raw.flush()
        self.lines += len(batch)
        self._tail.extend(batch)
        for line in batch:
            step = _STEP.match(line)
            if step and step[1] not in self._steps:
                self._steps.add(step[1])
                self._say(f"step {_short(line)}")
        now = self._clock()
        if batch and now - self._last_note >= self._progress_s:
            self._last_note = now
            self._say(
                f"bake output: {self.lines:,} lines in {duration(now - self._started)} so far; "
                f"last: {_short(batch[-1])}"
            )

    def close(self) -> None:
        """The summary: line count, duration, and the last lines (all of them when few)."""
        took = duration(self._clock() - self._started)
        tail = "\n".join(_short(line) for line in self._tail)
        if self.lines <= len(self._tail):
            self._say(f"bake output, all {self.lines:,} lines in {took}:\n{tail}")
        else:
            self._say(
                f"bake output: {self.lines:,} lines in {took}, all of them in this step's compute "
                f"log (stdout); the last {len(self._tail)}:\n{tail}"
            )

    def _say(self, message: str) -> None:
        self._event(message)
