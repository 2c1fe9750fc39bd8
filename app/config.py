"""Configuration: the only module that reads the process environment.

Every setting is declared once, as a field of ``Settings`` (pydantic-settings):
its variable is ``ASYNCH_`` + the field's name in upper case, its description
a one-line summary; docs/operations.md's table, checked against the fields and
their defaults (tests/test_config.py), says the whole meaning.  An empty
ASYNCH_DATABASE_URL means "not configured" (app/infra/db.py); `asynch dev`
writes its URLs to .asynch/dev.json, loaded into the environment first
(app/cli/devstate.py).

Invariants:
- ``load_settings(env)`` reads exactly the upper-case names of ``env``
  (default: os.environ); ``Settings(...)`` reads no environment.
- Parsing: a blank number or boolean is its default; a number that does not
  parse is a ValueError naming the variable; a boolean is true for
  1/true/yes/on (any case), else false; a string is taken as it is.
- Settings are frozen; ``with_overrides(**kw)`` is a copy (not re-validated)
  and refuses a name that is not a setting.
- A renamed setting still reads its old variable (``_aka``, listed in
  ``ALIASES`` and docs/operations.md); the new one wins when both are set,
  and ``with_overrides`` takes the old field name too.
"""
from __future__ import annotations

import os
from typing import Any, Mapping

from pydantic import AliasChoices, Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, EnvSettingsSource, SettingsConfigDict

ENV_PREFIX = "ASYNCH_"


def _s(default: Any, description: str, **kw) -> Any:
    """A setting's field: its default and a one-line summary of what it does."""
    return Field(default, description=description, **kw)


