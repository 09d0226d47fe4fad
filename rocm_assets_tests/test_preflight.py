"""Preflight: the core, the `rocm-assets preflight` CLI and the check at the start of a build run.

Real: Debian's docker-registry (`registry_server`), with images pushed over the HTTP API; the
shipped rocm-bake.hcl, evaluated with REGISTRY pointing at that registry and a NAMESPACE of the
test's own, so tests sharing the server never see each other's images; the CLI as a subprocess;
Dagster runs (`dg.materialize` on `instance_for_test`). The 403 case puts the Zot fake, answering
403 as a corporate proxy does, in front of the real registry through HTTP_PROXY. The in-run test
builds the e2e farm (rocm_assets_tests/fixtures/e2e) with real buildx 0.29 on Debian 13's dockerd,
pushing to the same registry, and reads what was built from BuildKit's history.
"""

import json
import os
import subprocess
from pathlib import Path

import dagster as dg
import pytest

from rocm_assets.core.bake import BakeGraph, load_graph
from rocm_assets.core.build.builds import Build, SelectionError, check_arches
from rocm_assets.core.common.constants import ROCM_MAX_JOBS_TAG, ROCM_NODE_TAG, ROCM_PREFLIGHT_TAG
from rocm_assets.core.registry.client import RegistryClient, RegistryError
from rocm_assets.core.registry.preflight import Missing, PreflightError, preflight
from rocm_assets.defs.assets import build_bake_assets
from rocm_assets.defs.registry_checks import build_registry_checks
from rocm_assets.defs.resources.bake import BakeResource
from rocm_assets.defs.resources.registry import RegistryResource
from rocm_assets_tests.helpers import PROJECT_ROOT, rocm_assets_cli
from rocm_assets_tests.servers.dockerd import E2E_BAKE_FILE, E2E_BUILDER, Builders, bake_push
from rocm_assets_tests.servers.fakes import FakeZot
from rocm_assets_tests.servers.registry import RegistryServer

SHIPPED = PROJECT_ROOT / "rocm-bake.hcl"
TORCH_TAG = "2.15.0-10.1.0-full"
MODULE = "dagster asset materialize -m rocm_assets.definitions"


@pytest.fixture
def namespace(registry_server: RegistryServer) -> str:
    return registry_server.new_repo("rocm-pytorch")


def graph_for(server: RegistryServer | FakeZot, namespace: str) -> BakeGraph:
    return load_graph(SHIPPED, {"REGISTRY": server.host, "NAMESPACE": namespace})


def image(server: RegistryServer | FakeZot, namespace: str, repo: str, tag: str) -> str:
    return f"{server.host}/{namespace}/{repo}:{tag}"


def cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return rocm_assets_cli("preflight", *args, env=env)


def cli_env(server: RegistryServer, namespace: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("REGISTRY", "ROCM_REGISTRY_URL")}
    # As bake would be run: REGISTRY names the host that ROCM_REGISTRY_URL points at.
    return {**env, "REGISTRY": server.host, "NAMESPACE": namespace, "ROCM_REGISTRY_URL": server.url}


# ##### THE CORE


@pytest.mark.real
def test_vllm_wheel_on_an_empty_registry(registry_server: RegistryServer, namespace: str) -> None:
    graph = graph_for(registry_server, namespace)
    with RegistryClient(registry_server.url) as client:
        report = preflight(graph, [Build("vllm-wheel", "gfx942")], client)
        assert client.requests == 2  # tags/list of the one repository, and /v2/ to trust its 404
    vllm = image(registry_server, namespace, "vllm", f"{TORCH_TAG}-gfx942")
    assert report.missing == [
        Missing(
            vllm, ["vllm-wheel"], "vllm", "gfx942", f"{MODULE} --select vllm --partition gfx942"
        )
    ]
    assert report.checked == 1 and report.unchecked == [] and not report.ok
    assert report.summary() == (
        f"preflight: 1 of 1 input image of 1 build not published on {registry_server.url}, "
        "and nothing in this run builds it: build it first"
    )
    registry_server.push_image(f"{namespace}/vllm", f"{TORCH_TAG}-gfx942")
    with RegistryClient(registry_server.url) as client:
        report = preflight(graph, [Build("vllm-wheel", "gfx942")], client)
    assert report.ok and report.checked == 1
    assert report.summary() == (
        f"preflight: 1 input image of 1 build checked, all on {registry_server.url}"
    )


