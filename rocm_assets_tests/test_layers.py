"""The package's layers hold: the folders say what may import what, and this checks they do.

- `rocm_assets.core` never imports Dagster or another layer, not even lazily: every module of it
  imports in a fresh interpreter with `dagster` absent from sys.modules afterwards.
- `rocm_assets.instance` (the run coordinator, loaded by the webserver and daemon) never imports
  `rocm_assets.defs` or `rocm_assets.cli`; `rocm_assets.defs` never imports `rocm_assets.cli`.
- No module under `rocm_assets/` is over 600 lines, and no test double lives in the product.

Real: the installed package and a fresh Python interpreter; nothing is mocked.
"""

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rocm_assets_tests.helpers import PROJECT_ROOT

PACKAGE = PROJECT_ROOT / "rocm_assets"
MAX_LINES = 600


def _module(path: Path) -> str:
    parts = path.relative_to(PROJECT_ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules(layer: str) -> list[str]:
    return sorted(_module(p) for p in (PACKAGE / layer).rglob("*.py"))


def _imports(path: Path) -> set[str]:
    """Every module `path` imports, at the top or inside a function."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


_PROBE = """
import importlib, json, sys
loaded = {}
for name in sys.argv[1:]:
    importlib.import_module(name)
    loaded[name] = sorted(m for m in sys.modules if m == "dagster" or m.startswith("dagster."))[:3]
print(json.dumps(loaded))
"""


def test_every_core_module_imports_without_dagster() -> None:
    modules = _modules("core")
    assert "rocm_assets.core.placement.online" in modules and len(modules) > 20
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, *modules],
        capture_output=True,
        text=True,
        check=False,
        cwd=PROJECT_ROOT,
    )
    assert done.returncode == 0, done.stderr
    loaded = json.loads(done.stdout)
    assert {name: mods for name, mods in loaded.items() if mods} == {}


def test_the_code_location_loads_without_the_instance_side() -> None:
    # The builder claims' SQL tables load alembic (0.3 s a load); only a build run needs them.
    probe = (
        "import sys, rocm_assets.definitions; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'alembic' "
        "or m.startswith('rocm_assets.instance.')))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=False, cwd=PROJECT_ROOT
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_a_warm_load_imports_neither_python_hcl2_nor_httpx(tmp_path: Path) -> None:
    # Issue 36: lark (0.15 s) is needed only to read a file not read before, httpx (0.27 s with
    # httpcore) only to ask a registry; the code location's load over `import dagster` is 0.25 s
    # without them. The first load reads the outline (and imports python-hcl2); the next does not.
    probe = (
        "import sys, rocm_assets.definitions as d; d.defs().get_repository_def(); "
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'lark', 'hcl2', 'httpx', "
        "'httpcore'}))"
    )
    env = {**os.environ, "ROCM_CACHE_DIR": str(tmp_path / "cache")}
    argv = [sys.executable, "-c", probe]
    runs = [
        subprocess.run(argv, capture_output=True, text=True, check=False, cwd=PROJECT_ROOT, env=env)
        for _ in range(2)
    ]
    assert all(r.returncode == 0 for r in runs), runs[0].stderr
    assert [r.stdout.strip().splitlines()[-1] for r in runs] == ["['hcl2', 'lark']", "[]"]


@pytest.mark.parametrize(
    ("layer", "forbidden"),
    [
        (
            "core",
            ("dagster", "dagster_", "rocm_assets.defs", "rocm_assets.instance", "rocm_assets.cli"),
        ),
        ("instance", ("rocm_assets.defs", "rocm_assets.cli", "rocm_assets.definitions")),
        ("defs", ("rocm_assets.cli",)),
    ],
)
def test_a_layer_imports_only_inwards(layer: str, forbidden: tuple[str, ...]) -> None:
    wrong = {
        _module(path): sorted(m for m in _imports(path) if m.startswith(forbidden))
        for path in (PACKAGE / layer).rglob("*.py")
    }
    assert {name: mods for name, mods in wrong.items() if mods} == {}


# The placement authority (issue 43): who holds which machine, and what a run's placement tags
# say, change in one module; the code location reaches the instance side only through it.
AUTHORITY = "rocm_assets.instance.authority"
PLACEMENT_TAGS = ("ROCM_PLACEMENT_TAG", "ROCM_NODE_TAG", "ROCM_BUILDER_TAG", "ROCM_WAITING_FOR_TAG")
CLAIM_CHANGES = (
    "claim_builder",
    "release_run",
    "release_claim",
    "renew_lease",
    "end_lease",
    "keep_from_dagster",
    "ensure_builder_pools",
)


def _writes(path: Path) -> set[str]:
    """Placement tags `path` puts in a dict (what `add_run_tags` is given), and the claims'
    changes it calls; reading a tag (`tags.get(ROCM_NODE_TAG)`, a run filter) is no write."""
    found: set[str] = set()
    tree = ast.parse(path.read_text(), str(path))
    # A run filter's `tags={...}` selects runs by their tags: a read.
    filters = {
        id(k.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        for k in node.keywords
        if k.arg == "tags"
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict) and id(node) not in filters:
            found.update(
                k.id for k in node.keys if isinstance(k, ast.Name) and k.id in PLACEMENT_TAGS
            )
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr in CLAIM_CHANGES:
                found.add(node.func.attr)
    return found


def test_placement_state_changes_in_the_authority_alone() -> None:
    writers = {
        _module(p): sorted(_writes(p))
        for p in PACKAGE.rglob("*.py")
        if _module(p) not in (AUTHORITY, "rocm_assets.instance.claims")
    }
    assert {name: w for name, w in writers.items() if w} == {}
    # The check sees the writes where they are.
    assert set(_writes(PACKAGE / "instance" / "authority.py")) >= {*PLACEMENT_TAGS, "claim_builder"}


def test_the_code_location_uses_only_the_authority_of_the_instance_side() -> None:
    allowed = (AUTHORITY, "rocm_assets.instance.dagster_internals")
    reached = {
        _module(path): sorted(
            m
            for m in _imports(path)
            if m.startswith("rocm_assets.instance")
            and not m.startswith(allowed)
            and m != "rocm_assets.instance"
        )
        for path in (PACKAGE / "defs").rglob("*.py")
    }
    assert {name: mods for name, mods in reached.items() if mods} == {}


def test_no_instance_function_is_over_60_lines() -> None:
    long = {
        f"{_module(path)}.{node.name}": node.end_lineno - node.lineno + 1
        for path in (PACKAGE / "instance").rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text(), str(path)))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno is not None
        and node.end_lineno - node.lineno + 1 > 60
    }
    assert long == {}


def test_no_module_is_over_600_lines() -> None:
    sizes = {_module(p): len(p.read_text().splitlines()) for p in PACKAGE.rglob("*.py")}
    assert {name: n for name, n in sizes.items() if n > MAX_LINES} == {}


def test_no_test_double_ships_in_the_package() -> None:
    servers = {
        _module(path): sorted(m for m in _imports(path) if m.startswith("http.server"))
        for path in PACKAGE.rglob("*.py")
    }
    assert {name: mods for name, mods in servers.items() if mods} == {}
    assert not any("class Fake" in p.read_text() for p in PACKAGE.rglob("*.py"))


def test_private_dagster_apis_stay_in_one_module() -> None:
    private = {
        _module(path): sorted(m for m in _imports(path) if m.startswith("dagster._"))
        for path in PACKAGE.rglob("*.py")
    }
    users = {name for name, mods in private.items() if mods}
    assert users == {"rocm_assets.instance.dagster_internals"}


def _import_graph() -> dict[str, set[str]]:
    """Module -> the package's modules it imports (at the top, lazily or for types only);
    `from pkg import mod` is an edge to `mod`, not to `pkg`."""
    modules = {_module(p): p for p in PACKAGE.rglob("*.py")}

    def owner(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        found: set[str | None] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                found.update(owner(a.name) for a in node.names if a.name.startswith("rocm_assets"))
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("rocm_assets"):
                for alias in node.names:
                    full = f"{node.module}.{alias.name}"
                    found.add(full if full in modules else owner(str(node.module)))
        graph[name] = {m for m in found if m and m != name}
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan's, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    circles.append(sorted(group))
    return circles


def test_no_module_imports_one_that_imports_it_back() -> None:
    # Type-only and lazy imports count: a circle is a circle however it is hidden.
    assert _circles(_import_graph()) == []
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_core_is_a_few_rooms_grouped_by_concern() -> None:
    entries = sorted(p.name for p in (PACKAGE / "core").iterdir() if p.name != "__pycache__")
    assert len(entries) <= 8, entries
    assert entries == [
        "__init__.py", "bake", "build", "common", "nodes", "placement", "registry",
    ]  # fmt: skip
    # The shared names depend on no room; every room may use them.
    common = {
        m: deps for m, deps in _import_graph().items() if m.startswith("rocm_assets.core.common")
    }
    assert {m: d for m, d in common.items() if d - set(common)} == {}
