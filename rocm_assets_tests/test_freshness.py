"""Freshness policies, their evaluation, unsynced downstreams, and the freshness alert sensor.

Real parts: the shipped code location (`rocm_assets.definitions` over rocm-bake.hcl) loaded as an
in-process workspace, exactly as the daemon and webserver load it; Dagster's FreshnessDaemon
iteration evaluating it on a temporary instance; the webserver's stale-status resolver
(`WorkspaceRequestContext.stale_status_loader`, behind "Unsynced" in the UI); and an HTTP server
on 127.0.0.1 receiving the alert webhook's POSTs. Stubbed: the bake resource in the unsynced
test, which returns a digest instead of running `docker buildx bake`. Time is moved with
Dagster's `freeze_time` rather than waited for.
"""

import http.server
import json
import logging
import socket
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import dagster as dg
import pytest
from dagster._core.definitions.data_version import StaleStatus
from dagster._core.definitions.freshness import FreshnessState
from dagster._core.remote_origin import InProcessCodeLocationOrigin
from dagster._core.test_utils import freeze_time
from dagster._core.types.loadable_target_origin import LoadableTargetOrigin
from dagster._core.workspace.context import WorkspaceProcessContext
from dagster._core.workspace.load_target import InProcessWorkspaceLoadTarget
from dagster._daemon.freshness import FreshnessDaemon

from rocm_assets.core.bake import load_graph
from rocm_assets.core.common.constants import ALERT_WEBHOOK_ENV, BAKE_FILE_ENV
from rocm_assets.defs.alerts import freshness_alert_sensor
from rocm_assets.defs.assets import build_bake_assets
from rocm_assets.defs.freshness import DEFAULT_WINDOW, WINDOWS, freshness_window
from rocm_assets.defs.resources.bake import BakeResource
from rocm_assets.defs.resources.registry import RegistryResource
from rocm_assets_tests.helpers import PROJECT_ROOT

SHIPPED = PROJECT_ROOT / "rocm-bake.hcl"
# A default-window wheel and the one target with its own window.
WHEEL = dg.AssetKey("vllm-wheel")
PYTORCH = dg.AssetKey("pytorch")
NEVER_BUILT = dg.AssetKey("lmcache")


# ##### FIXTURES


@pytest.fixture
def shipped_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(BAKE_FILE_ENV, str(SHIPPED))
    monkeypatch.delenv(ALERT_WEBHOOK_ENV, raising=False)


@pytest.fixture
def instance() -> Iterator[dg.DagsterInstance]:
    with dg.instance_for_test() as instance:
        yield instance


@pytest.fixture
def workspace(shipped_env: None, instance: dg.DagsterInstance) -> Iterator[WorkspaceProcessContext]:
    """The code location as the daemons load it, in this process."""
    origin = InProcessCodeLocationOrigin(
        LoadableTargetOrigin(
            module_name="rocm_assets.definitions", working_directory=str(PROJECT_ROOT)
        ),
        location_name="rocm_assets",
    )
    with WorkspaceProcessContext(instance, InProcessWorkspaceLoadTarget(origin)) as context:
        entries = context.create_request_context().get_code_location_entries()
        assert entries["rocm_assets"].load_error is None, entries["rocm_assets"].load_error
        yield context


class _Webhook(http.server.BaseHTTPRequestHandler):
    received: list[dict[str, Any]]
    status: int

    def do_POST(self) -> None:
        length = int(self.headers["Content-Length"])
        self.received.append(json.loads(self.rfile.read(length)))
        self.send_response(self.status)
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the base's name)
        """Quiet: the test reads `received`, not the access log."""


@pytest.fixture
def webhook() -> Iterator[tuple[str, list[dict[str, Any]], type[_Webhook]]]:
    """A real HTTP server on loopback: its URL, the JSON bodies it got, and its handler class."""
    handler = type("Webhook", (_Webhook,), {"received": [], "status": 204})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/hook", handler.received, handler
    finally:
        server.shutdown()
        server.server_close()