@pytest.mark.real
def test_inputs_the_request_publishes_do_not_count(
    registry_server: RegistryServer, namespace: str
) -> None:
    graph = graph_for(registry_server, namespace)
    with RegistryClient(registry_server.url) as client:
        # vllm is built in the same request, or by an earlier run of it.
        both = preflight(graph, [Build("vllm", "gfx942"), Build("vllm-wheel", "gfx942")], client)
        earlier = preflight(
            graph,
            [Build("vllm-wheel", "gfx942")],
            client,
            published_by_request=[Build("vllm", "gfx942")],
        )
        # The same target for another arch does not publish this arch's image.
        other_arch = preflight(
            graph,
            [Build("vllm-wheel", "gfx942")],
            client,
            published_by_request=[Build("vllm", "gfx950")],
        )
    assert earlier.missing == [] and earlier.checked == 0
    assert [m.image for m in other_arch.missing] == [
        image(registry_server, namespace, "vllm", f"{TORCH_TAG}-gfx942")
    ]
    assert [m.asset for m in both.missing] == [
        "triton-wheel", "pytorch", "aiter-wheel", "torchvision-wheel", "nixl-wheel", "lmcache-wheel"
    ]  # fmt: skip
    triton = both.missing[0]
    assert triton.partition is None and triton.command == f"{MODULE} --select triton-wheel"
    assert triton.image == image(registry_server, namespace, "triton-wheel", "3.7.0-rocm10.1.0")


@pytest.mark.real
def test_requests_grow_with_repositories_not_images(
    registry_server: RegistryServer, namespace: str
) -> None:
    graph = graph_for(registry_server, namespace)
    builds = [Build("vllm", arch) for arch in graph.arches]
    with RegistryClient(registry_server.url) as client:
        report = preflight(graph, builds, client)
        empty_requests = client.requests
    repos = {m.asset for m in report.missing}
    # pytorch, aiter, nixl, lmcache-wheel and torchvision for five arches, one noarch triton.
    assert report.checked == len(report.missing) == 26 and len(repos) == 6
    assert empty_requests == len(repos) + 1
    push_missing(graph, registry_server, builds)
    with RegistryClient(registry_server.url) as client:
        assert preflight(graph, builds, client).ok
        assert client.requests == len(repos)


@pytest.mark.real
def test_images_on_another_host_are_not_checked(registry_server: RegistryServer) -> None:
    graph = load_graph(SHIPPED, {})  # zot.snoc.lan:5000, not the test registry
    with RegistryClient(registry_server.url) as client:
        report = preflight(graph, [Build("vllm-wheel", "gfx942")], client)
        assert client.requests == 0
    assert report.ok and report.checked == 0
    assert report.unchecked == [f"zot.snoc.lan:5000/rocm-pytorch/vllm:{TORCH_TAG}-gfx942"]
    assert report.summary().endswith(
        f"; 1 on other hosts not checked (zot.snoc.lan:5000/rocm-pytorch/vllm:{TORCH_TAG}-gfx942)"
    )


def test_registry_errors_are_raised_never_missing(zot_fake: FakeZot) -> None:
    graph = graph_for(zot_fake, "rocm-pytorch")
    zot_fake.fail = "500"
    with (
        RegistryClient(zot_fake.url, retries=0) as client,
        pytest.raises(RegistryError, match="500 Internal Server Error for GET /v2/rocm-pytorch/"),
    ):
        preflight(graph, [Build("vllm-wheel", "gfx942")], client)


@pytest.mark.parametrize(
    ("builds", "message"),
    [
        ([Build("nope", "gfx942")], "builds: no target 'nope' in rocm-bake.hcl"),
        (
            [Build("vllm", None)],
            "builds: vllm is built per arch; its partition must be one of gfx942, gfx950, "
            "gfx1100, gfx1201, gfx1250, not None",
        ),
        (
            [Build("triton-wheel", "gfx942")],
            "builds: triton-wheel is noarch and takes no partition, not 'gfx942'",
        ),
    ],
)
def test_builds_that_do_not_fit_the_graph(
    zot_fake: FakeZot, builds: list[Build], message: str
) -> None:
    graph = graph_for(zot_fake, "rocm-pytorch")
    with RegistryClient(zot_fake.url) as client, pytest.raises(PreflightError) as caught:
        preflight(graph, builds, client)
    assert str(caught.value) == message
    assert zot_fake.log == []
    with pytest.raises(SelectionError, match="unknown arch 'gfx1'"):
        check_arches(graph, ["gfx1"])


