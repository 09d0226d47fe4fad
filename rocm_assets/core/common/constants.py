"""Names shared by the code location, the coordinator and the CLI: tag keys, env vars, defaults."""

# Run tags under this prefix belong to the coordinator and the build: any supplied at submission
# are blanked, and none is ever read to decide where a build runs (the builder claim is).
ROCM_TAG_PREFIX = "rocm/"
ROCM_NODE_TAG = "rocm/node"
# The machine the build holds: the node's buildx builder (two fleet entries never share one).
ROCM_BUILDER_TAG = "rocm/builder"
ROCM_MAX_JOBS_TAG = "rocm/max_jobs"
ROCM_EST_START_TAG = "rocm/est_start"
ROCM_EST_FINISH_TAG = "rocm/est_finish"
ROCM_BUILD_TAG = "rocm/build"
# A waiting build run has placement=waiting until the coordinator picks its node at dequeue time.
ROCM_PLACEMENT_TAG = "rocm/placement"
PLACEMENT_WAITING = "waiting"
PLACEMENT_PLACED = "placed"
# Set by a run's first build step once its preflight passed; the value is that run's id, because
# a re-execution copies the tags and must check its inputs again.
ROCM_PREFLIGHT_TAG = "rocm/preflight"
ROCM_WAITING_FOR_TAG = "rocm/waiting_for"
# Set by the coordinator on a waiting in-process run it gives up on (an input that stays
# unpublished): the run's worker fails the step with this reason.
ROCM_REFUSED_TAG = "rocm/refused"
# Set by the daemon on a build run that failed because its worker died holding its builder: one
# line, pid and how it ended. The UI's run list shows it beside the run.
ROCM_FAILURE_TAG = "rocm/failure"
# A request covering several builds becomes one run per build; the request's run is the parent.
ROCM_FANOUT_TAG = "rocm/fanout"
FANOUT_PARENT = "parent"
ROCM_FANOUT_OF_TAG = "rocm/fanout_of"

# Environment variables the farm reads.
BAKE_FILE_ENV = "ROCM_BAKE_FILE"
FLEET_FILE_ENV = "ROCM_FLEET_FILE"
REGISTRY_URL_ENV = "ROCM_REGISTRY_URL"
REGISTRY_USERNAME_ENV = "ROCM_REGISTRY_USERNAME"
REGISTRY_PASSWORD_ENV = "ROCM_REGISTRY_PASSWORD"
REGISTRY_CA_ENV = "ROCM_REGISTRY_CA"
# Extra known_hosts file for fleet probes, read on top of the system and user ones.
SSH_KNOWN_HOSTS_ENV = "ROCM_SSH_KNOWN_HOSTS"
# Where freshness alerts are POSTed as JSON; unset, they are only logged. May hold a token.
ALERT_WEBHOOK_ENV = "ROCM_ALERT_WEBHOOK"
DAGSTER_HOME_ENV = "DAGSTER_HOME"

DEFAULT_BAKE_FILE = "rocm-bake.hcl"
DEFAULT_FLEET_FILE = "fleet.yaml"
# The instance directory `make dev` uses, under the directory it runs in.
DEFAULT_DAGSTER_HOME = ".dagster_home"

# Names the bake file and the code agree on: the arch list, the arch variable, the mode switch.
ARCH_LIST_ATTR = "GPU_ARCHES"
ARCH_VAR = "GPU_ARCH"
TEST_TARGETS_ATTR = "TEST_TARGETS"
WHEELS_GROUP = "wheels"
PUBLISHED_INPUTS_VAR = "PUBLISHED_INPUTS"
# What Go's strconv.ParseBool reads, as bake reads a bool variable from the environment.
PARSE_BOOL_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})
PARSE_BOOL_FALSE = frozenset({"0", "f", "F", "FALSE", "false", "False"})
RUN_ID_VAR = "RUN_ID"
# Build args every build is given on the command line, and the sccache log level it passes.
MAX_JOBS_ARG = "MAX_JOBS"
BUILD_NAME_ARG = "BUILDKIT_BUILD_NAME"
SCCACHE_LOG_VAR = "SCCACHE_LOG"
REGISTRY_VAR = "REGISTRY"

# The history-name prefix: this repository's name, so the sibling project's builds stay apart.
BUILD_NAME_PREFIX = "rocm-pytorch-build"
NOARCH = "noarch"
# Each asset carries a tag per bake group it is in: rocm-group/<group>.
GROUP_TAG_PREFIX = "rocm-group/"

# The module `dagster asset materialize -m` loads; preflight names it in the commands it prints.
DEFINITIONS_MODULE = "rocm_assets.definitions"
# The asset check that compares a tag's digest in the registry with the last materialization's.
REGISTRY_DIGEST_CHECK = "registry_digest_matches"

# The Dagster webserver `rocm-assets backfill` talks to, and the UI `watch` links to.
DEFAULT_DAGSTER_URL = "http://localhost:3000"
# The seed's multi-node buildx builder. Here the coordinator schedules the pool, so the name only
# matters to `build-all`, which refuses it (and any name that is not one node's builder).
POOL_BUILDER = "snoc-pool"
# The bake group `rocm-assets plan` and the benchmark schedule when none is named.
DEFAULT_GROUP = "default"

# Dagster's own run tags, as the strings Dagster writes: the core reads them without Dagster.
PARTITION_TAG = "dagster/partition"
PARTITION_RANGE_START_TAG = "dagster/asset_partition_range_start"
PARTITION_RANGE_END_TAG = "dagster/asset_partition_range_end"
