"""Freshness alerts: a sensor that reports each asset going WARN or FAIL, once.

Dagster OSS records freshness but does not alert on it (alerts are a Dagster+ feature). The
FreshnessDaemon writes a FRESHNESS_STATE_CHANGE event each time an asset's state changes; this
sensor reads those events after its cursor (the last event's storage id), logs one line per
change to WARN or FAIL and, when $ROCM_ALERT_WEBHOOK is set, POSTs it there as JSON. The cursor
moves past every event it read, delivered or not, so each change is reported once; a webhook that
is down costs that change its POST, never the sensor its tick.
"""

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import dagster as dg

from rocm_assets.core.common.constants import ALERT_WEBHOOK_ENV
from rocm_assets.defs.freshness import freshness_window

_ALERT_STATES = frozenset({"WARN", "FAIL"})
# A tick reads at most this many events; the next tick carries on from the cursor.
_PAGE = 200
_WEBHOOK_TIMEOUT_S = 5.0


@dataclass(frozen=True, slots=True)
class FreshnessAlert:
    """One asset's freshness going WARN or FAIL."""

    asset: str
    state: str
    since: datetime

    def payload(self) -> dict[str, object]:
        """The webhook's JSON body."""
        return {
            "asset": self.asset,
            "state": self.state,
            "since": self.since.isoformat(),
            "window": freshness_window(self.asset).describe(),
        }

    def line(self) -> str:
        window = freshness_window(self.asset)
        return (
            f"freshness: {self.asset} is {self.state} since {self.since:%Y-%m-%d %H:%M:%S} UTC "
            f"(WARN after {_span(window.warn)}, FAIL after {_span(window.fail)} without a "
            "materialization)"
        )


def _span(delta: timedelta) -> str:
    """Whole days as "7d", anything else as timedelta prints it."""
    return f"{delta.days}d" if delta == timedelta(days=delta.days) else str(delta)


def _changes(
    instance: dg.DagsterInstance, after: int | None
) -> tuple[list[dg.EventLogRecord], int | None]:
    """Freshness state changes after `after`, oldest first, and the new cursor.

    With no cursor yet, everything so far is read and only each asset's latest change kept: a
    first tick reports what is stale now, not the history of every asset.
    """
    records = instance.event_log_storage.get_event_records(
        dg.EventRecordsFilter(
            event_type=dg.DagsterEventType.FRESHNESS_STATE_CHANGE, after_cursor=after
        ),
        limit=_PAGE if after is not None else None,
        ascending=True,
    )
    if not records:
        return [], after
    cursor = records[-1].storage_id
    if after is None:
        latest = {_dagster_event(r).asset_key: r for r in records}
        records = sorted(latest.values(), key=lambda r: r.storage_id)
    return list(records), cursor


def _dagster_event(record: dg.EventLogRecord) -> dg.DagsterEvent:
    # Only Dagster events are stored under an event type, so the filter never yields a bare log.
    event = record.event_log_entry.dagster_event
    assert event is not None
    return event


def _alert(record: dg.EventLogRecord) -> FreshnessAlert | None:
    """The alert for one change, or None when the asset went to a state that is not WARN/FAIL."""
    change = _dagster_event(record).asset_freshness_state_change_data
    if change.new_state.value not in _ALERT_STATES:
        return None
    return FreshnessAlert(
        asset=change.key.to_user_string(),
        state=change.new_state.value,
        since=datetime.fromtimestamp(change.state_change_timestamp, UTC),
    )


def _post_all(
    context: dg.SensorEvaluationContext, url: str, alerts: Sequence[FreshnessAlert]
) -> None:
    # The URL may carry a token (Slack-style webhooks), so it is never logged, nor is an error
    # message that could quote it: only the HTTP status or the exception type.
    import httpx  # here, not at load: most ticks post nothing

    with httpx.Client(timeout=_WEBHOOK_TIMEOUT_S) as client:
        for index, alert in enumerate(alerts):
            try:
                client.post(url, json=alert.payload()).raise_for_status()
            except httpx.HTTPStatusError as exc:
                context.log.warning(
                    "freshness alert webhook answered HTTP %s for %s",
                    exc.response.status_code,
                    alert.asset,
                )
            except httpx.HTTPError as exc:
                # Unreachable: stop here, so a dead endpoint costs one timeout, not one per alert.
                context.log.warning(
                    "freshness alert webhook unreachable (%s); %d alert(s) not posted",
                    type(exc).__name__,
                    len(alerts) - index,
                )
                return


@dg.sensor(
    name="freshness_alert_sensor",
    minimum_interval_seconds=60,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description=(
        "Logs each asset whose freshness went WARN or FAIL and, if $ROCM_ALERT_WEBHOOK is set, "
        'POSTs {"asset", "state", "since", "window"} there.'
    ),
)
def freshness_alert_sensor(context: dg.SensorEvaluationContext) -> dg.SensorResult | dg.SkipReason:
    try:
        after = json.loads(context.cursor)["after"] if context.cursor else None
    except (ValueError, TypeError, KeyError):
        context.log.warning("unreadable cursor %r: reading freshness afresh", context.cursor)
        after = None
    records, cursor = _changes(context.instance, after)
    if cursor == after:
        return dg.SkipReason("no freshness state changes")
    alerts = [a for a in map(_alert, records) if a is not None]
    for alert in alerts:
        context.log.warning(alert.line())
    url = os.environ.get(ALERT_WEBHOOK_ENV)
    if alerts and url:
        _post_all(context, url, alerts)
    # The sensor starts no runs, so the UI lists every tick as skipped, with this reason.
    if alerts:
        where = "logged and posted to the webhook" if url else f"logged ({ALERT_WEBHOOK_ENV} unset)"
        states = ", ".join(f"{a.asset} {a.state}" for a in alerts)
        reason = f"{len(alerts)} freshness alert(s) {where}: {states}"
    else:
        reason = f"{len(records)} change(s), none to WARN or FAIL"
    return dg.SensorResult(cursor=json.dumps({"after": cursor}), skip_reason=reason)
