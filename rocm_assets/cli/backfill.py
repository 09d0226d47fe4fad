"""`rocm-assets backfill`: launch an arch backfill through the Dagster webserver's GraphQL API.

The request is the `launchPartitionBackfill` mutation the UI sends. The backfill daemon turns it
into runs and the placement coordinator splits those into one placed run per build, each started
once its inputs are pushed. `--job J` launches a job's partition backfill instead (one run of J
per arch), for jobs outside the asset groups such as `pytorch_run_job`.

The selection goes out as `partitionsByAssets`: each per-arch target with the chosen arches, each
noarch target unpartitioned. `assetSelection` + `partitionNames` looks equivalent, but Dagster then
targets only the per-arch assets it reaches from the selection's roots through other selected
per-arch assets: for the `wheels` group it silently drops lmcache-wheel and vllm-wheel, whose
parents (lmcache, vllm) are outside the group (seen on the 1.13.27 webserver).
"""

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from rocm_assets.cli.common import EXIT_ERROR, EXIT_OK, add_list
from rocm_assets.core.bake import BakeGraph, load_graph
from rocm_assets.core.build.builds import SelectionError, check_arches, select_targets
from rocm_assets.core.common.constants import DEFAULT_DAGSTER_URL
from rocm_assets.core.common.settings import bake_file_path

_TIMEOUT_S = 30.0

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

    def job_partition_set(self, job: str) -> tuple[str, str, str]:
        """(code location, repository, partition set) of the job called `job`."""
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
                if job not in names:
                    continue
                sets = [s["name"] for s in repo["partitionSets"] if s["pipelineName"] == job]
                if not sets:
                    raise BackfillError(
                        f"job {job!r} in code location {entry['name']!r} is not partitioned by arch"
                    )
                return entry["name"], repo["name"], sets[0]
        shown = ", ".join(sorted(j for j in jobs if not j.startswith("__"))) or "none"
        raise BackfillError(f"the webserver at {self.url} has no job {job!r} (jobs: {shown})")

    def launch(self, params: Mapping[str, Any]) -> str:
        """Launch the backfill; its id."""
        result = self.query(_LAUNCH, {"params": dict(params)})["launchPartitionBackfill"]
        if result["__typename"] != "LaunchBackfillSuccess":
            raise BackfillError(
                f"the webserver refused the backfill ({result['__typename']}): "
                f"{_one_line(result.get('message', ''))}"
            )
        return str(result["backfillId"])


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
                params = asset_backfill_params(selection, f"rocm-assets: {what}")
                summary = {"targets": list(selection.targets), "builds": selection.build_count}
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


def add_parser(subparsers: Any) -> None:
    """Register `backfill` on the `rocm-assets` subcommand parser."""
    p = subparsers.add_parser(
        "backfill",
        help="launch an arch backfill through the Dagster webserver",
        description="Launch an asset backfill (or a job's partition backfill) through the "
        "webserver's GraphQL API; it becomes one placed run per build.",
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
    p.add_argument("--json", action="store_true", help="print the backfill as JSON")
    p.set_defaults(func=cmd_backfill)