def _aka(new: str, old: str, rest: str) -> AliasChoices:
    """A renamed setting's variable ``new_rest`` and its old one ``old_rest``, still read."""
    return AliasChoices(f"{ENV_PREFIX}{new}_{rest}", f"{ENV_PREFIX}{old}_{rest}")


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, frozen=True, extra="forbid", populate_by_name=True)

    database_url: str = _s("", "SQLAlchemy URL of the PostgreSQL database; empty: not configured.")
    db_pool_size: int = _s(16, "Connections each of a process's two pools keeps open (at least the API's threads).")
    redis_url: str = _s("redis://127.0.0.1:6379/0", "Redis, or a Redis Cluster (redis+cluster://host:port,...).")
    redis_timeout_seconds: float = _s(10.0, "Socket timeout of the Redis clients: past it a request answers 503.")
    broker_url: str = _s("", "Celery broker (redis:// or amqp://, never a cluster); empty: ASYNCH_REDIS_URL.")
    storage_url: str = _s("file://data/results", "Where results go: file://dir, s3://bucket/prefix or oss+http(s)://.")
    s3_endpoint_url: str = _s("", "S3 endpoint of MinIO or another S3-compatible server; empty: AWS S3.")
    s3_region: str = _s("us-east-1", "S3 region name.")
    s3_access_key: str = _s("", "S3 access key id; empty: boto3's default credential chain.")
    s3_secret_key: str = _s("", "S3 secret key, used with the access key.")
    redis_prefix: str = _s("asynch", "Redis key namespace (the runtime override keys live under it).")
    queue_name: str = _s("asynch", "Celery queue the API publishes run_job messages to.")
    bootstrap_admin_key: str = _s("", "An optional admin key accepted from the environment (never stored).")
    key_pepper: str = _s("", "Secret mixed into every stored API-key hash; changing it invalidates every key.")
    dev_mode: bool = _s(False, "A local trial (`asynch dev`): weak or missing secrets are accepted. Never deployed.")
    secrets_keys: str = _s("", "Comma-separated Fernet keys of secrets at rest: the first encrypts, each decrypts.")
    delivery_secret_overlap_seconds: int = _s(86400, "The previous signing secret keeps signing this long.",
                                              validation_alias=_aka("DELIVERY", "CALLBACK", "SECRET_OVERLAP_SECONDS"))
    auth_cache_seconds: float = _s(5.0, "How long a process caches an API key (0: off); a revocation's delay.")
    model_cache_seconds: float = _s(2.0, "How long a process caches a model's configuration (0: off).")
    max_body_bytes: int = _s(10 * 1024 * 1024, "Largest request body accepted.")
    files_max_bytes: int = _s(1024 * 1024 * 1024, "Largest file uploaded to /v1/files (streamed to storage).")
    batch_max_lines: int = _s(50_000, "Most lines of one batch's input file (OpenAI's limit: 50,000).")
    batch_admit_chunk: int = _s(1000, "Batch lines one feed pass tries to admit per batch.")
    batch_queue_share: float = _s(0.5, "The share of a model's queue_limit a tenant's batches may fill (room kept).")
    max_result_bytes: int = _s(64 * 1024 * 1024, "Largest model response a worker reads; larger fails the attempt.")
    result_redirect_seconds: int = _s(0, "S3 results: 0 streams through the API; N > 0 answers 307 to a presigned URL.")
    inline_result_bytes: int = _s(-1, "Results up to this size stay in the row; -1: 4096 for file://, else 0 (off).")
    max_model_timeout_seconds: int = _s(3600, "Cap of a model's timeout_seconds (the broker's visibility timeout).")
    lease_grace_seconds: int = _s(120, "A running attempt's lease beyond its model timeout; past it the worker died.")
    job_queue_budget_seconds: int = _s(3600, "How long a job may wait queued in total before it times out.")
    upload_attempts: int = _s(3, "Tries for one result upload; upload retries never re-call the model.")
    retry_backoff_seconds: float = _s(2.0, "Backoff of a failed attempt: base * 2**(attempt-1), capped.")
    retry_backoff_max_seconds: float = _s(300.0, "Cap of the retry backoff (seconds).")
    reconcile_grace_seconds: float = _s(30.0, "Reconcile spares gate slots younger than this (their row may commit).")
    queue_retry_after_max_seconds: int = _s(60, "Longest Retry-After a full queue answers (seconds).")
    wait_default_ms: int = _s(30000, "Long-poll budget when the caller names none (milliseconds).")
    wait_max_ms: int = _s(300000, "Cap on a long-poll budget (milliseconds).")
    sync_result_max_bytes: int = _s(65536, "Sync mode: a done job's JSON result up to this size is in the 200 body.")
    events_keepalive_seconds: float = _s(15.0, "An event stream sends a comment line this often (seconds).")
    events_poll_seconds: float = _s(1.0, "An event stream re-reads its rows this often (seconds).")
    events_max_seconds: float = _s(3600.0, "An event stream is closed after this long (seconds).")
    events_streams_per_tenant: int = _s(100, "Event streams one API process holds open per tenant (each is a wait "
                                             "too); past it: 429.")
    waiters_per_tenant: int = _s(1000, "Concurrent long-polls one API process holds per tenant; past it: 429.")
    waiters_max: int = _s(10000, "Concurrent long-polls one API process holds in total.")
    wait_parking: bool = _s(True, "Park a sleeping /wait as a record the wake-up hub answers (gevent only).")
    list_max_limit: int = _s(500, "Job listing page size cap.")
    beat_retry_seconds: float = _s(5.0, "Beat interval of retries (seconds).")
    beat_recover_seconds: float = _s(30.0, "Beat interval of recovery (seconds).")
    beat_cleanup_seconds: float = _s(60.0, "Beat interval of cleanup (seconds).")
    beat_batches_seconds: float = _s(1.0, "Beat interval of the batches pass: admit, collect, finalize (seconds).")
    beat_autotune_seconds: float = _s(3600.0, "Beat interval of autotune (seconds).")
    beat_verify_seconds: float = _s(300.0, "Beat interval of the ledger self-check on a sample (seconds); 0: off.")
    verify_sample: int = _s(1000, "Rows each check of beat's ledger self-check looks at.", ge=1)
    verify_grace_seconds: float = _s(60.0, "The ledger self-check spares anything younger than this (seconds).")
    republish_after_seconds: float = _s(300.0, "Pending jobs older than this whose entry may be lost are queued again.")
    failed_retention_seconds: int = _s(7 * 86400, "Retention of failed, timeout and canceled jobs (seconds).")
    done_retention_seconds: int = _s(7 * 86400, "Retention of done jobs never batch-claimed (seconds).")
    maintenance_batch: int = _s(500, "Rows one maintenance transaction locks (SKIP LOCKED) and works on.")
    run_work_max_tasks: int = _s(0, "Pending jobs one runWork pass claims and runs itself; 0: none.")
    beat_lock_ttl_seconds: float = _s(30.0, "Beat leader lock TTL: a standby takes over after it. Exceeds a tick.")
    beat_history_size: int = _s(1000, "Recent periodic runs kept in Redis; 0 keeps none.")
    autotune_window_seconds: int = _s(3600, "The window autotune looks back over (seconds).")
    autotune_ttl_seconds: int = _s(7200, "Lifetime of the runtime limits autotune writes (seconds).")
    autotune_min_samples: int = _s(5, "Fewest finished jobs in the window for autotune to act on a model.")
    autotune_queued_seconds: float = _s(1.0, "How long a job must have waited for a worker to count as queued.")
    tenant_queue_share: float = _s(1.0, "The share of a model's queue_limit a tenant may hold by default.")
    queue_fair_share: bool = _s(True, "Fair share at admission, with a reserve for tenants holding no slot.")
    queue_newcomer_reserve: float = _s(0.05, "Headroom above queue_limit (a share of it) only newcomers may enter.")
    worker_slots: int = _s(8, "Model calls one worker pool process runs at once; a slot freed takes the job the fair "
                              "dispatcher picks then.", ge=1, le=256)
    worker_express_slots: int = _s(1, "Call slots per worker pool process beyond worker_slots that only take a job "
                                      "of a tenant with nothing running on its model (0: none).", ge=0, le=16)
    dispatch_group: int = _s(8, "Most jobs one pull takes for a worker's free slots (claimed in one statement).",
                             ge=1, le=64)
    dispatch_bell_seconds: float = _s(10.0, "A model's doorbell no worker answered, while nothing of the model was "
                                            "pulled, is rung again after this long (its message was lost).", gt=0)
    estimate_alpha: float = _s(0.3, "Weight of each finished run in the model's moving average (0-1).")
    dispatch_fairness: str = _s("cost", "What fair dispatch shares: 'cost' (model time) or 'turns' (jobs).",
                                pattern="^(cost|turns)$")
    batch_max_ids: int = _s(1000, "getTaskBatch: most task ids one call may name.")
    upstream_control: bool = _s(True, "Adapt each model's concurrency to its upstream's 429/503 and latency.")
    upstream_busy_budget: int = _s(20, "Free busy answers a tenant has in hand per model (earned back one per done "
                                       "answer); spent out, a busy answer spends a retry.", ge=0)
    upstream_max_pause_seconds: float = _s(30.0, "Longest pause or backoff a busy answer (any Retry-After) may ask for.",
                                           gt=0, validation_alias=_aka("UPSTREAM_MAX_PAUSE", "UPSTREAM_RETRY_AFTER_MAX",
                                                                       "SECONDS"))
    upstream_backoff_seconds: float = _s(0.5, "First backoff after a busy answer without a usable Retry-After "
                                              "(doubling per busy answer in a row, with jitter).", gt=0)
    upstream_window_seconds: float = _s(10.0, "Two tenants congested on a model within this many seconds make "
                                              "the model as a whole back off.", gt=0)
    upstream_decrease: float = _s(0.5, "A busy answer multiplies the model's concurrency by this (floor 1).")
    upstream_latency_tolerance: float = _s(2.0, "Concurrency falls while run time exceeds this x baseline; 0: off.")
    delivery_timeout_seconds: float = _s(10.0, "The wall-clock deadline of one delivery attempt (seconds).",
                                         validation_alias=_aka("DELIVERY", "CALLBACK", "TIMEOUT_SECONDS"))
    delivery_max_attempts: int = _s(8, "Attempts of one delivery before it is given up.",
                                    validation_alias=_aka("DELIVERY", "CALLBACK", "MAX_ATTEMPTS"))
    delivery_backoff_seconds: float = _s(5.0, "Base of the delivery retry backoff (seconds).",
                                         validation_alias=_aka("DELIVERY", "CALLBACK", "BACKOFF_SECONDS"))
    delivery_backoff_max_seconds: float = _s(3600.0, "Cap of the delivery retry backoff (seconds).",
                                             validation_alias=_aka("DELIVERY", "CALLBACK", "BACKOFF_MAX_SECONDS"))
    delivery_tenant_inflight: int = _s(3, "Deliveries one tenant may have in flight at once (never more than the "
                                          "claiming node's processes - 1).")
    beat_deliveries_seconds: float = _s(15.0, "Beat interval of the outbox sweep (seconds).",
                                        validation_alias=_aka("BEAT_DELIVERIES", "BEAT_CALLBACKS", "SECONDS"))
    delivery_allow_hosts: str = _s("", "Allowlist of otherwise refused delivery targets: IPs, CIDRs, host names.",
                                   validation_alias=_aka("DELIVERY", "CALLBACK", "ALLOW_HOSTS"))
    resolve_timeout_seconds: float = _s(5.0, "The longest a URL check waits for DNS (seconds).")
    resolve_nameservers: str = _s("", "DNS servers of URL checks: ip, ip:port or [ipv6]:port; empty: resolv.conf.")
    resolve_cache_seconds: float = _s(10.0, "How long a DNS answer (or a failure) is kept; 0: not kept.")
    resolve_tenant_inflight: int = _s(4, "DNS lookups one tenant may have in flight per process.")
    batch_max_url_hosts: int = _s(8, "Distinct callback/webhook host names one batch submit may name.")
    delivery_queue_name: str = _s("asynch-callbacks", "Celery queue of the outbox (`asynch callback-worker`).",
                                  validation_alias=_aka("DELIVERY", "CALLBACK", "QUEUE_NAME"))
    trusted_gateway: bool = _s(False, "Trust X-User-Info from a gateway in front of the API for the creator.")
    model_key_headers_default: str = _s("", "The model_key_headers of a model created without them.")
    auth_mode: str = _s("key", "How requests authenticate: \"key\" (API keys) or \"gateway\" (the seed's gateway).")
    seed000_model: str = _s("", "The model the seed-000 routes (POST /jobs, GET /jobs/{id}...) serve; empty: 404.")
    seed_errors_http_200: bool = _s(False, "Seed-002 routes answer errors with HTTP 200 (the code in the envelope).")
    gateway_secret: str = _s("", "Gateway mode: the shared secret the gateway sends.")
    gateway_secret_header: str = _s("X-Gateway-Secret", "Gateway mode: the header carrying the gateway secret.")
    gateway_cidrs: str = _s("", "Gateway mode: comma list of CIDRs the gateway connects from.")
    gateway_default_tenant: str = _s("", "The tenant of a gateway request whose X-User-Info names none; empty: 401.")
    oss_authorization: str = _s("", "OSS file service: the Authorization sent when a job carries none.")
    oss_timeout_seconds: float = _s(60.0, "Timeout of one OSS upload or download (seconds).")
    log_level: str = _s("INFO", "Log level of every process (JSON lines on stderr).")
    metrics_token: str = _s("", "Bearer token of every metrics endpoint; empty: none needed.")
    metrics_job_count_cap: int = _s(10000, "asynch_jobs counts at most this many rows per model and terminal state.")
    metrics_dir: str = _s("", "Prometheus multiprocess directory of one process group; empty: a fresh temporary one.")
    worker_metrics_port: int = _s(9808, "A worker node's /metrics port; 0 serves none.")
    worker_metrics_bind: str = _s("127.0.0.1", "The address the worker metrics port binds.")
    worker_metrics_timeout_seconds: float = _s(5.0, "A worker metrics request head must arrive within this.")
    worker_metrics_max_connections: int = _s(8, "Worker metrics connections served at once; more are closed.")
    worker_heartbeat_seconds: float = _s(5.0, "Workers refresh their liveness key this often (it lasts 3 intervals).")
    recover_by_heartbeat: bool = _s(True, "Recovery fails a dead node's attempts when its liveness key expires.")
    rate_limit_per_second: float = _s(0.0, "Requests per second per API key (a token bucket in Redis); 0: off.")
    rate_limit_burst: int = _s(0, "Bucket capacity per key; 0: twice the rate, at least 1.")
    anon_rate_limit_per_second: float = _s(5.0, "Requests per second per address without a key; 0: off.")
    anon_rate_limit_burst: int = _s(60, "Burst of the anonymous per-address bucket (0: twice the rate).")

    @classmethod
    def settings_customise_sources(cls, settings_cls, init_settings, **_other_sources):
        # Only what the constructor is given: load_settings() is the one reader of the environment.
        return (init_settings,)

    @field_validator("*", mode="before")
    @classmethod
    def _parse_env_text(cls, raw: Any, info) -> Any:
        """A variable's text as its field's type, with today's rules (above)."""
        field = cls.model_fields[info.field_name]
        kind = field.annotation
        if not isinstance(raw, str) or kind is str:
            return raw
        if not raw.strip():
            return field.default
        if kind is bool:
            return raw.strip().lower() in ("1", "true", "yes", "on")
        try:
            return int(raw) if kind is int else float(raw)
        except ValueError:
            var = ENV_PREFIX + info.field_name.upper()
            raise ValueError(f"{var} must be {'an integer' if kind is int else 'a number'}, got {raw!r}") from None

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
        kw = {OLD_FIELDS.get(k, k): v for k, v in kw.items()}
        if unknown := set(kw) - set(type(self).model_fields):
            raise TypeError(f"not settings: {sorted(unknown)}")
        return self.model_copy(update=kw)