# ##### THE CLI


@pytest.mark.real
def test_cli_vllm_wheel_missing_then_present(
    registry_server: RegistryServer, namespace: str
) -> None:
    env = cli_env(registry_server, namespace)
    vllm = image(registry_server, namespace, "vllm", f"{TORCH_TAG}-gfx942")
    command = f"{MODULE} --select vllm --partition gfx942"
    out = cli("--arch", "gfx942", "--targets", "vllm-wheel", env=env)
    assert out.returncode == 1, out.stderr
    assert out.stdout.splitlines() == [
        f"missing {vllm}: needed by vllm-wheel; built by asset vllm partition gfx942: {command}",
        f"preflight: 1 of 1 input image of 1 build not published on {registry_server.url}, "
        "and nothing in this run builds it: build it first",
    ]
    out = cli("--arch", "gfx942", "--targets", "vllm-wheel", "--json", env=env)
    assert out.returncode == 1
    assert json.loads(out.stdout) == {
        "missing": [
            {
                "image": vllm,
                "needed_by": ["vllm-wheel"],
                "asset": "vllm",
                "partition": "gfx942",
                "command": command,
            }
        ],
        "checked": 1,
    }
    registry_server.push_image(f"{namespace}/vllm", f"{TORCH_TAG}-gfx942")
    out = cli("--arch", "gfx942", "--targets", "vllm-wheel", env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout == (
        f"preflight: 1 input image of 1 build checked, all on {registry_server.url}\n"
    )
    out = cli("--arch", "gfx942", "--targets", "vllm-wheel", "--json", env=env)
    assert (out.returncode, json.loads(out.stdout)) == (0, {"missing": [], "checked": 1})


@pytest.mark.real
def test_cli_group_counts_only_inputs_from_outside_the_request(
    registry_server: RegistryServer, namespace: str
) -> None:
    env = cli_env(registry_server, namespace)
    out = cli("--arch", "gfx942", "--group", "default", "--json", env=env)
    # default builds every input of its members for gfx942 itself.
    assert (out.returncode, json.loads(out.stdout)) == (0, {"missing": [], "checked": 0})
    # For gfx950 it still needs the gfx942 base: noarch triton-wheel builds against the first arch.
    out = cli("--arch", "gfx950", "--group", "default", "--json", env=env)
    assert out.returncode == 1
    assert json.loads(out.stdout)["missing"] == [
        {
            "image": image(registry_server, namespace, "pytorch-base", "10.1.0-full-gfx942"),
            "needed_by": ["triton-wheel"],
            "asset": "pytorch-base",
            "partition": "gfx942",
            "command": f"{MODULE} --select pytorch-base --partition gfx942",
        }
    ]
    out = cli("--arch", "gfx942", "--group", "serving", "--json", env=env)
    assert out.returncode == 1
    data = json.loads(out.stdout)
    assert data["checked"] == 4
    assert [(m["asset"], m["partition"], m["needed_by"]) for m in data["missing"]] == [
        ("pytorch-base", "gfx942", ["cupy-wheel"]),
        ("triton-wheel", None, ["lmcache", "vllm"]),
        ("pytorch", "gfx942", ["torchvision-wheel", "nixl-wheel", "lmcache", "vllm"]),
        ("aiter-wheel", "gfx942", ["vllm"]),
    ]


@pytest.mark.real
def test_cli_403_from_a_proxy_exits_2_with_the_hint(
    registry_server: RegistryServer, zot_fake: FakeZot, namespace: str
) -> None:
    zot_fake.fail = "403"
    env = {k: v for k, v in cli_env(registry_server, namespace).items() if k.lower() != "no_proxy"}
    env["HTTP_PROXY"] = zot_fake.url
    out = cli("--arch", "gfx942", "--targets", "vllm-wheel", env=env)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr == (
        f"rocm-assets: error: registry {registry_server.url}: 403 Forbidden for GET "
        f"/v2/{namespace}/vllm/tags/list: a proxy may be answering for {registry_server.host}; "
        "make sure no_proxy covers it\n"
    )


@pytest.mark.real
def test_cli_registry_option_and_mismatch(registry_server: RegistryServer, namespace: str) -> None:
    env = cli_env(registry_server, namespace)
    del env["ROCM_REGISTRY_URL"], env["REGISTRY"]
    out = cli("--arch", "gfx942", "--targets", "vllm-wheel", env=env)
    assert (out.returncode, out.stderr) == (
        2,
        "rocm-assets: error: ROCM_REGISTRY_URL is not set; point it at the registry, "
        "e.g. https://zot.example:5000\n",
    )
    # --registry also sets the graph's REGISTRY, so the images checked are the ones bake pulls.
    out = cli(
        "--arch", "gfx942", "--targets", "vllm-wheel", "--registry", registry_server.url, env=env
    )
    assert out.returncode == 1 and f"missing {registry_server.host}/{namespace}/vllm:" in out.stdout
    env["ROCM_REGISTRY_URL"] = registry_server.url
    env["REGISTRY"] = "zot.snoc.lan:5000"
    out = cli("--arch", "gfx942", "--targets", "vllm-wheel", env=env)
    assert (out.returncode, out.stderr) == (
        2,
        f"rocm-assets: error: input images are not on {registry_server.url} (e.g. "
        f"zot.snoc.lan:5000/{namespace}/vllm:{TORCH_TAG}-gfx942): the bake file's REGISTRY must "
        f"name the registry checked; set REGISTRY={registry_server.host} or pass --registry\n",
    )
    out = cli("--arch", "gfx942", "--targets", "vllm-whee", env=env)
    assert out.returncode == 2 and out.stderr.startswith(
        "rocm-assets: error: no target 'vllm-whee' in rocm-bake.hcl (targets: rocm-runtime, "
    )


# ##### INSIDE A RUN

E2E_NODE = "node-a"


@pytest.mark.real
def test_run_fails_before_bake_when_an_input_is_missing(
    registry_server: RegistryServer,
    builders: Builders,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The e2e farm on real buildx: bake and the run's preflight read REGISTRY from the env.
    registry = f"{registry_server.host}/{registry_server.new_repo('preflight')}"
    for name, value in builders.env.items():
        monkeypatch.setenv(name, value)
    for name in ("DOCKER_HOST", "DOCKER_CONTEXT", "PUBLISHED_INPUTS", "GPU_ARCH", "RUN_ID"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("REGISTRY", registry)
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(
        f"nodes:\n  - name: {E2E_NODE}\n    builder: {E2E_BUILDER}\n    cores: 4\n"
        "    mem_gb: 8\n    link_mbps: 1000\ntarget_costs:\n  reference: {cores: 4, mem_gb: 8}\n"
    )
    graph = load_graph(E2E_BAKE_FILE, {"REGISTRY": registry})
    everything = [*build_bake_assets(graph), *build_registry_checks(graph)]
    resources = {
        "bake": BakeResource(bake_file=str(E2E_BAKE_FILE), fleet_file=str(fleet)),
        "registry": RegistryResource(url=registry_server.url),
    }
    # Placed by tag, as the coordinator does, so no node is probed.
    tags = {ROCM_NODE_TAG: E2E_NODE, ROCM_MAX_JOBS_TAG: "2"}
    with dg.instance_for_test() as instance:
        failed = dg.materialize(
            everything,
            instance=instance,
            resources=resources,
            partition_key="gfx942",
            selection=[dg.AssetKey("app-wheel")],
            tags=tags,
            raise_on_error=False,
        )
        assert not failed.success
        failure = next(e for e in failed.all_events if e.is_step_failure)
        user = failure.step_failure_data.user_failure_data
        assert user.description.splitlines()[0] == (
            f"missing {registry}/e2e/lib:gfx942: needed by app-wheel; built by asset lib "
            f"partition gfx942: {MODULE} --select lib --partition gfx942"
        )
        assert ROCM_PREFLIGHT_TAG not in instance.get_run_by_id(failed.run_id).tags
        # BuildKit never saw the run: bake was not invoked.
        assert [r for r in builders.history(E2E_BUILDER) if failed.run_id in r.name] == []

        # lib's inputs published: a run of lib and app-wheel passes preflight once and builds
        # both; app-wheel's input is lib, which this run builds itself.
        bake_push(
            E2E_BUILDER, E2E_BAKE_FILE, {**os.environ, "GPU_ARCH": "gfx942"}, "base", "tool-wheel"
        )
        passed = dg.materialize(
            everything,
            instance=instance,
            resources=resources,
            partition_key="gfx942",
            selection=[dg.AssetKey("lib"), dg.AssetKey("app-wheel")],
            tags=tags,
            raise_on_error=False,
        )
        assert passed.success
        built = sorted(r.name for r in builders.history(E2E_BUILDER) if passed.run_id in r.name)
        assert built == [
            f"rocm-pytorch-build/{t}/gfx942/{passed.run_id}" for t in ("app-wheel", "lib")
        ]
        run = instance.get_run_by_id(passed.run_id)
        assert run.tags[ROCM_PREFLIGHT_TAG] == passed.run_id
        logs = [e.user_message for e in instance.all_logs(passed.run_id)]
        # lib's two inputs and app-wheel's one (built in this run, so not looked up).
        assert (
            logs.count(
                f"preflight: 2 input images of 2 builds checked, all on {registry_server.url}"
            )
            == 1
        )
        # The checks after the builds read the tags back: they hold what was pushed.
        checks = passed.get_asset_check_evaluations()
        assert {(c.asset_key, c.passed) for c in checks} == {
            (dg.AssetKey(t), True) for t in ("lib", "app-wheel")
        }
        for check in checks:
            target = check.asset_key.to_user_string()
            digest = registry_server.digest(f"{registry}/e2e/{target}:gfx942")
            assert check.description == (
                f"the materialized tag {registry}/e2e/{target}:gfx942 holds the image Dagster built"
            )
            materialization = next(
                m
                for m in passed.get_asset_materialization_events()
                if m.asset_key == check.asset_key
            )
            assert materialization.materialization.metadata["digest"].value == digest


def push_missing(graph: BakeGraph, server: RegistryServer, builds: list[Build]) -> None:
    """Push every input `builds` lack on `server`."""
    with RegistryClient(server.url) as client:
        for item in preflight(graph, builds, client).missing:
            server.push_image(*client.split_ref(item.image))


@pytest.mark.parametrize(
    ("registry_var", "failure", "description"),
    [
        (
            None,
            "403",
            "preflight could not check the run's inputs, no build started: registry {url}: "
            "403 Forbidden for GET /v2/rocm-pytorch/vllm/tags/list: a proxy may be answering for "
            "{host}; "
            "make sure no_proxy covers it",
        ),
        (
            "zot.snoc.lan:5000",
            None,
            "vllm-wheel pushes zot.snoc.lan:5000/rocm-pytorch/vllm-wheel:"
            f"{TORCH_TAG}-gfx942, which is not on the registry {{url}} that preflight and the "
            "observation sensor read: set REGISTRY to that host or ROCM_REGISTRY_URL to this one",
        ),
    ],
)
def test_run_fails_before_bake_when_preflight_cannot_check(
    zot_fake: FakeZot,
    monkeypatch: pytest.MonkeyPatch,
    registry_var: str | None,
    failure: str | None,
    description: str,
) -> None:
    monkeypatch.setenv("REGISTRY", registry_var or zot_fake.host)
    monkeypatch.setenv("NAMESPACE", "rocm-pytorch")
    zot_fake.fail = failure
    with dg.instance_for_test() as instance:
        result = dg.materialize(
            build_bake_assets(load_graph(SHIPPED, {})),
            instance=instance,
            resources={
                "bake": BakeResource(bake_file=str(SHIPPED)),
                "registry": RegistryResource(url=zot_fake.url, retries=0),
            },
            partition_key="gfx942",
            selection=[dg.AssetKey("vllm-wheel")],
            raise_on_error=False,
        )
    # The step failed with preflight's reason, which it raises before any bake is invoked.
    assert not result.success
    failure_event = next(e for e in result.all_events if e.is_step_failure)
    assert failure_event.step_failure_data.user_failure_data.description == description.format(
        url=zot_fake.url, host=zot_fake.host
    )
