"""Code versions: what decides a target's build, hashed, so Dagster knows what changed.

A target's definition is its bake entry as bake resolves it with inputs linked (PUBLISHED_INPUTS
unset), with the arch written as `${GPU_ARCH}`, the per-run args left out (RUN_ID, MAX_JOBS, the
history name, the sccache log level), tags cut to their repository and a registry input named by
the target that pushes it; plus the bytes of its Dockerfile and of every local file that
Dockerfile reads (COPY/ADD sources and RUN bind mounts, after `.dockerignore`). Inputs are not
in it: their pushed digests are their data versions, and Dagster carries those to dependents.

A per-arch target's definition holds each distinct arch-abstracted entry once, so a new arch
that resolves like the others changes no code version; it shows as missing partitions instead.
"""

import hashlib
import json
import os
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import dockerfile as dockerfile_parser

from rocm_assets.core.bake import BakeGraph
from rocm_assets.core.bake.targets import IMAGE_PREFIX, TARGET_PREFIX, Target
from rocm_assets.core.build.recipes import dockerfile_path
from rocm_assets.core.common.constants import (
    ARCH_VAR,
    BUILD_NAME_ARG,
    MAX_JOBS_ARG,
    RUN_ID_VAR,
    SCCACHE_LOG_VAR,
)

if TYPE_CHECKING:
    from docker.utils.build import PatternMatcher

# Args that change every run or only change logging: a new value rebuilds nothing.
PER_RUN_ARGS = frozenset({RUN_ID_VAR, MAX_JOBS_ARG, BUILD_NAME_ARG, SCCACHE_LOG_VAR})
# Documentation, not build input.
IGNORED_FIELDS = frozenset({"description"})
ARCH_PLACEHOLDER = f"${{{ARCH_VAR}}}"
# The materialization metadata entry that holds the definition a build was made from.
DEFINITION_METADATA = "code_definition"
_VARIABLE = re.compile(r"\$(\{[^}]*\}|[A-Za-z_][A-Za-z0-9_]*)")
_URL = re.compile(r"^[a-z][a-z0-9+.-]*://|^git@")


@dataclass(frozen=True)
class Definition:
    """What decides one target's build: `fields` (its abstracted bake entries), and sha256 of its
    Dockerfile and of each local file it reads, by path relative to the bake file's directory."""

    target: str
    fields: tuple[Mapping[str, Any], ...]
    dockerfile: str
    files: Mapping[str, str]

    def to_json(self) -> dict[str, Any]:
        return {
            "fields": list(self.fields),
            "dockerfile": self.dockerfile,
            "files": dict(self.files),
        }

    @property
    def version(self) -> str:
        text = json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _digest_or_reason(path: Path) -> str:
    try:
        return _sha256(path)
    except OSError as exc:
        return f"unreadable: {exc.strerror}"


def _repository(tag: str) -> str:
    """`host:port/ns/name:tag` -> `host:port/ns/name` (a digest is cut too)."""
    name = tag.split("@", 1)[0]
    slash = name.rfind("/")
    colon = name.rfind(":")
    return name[:colon] if colon > slash else name


def _abstract(value: Any, arch: str) -> Any:
    if isinstance(value, str):
        return value.replace(arch, ARCH_PLACEHOLDER)
    if isinstance(value, list):
        return [_abstract(v, arch) for v in value]
    if isinstance(value, dict):
        return {k: _abstract(v, arch) for k, v in value.items()}
    return value


def entry_fields(graph: BakeGraph, target: Target, arch: str) -> dict[str, Any]:
    """One resolved bake entry as the definition holds it."""
    resolved = graph.resolve(arch)
    fields: dict[str, Any] = {}
    for key, value in target.printed.items():
        if key in IGNORED_FIELDS:
            continue
        if key == "args":
            value = {k: v for k, v in value.items() if k not in PER_RUN_ARGS}
        elif key == "tags":
            value = sorted({_repository(t) for t in value})
        elif key == "contexts":
            value = {
                name: (
                    f"{TARGET_PREFIX}{owner}"
                    if ref.startswith(IMAGE_PREFIX)
                    and (owner := resolved.tag_owner(ref.removeprefix(IMAGE_PREFIX)))
                    else ref
                )
                for name, ref in value.items()
            }
        fields[key] = value
    return _abstract(fields, arch)


def _ignore(context: Path, dockerfile: Path) -> "PatternMatcher | None":
    """BuildKit's ignore file: `<Dockerfile>.dockerignore` beside it, else the context's."""
    for candidate in (
        dockerfile.with_name(f"{dockerfile.name}.dockerignore"),
        context / ".dockerignore",
    ):
        if candidate.is_file():
            # The docker SDK's matcher (Docker's own rules); it costs 0.14 s to import, so only
            # a context with an ignore file pays for it.
            from docker.utils.build import PatternMatcher

            lines = candidate.read_text(encoding="utf-8", errors="replace").splitlines()
            patterns = [
                ln.strip() for ln in lines if ln.strip() and not ln.lstrip().startswith("#")
            ]
            return PatternMatcher(patterns)
    return None


