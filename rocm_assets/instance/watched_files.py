"""The farm's two files as the daemon reads them on every tick: parsed again only when saved."""

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rocm_assets.core.bake import BakeError, BakeGraph, load_graph
from rocm_assets.core.common.settings import bake_file_path
from rocm_assets.core.nodes.fleet import Fleet, FleetError, fleet_path, load_fleet


@dataclass
class WatchedFiles:
    """The bake and fleet files, re-read when their mtime changes."""

    bake_file: str | None
    fleet_file: str | None
    cache: dict[str, tuple[float, Any]] = field(default_factory=dict)

    def _load(self, path: Path, loader: Any) -> Any:
        mtime = path.stat().st_mtime if path.exists() else -1.0
        cached = self.cache.get(str(path))
        if cached is None or cached[0] != mtime:
            try:
                cached = (mtime, loader(path))
            except (BakeError, FleetError) as exc:
                # A bad file stays bad until it is saved again: not re-parsed every tick.
                cached = (mtime, exc)
            self.cache[str(path)] = cached
        if isinstance(cached[1], BakeError | FleetError):
            raise cached[1].with_traceback(None)  # a fresh traceback each tick, none kept
        return cached[1]

    def graph(self) -> BakeGraph:
        return self._load(bake_file_path(self.bake_file), load_graph)

    def fleet(self) -> Fleet:
        return self._load(fleet_path(self.fleet_file), load_fleet)