class _EnvSource(EnvSettingsSource):
    """pydantic-settings' environment source over ``env``, upper-case names only."""

    def __init__(self, env: Mapping[str, str]):
        self._env = {k.lower(): v for k, v in env.items() if k.startswith(ENV_PREFIX) and k == k.upper()}
        super().__init__(Settings)

    def _load_env_vars(self) -> Mapping[str, str | None]:
        return self._env


def load_settings(env: Mapping[str, str] | None = None) -> Settings:
    """Settings from ``env`` (default: os.environ); a ValueError naming the
    variable when a value does not parse or settings conflict."""
    try:
        s = Settings(**_EnvSource(os.environ if env is None else env)())
    except ValidationError as exc:
        # Our own ValueError's text as raised; pydantic's after the variable's name.
        raise ValueError("; ".join(str(e["ctx"]["error"]) if e["type"] == "value_error"
                                   else f"{ENV_PREFIX}{str(e['loc'][0]).upper()}: {e['msg']}"
                                   for e in exc.errors())) from None
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


def is_cluster_url(url: str) -> bool:
    return url.split("://", 1)[0] in ("redis+cluster", "rediss+cluster")


def prometheus_multiproc_dir() -> str:
    """The multiprocess directory prometheus_client itself reads (set by
    `asynch api` / `asynch worker` for their group); empty: metrics in memory."""
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR", "")


