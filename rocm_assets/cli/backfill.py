"""`rocm-assets backfill`: launch an arch backfill through the Dagster webserver's GraphQL API.

By default every build of the selection is launched at once, as the run the UI's Materialize
button sends for one asset and partition (`launchRun`), in dependency order, all tagged with one
request id. The placement coordinator queues each until its inputs are pushed and starts it on the
node that finishes it first, so a build starts seconds after its last input is pushed.

`--asset-backfill` sends the `launchPartitionBackfill` mutation the UI's backfill dialog sends
instead: a Dagster asset backfill, on the UI's Backfills page. Its daemon requests a build only
once its parents are materialized, on an iteration every 30 s that Dagster 1.13 does not let one
set, so each dependency level waits up to 30 s more. `--job J` launches a job's partition
backfill (one run of J per arch), for jobs outside the asset groups such as `pytorch_run_job`.

An asset backfill's selection goes out as `partitionsByAssets`: each per-arch target with the
chosen arches, each noarch target unpartitioned. `assetSelection` + `partitionNames` looks
equivalent, but Dagster then targets only the per-arch assets it reaches from the selection's
roots through other selected per-arch assets: for the `wheels` group it silently drops
lmcache-wheel and vllm-wheel, whose parents (lmcache, vllm) are outside the group (seen on the
1.13.27 webserver).
"""

import argparse
import json
import sys
import urllib.parse
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from rocm_assets.cli.common import EXIT_ERROR, EXIT_OK, add_list
from rocm_assets.core.bake import BakeGraph, load_graph
from rocm_assets.core.build.builds import (
    Build,
    SelectionError,
    builds_for,
    check_arches,
    select_targets,
)
from rocm_assets.core.common.constants import DEFAULT_DAGSTER_URL, PARTITION_TAG
from rocm_assets.core.common.settings import bake_file_path

_TIMEOUT_S = 30.0
# The runs of one request, all tagged alike (not `rocm/`: those tags are the coordinator's).
REQUEST_TAG = "rocm-assets/request"
# Dagster's implicit job of every asset: the UI's Materialize button launches its subsets.
ASSET_JOB = "__ASSET_JOB"

_ASSET_NODES = """
query RocmAssetNodes($keys: [AssetKeyInput!]) {
  assetNodes(assetKeys: $keys) { assetKey { path } isPartitioned partitionKeys }
}
"""
_WORKSPACE = """
query RocmWorkspace {
  workspaceOrError {
    __typename
    ... on Workspace {
      locationEntries {
        name
        locationOrLoadError {
          __typename
          ... on RepositoryLocation {
            repositories { name jobs { name } partitionSets { name pipelineName } }
          }
          ... on PythonError { message }
        }
      }
    }
    ... on PythonError { message }
  }
}
"""
_LAUNCH = """
mutation RocmBackfill($params: LaunchBackfillParams!) {
  launchPartitionBackfill(backfillParams: $params) {
    __typename
    ... on LaunchBackfillSuccess { backfillId }
    ... on Error { message }
  }
}
"""
_LAUNCH_RUN = """
mutation RocmLaunchRun($params: ExecutionParams!) {
  launchRun(executionParams: $params) {
    __typename
    ... on LaunchRunSuccess { run { runId } }
    ... on RunConfigValidationInvalid { errors { message } }
    ... on Error { message }
  }
}
"""


class BackfillError(Exception):
    """A request that does not fit the bake file, or a webserver that is down or refuses it."""


def _one_line(text: str) -> str:
    return " ".join(text.split())


@dataclass(frozen=True)
class Selection:
    """What an asset backfill builds: `targets` in dependency order, each per-arch one per arch."""

    targets: tuple[str, ...]
    arches: tuple[str, ...]
    per_arch: frozenset[str]

    @property
    def build_count(self) -> int:
        return sum(len(self.arches) if t in self.per_arch else 1 for t in self.targets)


