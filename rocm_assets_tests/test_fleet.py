"""Tests for rocm_assets.core.nodes.fleet: manifest validation, path resolution, probe parsing and probing.

Real parts: the probes run against Debian's OpenSSH sshd started by the `sshd_server` fixture
(rocm_assets_tests/servers/sshd.py) on loopback, with real key exchange, host-key checking,
public-key login and the probe's sh script executed by sshd. Canned per node: /proc/meminfo, the
/proc/stat samples, `nproc` and `docker`. The slow node is a real TCP listener that never speaks
SSH; the unreachable node is a closed loopback port.
"""

import copy
import os
import socket
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from rocm_assets.core.common.constants import FLEET_FILE_ENV, SSH_KNOWN_HOSTS_ENV
from rocm_assets.core.nodes.fleet import (
    DEFAULT_TARGET_COST,
    Fleet,
    FleetError,
    Node,
    TargetCost,
    fleet_path,
    load_fleet,
    parse_fleet,
)
from rocm_assets.core.nodes.probes import (
    CpuSample,
    NodeProbe,
    ProbeError,
    best_node,
    idle_cores,
    parse_cpu_sample,
    parse_meminfo_available,
    parse_probe_output,
    probe_fleet,
    probe_node,
    probe_script,
)
from rocm_assets_tests.helpers import free_port
from rocm_assets_tests.servers.sshd import SshdServer

# The seed's sixteen bake targets.
SEED_TARGETS = {
    "rocm-runtime",
    "pytorch-base",
    "pytorch-src",
    "triton-wheel",
    "cupy-wheel",
    "pytorch",
    "pytorch-wheel",
    "pytorch-run",
    "pytorch-test",
    "aiter-wheel",
    "torchvision-wheel",
    "nixl-wheel",
    "lmcache",
    "lmcache-wheel",
    "vllm",
    "vllm-wheel",
}

BASE: dict[str, Any] = {
    "nodes": [
        {
            "name": "snoc-think",
            "builder": "snoc-think",
            "ssh": "root@snoc-think",
            "cores": 32,
            "mem_gb": 122,
            "link_mbps": 1000,
            "gpus": ["gfx942"],
        },
        {
            "name": "snoc-gaming",
            "builder": "snoc-gaming",
            "cores": 16,
            "mem_gb": 15,
            "link_mbps": 100,
        },
        {"name": "snoc-nuc", "builder": "snoc-nuc", "cores": 8, "mem_gb": 32, "link_mbps": 40},
    ],
    "target_costs": {
        "reference": {"cores": 32, "mem_gb": 122},
        "pytorch": {"seconds": 7200, "size_gb": 6.0},
    },
}


def _edited(edit: Callable[[dict[str, Any]], None]) -> str:
    doc = copy.deepcopy(BASE)
    edit(doc)
    return yaml.safe_dump(doc, sort_keys=False)


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


