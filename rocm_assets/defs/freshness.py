"""How old an image or wheel may get: one freshness window per bake target, and a default.

The windows live in `WINDOWS` below and nowhere else. Not in the bake file, which describes builds
and is read by `docker buildx bake` too; not in fleet.yaml, which describes nodes and is read by
the run coordinator, neither of which has any use for them. A target missing from the table, such
as one added to the bake file later, gets `DEFAULT_WINDOW`.

`assets.py` sets each target's policy on its asset spec; Dagster's
FreshnessDaemon (on by default in 1.13, every 30 s) evaluates them and records PASS, WARN or FAIL.
It judges an asset by its newest materialization of any arch partition, so one stale arch next to
a fresh one does not show here. An image older than an upstream rebuilt since shows as "Unsynced"
instead: builds record the pushed digest as the data version, so a new upstream digest marks the
downstream partition unsynced, and a rebuild that reproduces the same digest does not.
"""

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta

import dagster as dg


@dataclass(frozen=True, slots=True)
class FreshnessWindow:
    """WARN once the newest materialization is `warn` old, FAIL once it is `fail` old."""

    warn: timedelta
    fail: timedelta

    def describe(self) -> dict[str, float]:
        """The window in seconds, as alerts report it."""
        return {"warn_s": self.warn.total_seconds(), "fail_s": self.fail.total_seconds()}


# A weekly `make push-all` keeps every target inside this; three days without one is worth a look.
DEFAULT_WINDOW = FreshnessWindow(warn=timedelta(days=3), fail=timedelta(days=7))

WINDOWS: Mapping[str, FreshnessWindow] = {
    # A cold PyTorch is 1.5-3 h per arch on the strongest node and is rebuilt when its source or
    # base moves, not weekly; its dependents are rebuilt against the published image meanwhile.
    "pytorch": FreshnessWindow(warn=timedelta(days=7), fail=timedelta(days=14)),
}


def freshness_window(target: str) -> FreshnessWindow:
    """The window for `target`: its entry in `WINDOWS`, else `DEFAULT_WINDOW`."""
    return WINDOWS.get(target, DEFAULT_WINDOW)


def freshness_policy(target: str) -> dg.FreshnessPolicy:
    window = freshness_window(target)
    return dg.FreshnessPolicy.time_window(fail_window=window.fail, warn_window=window.warn)