def select(
    graph: BakeGraph, *, group: str | None, targets: Sequence[str] | None, arches: Sequence[str]
) -> Selection:
    """The asset targets of a group or a target list, checked against the bake file."""
    selected = select_targets(graph, group=group, targets=targets)
    return Selection(selected, check_arches(graph, arches), graph.per_arch)


def asset_backfill_params(selection: Selection, title: str) -> dict[str, Any]:
    """LaunchBackfillParams for an asset backfill of `selection` (see the module docstring)."""
    by_asset: list[dict[str, Any]] = []
    for target in selection.targets:
        entry: dict[str, Any] = {"assetKey": {"path": [target]}}
        if target in selection.per_arch:
            entry["partitions"] = {"ranges": [{"start": a, "end": a} for a in selection.arches]}
        by_asset.append(entry)
    return {"partitionsByAssets": by_asset, "title": title}


def run_params(location: str, repository: str, build: Build, request: str) -> dict[str, Any]:
    """ExecutionParams of one build's run: its asset, its arch as the partition, the request."""
    tags = [{"key": REQUEST_TAG, "value": request}]
    if build.arch is not None:
        tags.append({"key": PARTITION_TAG, "value": build.arch})
    return {
        "selector": {
            "repositoryLocationName": location,
            "repositoryName": repository,
            "jobName": ASSET_JOB,
            "assetSelection": [{"path": [build.target]}],
        },
        "mode": "default",
        "runConfigData": {},
        "executionMetadata": {"tags": tags},
    }


def job_backfill_params(
    location: str, repository: str, partition_set: str, arches: Sequence[str], title: str
) -> dict[str, Any]:
    """LaunchBackfillParams for a job's partition backfill: one run of the job per arch."""
    return {
        "selector": {
            "partitionSetName": partition_set,
            "repositorySelector": {
                "repositoryLocationName": location,
                "repositoryName": repository,
            },
        },
        "partitionNames": list(arches),
        "title": title,
    }


def ui_url(url: str, backfill_id: str) -> str:
    """The backfill's page in the Dagster UI."""
    return f"{url.rstrip('/')}/runs/b/{backfill_id}"


def request_url(url: str, request: str) -> str:
    """The UI's run list filtered to one request's runs."""
    query = urllib.parse.urlencode({"q[]": f"tag:{REQUEST_TAG}={request}"})
    return f"{url.rstrip('/')}/runs?{query}"


