"""Configuration: the only module that reads the process environment.

Every setting is declared once, below, as a field of ``Settings`` (a
pydantic-settings ``BaseSettings``): its ``ASYNCH_`` variable is the field's
name in upper case, its description says what it does (docs/operations.md's
table is checked against the declaration: tests/test_config.py).  The
database has no default: an empty ASYNCH_DATABASE_URL means "not
configured" (one clear error when something needs it, app/infra/db.py);
`asynch dev` brings its own PostgreSQL and Redis and writes their URLs to its
checkout's .asynch/dev.json, which the ``asynch`` command loads into the
environment before settings are read (app/cli/devstate.py).  Everything else
in the code receives a ``Settings`` object.

Invariants:
- ``load_settings(env)`` reads the variables of ``env`` (default:
  os.environ) through pydantic-settings' environment source, exactly the
  upper-case names; ``Settings(...)`` is the defaults plus what it is given
  (it reads no environment: tests and the docs check build it).
- Parsing is as it always was: an empty or blank value of a number or a
  boolean means its default; an integer or a number that does not parse is
  a ValueError naming the variable; a boolean is true for 1/true/yes/on (any
  case) and false for anything else; a string is taken as it is (empty is
  empty).
- Settings are frozen; ``with_overrides(**kw)`` is a copy with some fields
  replaced (not re-validated, like the dataclass it was), and refuses a name
  that is not a setting.
- A renamed setting keeps its old variable as an alias (``_aka``: the
  ``ASYNCH_CALLBACK_*`` names of the ``ASYNCH_DELIVERY_*`` settings); the new
  name wins when both are set, and ``with_overrides`` takes the old field
  name too.  docs/operations.md lists the aliases (``ALIASES``).
"""
from __future__ import annotations

import os
from typing import Any, Mapping

from pydantic import AliasChoices, Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, EnvSettingsSource, SettingsConfigDict

ENV_PREFIX = "ASYNCH_"


def _s(default: Any, description: str, **kw) -> Any:
    """A setting's field: its default and what it does (the docs table's text)."""
    return Field(default, description=description, **kw)


