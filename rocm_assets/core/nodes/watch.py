"""A node watched while a build runs on it: the farm's own probe, again and again, in the background.

A bake whose node's link is cut does not fail: TCP holds the connection, and `docker buildx bake`
waits for many minutes in silence. A cut shorter than TCP's retransmission limit (~25 s) is
survived as it should be. `LinkWatch` probes the node over SSH (`probe_node`) every `every_s`
while the build runs, and once every probe has failed for `unreachable_s` it gives a verdict
naming the node and the probe's reason; the caller stops the bake. The verdict comes at most
`unreachable_s + every_s` plus one probe's timeout after the node stopped answering.
"""

import threading
import time
from collections.abc import Callable
from types import TracebackType

from rocm_assets.core.nodes.fleet import Node
from rocm_assets.core.nodes.probes import NodeProbe, probe_node

# Longer than TCP's own retransmission limit (~25 s), which a bake survives unaided.
UNREACHABLE_S = 45.0
EVERY_S = 10.0


class LinkWatch:
    """Probes `node` in a thread of its own; `verdict()` says when it has been unreachable too long."""

    def __init__(
        self,
        node: Node,
        *,
        every_s: float = EVERY_S,
        unreachable_s: float = UNREACHABLE_S,
        probe: Callable[[Node], NodeProbe] = probe_node,
    ) -> None:
        self.node = node
        self.every_s = every_s
        self.unreachable_s = unreachable_s
        self._probe = probe
        self._verdict: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._loop, name=f"rocm-watch-{node.name}", daemon=True
        )

    def _loop(self) -> None:
        failing_since: float | None = None
        while not self._stop.wait(self.every_s):
            probe = self._probe(self.node)
            if probe.ok:
                failing_since = None
                continue
            failing_since = failing_since or probe.probed_at
            silent = time.time() - failing_since
            if silent >= self.unreachable_s:
                self._verdict = (
                    f"node {self.node.name} unreachable for {silent:.0f} s ({probe.reason})"
                )
                return

    def verdict(self) -> str | None:
        """None while the node answers (or has not been silent long enough); else why not."""
        return self._verdict

    def __enter__(self) -> "LinkWatch":
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        # A probe in flight ends within its own timeout; the thread is a daemon, not waited for.
        self._stop.set()