# Old variable -> the setting's variable, and old field name -> field (see ``_aka``).
ALIASES = {old: f.validation_alias.choices[0] for f in Settings.model_fields.values()
           if isinstance(f.validation_alias, AliasChoices) for old in f.validation_alias.choices[1:]}
OLD_FIELDS = {old[len(ENV_PREFIX):].lower(): new[len(ENV_PREFIX):].lower() for old, new in ALIASES.items()}


# Settings no longer read (docs/operations.md, "Removed settings"): a process that finds one set says so at
# start (app/cli/processes.py), with this reason.
REMOVED = {
    "ASYNCH_DISPATCH_WINDOW": "no longer read since 2026-12-07: no job waits in the broker; a worker's free call "
                              "slots pull theirs (ASYNCH_WORKER_SLOTS)",
    "ASYNCH_DISPATCH_LEASE_SECONDS": "no longer read since 2026-12-07: no dispatched job waits unclaimed; a lost "
                                     "doorbell is rung again after ASYNCH_DISPATCH_BELL_SECONDS",
}


def removed_settings(env: Mapping[str, str] | None = None) -> list[str]:
    """The removed settings ``env`` (default: os.environ) still sets, each with its reason."""
    env = os.environ if env is None else env
    return [f"{name} is {why}" for name, why in REMOVED.items() if name in env]


def env_names() -> dict[str, str]:
    """Setting name -> environment variable (used by docs and the compose test)."""
    return {name: ENV_PREFIX + name.upper() for name in Settings.model_fields}


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