def _aka(name: str, old: str) -> AliasChoices:
    """A setting's variable and the old one still read (the field is ``name`` lower-cased)."""
    return AliasChoices(ENV_PREFIX + name, ENV_PREFIX + old)


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, frozen=True, extra="forbid", populate_by_name=True)

    database_url: str = _s("", "SQLAlchemy URL of the PostgreSQL database (postgresql+psycopg2://...), the source of "
        "truth and the one SQL dialect; empty: not configured.")
    db_pool_size: int = _s(16, "Connections each of a process's two pools keeps open.  At least the API's threads "
        "per process: a pool smaller than the concurrency closes each overflow connection on return and opens a new "
        "one on the next checkout (a PostgreSQL backend fork per request; admission measured ~490 req/s with 5, ~700 "
        "with 20, bench/bench_admission.py).")
    redis_url: str = _s("redis://127.0.0.1:6379/0", "One Redis (redis://, rediss://) or a Redis Cluster "
        "(redis+cluster://host:port[,host:port...], rediss+cluster://): gates, permits, runtime limits, rate limits, "
        "wake-ups, beat leadership.")
    redis_timeout_seconds: float = _s(10.0, "Socket timeout of the Redis clients (seconds): how long a request waits "
        "on an unreachable Redis before it answers 503.")
    broker_url: str = _s("", "Celery broker; empty means \"the Redis above\".  amqp:// works too. Never a Redis "
        "Cluster: with a cluster ASYNCH_REDIS_URL it must be set.")
    storage_url: str = _s("file://data/results", "Where results go: file:///abs/dir, file://relative/dir, "
        "s3://bucket/prefix or oss+http(s)://host:port/base (the seed's file service, see storage.py)")
    s3_endpoint_url: str = _s("", "S3 endpoint of MinIO or another S3-compatible server; empty: AWS S3.")
    s3_region: str = _s("us-east-1", "S3 region name.")
    s3_access_key: str = _s("", "S3 access key id; empty: boto3's default credential chain.")
    s3_secret_key: str = _s("", "S3 secret key, used with the access key.")
    redis_prefix: str = _s("asynch", "Redis key namespace; the runtime override keys the seed documents "
        "(asynch:runtime:...) live under it.")
    queue_name: str = _s("asynch", "Celery queue the API publishes run_job messages to.")
    bootstrap_admin_key: str = _s("", "An optional bootstrap admin key accepted from the environment (never stored).")
    key_pepper: str = _s("", "Secret mixed into every stored API-key hash; changing it invalidates every key.")
    dev_mode: bool = _s(False, "A local trial (`asynch dev` sets it): weak or missing secrets are accepted "
        "(app/secrets_policy.py check_startup). Never in a deployment.")
    secrets_keys: str = _s("", "Keys encrypting secrets at rest (head_msg values, tenant callback secrets): "
        "comma-separated Fernet keys, the first encrypts, every one decrypts (app/infra/secretbox.py).  Empty: "
        "derived from the pepper (dev mode only).")
    delivery_secret_overlap_seconds: int = _s(86400, "The previous tenant signing secret keeps signing (a second "
        "signature) this long after a rotation.",
        validation_alias=_aka("DELIVERY_SECRET_OVERLAP_SECONDS", "CALLBACK_SECRET_OVERLAP_SECONDS"))
    auth_cache_seconds: float = _s(5.0, "How long an API process caches an API key on the admission path (seconds; 0 "
        "disables): a revoked key reaches every API process within this.")
    model_cache_seconds: float = _s(2.0, "How long an API process caches a model's configuration (seconds; 0 "
        "disables).")
    max_body_bytes: int = _s(10 * 1024 * 1024, "Largest request body accepted.")
    max_result_bytes: int = _s(64 * 1024 * 1024, "Largest model response a worker reads; a larger one fails the "
        "attempt.")
    result_redirect_seconds: int = _s(0, "GET .../result with S3 storage: 0 streams the object through the API; N > "
        "0 answers 307 to a presigned S3 URL valid N seconds instead.")
    inline_result_bytes: int = _s(-1, "Results of at most this many bytes stay in the job's row (location "
        "``inline:``): no storage round trip, nothing to delete at cleanup.  -1: 4096 for file:// storage, 0 (off) "
        "for S3 and OSS, whose locations (oss_file) callers may fetch themselves.  0: always store.")
    max_model_timeout_seconds: int = _s(3600, "A model's timeout_seconds may not exceed this; the broker's "
        "visibility timeout is derived from it so a slow call is never re-delivered early.")
    lease_grace_seconds: int = _s(120, "Extra seconds a running attempt's lease lasts beyond its model timeout "
        "(upload + bookkeeping).  A lease past expiry means the worker died.")
    job_queue_budget_seconds: int = _s(3600, "How long a job may wait in the queue in total, on top of its attempts' "
        "time, before it counts as timed out (see services.jobs.job_deadline).")
    upload_attempts: int = _s(3, "Tries for one result upload; upload retries never re-call the model.")
    retry_backoff_seconds: float = _s(2.0, "Backoff before a failed attempt is re-admitted: base * 2**(attempt-1), "
        "capped.")
    retry_backoff_max_seconds: float = _s(300.0, "Cap of the retry backoff (seconds).")
    reconcile_grace_seconds: float = _s(30.0, "Reconcile leaves gate slots younger than this alone: their row may be "
        "about to commit.")
    wait_default_ms: int = _s(30000, "Long-poll budget when the caller names none (milliseconds), seed 000's "
        "contract.")
    wait_max_ms: int = _s(300000, "Cap on a long-poll budget (milliseconds).")
    sync_result_max_bytes: int = _s(65536, "Sync mode (``Prefer: wait=N`` on a submit): a done job's JSON result of "
        "at most this many bytes is in the 200 body itself (0: never inline).")
    events_keepalive_seconds: float = _s(15.0, "Event streams (GET .../jobs/{id}/events, GET /v1/events; each counts "
        "as a waiter): a comment line every keepalive seconds, the row re-read every poll seconds (a terminal state "
        "wakes the stream at once), and a stream closed after max seconds (the client resumes with Last-Event-ID).")
    events_poll_seconds: float = _s(1.0, "An event stream re-reads its rows this often (seconds).")
    events_max_seconds: float = _s(3600.0, "An event stream is closed after this long (seconds).")
    waiters_per_tenant: int = _s(1000, "Concurrent long-polls (/wait) one API process holds, per tenant and in "
        "total.  A wait parks no thread (the API serves on gevent), but each holds a socket and a little memory: the "
        "tenant cap keeps one tenant from taking a process's whole budget, the process cap bounds its file "
        "descriptors (`asynch api --worker-connections` defaults above it). Past either: 429 with Retry-After.  A "
        "tenant's own cap is its max_waiters in its limits (PUT /v1/tenants/{tenant}/limits).")
    waiters_max: int = _s(10000, "Concurrent long-polls one API process holds in total.")
    wait_parking: bool = _s(True, "Park a sleeping /wait as a small record answered by the wake-up hub "
        "(app/infra/parking.py) instead of keeping its request greenlet, under `asynch api`'s gevent worker.  Off: "
        "every wait keeps its greenlet.")
    list_max_limit: int = _s(500, "Job listing page size cap.")
    beat_retry_seconds: float = _s(5.0, "Beat interval of retries (seconds).")
    beat_recover_seconds: float = _s(30.0, "Beat interval of recovery (seconds).")
    beat_cleanup_seconds: float = _s(60.0, "Beat interval of cleanup (seconds).")
    beat_autotune_seconds: float = _s(3600.0, "Beat interval of autotune (seconds).")
    republish_after_seconds: float = _s(300.0, "Pending jobs older than this whose message may be lost get "
        "re-published.")
    failed_retention_seconds: int = _s(7 * 86400, "Retention of terminal jobs that nobody claims: "
        "failed/timeout/canceled, and done jobs never batch- claimed.  Claimed jobs use the model's "
        "auto_clean_seconds (expire_at).")
    done_retention_seconds: int = _s(7 * 86400, "Retention of done jobs never batch-claimed (seconds).")
    maintenance_batch: int = _s(500, "Rows one maintenance transaction locks (SKIP LOCKED) and works on.")
    run_work_max_tasks: int = _s(0, "Pending jobs one runWork pass claims and runs itself (the worker-less "
        "deployment of seed 002, app/maintenance/run_once.py); 0: it runs none (resident Celery workers run them).")
    beat_lock_ttl_seconds: float = _s(30.0, "Beat leader lock: a beat that stops renewing it for this long loses it "
        "and a standby beat takes over.  Must exceed a beat tick.")
    beat_history_size: int = _s(1000, "Recent periodic runs kept in Redis (operators, tests); 0 keeps none.")
    autotune_window_seconds: int = _s(3600, "The window autotune looks back over (seconds).")
    autotune_ttl_seconds: int = _s(7200, "Lifetime of the runtime limits autotune writes (seconds).")
    autotune_min_samples: int = _s(5, "Fewest finished jobs in the window for autotune to act on a model.")
    autotune_queued_seconds: float = _s(1.0, "How long a job must have waited for a worker to count as queued "
        "(seconds).")
    tenant_queue_share: float = _s(1.0, "Capacity isolation (docs/architecture.md, \"Fair share\" and \"Fair "
        "dispatch\"). A tenant may hold at most this share of a model's queue_limit unless the model "
        "(tenant_queue_limit) or the tenant (its limits) says otherwise; 1.0: no static per-tenant cap (the fair "
        "share still applies).")
    queue_fair_share: bool = _s(True, "Fair share at admission (docs/architecture.md \"Fair share at admission\"): "
        "once several tenants hold slots of a model, a tenant may hold at most its weighted share of the queue, and "
        "a tenant holding none is admitted into the reserve above the limit. false: the static caps only (no "
        "reserve).")
    queue_newcomer_reserve: float = _s(0.05, "With ASYNCH_QUEUE_FAIR_SHARE: headroom above a model's queue_limit, as "
        "a share of it (rounded up), that only a tenant holding no slot may enter, so its first job gets in when "
        "others filled the queue.")
    dispatch_window: int = _s(8, "Run_job messages per model that may wait in the broker unclaimed: the fair "
        "scheduler decides the order up to here, the broker's FIFO after. At least the worker processes that serve "
        "the model keeps them all busy; more only adds waiting where fairness no longer applies.")
    dispatch_lease_seconds: float = _s(60.0, "A dispatched job no worker claimed within this many seconds lost its "
        "message: it goes back to the head of its tenant's queue.")
    estimate_alpha: float = _s(0.3, "Queue estimates (docs/architecture.md, \"Deadlines and queue estimates\"): the "
        "weight of each finished attempt's run time in the model's moving average (0-1; higher follows changes "
        "faster).")
    dispatch_fairness: str = _s("cost", "What fair dispatch shares between tenants: 'cost', model time (each "
        "dispatch charges the tenant its average run seconds over its weight), or 'turns', one turn per job whatever "
        "it costs (the baseline bench/bench_fairness.py --cost measures against).", pattern="^(cost|turns)$")
    batch_max_ids: int = _s(1000, "getTaskBatch: most task ids one call may name.")
    upstream_control: bool = _s(True, "Adapt each model's concurrency to its upstream (docs/architecture.md, "
        "\"Upstream backpressure\"): a 429/503 answer is busy, not a failure; off: busy answers are failed attempts "
        "and limits are static.")
    upstream_busy_budget: int = _s(20, "Busy answers per job spending no retry; beyond: failed.")
    upstream_retry_after_max_seconds: float = _s(30.0, "Longest pause a Retry-After may ask for.")
    upstream_decrease: float = _s(0.5, "A busy answer multiplies the model's effective concurrency by this (floor "
        "1), once per round of calls.")
    upstream_latency_tolerance: float = _s(2.0, "Latency gradient: concurrency falls while the recent run time "
        "exceeds this multiple of the model's baseline (limit x min(1, tolerance x baseline / recent), smoothed); 0: "
        "off.")
    delivery_timeout_seconds: float = _s(10.0, "Callbacks and webhooks: the wall-clock deadline of one delivery "
        "attempt (connect, send, headers and body together); retries back off base * 2**(n-1), capped, with jitter.",
        validation_alias=_aka("DELIVERY_TIMEOUT_SECONDS", "CALLBACK_TIMEOUT_SECONDS"))
    delivery_max_attempts: int = _s(8, "Attempts of one delivery before it is given up.",
        validation_alias=_aka("DELIVERY_MAX_ATTEMPTS", "CALLBACK_MAX_ATTEMPTS"))
    delivery_backoff_seconds: float = _s(5.0, "Base of the retry backoff (seconds).",
        validation_alias=_aka("DELIVERY_BACKOFF_SECONDS", "CALLBACK_BACKOFF_SECONDS"))
    delivery_backoff_max_seconds: float = _s(3600.0, "Cap of the retry backoff (seconds).",
        validation_alias=_aka("DELIVERY_BACKOFF_MAX_SECONDS", "CALLBACK_BACKOFF_MAX_SECONDS"))
    delivery_tenant_inflight: int = _s(4, "Deliveries one tenant may have in flight at once (the claim's cap over "
        "the whole pool; the fewest in flight go first).")
    beat_deliveries_seconds: float = _s(15.0, "Beat interval of the outbox sweep (due callback and webhook "
        "deliveries, seconds).", validation_alias=_aka("BEAT_DELIVERIES_SECONDS", "BEAT_CALLBACKS_SECONDS"))
    delivery_allow_hosts: str = _s("", "Operator allowlist for callback and webhook targets that would otherwise be "
        "refused (loopback, private, link-local ...): comma list of IPs, CIDRs or host names.",
        validation_alias=_aka("DELIVERY_ALLOW_HOSTS", "CALLBACK_ALLOW_HOSTS"))
    resolve_timeout_seconds: float = _s(5.0, "The longest a URL check waits for DNS (callbackUrl at submit and "
        "before each delivery); past it the target counts as not resolving.")
    resolve_nameservers: str = _s("", "DNS servers for those checks: comma list of ip, ip:port or [ipv6]:port; "
        "empty: /etc/resolv.conf (names in /etc/hosts are answered from it first).")
    resolve_cache_seconds: float = _s(10.0, "How long a DNS answer (or a name that did not resolve) is kept; 0: not "
        "kept.")
    resolve_tenant_inflight: int = _s(4, "DNS lookups one tenant may have in flight per API/worker process; more "
        "wait for a place within their own deadline.")
    batch_max_url_hosts: int = _s(8, "Distinct callback/webhook host names (IP literals do not count) one batch "
        "submit may name; the items past it are refused (422).")
    delivery_queue_name: str = _s("asynch-callbacks", "Celery queue of the outbox (callbacks and webhooks), consumed "
        "by `asynch callback-worker` only: a slow receiver ties up delivery processes, never job workers.",
        validation_alias=_aka("DELIVERY_QUEUE_NAME", "CALLBACK_QUEUE_NAME"))
    trusted_gateway: bool = _s(False, "Trust X-User-Info from a gateway in front of the API for the job's creator.  "
        "Off: only the creator field / X-Creator header count.")
    model_key_headers_default: str = _s("", "The modelKey allowlist of a model created without model_key_headers "
        "(issue 12: empty, jobs set no header).  A seed-002 deployment whose clients create models with the seed's "
        "createModel and send modelKey (e.g. X-API-Key over head_msg) names those headers here (docs/migrating.md).")
    auth_mode: str = _s("key", "How requests authenticate: \"key\" (a Bearer API key, the default) or \"gateway\" "
        "(the seed-002 deployment behind the business gateway: a request proven to come from the gateway -- "
        "ASYNCH_GATEWAY_SECRET in ASYNCH_GATEWAY_SECRET_HEADER and/or a source in ASYNCH_GATEWAY_CIDRS -- acts for "
        "the tenant and creator its X-User-Info names, and its Authorization goes to the OSS file service unchanged; "
        "a request that carries one of our API keys is still authenticated by it: admin routes).")
    seed_errors_http_200: bool = _s(False, "Seed-002 routes answer errors with HTTP 200 and the status only in the "
        "envelope's code (as some seed clients expect); off: the real status.")
    gateway_secret: str = _s("", "Gateway mode: the shared secret the gateway sends (compared in constant time).")
    gateway_secret_header: str = _s("X-Gateway-Secret", "Gateway mode: the header carrying the gateway secret.")
    gateway_cidrs: str = _s("", "Gateway mode: comma list of CIDRs the gateway connects from.")
    gateway_default_tenant: str = _s("", "The tenant of a gateway request whose X-User-Info names none; empty: 401.")
    oss_authorization: str = _s("", "OSS file service backend (storage_url oss+http://host:port/base): the "
        "Authorization sent when a job carries none of its own, and the timeout.")
    oss_timeout_seconds: float = _s(60.0, "Timeout of one OSS upload or download (seconds).")
    log_level: str = _s("INFO", "Log level of every process (logs are JSON lines on stderr).")
    metrics_token: str = _s("", "Every metrics endpoint (an API's /metrics and /metrics/cluster, a worker node's "
        "metrics port): empty means no key needed; else \"Authorization: Bearer <token>\".")
    metrics_job_count_cap: int = _s(10000, "asynch_jobs{state=done|failed|claimed|timeout|canceled} counts at most "
        "this many rows per model and state: a scrape never counts the whole history.")
    metrics_dir: str = _s("", "Prometheus multiprocess directory of one process group (an API server: gunicorn "
        "master + workers; a worker node: Celery main + pool).  Empty: `asynch api` / `asynch worker` make a fresh "
        "temporary one each start. Never share one between two groups: each wipes it when it starts.")
    worker_metrics_port: int = _s(9808, "A worker node's main process serves its /metrics on this port (pool "
        "processes' counters included); 0 serves none.")
    worker_metrics_bind: str = _s("127.0.0.1", "The address the worker metrics port binds: loopback, as the port is "
        "plain HTTP.  A deployment whose Prometheus scrapes it from another host/pod sets 0.0.0.0.")
    worker_metrics_timeout_seconds: float = _s(5.0, "A worker metrics connection's whole request head must arrive "
        "within this (one deadline).")
    worker_metrics_max_connections: int = _s(8, "At most this many worker metrics connections are served at once; "
        "more are closed.")
    worker_heartbeat_seconds: float = _s(5.0, "Workers refresh their liveness key this often; it expires after 3 "
        "intervals.")
    recover_by_heartbeat: bool = _s(True, "Recovery fails a node's running attempts as soon as its liveness key has "
        "expired (instead of when their lease runs out).  Off: leases only.")
    rate_limit_per_second: float = _s(0.0, "Request rate limit per API key (a token bucket in Redis, see "
        "app/web/ratelimit.py): tokens per second.  0 turns limiting off and then a request costs no Redis round "
        "trip for it.  The defaults every key gets until per-tenant overrides are plugged in (set_policy_resolver).")
    rate_limit_burst: int = _s(0, "Bucket capacity: how many requests a rested key may send at once. 0 means twice "
        "the rate per second, at least 1.")
    anon_rate_limit_per_second: float = _s(5.0, "Requests without a key (the OpenAPI document, console pages and "
        "assets, health probes, an anonymous /metrics, unknown paths, failed keys), per client address, shared by "
        "every API process through Redis (app/web/ratelimit.py): tokens per second.  A console page load is ~3 of "
        "them; /healthz and /readyz take from their own bucket with 10x both (a kubelet probes every pod of its node "
        "from one address).  0 turns it off.")
    anon_rate_limit_burst: int = _s(60, "Burst of the anonymous per-address bucket (0: twice the rate).")

    @classmethod
    def settings_customise_sources(cls, settings_cls, init_settings, env_settings, dotenv_settings,
                                   file_secret_settings):
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
        if raw.strip() == "":
            return field.default
        var = ENV_PREFIX + info.field_name.upper()
        if kind is bool:
            return raw.strip().lower() in ("1", "true", "yes", "on")
        try:
            return int(raw) if kind is int else float(raw)
        except ValueError:
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
        unknown = set(kw) - set(type(self).model_fields)
        if unknown:
            raise TypeError(f"not settings: {sorted(unknown)}")
        return self.model_copy(update=kw)