class Webserver:
    """The few GraphQL calls the backfill needs; every failure is a one-line BackfillError."""

    def __init__(self, url: str, timeout_s: float = _TIMEOUT_S):
        self.url = url.rstrip("/")
        self._http = httpx.Client(timeout=timeout_s)

    def __enter__(self) -> "Webserver":
        return self

    def __exit__(self, *exc: object) -> None:
        self._http.close()

    def query(self, document: str, variables: Mapping[str, Any] | None = None) -> dict[str, Any]:
        endpoint = f"{self.url}/graphql"
        try:
            response = self._http.post(
                endpoint, json={"query": document, "variables": dict(variables or {})}
            )
        except httpx.TransportError as exc:
            raise BackfillError(
                f"cannot reach the Dagster webserver at {self.url}: {_one_line(str(exc)) or type(exc).__name__} "
                "(start it with `make dev`, or pass --url)"
            ) from None
        try:
            body = response.json()
        except ValueError:
            raise BackfillError(
                f"{endpoint} answered HTTP {response.status_code} without a GraphQL reply: "
                "is this the Dagster webserver?"
            ) from None
        # A resolver's PythonError comes back as HTTP 500 with the error in `data`.
        errors = body.get("errors") if isinstance(body, dict) else None
        if errors:
            raise BackfillError(
                f"{endpoint}: {_one_line(str(errors[0].get('message', errors[0])))}"
            )
        data = body.get("data") if isinstance(body, dict) else None
        if not isinstance(data, dict):
            raise BackfillError(f"{endpoint} answered HTTP {response.status_code} with no data")
        return data

    def check_partitions(self, selection: Selection) -> None:
        """The webserver's code location must know every target, and every arch as a partition.

        It reads the bake file when the code location loads, so an arch added since is unknown
        to it until the location is reloaded.
        """
        keys = [{"path": [t]} for t in selection.targets]
        nodes = self.query(_ASSET_NODES, {"keys": keys})["assetNodes"]
        known = {"/".join(n["assetKey"]["path"]): n for n in nodes}
        reload = (
            "reload the code location (UI: Deployment, Reload) or restart `make dev`, so it "
            "reads the bake file again"
        )
        for target in selection.targets:
            node = known.get(target)
            if node is None:
                raise BackfillError(
                    f"the webserver at {self.url} has no asset {target!r}: {reload}"
                )
            if target in selection.per_arch:
                missing = [a for a in selection.arches if a not in node["partitionKeys"]]
                if missing:
                    raise BackfillError(
                        f"the webserver at {self.url} has no partition {missing[0]!r} for "
                        f"{target} (it has {', '.join(node['partitionKeys']) or 'none'}): {reload}"
                    )

    def find_job(self, job: str) -> tuple[str, dict[str, Any]]:
        """(code location, repository) holding the job called `job`."""
        workspace = self.query(_WORKSPACE)["workspaceOrError"]
        if workspace["__typename"] != "Workspace":
            raise BackfillError(
                f"the webserver cannot list its workspace: {_one_line(workspace.get('message', ''))}"
            )
        jobs: list[str] = []
        for entry in workspace["locationEntries"]:
            location = entry["locationOrLoadError"] or {}
            for repo in location.get("repositories", []):
                names = [j["name"] for j in repo["jobs"]]
                jobs.extend(names)
                if job in names:
                    return entry["name"], repo
        shown = ", ".join(sorted(j for j in jobs if not j.startswith("__"))) or "none"
        raise BackfillError(f"the webserver at {self.url} has no job {job!r} (jobs: {shown})")

    def job_partition_set(self, job: str) -> tuple[str, str, str]:
        """(code location, repository, partition set) of the job called `job`."""
        location, repo = self.find_job(job)
        sets = [s["name"] for s in repo["partitionSets"] if s["pipelineName"] == job]
        if not sets:
            raise BackfillError(
                f"job {job!r} in code location {location!r} is not partitioned by arch"
            )
        return location, repo["name"], sets[0]

    def launch_run(self, params: Mapping[str, Any]) -> str:
        """Launch one run; its id."""
        result = self.query(_LAUNCH_RUN, {"params": dict(params)})["launchRun"]
        if result["__typename"] != "LaunchRunSuccess":
            errors = result.get("errors") or [{}]
            message = result.get("message") or errors[0].get("message", "")
            raise BackfillError(
                f"the webserver refused the run ({result['__typename']}): {_one_line(message)}"
            )
        return str(result["run"]["runId"])

    def launch(self, params: Mapping[str, Any]) -> str:
        """Launch the backfill; its id."""
        result = self.query(_LAUNCH, {"params": dict(params)})["launchPartitionBackfill"]
        if result["__typename"] != "LaunchBackfillSuccess":
            raise BackfillError(
                f"the webserver refused the backfill ({result['__typename']}): "
                f"{_one_line(result.get('message', ''))}"
            )
        return str(result["backfillId"])


def launch_at_once(web: Webserver, graph: BakeGraph, selection: Selection) -> dict[str, Any]:
    """Every build of `selection` as its own run, in dependency order, under one request id."""
    location, repo = web.find_job(ASSET_JOB)
    request = uuid.uuid4().hex[:12]
    runs: dict[str, str] = {}
    builds = builds_for(graph, selection.targets, selection.arches)
    for build in builds:
        try:
            runs[str(build)] = web.launch_run(run_params(location, repo["name"], build, request))
        except BackfillError as exc:
            raise BackfillError(
                f"{build}: {exc} ({len(runs)} of {len(builds)} runs of request {request} "
                "were launched and stay queued)"
            ) from None
    return {"request": request, "runs": runs}


