"""What operators look at: live numbers per model and throughput series."""
from __future__ import annotations

from pydantic import Field

from app.contract import BeatRun, Int, Params, Shape, Timestamp, rule


class RuntimeOverrides(Shape):
    queue_limit: int | None
    max_concurrency: int | None


class ModelLive(Shape):
    model_name: str
    enabled: bool
    queue_depth: int = Field(description="gate slots taken (pending + running)")
    queue_limit: int = Field(description="effective: runtime override capped by the configuration")
    queue_limit_configured: int
    running: int
    pending: int
    retry_wait: int
    max_concurrency: int
    max_concurrency_configured: int
    runtime: RuntimeOverrides = Field(description="autotune's overrides (null: none)")
    effective_concurrency: int = Field(description="the permit cap dispatch applies: max_concurrency, lowered by "
                                       "the upstream controller while the model pushes back")
    paused_until: Timestamp | None = Field(None, description="dispatch paused for the model's Retry-After until")


class Overview(Shape):
    models: list[ModelLive]


class SeriesPoint(Shape):
    done: int
    p90_seconds: float | None


class Series(Shape):
    since: Timestamp
    bucket_minutes: int
    models: dict[str, list[SeriesPoint]]


class SeriesQuery(Params):
    minutes: Int(5, 1440, query=True) = rule("an integer from 5 to 1440", 60)


# --- the console's operator pages (app/observe/ops.py) ---------------------------------

class RunningJob(Shape):
    job_id: str
    model: str
    tenant: str
    attempt: int
    started_at: Timestamp | None


class WorkerView(Shape):
    node: str = Field(description="the Celery node name")
    alive: bool = Field(description="its liveness hash is there: each heartbeat or consumed message renews it for "
                                    "ttl_seconds; gone, recovery fails the node's attempts")
    heartbeat_age_seconds: float | None = Field(description="null: no heartbeat since the hash was (re)made")
    consumed_age_seconds: float | None = Field(description="since it last took a message")
    queues: list[str]
    instance: str | None
    running: list[RunningJob] = Field(description="the jobs whose current attempt this node holds")


class Workers(Shape):
    ttl_seconds: int = Field(description="a node silent for longer is dead (recovery fails its attempts)")
    workers: list[WorkerView]
    unassigned_running: int = Field(description="running jobs that name no node")


class BeatLeader(Shape):
    owner: str
    token: int = Field(description="the fencing token of this leadership")
    ttl_ms: int | None = Field(description="left on the lock; the leader renews it")


class PeriodicRun(BeatRun):  # the same record under the name the state documents
    pass


class GateState(Shape):
    model: str
    slots: int = Field(description="members of the model's gate set in Redis")
    active_rows: int = Field(description="its pending + running rows")
    drift: int = Field(description="slots - active_rows: what a reconcile would repair (young slots are spared)")
    configured: bool = Field(description="false: a gate left by a deleted model")


class MaintenanceState(Shape):
    leader: BeatLeader | None = Field(description="null: no beat holds the lock")
    latest: list[PeriodicRun] = Field(description="the latest recorded run of each periodic task")
    gates: list[GateState]
    checked_at: Timestamp


class TenantList(Shape):
    tenants: list[str]
    caller: str = Field(description="the caller's own tenant (the console opens on it)")


class TenantModelShare(Shape):
    model: str
    in_use: int = Field(description="the tenant's slots in the model's gate (pending + running)")
    cap: int = Field(description="slots the tenant may hold (its share of queue_limit)")
    queue_limit: int
    pending: int
    running: int
    retry_wait: int


class KeyBucket(Shape):
    key_id: int
    tokens: float | None = Field(description="requests the key may send at once now (null: Redis unreachable)")


class RateState(Shape):
    limited: bool
    rate_per_second: float | None
    burst: int | None
    keys: list[KeyBucket] = Field(description="the tenant's active keys' buckets")


class TenantState(Shape):
    tenant: str
    models: list[TenantModelShare]
    rate: RateState