class _Keep(logging.Handler):
    """Keeps the messages a sensor logs through `context.log`."""

    def __init__(self) -> None:
        super().__init__(level=logging.INFO)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture
def dagster_log() -> _Keep:
    return _Keep()


def _materialize_runless(instance: dg.DagsterInstance, key: dg.AssetKey) -> None:
    instance.report_runless_asset_event(dg.AssetMaterialization(asset_key=key, partition="gfx942"))


def _evaluate(workspace: WorkspaceProcessContext, at: datetime) -> None:
    """One FreshnessDaemon iteration, as the daemon runs it, at `at`."""
    with freeze_time(at):
        list(FreshnessDaemon().run_iteration(workspace))


def _states(instance: dg.DagsterInstance, *keys: dg.AssetKey) -> dict[str, str]:
    records = instance.get_freshness_state_records(list(keys))
    return {k.to_user_string(): records[k].freshness_state.value for k in keys}


def _tick(
    instance: dg.DagsterInstance, cursor: str | None, log: _Keep | None = None
) -> dg.SensorResult | dg.SkipReason:
    context = dg.build_sensor_context(instance=instance, cursor=cursor)
    if log is not None:
        context.log.addHandler(log)
    result = freshness_alert_sensor(context)
    assert isinstance(result, dg.SensorResult | dg.SkipReason)
    return result


def _reason(result: dg.SensorResult | dg.SkipReason) -> str:
    """The one line the UI shows for the tick: the sensor starts no runs, so every tick has one."""
    skip = result if isinstance(result, dg.SkipReason) else result.skip_reason
    assert skip is not None and skip.skip_message and "\n" not in skip.skip_message
    return skip.skip_message


# ##### POLICIES


def test_every_asset_has_its_targets_policy(shipped_env: None) -> None:
    from rocm_assets.definitions import defs

    asset_graph = defs().resolve_asset_graph()
    keys = asset_graph.get_all_asset_keys()
    assert len(keys) == 15
    for key in keys:
        window = freshness_window(key.to_user_string())
        expected = dg.FreshnessPolicy.time_window(fail_window=window.fail, warn_window=window.warn)
        assert asset_graph.get(key).freshness_policy == expected, key
    assert asset_graph.get(PYTORCH).freshness_policy == dg.FreshnessPolicy.time_window(
        fail_window=timedelta(days=14), warn_window=timedelta(days=7)
    )


def test_the_window_table_names_real_targets_only() -> None:
    # A renamed target would otherwise fall back to the default without a word.
    assert set(WINDOWS) <= set(load_graph(SHIPPED, {}).asset_targets)


def test_a_target_added_later_gets_the_default(tmp_path, monkeypatch) -> None:
    text = SHIPPED.read_text() + (
        '\ntarget "extra-wheel" {\n  inherits = ["_common"]\n'
        '  tags = [img("extra-wheel", TORCH_TAG)]\n}\n'
    )
    (tmp_path / "bake.hcl").write_text(text)
    monkeypatch.setenv(BAKE_FILE_ENV, str(tmp_path / "bake.hcl"))
    from rocm_assets.definitions import defs

    node = defs().resolve_asset_graph().get(dg.AssetKey("extra-wheel"))
    assert node.freshness_policy == dg.FreshnessPolicy.time_window(
        fail_window=DEFAULT_WINDOW.fail, warn_window=DEFAULT_WINDOW.warn
    )


# ##### EVALUATION BY THE FRESHNESS DAEMON


def test_daemon_grades_assets_by_their_own_windows(instance, workspace) -> None:
    _materialize_runless(instance, WHEEL)
    _materialize_runless(instance, PYTORCH)
    now = datetime.now(UTC)
    expected = [
        # (time since the builds, the wheel's state (3 d / 7 d), pytorch's (7 d / 14 d))
        (timedelta(hours=1), "PASS", "PASS"),
        (timedelta(days=4), "WARN", "PASS"),
        (timedelta(days=8), "FAIL", "WARN"),
        (timedelta(days=15), "FAIL", "FAIL"),
    ]
    for age, wheel, pytorch in expected:
        _evaluate(workspace, now + age)
        states = _states(instance, WHEEL, PYTORCH, NEVER_BUILT)
        assert states == {"vllm-wheel": wheel, "pytorch": pytorch, "lmcache": "UNKNOWN"}, age