def cmd_backfill(args: argparse.Namespace) -> int:
    try:
        graph = load_graph(bake_file_path(args.bake_file))
        with Webserver(args.url) as web:
            if args.job is not None:
                arches = check_arches(graph, args.arch)
                location, repository, partition_set = web.job_partition_set(args.job)
                what = f"job {args.job}"
                params = job_backfill_params(
                    location, repository, partition_set, arches, f"rocm-assets: {what}"
                )
                summary: dict[str, Any] = {"job": args.job, "runs": len(arches)}
            else:
                selection = select(graph, group=args.group, targets=args.targets, arches=args.arch)
                arches = selection.arches
                what = f"group {args.group}" if args.group else " ".join(selection.targets)
                web.check_partitions(selection)
                summary = {"targets": list(selection.targets), "builds": selection.build_count}
                if not args.asset_backfill:
                    launched = launch_at_once(web, graph, selection)
                    return _said_request(args, what, arches, summary, launched)
                params = asset_backfill_params(selection, f"rocm-assets: {what}")
            backfill_id = web.launch(params)
    except (BackfillError, SelectionError) as exc:
        sys.stderr.write(f"rocm-assets: error: {exc}\n")
        return EXIT_ERROR
    link = ui_url(args.url, backfill_id)
    if args.json:
        data = {"backfill_id": backfill_id, "url": link, "arches": list(arches), **summary}
        sys.stdout.write(json.dumps(data, indent=2) + "\n")
        return EXIT_OK
    count = f"{summary['builds']} builds" if "builds" in summary else f"{summary['runs']} runs"
    sys.stdout.write(f"backfill {backfill_id}: {what} for {', '.join(arches)} ({count})\n{link}\n")
    return EXIT_OK


def _said_request(
    args: argparse.Namespace,
    what: str,
    arches: Sequence[str],
    summary: Mapping[str, Any],
    launched: Mapping[str, Any],
) -> int:
    link = request_url(args.url, launched["request"])
    if args.json:
        data = {
            "request_id": launched["request"],
            "url": link,
            "arches": list(arches),
            **summary,
            "runs": launched["runs"],
        }
        sys.stdout.write(json.dumps(data, indent=2) + "\n")
        return EXIT_OK
    sys.stdout.write(
        f"request {launched['request']}: {what} for {', '.join(arches)} ({summary['builds']} "
        "builds, one run each, launched at once; each starts when its inputs are pushed)\n"
        f"{link}\n"
    )
    return EXIT_OK


def add_parser(subparsers: Any) -> None:
    """Register `backfill` on the `rocm-assets` subcommand parser."""
    p = subparsers.add_parser(
        "backfill",
        help="launch an arch backfill through the Dagster webserver",
        description="Launch every build of a group or targets for the arches through the "
        "webserver's GraphQL API, one run per build at once, each placed when its inputs are "
        "pushed; or a Dagster asset backfill (--asset-backfill), or a job's partition backfill "
        "(--job).",
    )
    p.add_argument("--bake-file", help="bake file (default: $ROCM_BAKE_FILE, else ./rocm-bake.hcl)")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--group", metavar="G", help="a bake group")
    add_list(what, "--targets", metavar="T", help="bake targets")
    what.add_argument("--job", metavar="J", help="a partitioned job, e.g. pytorch_run_job")
    add_list(p, "--arch", required=True, metavar="A", help="GPU arches (partitions) to build")
    p.add_argument(
        "--url", default=DEFAULT_DAGSTER_URL, help=f"webserver URL (default: {DEFAULT_DAGSTER_URL})"
    )
    p.add_argument(
        "--asset-backfill",
        action="store_true",
        help="a Dagster asset backfill (the UI's Backfills page; its daemon advances every 30 s) "
        "instead of every build's run at once",
    )
    p.add_argument("--json", action="store_true", help="print the backfill as JSON")
    p.set_defaults(func=cmd_backfill)
