"""Bake itself resolves the file: `docker buildx bake --print`, once per environment, in parallel.

The seed's depgraph asks bake, and so does this: bake is the only evaluator of the file. Every
`--print` runs through `run_print`. One call, with the probe (`probe`) after the farm's file,
answers everything the graph needs for one environment. Answers are cached on disk by everything
that decides them (the buildx binary, the files' bytes, the variables' values from the
environment).
"""

import concurrent.futures
import contextlib
import json
import os
import re
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rocm_assets.core.bake.environment import bake_env, print_env
from rocm_assets.core.bake.error_text import error_from_stderr
from rocm_assets.core.bake.errors import BakeError
from rocm_assets.core.bake.probe import added_files, requested
from rocm_assets.core.bake.source import Outline
from rocm_assets.core.common.buildx import Buildx
from rocm_assets.core.common.cache import cache_dir, digest, read_json, write_json

PRINT_TIMEOUT_S = 30.0
# Functions whose results change from call to call: a file using them is never cached.
_UNSTABLE = re.compile(r"\b(timestamp|uuidv4|uuid)\s*\(")


class BakeUnavailable(BakeError):
    """Bake did not run or did not finish: no verdict on the file, only on this host."""


def run_print(
    buildx: Buildx,
    bake_file: Path,
    env: Mapping[str, str],
    *,
    extra_files: Sequence[Path] = (),
    names: Sequence[str] = (),
) -> str:
    """`docker buildx bake -f BAKE_FILE [-f EXTRA ...] --print -- NAMES` in the bake file's dir:
    its stdout, or bake's refusal as its one-line BakeError."""
    env = print_env(env)
    argv = [str(buildx.path), "bake"]
    for file in (bake_file.resolve(), *extra_files):
        argv += ["-f", str(file)]
    # No names after `--` is bake's default group, as without it (buildx 0.13 and 0.29).
    argv += ["--print", "--progress=quiet", "--", *names]
    try:
        out = subprocess.run(
            argv,
            env=env,
            cwd=bake_file.parent,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=PRINT_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise BakeUnavailable(
            f"docker buildx bake --print did not finish in {PRINT_TIMEOUT_S:.0f} s", path=bake_file
        ) from None
    except OSError as exc:
        raise BakeUnavailable(
            f"cannot run {buildx.path}: {exc.strerror or exc}", path=bake_file
        ) from None
    if out.returncode != 0:
        raise error_from_stderr(out.stderr, bake_file, env)
    return out.stdout


class BakePrinter:
    """Runs `bake --print` for a bake file under several environments, with an on-disk cache."""

    def __init__(
        self, buildx: Buildx, outline: Outline, *, env: Mapping[str, str] | None = None
    ) -> None:
        self.buildx = buildx
        self.outline = outline
        self.env = dict(os.environ if env is None else env)
        self.extra_files = added_files(buildx, outline, self.env)
        # Read once: every call of this printer answers for these bytes.
        contents = [f.read_bytes() for f in (outline.path.resolve(), *self.extra_files)]
        self._files_digest = digest(*contents)
        self._cacheable = not _UNSTABLE.search(contents[0].decode("utf-8", errors="replace"))

    def _key(self, env: Mapping[str, str]) -> str:
        # Keyed on what the call is run with, so a dropped variable changes no entry.
        return digest(
            self.buildx.identity(),
            self._files_digest,
            json.dumps(sorted(bake_env(self.outline, print_env(env)).items())),
            str(self.outline.path.parent.resolve()),
        )

    def _run(self, env: Mapping[str, str]) -> dict[str, Any]:
        memo = cache_dir(self.env) / "bake-print" / f"{self._key(env)}.json"
        cached = read_json(memo) if self._cacheable else None
        if isinstance(cached, dict):
            return cached
        stdout = run_print(
            self.buildx,
            self.outline.path,
            env,
            extra_files=self.extra_files,
            names=requested(self.outline),
        )
        try:
            data = json.loads(stdout)
        except ValueError:
            raise BakeError(
                "docker buildx bake --print wrote no JSON", path=self.outline.path
            ) from None
        if not isinstance(data, dict) or not isinstance(data.get("target"), dict):
            raise BakeError(
                "docker buildx bake --print wrote JSON of another shape", path=self.outline.path
            )
        if self._cacheable:
            write_json(memo, data)
        return data

    def print_many(self, envs: Sequence[Mapping[str, str]]) -> list[dict[str, Any]]:
        """`--print`'s JSON for each environment (bake's whole environment for that call: PATH,
        HOME, the variables); the calls run concurrently."""
        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, len(envs))) as pool:
            return list(pool.map(self._run, envs))


def bake_verdict(buildx: Buildx, path: Path, env: Mapping[str, str]) -> None:
    """Bake's own verdict on a file python-hcl2 could not parse: its error, if it has one."""
    # A bake that cannot run here says nothing about the file: python-hcl2's error stands.
    with contextlib.suppress(BakeUnavailable):
        run_print(buildx, path, env)