def test_a_fresh_build_passes_again(instance, workspace) -> None:
    _materialize_runless(instance, WHEEL)
    _evaluate(workspace, datetime.now(UTC) + timedelta(days=8))
    assert _states(instance, WHEEL) == {"vllm-wheel": FreshnessState.FAIL.value}
    _materialize_runless(instance, WHEEL)
    _evaluate(workspace, datetime.now(UTC))
    assert _states(instance, WHEEL) == {"vllm-wheel": FreshnessState.PASS.value}


# ##### UNSYNCED: A DOWNSTREAM OLDER THAN ITS REBUILT UPSTREAM


class _DigestBake(BakeResource):
    """Returns a digest per target and build instead of baking; the data version is the digest."""

    build: str = "1"

    def materialize(self, context: dg.AssetExecutionContext, target: str, *_: Any) -> Any:
        return dg.MaterializeResult(data_version=dg.DataVersion(f"sha256:{target}-{self.build}"))


def test_downstream_is_unsynced_after_an_upstream_digest_changes(instance, workspace) -> None:
    assets = build_bake_assets(load_graph(SHIPPED, {}))
    registry = RegistryResource(url="http://127.0.0.1:9")

    def build(key: dg.AssetKey, digest: str) -> None:
        result = dg.materialize(
            assets,
            selection=[key],
            partition_key="gfx942",
            instance=instance,
            resources={"bake": _DigestBake(build=digest), "registry": registry},
        )
        assert result.success

    def status(key: dg.AssetKey) -> StaleStatus:
        # A new request context per question, as the webserver has one per request.
        loader = workspace.create_request_context().stale_status_loader
        return loader.get_status(key, "gfx942")

    wheel = dg.AssetKey("pytorch-wheel")
    build(PYTORCH, "a")
    build(wheel, "a")
    assert status(wheel) == StaleStatus.FRESH
    # A rebuild that reproduces the digest leaves the wheel in sync.
    build(PYTORCH, "a")
    assert status(wheel) == StaleStatus.FRESH
    build(PYTORCH, "b")
    assert status(wheel) == StaleStatus.STALE
    causes = workspace.create_request_context().stale_status_loader.get_stale_root_causes(
        wheel, "gfx942"
    )
    assert [(c.key.asset_key, c.key.partition_key, c.reason) for c in causes] == [
        (PYTORCH, "gfx942", "has a new data version")
    ]
    build(wheel, "b")
    assert status(wheel) == StaleStatus.FRESH


# ##### THE ALERT SENSOR


def test_alert_sensor_posts_each_transition_once(
    instance, workspace, webhook, dagster_log, monkeypatch
) -> None:
    url, received, _ = webhook
    monkeypatch.setenv(ALERT_WEBHOOK_ENV, url)
    _materialize_runless(instance, WHEEL)
    now = datetime.now(UTC)
    cursor = None
    posted_per_step = []
    reasons = []
    for age in (timedelta(hours=1), timedelta(days=4), timedelta(days=5), timedelta(days=8)):
        _evaluate(workspace, now + age)
        before = len(received)
        result = _tick(instance, cursor, dagster_log)
        reasons.append(_reason(result))
        cursor = result.cursor if isinstance(result, dg.SensorResult) else cursor
        # A second tick with nothing new posts nothing.
        again = _tick(instance, cursor)
        assert isinstance(again, dg.SkipReason)
        assert _reason(again) == "no freshness state changes"
        posted_per_step.append([(p["asset"], p["state"]) for p in received[before:]])
    # UNKNOWN->PASS for the wheel and UNKNOWN for the rest: no alert; then WARN, no change, FAIL.
    assert posted_per_step == [[], [("vllm-wheel", "WARN")], [], [("vllm-wheel", "FAIL")]]
    assert reasons == [
        "15 change(s), none to WARN or FAIL",  # every asset to UNKNOWN or PASS
        "1 freshness alert(s) logged and posted to the webhook: vllm-wheel WARN",
        "no freshness state changes",
        "1 freshness alert(s) logged and posted to the webhook: vllm-wheel FAIL",
    ]
    fail = received[-1]
    assert set(fail) == {"asset", "state", "since", "window"}
    assert fail["window"] == {"warn_s": 3 * 86400.0, "fail_s": 7 * 86400.0}
    # The state changed when the daemon saw it, eight days on.
    assert datetime.fromisoformat(fail["since"]) == now + timedelta(days=8)
    lines = [m for m in dagster_log.messages if m.startswith("freshness: vllm-wheel")]
    assert len(lines) == 2
    assert lines[1].startswith("freshness: vllm-wheel is FAIL since ")
    assert lines[1].endswith("(WARN after 3d, FAIL after 7d without a materialization)")