class _EnvSource(EnvSettingsSource):
    """pydantic-settings' environment source over a given mapping, limited to
    the upper-case names (ASYNCH_REDIS_URL, never asynch_redis_url)."""

    def __init__(self, env: Mapping[str, str]):
        self._env = {k: v for k, v in env.items() if k.startswith(ENV_PREFIX) and k == k.upper()}
        super().__init__(Settings)

    def _load_env_vars(self) -> Mapping[str, str | None]:
        return {k.lower(): v for k, v in self._env.items()}


def load_settings(env: Mapping[str, str] | None = None) -> Settings:
    """Build Settings from ``env`` (default: os.environ).  Raises ValueError
    naming the variable when a value does not parse or settings conflict."""
    env = os.environ if env is None else env
    try:
        s = Settings(**_EnvSource(env)())
    except ValidationError as exc:
        raise ValueError("; ".join(_message(e) for e in exc.errors())) from None
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


def _message(err: dict) -> str:
    """Our own ValueError's text as it was raised; pydantic's, after the variable's name."""
    if err["type"] == "value_error":
        return str(err["ctx"]["error"])
    return f"{ENV_PREFIX}{str(err['loc'][0]).upper()}: {err['msg']}"


def is_cluster_url(url: str) -> bool:
    """A Redis Cluster URL (redis+cluster:// or rediss+cluster://)."""
    return url.split("://", 1)[0] in ("redis+cluster", "rediss+cluster")


def prometheus_multiproc_dir(env: Mapping[str, str] | None = None) -> str:
    """The multiprocess directory prometheus_client itself reads (from
    PROMETHEUS_MULTIPROC_DIR, which `asynch api` / `asynch worker` set for
    their process group); empty when this process keeps metrics in memory."""
    env = os.environ if env is None else env
    return env.get("PROMETHEUS_MULTIPROC_DIR", "")


# Old variable -> the setting's variable, and old field name -> field (see ``_aka``).
ALIASES = {old: f.validation_alias.choices[0] for f in Settings.model_fields.values()
           if isinstance(f.validation_alias, AliasChoices) for old in f.validation_alias.choices[1:]}
OLD_FIELDS = {old[len(ENV_PREFIX):].lower(): new[len(ENV_PREFIX):].lower() for old, new in ALIASES.items()}


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