# --- fleet.yaml validation ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        # A typo'd or invented field on a node.
        (lambda d: d["nodes"][0].update(colour="red"), "nodes[0].colour: unknown key"),
        # A required figure left out.
        (lambda d: d["nodes"][0].pop("cores"), "nodes[0].cores: missing"),
        # Two entries for one machine.
        (
            lambda d: d["nodes"][1].update(name="snoc-think"),
            "nodes[1].name: duplicate node name 'snoc-think'",
        ),
        # Non-positive figures.
        (lambda d: d["nodes"][2].update(cores=0), "nodes[2].cores: must be > 0 (got 0)"),
        (lambda d: d["nodes"][1].update(link_mbps=-5), "nodes[1].link_mbps: must be > 0 (got -5)"),
        (
            lambda d: d["target_costs"]["pytorch"].update(seconds=0),
            "target_costs.pytorch.seconds: must be > 0 (got 0)",
        ),
        (
            lambda d: d["target_costs"]["pytorch"].update(size_gb=-1.0),
            "target_costs.pytorch.size_gb: must be >= 0 (got -1.0)",
        ),
        (
            lambda d: d["target_costs"]["reference"].update(mem_gb=0),
            "target_costs.reference.mem_gb: must be > 0 (got 0)",
        ),
        # Wrong types: a string for a count, a bare string for the gpu list.
        (
            lambda d: d["nodes"][0].update(cores="many"),
            "nodes[0].cores: input should be a valid integer (got 'many')",
        ),
        (
            lambda d: d["nodes"][0].update(gpus="gfx942"),
            "nodes[0].gpus: input should be a valid tuple (got 'gfx942')",
        ),
        # Unknown keys elsewhere: top level, inside a cost entry.
        (lambda d: d.update(colour="red"), "colour: unknown key"),
        (
            lambda d: d["target_costs"]["pytorch"].update(cores=3),
            "target_costs.pytorch.cores: unknown key",
        ),
        # Structure left out.
        (lambda d: d["target_costs"].pop("reference"), "target_costs.reference: missing"),
        (lambda d: d.pop("target_costs"), "target_costs: missing"),
        (lambda d: d.pop("nodes"), "nodes: missing"),
        (lambda d: d.update(nodes=[]), "nodes: must list at least one node"),
        (lambda d: d["nodes"][0].update(name=""), "nodes[0].name: must not be empty"),
        # Two entries for one machine: both named, whatever the entries are called.
        (
            lambda d: d["nodes"][2].update(builder="snoc-think"),
            "nodes[2].builder: 'snoc-think' is also the builder of node 'snoc-think' "
            "(nodes[0]); a machine is one entry",
        ),
        # Figures that are not finite, or past any real machine, never reach placement.
        (
            lambda d: d["nodes"][0].update(mem_gb=float("inf")),
            "nodes[0].mem_gb: must be a finite number (got inf)",
        ),
        (
            lambda d: d["nodes"][1].update(link_mbps=float("nan")),
            "nodes[1].link_mbps: must be a finite number (got nan)",
        ),
        (
            lambda d: d["target_costs"]["pytorch"].update(seconds=float("-inf")),
            "target_costs.pytorch.seconds: must be a finite number (got -inf)",
        ),
        (
            lambda d: d["target_costs"]["pytorch"].update(size_gb=1e308),
            "target_costs.pytorch.size_gb: must be <= 100000 (got 1e+308)",
        ),
        (
            lambda d: d["nodes"][0].update(cores=10**9),
            "nodes[0].cores: must be <= 65536 (got 1000000000)",
        ),
        # Several problems: the first is named and the rest counted, still on one line.
        (
            lambda d: [n.update(cores=0) for n in d["nodes"]],
            "nodes[0].cores: must be > 0 (got 0) (and 2 more)",
        ),
    ],
)
def test_load_fleet_names_the_bad_field(
    tmp_path: Path, edit: Callable[[dict[str, Any]], None], expected: str
) -> None:
    path = _write(tmp_path / "fleet.yaml", _edited(edit))
    with pytest.raises(FleetError) as caught:
        load_fleet(path)
    assert str(caught.value) == f"{path}: {expected}"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # Unclosed flow mapping: the parser's line and column.
        (
            "nodes: [\n  {name: a\n",
            ":3:1: invalid YAML: expected ',' or '}', but got '<stream end>'",
        ),
        # A tab where YAML wants spaces.
        (
            "nodes:\n\t- x\n",
            ":2:1: invalid YAML: found character '\\t' that cannot start any token",
        ),
        # A repeated key would otherwise silently keep the last value.
        (
            "nodes:\n  - name: a\n    name: b\n",
            ":3:5: invalid YAML: duplicate key 'name'",
        ),
        ("", ": empty file; expected nodes: and target_costs:"),
        # Keys YAML reads as a number, null, a boolean or a list: refused where they are.
        ("1: x\nnodes: []\n", ":1:1: invalid YAML: a key must be a string, not int 1; quote it"),
        (
            "null: x\n",
            ":1:1: invalid YAML: a key must be a string, not NoneType None; quote it",
        ),
        (
            "nodes:\n  - on: 1\n",
            ":2:5: invalid YAML: a key must be a string, not bool True; quote it",
        ),
        ("? [a]\n: x\n", ":1:3: invalid YAML: a key must be a string, not a list or mapping"),
        # A date that does not exist: the constructor's error, at the value.
        (
            "nodes:\n  - cores: 2001-02-30\n",
            ":2:12: invalid YAML: unreadable value: day is out of range for month",
        ),
        ("nodes: " + "[" * 50 + "]" * 50, ":1:23: invalid YAML: nested deeper than 16 levels"),
        ("nodes:\n  - <<: {name: a}\n", ":2:5: invalid YAML: merge keys (<<) are not supported"),
        (
            "nodes: !!python/object/apply:os.system [true]\n",
            ":1:8: invalid YAML: could not determine a constructor for the tag "
            "'tag:yaml.org,2002:python/object/apply:os.system'",
        ),
        ("- a\n- b\n", ": expected a mapping with nodes: and target_costs:"),
    ],
)
def test_load_fleet_reports_yaml_problems_with_line(
    tmp_path: Path, text: str, expected: str
) -> None:
    path = _write(tmp_path / "fleet.yaml", text)
    with pytest.raises(FleetError) as caught:
        load_fleet(path)
    assert str(caught.value) == f"{path}{expected}"


