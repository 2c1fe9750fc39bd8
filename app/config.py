"""Configuration: the only module that reads the process environment.

Every setting has an ``ASYNCH_`` variable and a default.  The database has
none: an empty ASYNCH_DATABASE_URL means "not configured" (one clear error
when something needs it, app/infra/db.py); `asynch dev` brings its own
PostgreSQL and Redis and writes their URLs to its checkout's
.asynch/dev.json, which the ``asynch`` command loads into the environment
before settings are read (app/cli/devstate.py).  Everything else in the code
receives a ``Settings`` object.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, fields, replace
from typing import Mapping


def _int(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        return int(raw)
    except ValueError as exc:
        raise ValueError(f"{name} must be an integer, got {raw!r}") from exc


def _float(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        return float(raw)
    except ValueError as exc:
        raise ValueError(f"{name} must be a number, got {raw!r}") from exc


def _bool(env: Mapping[str, str], name: str, default: bool) -> bool:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    return raw.strip().lower() in ("1", "true", "yes", "on")


@dataclass(frozen=True)
class Settings:
    # PostgreSQL (postgresql+psycopg2://...), the one SQL dialect; empty: not configured.
    database_url: str = ""
    # Connections each of a process's two pools keeps open.  At least the
    # API's threads per process: a pool smaller than the concurrency closes
    # each overflow connection on return and opens a new one on the next
    # checkout (a PostgreSQL backend fork per request; admission measured
    # ~490 req/s with 5, ~700 with 20, bench/bench_admission.py).
    db_pool_size: int = 16
    # One Redis (redis://, rediss://) or a Redis Cluster
    # (redis+cluster://host:port[,host:port...], rediss+cluster://): gates,
    # permits, runtime limits, rate limits, wake-ups, beat leadership.
    redis_url: str = "redis://127.0.0.1:6379/0"
    # Socket timeout of the Redis clients (seconds): how long a request
    # waits on an unreachable Redis before it answers 503.
    redis_timeout_seconds: float = 10.0
    # Celery broker; empty means "the Redis above".  amqp:// works too.
    # Never a Redis Cluster: with a cluster ASYNCH_REDIS_URL it must be set.
    broker_url: str = ""
    # Where results go: file:///abs/dir, file://relative/dir, s3://bucket/prefix
    # or oss+http(s)://host:port/base (the seed's file service, see storage.py)
    storage_url: str = "file://data/results"
    s3_endpoint_url: str = ""
    s3_region: str = "us-east-1"
    s3_access_key: str = ""
    s3_secret_key: str = ""
    # Redis key namespace; the runtime override keys the seed documents
    # (asynch:runtime:...) live under it.
    redis_prefix: str = "asynch"
    # Celery queue the API publishes run_job messages to.
    queue_name: str = "asynch"
    # API keys: an optional bootstrap admin key accepted from the environment
    # (never stored), and a pepper mixed into every stored key hash.
    bootstrap_admin_key: str = ""
    key_pepper: str = ""
    # A local trial (`asynch dev` sets it): weak or missing secrets are
    # accepted (see check_startup).  Never in a deployment.
    dev_mode: bool = False
    # Keys encrypting secrets at rest (head_msg values, tenant callback
    # secrets): comma-separated Fernet keys, the first encrypts, every one
    # decrypts (app/infra/secretbox.py).  Empty: derived from the pepper (dev mode only).
    secrets_keys: str = ""
    # The previous callback secret keeps signing (a second signature) this long after a rotation.
    callback_secret_overlap_seconds: int = 86400
    # Per-process caches on the admission path (seconds; 0 disables): a
    # revoked key / changed model reaches every API process within this.
    auth_cache_seconds: float = 5.0
    model_cache_seconds: float = 2.0
    # Request and response limits.
    max_body_bytes: int = 10 * 1024 * 1024
    max_result_bytes: int = 64 * 1024 * 1024
    # GET .../result with S3 storage: 0 streams the object through the API;
    # N > 0 answers 307 to a presigned S3 URL valid N seconds instead.
    result_redirect_seconds: int = 0
    # Results of at most this many bytes stay in the job's row (location
    # ``inline:``): no storage round trip, nothing to delete at cleanup.  -1:
    # 4096 for file:// storage, 0 (off) for S3 and OSS, whose locations
    # (oss_file) callers may fetch themselves.  0: always store.
    inline_result_bytes: int = -1
    # A model's timeout_seconds may not exceed this; the broker's visibility
    # timeout is derived from it so a slow call is never re-delivered early.
    max_model_timeout_seconds: int = 3600
    # Extra seconds a running attempt's lease lasts beyond its model timeout
    # (upload + bookkeeping).  A lease past expiry means the worker died.
    lease_grace_seconds: int = 120
    # How long a job may wait in the queue in total, on top of its attempts'
    # time, before it counts as timed out (see services.jobs.job_deadline).
    job_queue_budget_seconds: int = 3600
    # Tries for one result upload; upload retries never re-call the model.
    upload_attempts: int = 3
    # Backoff before a failed attempt is re-admitted: base * 2**(attempt-1), capped.
    retry_backoff_seconds: float = 2.0
    retry_backoff_max_seconds: float = 300.0
    # Reconcile leaves gate slots younger than this alone: their row may be
    # about to commit.
    reconcile_grace_seconds: float = 30.0
    # Long-poll limits (milliseconds), seed 000's contract.
    wait_default_ms: int = 30000
    wait_max_ms: int = 300000
    # Sync mode (``Prefer: wait=N`` on a submit): a done job's JSON result of
    # at most this many bytes is in the 200 body itself (0: never inline).
    sync_result_max_bytes: int = 65536
    # Event streams (GET .../jobs/{id}/events, GET /v1/events; each counts
    # as a waiter): a comment line every keepalive seconds, the row re-read
    # every poll seconds (a terminal state wakes the stream at once), and a
    # stream closed after max seconds (the client resumes with Last-Event-ID).
    events_keepalive_seconds: float = 15.0
    events_poll_seconds: float = 1.0
    events_max_seconds: float = 3600.0
    # Concurrent long-polls (/wait) one API process holds, per tenant and in
    # total.  A wait parks no thread (the API serves on gevent), but each
    # holds a socket and a little memory: the tenant cap keeps one tenant
    # from taking a process's whole budget, the process cap bounds its file
    # descriptors (`asynch api --worker-connections` defaults above it).
    # Past either: 429 with Retry-After.  A tenant's own cap is its max_waiters in
    # its limits (PUT /v1/tenants/{tenant}/limits).
    waiters_per_tenant: int = 1000
    waiters_max: int = 10000
    # Park a sleeping /wait as a small record answered by the wake-up hub
    # (app/infra/parking.py) instead of keeping its request greenlet, under
    # `asynch api`'s gevent worker.  Off: every wait keeps its greenlet.
    wait_parking: bool = True
    # Job listing page size cap.
    list_max_limit: int = 500
    # Beat intervals (seconds).
    beat_retry_seconds: float = 5.0
    beat_recover_seconds: float = 30.0
    beat_cleanup_seconds: float = 60.0
    beat_autotune_seconds: float = 3600.0
    # Pending jobs older than this whose message may be lost get re-published.
    republish_after_seconds: float = 300.0
    # Retention of terminal jobs that nobody claims: failed/timeout/canceled,
    # and done jobs never batch-claimed.  Claimed jobs use the model's
    # auto_clean_seconds (expire_at).
    failed_retention_seconds: int = 7 * 86400
    done_retention_seconds: int = 7 * 86400
    # Rows one maintenance transaction locks (SKIP LOCKED) and works on.
    maintenance_batch: int = 500
    # Pending jobs one runWork pass claims and runs itself (the worker-less
    # deployment of seed 002, app/maintenance/run_once.py); 0: it runs none
    # (resident Celery workers run them).
    run_work_max_tasks: int = 0
    # Beat leader lock: a beat that stops renewing it for this long loses
    # it and a standby beat takes over.  Must exceed a beat tick.
    beat_lock_ttl_seconds: float = 30.0
    # Recent periodic runs kept in Redis (operators, tests); 0 keeps none.
    beat_history_size: int = 1000
    # Autotune: the window it looks back over, how long its runtime limits
    # live without being refreshed, the fewest finished jobs it acts on, and
    # how long a job must have waited for a worker to count as queued.
    autotune_window_seconds: int = 3600
    autotune_ttl_seconds: int = 7200
    autotune_min_samples: int = 5
    autotune_queued_seconds: float = 1.0
    # Capacity isolation (docs/architecture.md, "Fair share" and "Fair dispatch").
    # A tenant may hold at most this share of a model's queue_limit unless
    # the model (tenant_queue_limit) or the tenant (its limits) says otherwise;
    # 1.0: no per-tenant cap.
    tenant_queue_share: float = 1.0
    # Run_job messages per model that may wait in the broker unclaimed: the
    # fair scheduler decides the order up to here, the broker's FIFO after.
    # At least the worker processes that serve the model keeps them all busy;
    # more only adds waiting where fairness no longer applies.
    dispatch_window: int = 8
    # A dispatched job no worker claimed within this many seconds lost its
    # message: it goes back to the head of its tenant's queue.
    dispatch_lease_seconds: float = 60.0
    # getTaskBatch: most task ids one call may name.
    batch_max_ids: int = 1000
    # Callbacks on done (seed 002): the wall-clock deadline of one delivery
    # attempt (connect, send, headers and body together), attempts, backoff
    # base * 2**(n-1) capped, with jitter.
    callback_timeout_seconds: float = 10.0
    callback_max_attempts: int = 8
    callback_backoff_seconds: float = 5.0
    callback_backoff_max_seconds: float = 3600.0
    beat_callbacks_seconds: float = 15.0
    # Operator allowlist for callback targets that would otherwise be refused
    # (loopback, private, link-local ...): comma list of IPs, CIDRs or host names.
    callback_allow_hosts: str = ""
    # The longest a URL check waits for DNS (callbackUrl at submit and before
    # each delivery); past it the target counts as not resolving.
    resolve_timeout_seconds: float = 5.0
    # Celery queue of callback deliveries, consumed by `asynch callback-worker`
    # only: a slow receiver ties up callback processes, never job workers.
    callback_queue_name: str = "asynch-callbacks"
    # Trust X-User-Info from a gateway in front of the API for the job's
    # creator.  Off: only the creator field / X-Creator header count.
    trusted_gateway: bool = False
    # The modelKey allowlist of a model created without model_key_headers
    # (issue 12: empty, jobs set no header).  A seed-002 deployment whose
    # clients create models with the seed's createModel and send modelKey
    # (e.g. X-API-Key over head_msg) names those headers here
    # (docs/migrating.md).
    model_key_headers_default: str = ""
    # How requests authenticate: "key" (a Bearer API key, the default) or
    # "gateway" (the seed-002 deployment behind the business gateway: a
    # request proven to come from the gateway -- ASYNCH_GATEWAY_SECRET in
    # ASYNCH_GATEWAY_SECRET_HEADER and/or a source in ASYNCH_GATEWAY_CIDRS --
    # acts for the tenant and creator its X-User-Info names, and its
    # Authorization goes to the OSS file service unchanged; a request that
    # carries one of our API keys is still authenticated by it: admin routes).
    auth_mode: str = "key"
    # Seed-002 routes answer errors with HTTP 200 and the status only in the
    # envelope's code (as some seed clients expect); off: the real status.
    seed_errors_http_200: bool = False
    gateway_secret: str = ""
    gateway_secret_header: str = "X-Gateway-Secret"
    gateway_cidrs: str = ""
    # The tenant of a gateway request whose X-User-Info names none; empty: 401.
    gateway_default_tenant: str = ""
    # OSS file service backend (storage_url oss+http://host:port/base): the
    # Authorization sent when a job carries none of its own, and the timeout.
    oss_authorization: str = ""
    oss_timeout_seconds: float = 60.0
    log_level: str = "INFO"
    # Every metrics endpoint (an API's /metrics and /metrics/cluster, a worker
    # node's metrics port): empty means no key needed; else "Authorization: Bearer <token>".
    metrics_token: str = ""
    # asynch_jobs{state=done|failed|claimed|timeout|canceled} counts at most
    # this many rows per model and state: a scrape never counts the whole history.
    metrics_job_count_cap: int = 10000
    # Prometheus multiprocess directory of one process group (an API server:
    # gunicorn master + workers; a worker node: Celery main + pool).  Empty:
    # `asynch api` / `asynch worker` make a fresh temporary one each start.
    # Never share one between two groups: each wipes it when it starts.
    metrics_dir: str = ""
    # A worker node's main process serves its /metrics on this port (pool
    # processes' counters included); 0 serves none.
    worker_metrics_port: int = 9808
    # Workers refresh their liveness key this often; it expires after 3 intervals.
    worker_heartbeat_seconds: float = 5.0
    # Recovery fails a node's running attempts as soon as its liveness key
    # has expired (instead of when their lease runs out).  Off: leases only.
    recover_by_heartbeat: bool = True
    # Request rate limit per API key (a token bucket in Redis, see
    # app/web/ratelimit.py): tokens per second.  0 turns limiting off and then
    # a request costs no Redis round trip for it.  The defaults every key gets
    # until per-tenant overrides are plugged in (set_policy_resolver).
    rate_limit_per_second: float = 0.0
    # Bucket capacity: how many requests a rested key may send at once.
    # 0 means twice the rate per second, at least 1.
    rate_limit_burst: int = 0

    @property
    def inline_result_limit(self) -> int:
        if self.inline_result_bytes >= 0:
            return self.inline_result_bytes
        return 4096 if self.storage_url.startswith("file:") else 0

    @property
    def effective_broker_url(self) -> str:
        return self.broker_url or self.redis_url

    @property
    def broker_visibility_timeout(self) -> int:
        # Above the longest model call plus its lease grace, so Redis does
        # not hand a message that is still being worked on to a second worker.
        return self.max_model_timeout_seconds + self.lease_grace_seconds + 300

    def with_overrides(self, **kw) -> "Settings":
        return replace(self, **kw)


_ENV_NAMES = {f.name: "ASYNCH_" + f.name.upper() for f in fields(Settings)}


def load_settings(env: Mapping[str, str] | None = None) -> Settings:
    """Build Settings from ``env`` (default: os.environ)."""
    env = os.environ if env is None else env
    kw = {}
    defaults = Settings()
    for f in fields(Settings):
        name = _ENV_NAMES[f.name]
        default = getattr(defaults, f.name)
        if isinstance(default, bool):
            kw[f.name] = _bool(env, name, default)
        elif isinstance(default, int):
            kw[f.name] = _int(env, name, default)
        elif isinstance(default, float):
            kw[f.name] = _float(env, name, default)
        else:
            kw[f.name] = env.get(name, default)
    s = Settings(**kw)
    if is_cluster_url(s.redis_url) and not s.broker_url:
        raise ValueError("ASYNCH_REDIS_URL is a Redis Cluster: set ASYNCH_BROKER_URL to a single Redis or "
                         "RabbitMQ (the Celery broker cannot use a cluster)")
    if is_cluster_url(s.broker_url):
        raise ValueError("ASYNCH_BROKER_URL cannot be a Redis Cluster: use a single Redis or RabbitMQ")
    if s.auth_mode not in ("key", "gateway"):
        raise ValueError(f"ASYNCH_AUTH_MODE must be key or gateway, got {s.auth_mode!r}")
    if s.auth_mode == "gateway" and not (s.gateway_secret or s.gateway_cidrs.strip()):
        raise ValueError("ASYNCH_AUTH_MODE=gateway needs ASYNCH_GATEWAY_SECRET and/or ASYNCH_GATEWAY_CIDRS")
    return s


# The shortest ASYNCH_BOOTSTRAP_ADMIN_KEY a deployment accepts.
MIN_BOOTSTRAP_KEY_LENGTH = 32


def check_startup(s: Settings) -> None:
    """Refuse to serve with insecure secrets outside dev mode (every server
    command calls it): a bootstrap admin key shorter than 32 characters or an
    empty pepper.  Raises ValueError with the fix."""
    if s.dev_mode:
        return
    problems = []
    if s.bootstrap_admin_key and len(s.bootstrap_admin_key) < MIN_BOOTSTRAP_KEY_LENGTH:
        problems.append(f"ASYNCH_BOOTSTRAP_ADMIN_KEY is shorter than {MIN_BOOTSTRAP_KEY_LENGTH} characters")
    if not s.key_pepper:
        problems.append("ASYNCH_KEY_PEPPER is empty")
    if problems:
        raise ValueError("refusing to start outside dev mode (ASYNCH_DEV_MODE): " + "; ".join(problems)
                         + " (generate one with: python -c 'import secrets; print(secrets.token_urlsafe(32))')")


def is_cluster_url(url: str) -> bool:
    """A Redis Cluster URL (redis+cluster:// or rediss+cluster://)."""
    return url.split("://", 1)[0] in ("redis+cluster", "rediss+cluster")


def prometheus_multiproc_dir(env: Mapping[str, str] | None = None) -> str:
    """The multiprocess directory prometheus_client itself reads (from
    PROMETHEUS_MULTIPROC_DIR, which `asynch api` / `asynch worker` set for
    their process group); empty when this process keeps metrics in memory."""
    env = os.environ if env is None else env
    return env.get("PROMETHEUS_MULTIPROC_DIR", "")


def env_names() -> dict[str, str]:
    """Setting name -> environment variable (used by docs and the compose test)."""
    return dict(_ENV_NAMES)


_current: Settings | None = None


def get_settings() -> Settings:
    """Process-wide settings, read once."""
    global _current
    if _current is None:
        _current = load_settings()
    return _current


def set_settings(settings: Settings) -> None:
    """Install settings for this process (tests, the dev runner)."""
    global _current
    _current = settings