def test_alert_sensor_first_tick_reports_the_current_state_only(
    instance, workspace, webhook, monkeypatch
) -> None:
    url, received, _ = webhook
    monkeypatch.setenv(ALERT_WEBHOOK_ENV, url)
    _materialize_runless(instance, WHEEL)
    now = datetime.now(UTC)
    for age in (timedelta(hours=1), timedelta(days=4), timedelta(days=8)):
        _evaluate(workspace, now + age)
    result = _tick(instance, None)
    assert isinstance(result, dg.SensorResult)
    assert [(p["asset"], p["state"]) for p in received] == [("vllm-wheel", "FAIL")]


def test_alert_sensor_survives_a_webhook_that_is_down(
    instance, workspace, dagster_log, monkeypatch
) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed = sock.getsockname()[1]
    secret_url = f"http://127.0.0.1:{closed}/hook?token=s3cret"
    monkeypatch.setenv(ALERT_WEBHOOK_ENV, secret_url)
    for key in (WHEEL, dg.AssetKey("triton-wheel")):
        instance.report_runless_asset_event(dg.AssetMaterialization(asset_key=key))
    _evaluate(workspace, datetime.now(UTC) + timedelta(days=8))
    result = _tick(instance, json.dumps({"after": 0}), dagster_log)
    assert isinstance(result, dg.SensorResult)
    # The cursor moves on: a later tick does not report these again.
    assert isinstance(_tick(instance, result.cursor), dg.SkipReason)
    unreachable = [m for m in dagster_log.messages if "webhook unreachable" in m]
    assert unreachable == [
        "freshness alert webhook unreachable (ConnectError); 2 alert(s) not posted"
    ]
    assert not any("s3cret" in m for m in dagster_log.messages)


def test_alert_sensor_logs_a_webhook_error_status(
    instance, workspace, webhook, dagster_log, monkeypatch
) -> None:
    url, received, handler = webhook
    handler.status = 500
    monkeypatch.setenv(ALERT_WEBHOOK_ENV, url)
    _materialize_runless(instance, WHEEL)
    _evaluate(workspace, datetime.now(UTC) + timedelta(days=4))
    result = _tick(instance, None, dagster_log)
    assert isinstance(result, dg.SensorResult)
    assert len(received) == 1
    assert "freshness alert webhook answered HTTP 500 for vllm-wheel" in dagster_log.messages


def test_alert_sensor_only_logs_without_a_webhook(instance, workspace, dagster_log) -> None:
    _materialize_runless(instance, WHEEL)
    _evaluate(workspace, datetime.now(UTC) + timedelta(days=4))
    result = _tick(instance, None, dagster_log)
    assert isinstance(result, dg.SensorResult)
    assert _reason(result) == (
        "1 freshness alert(s) logged (ROCM_ALERT_WEBHOOK unset): vllm-wheel WARN"
    )
    lines = [m for m in dagster_log.messages if m.startswith("freshness: ")]
    assert len(lines) == 1
    assert lines[0].startswith("freshness: vllm-wheel is WARN since ")