# The 536-byte file: nine levels of nine aliases under an unknown key, a billion strings
# once expanded. It is refused where the first anchor is, before anything is built.
ALIAS_BOMB = "\n".join(
    [
        "nodes: []",
        "extra:",
        '  a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]',
        *(
            f"  {chr(98 + i)}: &{chr(98 + i)} [{','.join([f'*{chr(97 + i)}'] * 9)}]"
            for i in range(8)
        ),
    ]
)


def test_an_alias_bomb_is_refused_at_its_first_anchor(tmp_path: Path) -> None:
    path = _write(tmp_path / "fleet.yaml", ALIAS_BOMB)
    assert len(ALIAS_BOMB) < 600
    with pytest.raises(FleetError) as caught:
        load_fleet(path)
    assert str(caught.value) == (
        f"{path}:3:6: invalid YAML: anchors and aliases (&name, *name) are not supported; "
        "write the value out"
    )


def test_values_in_errors_are_quoted_short_and_on_one_line(tmp_path: Path) -> None:
    huge = "x" * 100_000
    path = _write(
        tmp_path / "fleet.yaml",
        _edited(lambda d: d["nodes"][0].update(cores=huge + "\n\x1b[31m")),
    )
    with pytest.raises(FleetError) as caught:
        load_fleet(path)
    assert (
        str(caught.value)
        == f"{path}: nodes[0].cores: input should be a valid integer (got '{'x' * 56}...)"
    )
    tag = _write(tmp_path / "tag.yaml", f"nodes: !{huge} a\n")
    with pytest.raises(FleetError) as caught:
        load_fleet(tag)
    assert len(str(caught.value)) < len(str(tag)) + 240


def test_exponent_floats_read_as_numbers() -> None:
    fleet = parse_fleet(_edited(lambda d: None).replace("seconds: 7200", "seconds: 7.2e3"), "f")
    assert fleet.cost("pytorch").seconds == 7200.0
    fleet = parse_fleet(_edited(lambda d: None).replace("seconds: 7200", "seconds: 72e2"), "f")
    assert fleet.cost("pytorch").seconds == 7200.0


def test_a_fleet_file_past_the_cap_is_refused_unread(tmp_path: Path) -> None:
    # /dev/zero never ends: only the cap plus one byte is read.
    with pytest.raises(FleetError) as caught:
        load_fleet("/dev/zero")
    assert str(caught.value) == "/dev/zero: larger than 256 KiB; not a fleet file"
    big = _write(tmp_path / "fleet.yaml", "# " + "x" * (256 << 10) + "\n")
    with pytest.raises(FleetError, match=r"larger than 256 KiB; not a fleet file$"):
        load_fleet(big)


