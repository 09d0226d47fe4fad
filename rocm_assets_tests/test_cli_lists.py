"""List options lose nothing: a repeated `--arch` or `--targets` adds, never replaces.

Every list option of every `rocm-assets` command: `plan --arch/--targets`, `preflight --targets`,
`backfill --arch/--targets`, `build-all --arch` (its bakes: test_make.py). Real: the CLI in a fresh interpreter for plan (the shipped bake file
and fleet, no server needed); the parser and the backfill's selection for backfill (its launch
needs a webserver, which test_backfill.py drives); the parser for preflight.
"""

import json

import pytest

from rocm_assets.cli.backfill import select
from rocm_assets.cli.main import build_parser
from rocm_assets.core.bake import load_graph
from rocm_assets_tests.helpers import SHIPPED_BAKE_FILE, rocm_assets_cli


def _plan(*args: str) -> dict:
    done = rocm_assets_cli("plan", "--json", "--strategy", "greedy", *args)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_plan_arch_repeated_equals_listed() -> None:
    repeated = _plan("--group", "default", "--arch", "gfx942", "--arch", "gfx1250")
    listed = _plan("--group", "default", "--arch", "gfx942", "gfx1250")
    assert repeated == listed
    assert {b["arch"] for b in repeated["builds"]} == {"gfx942", "gfx1250", None}


def test_plan_targets_repeated_equals_listed() -> None:
    repeated = _plan("--targets", "vllm", "--targets", "vllm-wheel", "--arch", "gfx950")
    listed = _plan("--targets", "vllm", "vllm-wheel", "--arch", "gfx950")
    assert repeated == listed
    assert {b["target"] for b in repeated["builds"]} == {"vllm", "vllm-wheel"}


@pytest.mark.parametrize(
    ("repeated", "listed", "field", "value"),
    [
        (
            ["preflight", "--arch", "gfx942", "--targets", "vllm", "--targets", "vllm-wheel"],
            ["preflight", "--arch", "gfx942", "--targets", "vllm", "vllm-wheel"],
            "targets",
            ["vllm", "vllm-wheel"],
        ),
        (
            ["backfill", "--group", "serving", "--arch", "gfx942", "--arch", "gfx1100"],
            ["backfill", "--group", "serving", "--arch", "gfx942", "gfx1100"],
            "arch",
            ["gfx942", "gfx1100"],
        ),
        (
            ["backfill", "--targets", "vllm", "--targets", "lmcache", "--arch", "gfx942"],
            ["backfill", "--targets", "vllm", "lmcache", "--arch", "gfx942"],
            "targets",
            ["vllm", "lmcache"],
        ),
        (
            ["build-all", "--builder", "b", "--arch", "gfx942", "--arch", "gfx950"],
            ["build-all", "--builder", "b", "--arch", "gfx942", "gfx950"],
            "arch",
            ["gfx942", "gfx950"],
        ),
        (
            ["plan", "--arch", "gfx942", "--arch", "gfx950", "--arch", "gfx1100"],
            ["plan", "--arch", "gfx942", "gfx950", "gfx1100"],
            "arch",
            ["gfx942", "gfx950", "gfx1100"],
        ),
    ],
)
def test_repeated_list_option_parses_as_one_list(
    repeated: list[str], listed: list[str], field: str, value: list[str]
) -> None:
    parser = build_parser()
    a, b = parser.parse_args(repeated), parser.parse_args(listed)
    assert getattr(a, field) == getattr(b, field) == value
    assert vars(a) == vars(b)


def test_backfill_selection_keeps_every_repeated_arch() -> None:
    graph = load_graph(SHIPPED_BAKE_FILE, {})
    args = build_parser().parse_args(
        ["backfill", "--group", "serving", "--arch", "gfx942", "--arch", "gfx1201"]
    )
    selection = select(graph, group=args.group, targets=args.targets, arches=args.arch)
    assert selection.arches == ("gfx942", "gfx1201")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["plan", "--arch"],
            "rocm-assets: error: plan: argument --arch: expected at least one argument",
        ),
        (
            ["plan", "--targets"],
            "rocm-assets: error: plan: argument --targets: expected at least one argument",
        ),
        (
            ["preflight", "--arch", "gfx942", "--targets"],
            "rocm-assets: error: preflight: argument --targets: expected at least one argument",
        ),
        (
            ["backfill", "--group", "serving", "--arch"],
            "rocm-assets: error: backfill: argument --arch: expected at least one argument",
        ),
    ],
)
def test_an_empty_list_is_refused_in_one_line(args: list[str], message: str) -> None:
    done = rocm_assets_cli(*args)
    assert done.returncode == 2
    assert done.stderr == message + "\n"