def _expand(text: str, args: Mapping[str, str]) -> str | None:
    """`$NAME` and `${NAME}` from the build args; None if one is not a plain arg."""
    unknown = False

    def sub(match: re.Match[str]) -> str:
        nonlocal unknown
        name = match[1].strip("{}")
        if name not in args:
            unknown = True
            return ""
        return args[name]

    out = _VARIABLE.sub(sub, text)
    return None if unknown else out


def _local_sources(path: Path, args: Mapping[str, str]) -> Iterator[str | None]:
    """What the Dockerfile reads from its local context, as written; None: it cannot be told
    (a source names a variable the build args do not give), so the whole context counts."""
    try:
        commands = dockerfile_parser.parse_file(str(path))
    except (OSError, dockerfile_parser.GoIOError, dockerfile_parser.GoParseError):
        # BuildKit will refuse it and `rocm-assets check` names why; its bytes are in the hash.
        return
    for command in commands:
        flags = [f.lower() for f in command.flags]
        if command.cmd.upper() in ("COPY", "ADD") and not any(
            f.startswith("--from=") for f in flags
        ):
            for source in command.value[:-1]:
                if source.startswith("<<") or _URL.match(source):
                    continue
                yield _expand(source, args)
        elif command.cmd.upper() == "RUN":
            for flag in flags:
                if not flag.startswith("--mount="):
                    continue
                options = dict(
                    part.split("=", 1) if "=" in part else (part, "")
                    for part in flag.removeprefix("--mount=").split(",")
                )
                if options.get("type", "bind") == "bind" and "from" not in options:
                    yield _expand(options.get("source", options.get("src", ".")), args)


def _files_under(root: Path, relative: str) -> Iterator[str]:
    base = root / relative
    if base.is_file():
        yield relative
    elif base.is_dir():
        for dirpath, dirnames, filenames in os.walk(base):
            dirnames.sort()
            for name in sorted(filenames):
                yield os.path.relpath(os.path.join(dirpath, name), root)


def context_files(context: Path, dockerfile: Path, args: Mapping[str, str]) -> list[Path]:
    """The local files a build of `dockerfile` in `context` reads, after the ignore file."""
    ignore = _ignore(context, dockerfile)
    sources = list(_local_sources(dockerfile, args))
    patterns = ["."] if None in sources else [s for s in sources if s is not None]
    found: set[str] = set()
    for pattern in patterns:
        relative = os.path.normpath(pattern.lstrip("/")) or "."
        if any(ch in relative for ch in "*?["):
            matches: Iterable[str] = sorted(
                str(p.relative_to(context)) for p in context.glob(relative)
            )
        else:
            matches = [relative]
        for match in matches:
            for name in _files_under(context, match):
                if name != "." and (ignore is None or not ignore.matches(name)):
                    found.add(name)
    return [context / name for name in sorted(found)]


def definition(graph: BakeGraph, target: str) -> Definition:
    """The definition of `target`: over every arch it builds for (a noarch target: the one)."""
    arches = (
        graph.arches if target in graph.per_arch else (graph.build_arch(target, graph.arches[0]),)
    )
    entries = {}
    for arch in arches:
        fields = entry_fields(graph, graph.resolve(arch).targets[target], arch)
        entries[json.dumps(fields, sort_keys=True)] = fields
    resolved = graph.resolve(arches[0]).targets[target]
    root = graph.path.parent
    path = dockerfile_path(graph, resolved)
    context = (root / resolved.context).resolve()
    # A file that cannot be read is part of the definition as such: loading never fails on it,
    # and the build itself says what is wrong.
    files = {
        os.path.relpath(f, root): _digest_or_reason(f)
        for f in context_files(context, path, resolved.args)
    }
    return Definition(
        target=target,
        fields=tuple(entries[k] for k in sorted(entries)),
        dockerfile=_digest_or_reason(path),
        files=files,
    )


def definitions(graph: BakeGraph) -> dict[str, Definition]:
    """Every asset target's definition."""
    return {target: definition(graph, target) for target in graph.asset_targets}


def changes(old: Mapping[str, Any], new: Definition) -> list[str]:
    """What differs between a recorded definition (`Definition.to_json`) and `new`, one short
    phrase each: `args VLLM_REF`, `Dockerfile`, `context docker/bin/build-env`, `tags`."""
    found: list[str] = []
    before, after = old.get("fields") or [], [dict(f) for f in new.fields]
    if before != after:
        keys = sorted({k for f in (*before, *after) for k in f})
        for key in keys:
            olds = [f.get(key) for f in before]
            news = [f.get(key) for f in after]
            if olds == news:
                continue
            if all(isinstance(v, dict) for v in (*olds, *news)):
                names = sorted(
                    {n for o, n_ in zip(olds or [{}], news or [{}], strict=False)
                     for n in {*o, *n_} if o.get(n) != n_.get(n)}
                )  # fmt: skip
                found.append(f"{key} {', '.join(names)}" if names else key)
            else:
                found.append(key)
        if not found:
            found.append("arches")
    if old.get("dockerfile") != new.dockerfile:
        found.append("Dockerfile")
    old_files = old.get("files") or {}
    touched = sorted(
        name for name in {*old_files, *new.files} if old_files.get(name) != new.files.get(name)
    )
    found.extend(f"context {name}" for name in touched)
    return found