def test_an_unforeseen_error_is_still_a_fleet_error(monkeypatch: pytest.MonkeyPatch) -> None:
    # Stands in for a bug or a library surprise at the boundary: one line, the cause kept.
    def broken(data: object) -> None:
        raise KeyError("surprise")

    monkeypatch.setattr(Fleet, "model_validate", broken)
    with pytest.raises(FleetError) as caught:
        parse_fleet(_edited(lambda d: None), "fleet.yaml")
    assert str(caught.value) == "fleet.yaml: cannot read the fleet: KeyError: 'surprise'"
    assert isinstance(caught.value.__cause__, KeyError)


def test_load_fleet_missing_file_says_how_to_point_at_one(tmp_path: Path) -> None:
    path = tmp_path / "nowhere.yaml"
    with pytest.raises(FleetError) as caught:
        load_fleet(path)
    assert str(caught.value) == (
        f"{path}: cannot read fleet file: No such file or directory "
        f"(set {FLEET_FILE_ENV} or pass a path)"
    )


def test_parse_fleet_keeps_reference_apart_from_target_costs() -> None:
    fleet = parse_fleet(_edited(lambda d: None), "inline")
    assert fleet.reference.cores == 32
    assert set(fleet.costs) == {"pytorch"}
    assert fleet.nodes[0].gpus == ("gfx942",)
    assert fleet.nodes[1].ssh is None


def test_fleet_cost_falls_back_to_the_stated_default() -> None:
    fleet = parse_fleet(_edited(lambda d: None), "inline")
    assert fleet.cost("pytorch") == TargetCost(seconds=7200, size_gb=6.0)
    assert fleet.cost("not-in-table") == DEFAULT_TARGET_COST == TargetCost(seconds=600, size_gb=1)


def test_fleet_node_lookup_names_known_nodes() -> None:
    fleet = parse_fleet(_edited(lambda d: None), "inline")
    assert fleet.node("snoc-nuc").cores == 8
    with pytest.raises(FleetError, match=r"^no node 'gone' in the fleet \(nodes: snoc-think, "):
        fleet.node("gone")


def test_repo_fleet_yaml_covers_every_seed_target(project_root: Path) -> None:
    fleet = load_fleet(project_root / "fleet.yaml")
    names = [n.name for n in fleet.nodes]
    assert {"snoc-think", "snoc-gaming"} <= set(names)
    assert fleet.node("snoc-think").cores == 32
    assert fleet.node("snoc-gaming").mem_gb == 15
    assert set(fleet.costs) == SEED_TARGETS
    links = [n.link_mbps for n in fleet.nodes]
    assert max(links) / min(links) >= 25
    assert any("gfx942" in n.gpus for n in fleet.nodes)


# --- where the file comes from -----------------------------------------------------------------


