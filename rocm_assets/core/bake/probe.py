"""The files rocm-assets passes to bake after the farm's: the probe, and the arch check.

The probe is a group of every target and group the file declares, and a target whose args are
bake's `jsonencode` of every top-level value (GPU_ARCHES, TEST_TARGETS, PUB_*): one `--print` of
it answers everything the graph needs for one environment, and no value is computed here.
"""

import json
import os
from collections.abc import Mapping
from pathlib import Path

from rocm_assets.core.bake.errors import BakeError
from rocm_assets.core.bake.source import Outline
from rocm_assets.core.common.buildx import Buildx
from rocm_assets.core.common.cache import cache_dir, digest
from rocm_assets.core.common.constants import ARCH_LIST_ATTR, ARCH_VAR

# The probe's names: a file that declares either is refused (`model`).
VALUES_TARGET = "rocm-assets-values"
ALL_GROUP = "rocm-assets-all"
# Variable validation arrived in buildx 0.19 (bake: basic variable validation).
VALIDATION_SINCE = (0, 19)
# The arch check bake runs where it can: a variable whose validation refuses an unknown GPU_ARCH.
# A separate file, because older buildx rejects `validation` (and the shipped files must load).
ARCH_CHECK_FILE = Path(__file__).with_name("arch_check.hcl")


def requested(outline: Outline) -> list[str]:
    """The names asked for: the probe's group, and the empty groups, which must not be nested."""
    return [ALL_GROUP, *outline.empty_groups]


def probe_text(outline: Outline) -> str:
    """The probe: one group of everything the file declares, one target of its values."""
    values = "".join(f'    "{name}" = jsonencode({name})\n' for name in outline.top_level_names)
    members = [
        VALUES_TARGET,
        *(n for n in outline.targets if not n.startswith("_")),
        *(g for g in outline.groups if g not in outline.empty_groups),
    ]
    return (
        "# Written by rocm-assets for `docker buildx bake --print`: bake's values of the names\n"
        f"# {outline.path.name} declares, and all its targets and groups in one request.\n"
        f'target "{VALUES_TARGET}" {{\n  args = {{\n{values}  }}\n}}\n'
        f'group "{ALL_GROUP}" {{\n  targets = {json.dumps(members)}\n}}\n'
    )


def _written_probe(outline: Outline, env: Mapping[str, str]) -> Path:
    """The probe in the cache dir, named by its digest: written once, atomically, for every
    process that reads the same file."""
    text = probe_text(outline)
    probe = cache_dir(env) / "probe" / f"{digest(text)}.hcl"
    if not probe.is_file():
        try:
            probe.parent.mkdir(parents=True, exist_ok=True)
            partial = probe.with_name(f".{probe.name}.{os.getpid()}")
            partial.write_text(text, encoding="utf-8")
            os.replace(partial, probe)
        except OSError as exc:
            raise BakeError(
                f"cannot write bake's probe file {probe}: {exc.strerror or exc} (set "
                "ROCM_CACHE_DIR to a writable directory)",
                path=outline.path,
            ) from None
    return probe


def added_files(buildx: Buildx, outline: Outline, env: Mapping[str, str]) -> list[Path]:
    """The `-f` files after the farm's: the arch check where this buildx validates and the file
    has the arch variables, then the probe."""
    files = []
    if buildx.version >= VALIDATION_SINCE and {ARCH_VAR, ARCH_LIST_ATTR} <= set(outline.variables):
        files.append(ARCH_CHECK_FILE)
    files.append(_written_probe(outline, env))
    return files