def test_fleet_path_prefers_explicit_then_env_then_cwd(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(FLEET_FILE_ENV, raising=False)
    assert fleet_path() == Path("fleet.yaml")
    monkeypatch.setenv(FLEET_FILE_ENV, str(tmp_path / "env.yaml"))
    assert fleet_path() == tmp_path / "env.yaml"
    assert fleet_path(tmp_path / "arg.yaml") == tmp_path / "arg.yaml"
    assert fleet_path("arg.yaml") == Path("arg.yaml")


def test_load_fleet_reads_env_file_else_cwd(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env_file = _write(tmp_path / "from-env.yaml", _edited(lambda d: d["nodes"].pop()))
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    _write(cwd / "fleet.yaml", _edited(lambda d: None))
    monkeypatch.chdir(cwd)
    monkeypatch.setenv(FLEET_FILE_ENV, str(env_file))
    assert len(load_fleet().nodes) == 2
    monkeypatch.delenv(FLEET_FILE_ENV)
    assert len(load_fleet().nodes) == 3


# --- parsing probe output (pure) ---------------------------------------------------------------


def test_parse_meminfo_available_converts_kib_to_gib() -> None:
    text = "MemTotal:  131072000 kB\nMemAvailable:   52428800 kB\nBuffers: 1 kB\n"
    assert parse_meminfo_available(text) == 50.0


def test_parse_meminfo_available_without_the_line_is_a_probe_error() -> None:
    with pytest.raises(ProbeError, match="no MemAvailable"):
        parse_meminfo_available("MemTotal: 1 kB\n")


def test_parse_cpu_sample_counts_idle_and_iowait_and_skips_guest() -> None:
    # user nice system idle iowait irq softirq steal guest guest_nice
    sample = parse_cpu_sample("cpu  10 20 30 40 50 60 70 80 90 100")
    assert sample == CpuSample(idle=90, total=360)


@pytest.mark.parametrize(
    "line",
    [
        "cpu0 1 2 3 4 5",  # a per-core line, not the aggregate
        "cpu 1 2 x 4 5",  # a non-numeric field
        "cpu 1 2 3",  # too short to hold idle and iowait
        "",
    ],
)
def test_parse_cpu_sample_rejects_malformed_lines(line: str) -> None:
    with pytest.raises(ProbeError, match="unreadable /proc/stat cpu line"):
        parse_cpu_sample(line)


def test_idle_cores_scales_the_idle_share_by_core_count() -> None:
    assert idle_cores(CpuSample(100, 1000), CpuSample(400, 2000), 16) == 4.8


def test_idle_cores_refuses_samples_that_do_not_advance() -> None:
    with pytest.raises(ProbeError, match="do not advance"):
        idle_cores(CpuSample(100, 1000), CpuSample(100, 1000), 8)


NODE = Node(name="n1", builder="b1", ssh="root@n1", cores=8, mem_gb=32, link_mbps=100)
PROBE_OUTPUT = (
    "nproc 8\n"
    "MemAvailable:   16777216 kB\n"
    "stat0 cpu  100 0 100 700 100 0 0 0 0 0\n"
    "stat1 cpu  200 0 200 1300 300 0 0 0 0 0\n"
    "builder 0\n"
)


def test_parse_probe_output_reads_every_figure() -> None:
    probe = parse_probe_output(NODE, PROBE_OUTPUT, probed_at=12.5)
    assert probe == NodeProbe(
        node="n1",
        ok=True,
        reason=None,
        mem_available_gb=16.0,
        cores=8,
        idle_cores=6.4,  # Δidle 800 of Δtotal 1000, x 8 cores
        builder_ok=True,
        probed_at=12.5,
    )
    assert probe.score == pytest.approx(22.4)


def test_parse_probe_output_excludes_a_node_whose_builder_is_silent() -> None:
    probe = parse_probe_output(NODE, PROBE_OUTPUT.replace("builder 0", "builder 1"), probed_at=0)
    assert (probe.ok, probe.builder_ok) == (False, False)
    assert probe.reason == "builder 'b1' did not answer (docker exit 1)"
    assert probe.mem_available_gb == 16.0


@pytest.mark.parametrize("dropped", ["nproc", "stat1", "builder"])
def test_parse_probe_output_missing_line_is_a_probe_error(dropped: str) -> None:
    text = "\n".join(ln for ln in PROBE_OUTPUT.splitlines() if not ln.startswith(dropped))
    with pytest.raises(ProbeError, match=f"no '{dropped}' line"):
        parse_probe_output(NODE, text, probed_at=0)


def test_probe_script_quotes_the_builder_as_one_argument() -> None:
    script = probe_script("a b; touch /tmp/x", 0.25)
    assert "docker buildx inspect 'a b; touch /tmp/x' >/dev/null" in script
    assert "sleep 0.25" in script
    assert '"${PROC_ROOT:-/proc}"' in script


def test_probe_script_is_valid_posix_sh() -> None:
    checked = subprocess.run(
        ["sh", "-n", "-c", probe_script("b", 0.5)], capture_output=True, text=True, check=False
    )
    assert (checked.returncode, checked.stderr) == (0, "")


def test_probe_script_reads_this_machines_real_proc_by_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The production path: no PROC_ROOT, so the script reads /proc; run it with local sh.
    monkeypatch.delenv("PROC_ROOT", raising=False)
    # GNU nproc would report these instead of the CPUs this process may use.
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("OMP_THREAD_LIMIT", raising=False)
    done = subprocess.run(
        ["sh", "-c", probe_script("no-such-builder", 0.2)],
        capture_output=True,
        text=True,
        check=True,
    )
    probe = parse_probe_output(NODE, done.stdout, probed_at=0)
    assert probe.cores == len(os.sched_getaffinity(0))
    assert probe.mem_available_gb > 0
    assert 0 <= probe.idle_cores <= probe.cores
    assert not probe.builder_ok


def _probe(name: str, *, ok: bool, mem: float, idle: float) -> NodeProbe:
    return NodeProbe(
        node=name,
        ok=ok,
        reason=None if ok else "down",
        mem_available_gb=mem,
        cores=16,
        idle_cores=idle,
        builder_ok=ok,
        probed_at=0.0,
    )


def test_best_node_takes_the_highest_score_among_usable_nodes() -> None:
    probes = [
        _probe("ram", ok=True, mem=40, idle=2),  # 42
        _probe("cores", ok=True, mem=10, idle=16),  # 26
        _probe("down", ok=False, mem=500, idle=64),  # excluded however strong
    ]
    best = best_node(probes)
    assert best is not None
    assert best.node == "ram"
    assert best_node([probes[2]]) is None
    assert best_node([]) is None


def test_probe_node_without_ssh_uses_fleet_figures() -> None:
    node = Node(name="cloud", builder="cloud", cores=48, mem_gb=96, link_mbps=800)
    probe = probe_node(node)
    assert (probe.ok, probe.probed, probe.mem_available_gb, probe.idle_cores) == (
        True,
        False,
        96,
        48,
    )
    assert probe.score == 144


# --- probes against the real sshd --------------------------------------------------------------

# Generous per-phase bound: on a loaded 2-core CI box sshd can take over 2 s to send its
# banner. It costs time only when a probe fails, and failures here are not timeouts.
FAST = {"timeout_s": 15.0, "sample_s": 0.1}


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The user's ~/.ssh (known_hosts, config) must not decide what these tests see.
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv(SSH_KNOWN_HOSTS_ENV, raising=False)


def _node(sshd: SshdServer, canned: str, *, builder: str | None = None) -> Node:
    return Node(
        name=canned,
        builder=builder or f"{canned}-builder",
        ssh=sshd.ssh_address(canned),
        cores=1,
        mem_gb=1,
        link_mbps=100,
    )


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A TCP port that accepts connections (kernel backlog) and never sends an SSH banner."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        yield sock.getsockname()[1]


@pytest.mark.real
def test_probe_fleet_ranks_real_nodes_and_excludes_the_unreachable(
    sshd_server: SshdServer,
) -> None:
    dead_port = free_port()
    fleet = parse_fleet(
        yaml.safe_dump(
            {
                "nodes": [
                    _node(sshd_server, "small").model_dump(),
                    _node(sshd_server, "big").model_dump(),
                    {
                        "name": "dead",
                        "builder": "dead",
                        "ssh": f"root@127.0.0.1:{dead_port}",
                        "cores": 64,
                        "mem_gb": 512,
                        "link_mbps": 1000,
                    },
                    {
                        "name": "laptop",
                        "builder": "laptop",
                        "cores": 2,
                        "mem_gb": 4,
                        "link_mbps": 50,
                    },
                ],
                "target_costs": {"reference": {"cores": 32, "mem_gb": 122}},
            }
        ),
        "inline",
    )
    probes = probe_fleet(
        fleet,
        **FAST,
        connect_kwargs=sshd_server.connect_kwargs(),
        known_hosts=sshd_server.known_hosts,
    )
    by_name = {p.node: p for p in probes}
    assert [p.node for p in probes] == ["small", "big", "dead", "laptop"]

    big, small = by_name["big"], by_name["small"]
    assert (big.ok, big.probed, big.mem_available_gb, big.cores) == (True, True, 100.0, 32)
    assert big.idle_cores == pytest.approx(24.0)
    assert big.score == pytest.approx(124.0)
    assert (small.ok, small.mem_available_gb, small.cores) == (True, 8.0, 16)
    assert small.idle_cores == pytest.approx(4.0)
    assert small.score == pytest.approx(12.0)

    dead = by_name["dead"]
    assert not dead.ok
    assert dead.reason == f"ssh connection to root@127.0.0.1:{dead_port} refused"
    assert by_name["laptop"].probed is False

    best = best_node(probes)
    assert best is not None
    assert best.node == "big"


@pytest.mark.real
def test_probe_node_reports_a_builder_that_does_not_answer(sshd_server: SshdServer) -> None:
    probe = probe_node(
        _node(sshd_server, "big", builder="nope"),
        **FAST,
        connect_kwargs=sshd_server.connect_kwargs(),
        known_hosts=sshd_server.known_hosts,
    )
    assert (probe.ok, probe.builder_ok) == (False, False)
    assert probe.reason == "builder 'nope' did not answer (docker exit 1)"
    assert probe.mem_available_gb == 100.0


@pytest.mark.real
def test_probe_node_passes_a_hostile_builder_name_as_one_argument(
    sshd_server: SshdServer, tmp_path: Path
) -> None:
    marker = tmp_path / "injected"
    probe = probe_node(
        _node(sshd_server, "big", builder=f"x; touch {marker}"),
        **FAST,
        connect_kwargs=sshd_server.connect_kwargs(),
        known_hosts=sshd_server.known_hosts,
    )
    assert probe.reason == f"builder 'x; touch {marker}' did not answer (docker exit 1)"
    assert not marker.exists()


@pytest.mark.real
def test_probe_node_reads_known_hosts_from_env(
    sshd_server: SshdServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(SSH_KNOWN_HOSTS_ENV, str(sshd_server.known_hosts))
    probe = probe_node(
        _node(sshd_server, "small"), **FAST, connect_kwargs=sshd_server.connect_kwargs()
    )
    assert (probe.ok, probe.reason, probe.cores) == (True, None, 16)


@pytest.mark.real
def test_probe_node_rejects_a_host_key_not_in_known_hosts(
    sshd_server: SshdServer, tmp_path: Path
) -> None:
    empty = _write(tmp_path / "known_hosts", "")
    node = _node(sshd_server, "big")
    probe = probe_node(node, **FAST, connect_kwargs=sshd_server.connect_kwargs(), known_hosts=empty)
    assert not probe.ok
    assert probe.reason == f"host key of {node.ssh} not in known_hosts"
    # Rejected, not added: the file the probe read is untouched.
    assert empty.read_text() == ""


@pytest.mark.real
def test_probe_node_rejects_a_host_key_that_changed(
    sshd_server: SshdServer, tmp_path: Path
) -> None:
    key = tmp_path / "other_host_key"
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)],
        check=True,
        capture_output=True,
    )
    other = " ".join(key.with_suffix(".pub").read_text().split()[:2])
    port = sshd_server.ports["big"]
    wrong = _write(tmp_path / "known_hosts", f"[127.0.0.1]:{port} {other}\n")
    node = _node(sshd_server, "big")
    probe = probe_node(node, **FAST, connect_kwargs=sshd_server.connect_kwargs(), known_hosts=wrong)
    assert not probe.ok
    assert probe.reason == f"host key of {node.ssh} does not match known_hosts ({wrong}:1)"


@pytest.mark.real
def test_probe_node_times_out_on_a_host_that_never_speaks_ssh(silent_port: int) -> None:
    node = Node(
        name="mute",
        builder="mute",
        ssh=f"root@127.0.0.1:{silent_port}",
        cores=8,
        mem_gb=8,
        link_mbps=10,
    )
    probe = probe_node(node, timeout_s=1.0, sample_s=0.1)
    assert not probe.ok
    assert probe.reason is not None
    assert probe.reason.startswith("ssh timeout after 1 s (")


@pytest.mark.real
def test_probe_node_bounds_a_remote_command_that_hangs(sshd_server: SshdServer) -> None:
    probe = probe_node(
        _node(sshd_server, "stuck"),
        timeout_s=1.0,
        sample_s=0.1,
        connect_kwargs=sshd_server.connect_kwargs(),
        known_hosts=sshd_server.known_hosts,
    )
    assert not probe.ok
    assert probe.reason == "probe command timed out after 1.1 s"
