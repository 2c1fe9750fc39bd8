"""Static checks of the deployment files: docker-compose.yml, the Dockerfile and
docs/operations.md.

No Docker engine is needed: the files are parsed and cross-checked against
the code they start (the ``asynch`` click commands, the Celery app, the
settings in app/config.py).  No network, no database of our own; the
session fixtures of conftest.py still run.
"""
from __future__ import annotations

import importlib
import json
import re
import shlex
import tomllib
from pathlib import Path
from urllib.parse import urlparse

import click
import pytest
import yaml

from app.cli import main as cli_main
from app.config import env_names, load_settings

ROOT = Path(__file__).resolve().parent.parent
COMPOSE_PATH = ROOT / "docker-compose.yml"
DOCKERFILE_PATH = ROOT / "Dockerfile"
DOCS_PATH = ROOT / "docs" / "operations.md"
PYPROJECT_PATH = ROOT / "pyproject.toml"

REQUIRED_SERVICES = {"postgres", "pgbouncer", "redis", "minio", "minio-init", "migrate", "api", "worker", "callbacks", "beat",
                     "flower"}
LONG_RUNNING = {"postgres", "pgbouncer", "redis", "minio", "api", "worker", "callbacks", "beat", "flower"}
ONE_SHOT = {"minio-init", "migrate"}
# Services that run our code (the image built from the Dockerfile).
OUR_SERVICES = {"migrate", "api", "worker", "callbacks", "beat", "flower"}

ASYNCH_VAR = re.compile(r"\bASYNCH_[A-Z0-9_]+\b")
# Compose interpolation: ${VAR}, ${VAR:-default}, ${VAR-default}, ${VAR:?err}, ${VAR?err}
INTERPOLATION = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?])([^}]*))?\}")


# --- helpers ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def compose_text() -> str:
    return COMPOSE_PATH.read_text()


@pytest.fixture(scope="module")
def compose(compose_text) -> dict:
    data = yaml.safe_load(compose_text)
    assert isinstance(data, dict) and isinstance(data.get("services"), dict), "no services: mapping"
    return data


@pytest.fixture(scope="module")
def services(compose) -> dict:
    return compose["services"]


@pytest.fixture(scope="module")
def dockerfile() -> list[tuple[str, str]]:
    return parse_dockerfile(DOCKERFILE_PATH.read_text())


def real_env_vars() -> set[str]:
    return set(env_names().values())


def as_argv(value) -> list[str]:
    """A compose command/entrypoint (string or list) as an argv list."""
    if value is None:
        return []
    if isinstance(value, str):
        return shlex.split(value)
    assert isinstance(value, list), f"command must be a string or a list: {value!r}"
    return [str(v) for v in value]


def service_argv(svc: dict) -> list[str]:
    return as_argv(svc.get("entrypoint")) + as_argv(svc.get("command"))


def shell_commands(script: str) -> list[list[str]]:
    """Split a shell one-liner into simple commands (on && || ; |)."""
    out, cur = [], []
    lex = shlex.shlex(script, posix=True, punctuation_chars=";&|")
    lex.whitespace_split = True
    for tok in lex:
        if tok and set(tok) <= set(";&|"):
            if cur:
                out.append(cur)
            cur = []
        else:
            cur.append(tok)
    if cur:
        out.append(cur)
    return out


def expand_argv(argv: list[str]) -> list[list[str]]:
    """An argv, plus the commands inside `sh -c '...'` if it is one."""
    if len(argv) >= 3 and Path(argv[0]).name in ("sh", "bash") and argv[1] == "-c":
        return [cmd for script in argv[2:] for cmd in shell_commands(script)]
    return [argv]


def healthcheck_commands(svc: dict) -> list[list[str]]:
    hc = svc.get("healthcheck") or {}
    test = hc.get("test")
    if not test:
        return []
    if isinstance(test, str):
        return shell_commands(test)
    kind, rest = test[0], [str(t) for t in test[1:]]
    if kind == "CMD-SHELL":
        return [cmd for script in rest for cmd in shell_commands(script)]
    if kind == "CMD":
        return expand_argv(rest)
    return []


def all_commands(services: dict) -> list[tuple[str, list[str]]]:
    """(service, argv) for every command the compose file runs."""
    out = []
    for name, svc in services.items():
        for argv in expand_argv(service_argv(svc)) + healthcheck_commands(svc):
            if argv:
                out.append((name, argv))
    return out


def resolve_asynch(argv: list[str]) -> click.Command:
    """The click command ``asynch <argv...>`` runs; fails on unknown
    subcommands and on options the command does not take."""
    assert argv and Path(argv[0]).name == "asynch", argv
    args = list(argv[1:])
    cmd: click.Command = cli_main
    path = ["asynch"]
    ctx = click.Context(cli_main, info_name="asynch")
    while isinstance(cmd, click.Group):
        assert args, f"`{' '.join(argv)}`: `{' '.join(path)}` needs a subcommand ({sorted(cmd.commands)})"
        name = args.pop(0)
        sub = cmd.get_command(ctx, name)
        assert sub is not None, f"`{' '.join(argv)}`: no command `{name}` in `{' '.join(path)}` ({sorted(cmd.commands)})"
        cmd, path = sub, path + [name]
        ctx = click.Context(cmd, info_name=name, parent=ctx)
    try:
        # Parses the options without invoking the command.
        cmd.make_context(" ".join(path), list(args), parent=ctx.parent)
    except click.ClickException as exc:
        pytest.fail(f"`{' '.join(argv)}`: {exc.format_message()}")
    return cmd


def command_path(argv: list[str]) -> tuple[str, ...]:
    """('asynch', 'db', 'upgrade') for ['asynch', 'db', 'upgrade', ...]."""
    out, cmd = [argv[0]], cli_main
    ctx = click.Context(cli_main, info_name="asynch")
    for tok in argv[1:]:
        if not isinstance(cmd, click.Group):
            break
        sub = cmd.get_command(ctx, tok)
        if sub is None:
            break
        out.append(tok)
        cmd = sub
    return tuple(out)


def celery_app_target(argv: list[str]) -> str | None:
    """The -A/--app value of a `celery ...` or `python -m celery ...` argv."""
    if not argv:
        return None
    if Path(argv[0]).name == "celery":
        rest = argv[1:]
    elif len(argv) >= 3 and Path(argv[0]).name.startswith("python") and argv[1:3] == ["-m", "celery"]:
        rest = argv[3:]
    else:
        return None
    for i, tok in enumerate(rest):
        if tok in ("-A", "--app") and i + 1 < len(rest):
            return rest[i + 1]
        if tok.startswith("--app="):
            return tok.split("=", 1)[1]
    pytest.fail(f"celery command without -A/--app: {argv}")


# Values an operator would supply for the required ${VAR:?} secrets (the checks parse with them).
# Random-looking, as app/secret_settings.py demands outside dev mode.
REQUIRED_PLACEHOLDERS = {
    "ASYNCH_KEY_PEPPER": "pQ7xR2vL9mK4wN8sT1yB6cF3hJ5dG0aZ",
    "ASYNCH_BOOTSTRAP_ADMIN_KEY": "bV3nM8qW2eR7tY1uI6oP4aS9dF5gH0jK",
    "ASYNCH_SECRETS_KEYS": "QUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUE=",
    "ASYNCH_METRICS_TOKEN": "mZ4xC9vB2nM7aS1dF6gH3jK8lQ5wE0rT",
    "POSTGRES_PASSWORD": "dB5kL2mN8pQ4rS7tU1vW6xY3zA9bC0eF",
    "MINIO_ROOT_PASSWORD": "oS3gH7jK1lZ5xC9vB4nM8qW2eR6tY0uI",
}


def interpolate(value: str) -> str:
    """Compose-style interpolation with an empty shell environment (the
    required secrets get REQUIRED_PLACEHOLDERS)."""
    def sub(m: re.Match) -> str:
        op, default = m.group(2), m.group(3)
        if op in (":-", "-"):
            return default or ""
        if m.group(1) in REQUIRED_PLACEHOLDERS:
            return REQUIRED_PLACEHOLDERS[m.group(1)]
        pytest.fail(f"{m.group(0)}: a required variable without a default; the check needs a default")
    return INTERPOLATION.sub(sub, value.replace("$$", "\0")).replace("\0", "$")


def parse_dockerfile(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs; comments dropped, continuations joined."""
    out, buf = [], ""
    for raw in text.splitlines():
        line = raw.strip()
        if not buf and (not line or line.startswith("#")):
            continue
        if buf and line.startswith("#"):
            continue  # comment lines inside a continuation are ignored by Docker
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        buf += line
        if buf.strip():
            instr, _, args = buf.strip().partition(" ")
            out.append((instr.upper(), args.strip()))
        buf = ""
    assert not buf, "Dockerfile ends inside a line continuation"
    return out


def docker_argv(args: str) -> list[str]:
    """CMD/ENTRYPOINT arguments: exec form (JSON) or shell form."""
    if args.startswith("["):
        argv = json.loads(args)
        assert isinstance(argv, list) and all(isinstance(a, str) for a in argv), args
        return argv
    return ["/bin/sh", "-c", args]


def instr(dockerfile, name: str) -> list[str]:
    return [args for i, args in dockerfile if i == name]


# --- compose: services --------------------------------------------------------------------

def test_compose_has_every_required_service(services):
    missing = REQUIRED_SERVICES - set(services)
    assert not missing, f"docker-compose.yml lacks services: {sorted(missing)}"


def test_our_services_are_built_from_the_dockerfile(services):
    for name in OUR_SERVICES:
        svc = services[name]
        build = svc.get("build")
        ctx = build if isinstance(build, str) else (build or {}).get("context")
        assert ctx in (".", "./"), f"{name}: must build the image from this repository's Dockerfile"


def test_images_of_the_backing_services(services):
    assert services["postgres"]["image"].startswith("postgres:16")
    assert "pgbouncer" in services["pgbouncer"]["image"]
    assert services["redis"]["image"].startswith("redis:7")
    assert "minio/minio" in services["minio"]["image"]
    assert "minio/mc" in services["minio-init"]["image"]


# --- compose: configuration ---------------------------------------------------------------

def test_every_asynch_variable_in_compose_is_a_real_setting(compose_text):
    named = set(ASYNCH_VAR.findall(compose_text))
    unknown = named - real_env_vars()
    assert not unknown, f"docker-compose.yml names ASYNCH_ variables app/config.py does not have: {sorted(unknown)}"
    assert named, "docker-compose.yml names no ASYNCH_ variable at all"


def test_shared_env_block_is_an_anchor(compose, compose_text, services):
    assert "x-asynch-env" in compose, "the shared environment must live in an x-asynch-env block"
    assert re.search(r"^x-asynch-env:\s*&\S+", compose_text, re.M), "x-asynch-env must define a YAML anchor"
    shared = compose["x-asynch-env"]
    for name in OUR_SERVICES:
        assert services[name].get("environment") == shared, f"{name}: environment must be the x-asynch-env block"


def test_our_services_are_configured_only_through_asynch_variables(services):
    real = real_env_vars()
    for name in OUR_SERVICES:
        svc = services[name]
        assert "env_file" not in svc, f"{name}: configuration only through the ASYNCH_* environment block"
        env = svc.get("environment") or {}
        if isinstance(env, list):
            env = dict(item.split("=", 1) if "=" in item else (item, "") for item in env)
        assert env, f"{name}: no environment"
        bad = [k for k in env if k not in real]
        assert not bad, f"{name}: environment variables that are not ASYNCH_ settings: {bad}"


def test_shared_env_sets_the_deployment_settings(compose, compose_text, services):
    env = {k: interpolate(str(v)) for k, v in compose["x-asynch-env"].items()}
    for var in ("ASYNCH_DATABASE_URL", "ASYNCH_REDIS_URL", "ASYNCH_BROKER_URL", "ASYNCH_STORAGE_URL",
                "ASYNCH_S3_ENDPOINT_URL", "ASYNCH_S3_REGION", "ASYNCH_S3_ACCESS_KEY", "ASYNCH_S3_SECRET_KEY",
                "ASYNCH_KEY_PEPPER", "ASYNCH_BOOTSTRAP_ADMIN_KEY"):
        assert env.get(var), f"x-asynch-env must set {var}"
    # The secrets come from the operator's environment, required, with no default (issue 12, item 2;
    # issue 21, item 8: tests/test_security_deploy.py checks every secret-looking variable).
    for var in REQUIRED_PLACEHOLDERS:
        assert re.search(rf"{var}:\s*\$\{{{var}:\?[^}}]*\}}", compose_text), f"{var} must be ${{{var}:?...}}"

    s = load_settings(env)  # every value parses as its setting's type
    assert s.database_url.startswith("postgresql+psycopg2://")
    assert s.redis_url.startswith("redis://") and s.effective_broker_url.startswith(("redis://", "amqp://"))
    for var, url in (("ASYNCH_DATABASE_URL", s.database_url), ("ASYNCH_REDIS_URL", s.redis_url),
                     ("ASYNCH_BROKER_URL", s.effective_broker_url), ("ASYNCH_S3_ENDPOINT_URL", s.s3_endpoint_url)):
        host = urlparse(url).hostname
        assert host in services, f"{var} points at {host!r}, which is not a compose service"

    storage = urlparse(s.storage_url)
    assert storage.scheme == "s3" and storage.netloc, f"ASYNCH_STORAGE_URL must be s3://<bucket>/...: {s.storage_url}"
    assert storage.path.strip("/") == "results", s.storage_url
    init = " ".join(service_argv(services["minio-init"]))
    assert re.search(rf"\bmc mb\b.*/{re.escape(storage.netloc)}\b", init), \
        f"minio-init must create the bucket {storage.netloc!r} named in ASYNCH_STORAGE_URL"


def test_the_api_is_published_on_the_loopback_interface_only(services):
    """Issue 12, item 2: a host port on every interface exposed the API (and
    its bootstrap admin key) to the network; it is 127.0.0.1 only."""
    for name, svc in services.items():
        for port in svc.get("ports") or []:
            spec = str(port.get("host_ip", "") + ":" + str(port.get("published"))) if isinstance(port, dict) else str(port)
            assert spec.startswith("127.0.0.1:"), f"{name}: port {port!r} is published on every interface"


def test_compose_settings_pass_the_startup_check(compose):
    from app.secret_settings import check_startup
    check_startup(load_settings({k: interpolate(str(v)) for k, v in compose["x-asynch-env"].items()}))


def test_database_url_matches_the_postgres_service(compose):
    env = {k: interpolate(str(v)) for k, v in compose["x-asynch-env"].items()}
    pg_env = {k: interpolate(str(v)) for k, v in compose["services"]["postgres"]["environment"].items()}
    url = urlparse(env["ASYNCH_DATABASE_URL"])
    assert url.username == pg_env["POSTGRES_USER"]
    assert url.password == pg_env["POSTGRES_PASSWORD"]
    assert url.path.lstrip("/") == pg_env["POSTGRES_DB"]


def test_every_process_reaches_postgres_through_pgbouncer_in_transaction_mode(compose, services):
    """Our processes connect to pgbouncer, never to postgres; pgbouncer pools
    per transaction and forwards to the postgres service with its credentials
    (tests/test_cluster_hosts.py runs the stack through one)."""
    env = {k: interpolate(str(v)) for k, v in compose["x-asynch-env"].items()}
    url = urlparse(env["ASYNCH_DATABASE_URL"])
    bouncer = services["pgbouncer"]
    b_env = {k: interpolate(str(v)) for k, v in bouncer["environment"].items()}
    assert url.hostname == "pgbouncer" and url.port == int(b_env["LISTEN_PORT"])
    assert b_env["POOL_MODE"] == "transaction"
    upstream = urlparse(b_env["DATABASE_URL"])
    pg_env = {k: interpolate(str(v)) for k, v in services["postgres"]["environment"].items()}
    assert upstream.hostname == "postgres" and (upstream.port or 5432) == 5432
    assert (upstream.username, upstream.password, upstream.path.lstrip("/")) == \
        (pg_env["POSTGRES_USER"], pg_env["POSTGRES_PASSWORD"], pg_env["POSTGRES_DB"])
    assert bouncer["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert services["migrate"]["depends_on"]["pgbouncer"]["condition"] == "service_healthy"
    assert int(b_env["DEFAULT_POOL_SIZE"]) < int(services["postgres"]["command"][-1].split("=")[1])


# --- compose: commands --------------------------------------------------------------------

def test_console_script_is_asynch():
    scripts = tomllib.loads(PYPROJECT_PATH.read_text())["project"]["scripts"]
    assert scripts.get("asynch") == "app.cli:main"


def test_every_asynch_command_in_compose_exists(services):
    used = [(name, argv) for name, argv in all_commands(services) if Path(argv[0]).name == "asynch"]
    assert used, "no service runs `asynch ...`"
    for _name, argv in used:
        resolve_asynch(argv)


def test_services_run_the_expected_commands(services):
    expected = {
        "migrate": ("asynch", "db", "upgrade"),
        "api": ("asynch", "api"),
        "worker": ("asynch", "worker"),
        "callbacks": ("asynch", "callback-worker"),
        "beat": ("asynch", "beat"),
    }
    for name, path in expected.items():
        argv = service_argv(services[name])
        assert argv and command_path(argv) == path, f"{name} must run `{' '.join(path)}`, runs {argv}"
    api = resolve_asynch(service_argv(services["api"]))
    ctx = api.make_context("api", service_argv(services["api"])[2:])
    assert ctx.params["bind"] == "0.0.0.0:8000", "api must listen on 0.0.0.0:8000 inside its container"


def test_every_celery_app_target_is_importable(services):
    targets = {celery_app_target(argv) for _n, argv in all_commands(services)} - {None}
    assert "workers.celery_app" in targets
    from celery import Celery
    for target in targets:
        module, _, attr = target.partition(":")
        mod = importlib.import_module(module)
        if attr:
            assert isinstance(getattr(mod, attr), Celery), target
        else:
            assert any(isinstance(getattr(mod, a, None), Celery) for a in ("app", "celery")), \
                f"{module} has no Celery instance named app or celery"


def test_flower_watches_our_celery_app(services, dockerfile):
    argv = service_argv(services["flower"])
    assert celery_app_target(argv) == "workers.celery_app"
    assert "flower" in argv
    assert any("5555" in a for a in argv) or any("5555" in str(p) for p in services["flower"].get("ports", []))
    # Flower is not a package dependency: the image must install it.
    runs = " ".join(instr(dockerfile, "RUN"))
    assert re.search(r"pip install[^&;]*\bflower\b", runs), "the Dockerfile must pip install flower"


# --- compose: topology --------------------------------------------------------------------

@pytest.mark.parametrize("name", ["worker", "callbacks"])
def test_workers_are_scalable(services, name):
    w = services[name]
    assert "container_name" not in w, f"{name}: container_name prevents --scale {name}=N"
    assert not w.get("ports"), f"{name}: a fixed host port prevents --scale {name}=N"
    argv = service_argv(w)
    cmd = resolve_asynch(argv)
    params = cmd.make_context(name, argv[2:]).params
    assert params["concurrency"] >= 1


def test_the_callback_pool_leaves_a_process_free_of_any_one_tenant(services):
    """Issue 32 item 8: the claim holds a tenant to its cap and to all but
    one process of the node (app/delivery/outbox.py ``tenant_cap``), so the
    shipped pools need two processes at least; the CLI's default is above
    the default cap, so the cap alone leaves one free too."""
    from app.cli.processes import CALLBACK_PROCESSES
    from app.config import Settings

    argv = service_argv(services["callbacks"])
    assert resolve_asynch(argv).make_context("callbacks", argv[2:]).params["concurrency"] >= 2
    assert resolve_asynch(["asynch", "callback-worker"]).make_context("callbacks", []).params["concurrency"] \
        == CALLBACK_PROCESSES > Settings().delivery_tenant_inflight


def test_jobs_and_callbacks_have_separate_queues_and_pools(services):
    """A stalling callback receiver must never hold a job worker: the worker
    service consumes the job queue only, the callbacks service the callback
    queue only, and the callback tasks are routed there."""
    from app.cli.processes import callback_worker_argv, worker_argv
    from app.config import get_settings
    from app.infra.celery_config import DELIVER_DUE_TASK, DELIVER_TASK, RUN_JOB_TASK, celery_settings, queue_for

    default = load_settings({})
    assert default.delivery_queue_name == "asynch-callbacks" and default.delivery_queue_name != default.queue_name
    s = get_settings()
    w = resolve_asynch(service_argv(services["worker"])).make_context("worker", service_argv(services["worker"])[2:])
    assert w.params["queues"] is None, "worker: must consume the job queue (its default), not -Q a list"

    def consumed(argv: list[str]) -> list[str]:
        return argv[argv.index("-Q") + 1].split(",")

    assert consumed(worker_argv(2)) == [s.queue_name]
    cb_argv = callback_worker_argv(2)
    assert consumed(cb_argv) == [s.delivery_queue_name]
    # Its own node name: the healthcheck pings it, and it differs from the job worker's.
    node = cb_argv[cb_argv.index("-n") + 1]
    assert node.split("@")[0] in json.dumps(services["callbacks"]["healthcheck"])
    assert "-n" not in worker_argv(2) and "celery@" in json.dumps(services["worker"]["healthcheck"])
    for task in (DELIVER_TASK, DELIVER_DUE_TASK):
        assert queue_for(task, s) == s.delivery_queue_name
        assert celery_settings(s)["task_routes"][task]["queue"] == s.delivery_queue_name
    assert queue_for(RUN_JOB_TASK, s) == s.queue_name
    from beat_schedule import build_schedule
    sched = build_schedule(s)
    on_callbacks = {"deliver"}
    assert all(sched[k]["options"]["queue"] == s.delivery_queue_name for k in on_callbacks)
    assert all(e["options"]["queue"] == s.queue_name for k, e in sched.items() if k not in on_callbacks)


def test_beat_is_a_single_service(services):
    beats = []
    for name, argv in ((n, service_argv(s)) for n, s in services.items()):
        if argv and command_path(argv) == ("asynch", "beat"):
            beats.append(name)
        elif celery_app_target(argv) and "beat" in argv:
            beats.append(name)
        elif celery_app_target(argv) and "worker" in argv and ({"-B", "--beat"} & set(argv)):
            beats.append(name)
    assert beats == ["beat"], f"exactly one service may run beat, found {beats}"
    b = services["beat"]
    assert (b.get("deploy") or {}).get("replicas", 1) == 1
    assert b.get("scale", 1) == 1


def test_long_running_services_have_healthchecks(services):
    for name in LONG_RUNNING:
        hc = services[name].get("healthcheck")
        assert hc and hc.get("test") and not hc.get("disable"), f"{name}: needs a healthcheck"
        assert healthcheck_commands(services[name]), f"{name}: healthcheck runs no command"


def test_healthchecks_fit_their_service(services, dockerfile):
    api_hc = " ".join(a for cmd in healthcheck_commands(services["api"]) for a in cmd)
    assert "/healthz" in api_hc and ":8000" in api_hc
    # The image's HEALTHCHECK probes the API port; every other process built
    # from the image must override it (or, one-shots, disable it).
    assert instr(dockerfile, "HEALTHCHECK")
    for name in OUR_SERVICES - {"api"}:
        hc = services[name].get("healthcheck") or {}
        assert hc.get("test") or hc.get("disable"), \
            f"{name}: would inherit the image's API healthcheck; override or disable it"
        assert "/healthz" not in json.dumps(hc), f"{name}: does not serve /healthz"


def test_one_shots_do_not_restart(services):
    for name in ONE_SHOT:
        assert str(services[name].get("restart", "no")) in ("no", "False", "false"), \
            f"{name}: a one-shot must not be restarted"


def test_migrate_runs_first(services):
    migrate = services["migrate"]
    assert service_argv(migrate) == ["asynch", "db", "upgrade"]
    assert migrate["depends_on"]["postgres"]["condition"] == "service_healthy"
    for name in ("api", "worker", "callbacks", "beat"):
        deps = services[name].get("depends_on") or {}
        assert isinstance(deps, dict) and "migrate" in deps, f"{name} must depend on migrate"
        assert deps["migrate"].get("condition") == "service_completed_successfully", \
            f"{name}: depends_on migrate must use condition service_completed_successfully"


def test_depends_on_is_consistent(services):
    conditions = {"service_started", "service_healthy", "service_completed_successfully"}
    for name, svc in services.items():
        deps = svc.get("depends_on") or {}
        if isinstance(deps, list):
            deps = {d: {"condition": "service_started"} for d in deps}
        for dep, spec in deps.items():
            assert dep in services, f"{name} depends on unknown service {dep}"
            cond = (spec or {}).get("condition", "service_started")
            assert cond in conditions, f"{name} -> {dep}: unknown condition {cond}"
            if cond == "service_healthy":
                assert (services[dep].get("healthcheck") or {}).get("test"), f"{dep} has no healthcheck"
            if cond == "service_completed_successfully":
                assert dep in ONE_SHOT, f"{name} waits for {dep} to exit, but {dep} is long-running"


def test_data_volumes(compose, services):
    declared = set((compose.get("volumes") or {}).keys())

    def named_volumes(svc):
        out = set()
        for v in svc.get("volumes") or []:
            src = v.split(":", 1)[0] if isinstance(v, str) else v.get("source")
            if src and not src.startswith((".", "/", "~")):
                out.add(src)
        return out

    for name, target in (("postgres", "/var/lib/postgresql/data"), ("minio", "/data")):
        vols = named_volumes(services[name])
        assert vols, f"{name}: its data needs a named volume"
        assert vols <= declared, f"{name}: volumes {vols - declared} are not declared at the top level"
        assert any(target in str(v) for v in services[name]["volumes"]), f"{name}: mount the volume at {target}"


# --- Dockerfile ---------------------------------------------------------------------------

def test_dockerfile_base_user_port(dockerfile):
    froms = instr(dockerfile, "FROM")
    assert froms and froms[-1].split()[0] == "python:3.11-slim"
    users = instr(dockerfile, "USER")
    assert users and users[-1].split(":")[0] not in ("root", "0"), "the image must run as a non-root user"
    assert any("8000" in e.split() for e in instr(dockerfile, "EXPOSE"))
    hc = instr(dockerfile, "HEALTHCHECK")
    assert hc and "/healthz" in hc[-1]
    runs = " ".join(instr(dockerfile, "RUN"))
    assert re.search(r"pip install\s+(?:[^&;]*\s)?\.(\s|$)", runs), "the image must `pip install .`"


def test_dockerfile_cmd_and_entrypoint_exist(dockerfile):
    entry = instr(dockerfile, "ENTRYPOINT")
    cmd = instr(dockerfile, "CMD")
    assert cmd, "the Dockerfile needs a CMD"
    argv = (docker_argv(entry[-1]) if entry else []) + docker_argv(cmd[-1])
    assert argv == ["asynch", "api"], f"default command must be `asynch api`, is {argv}"
    for sub in expand_argv(argv):
        if Path(sub[0]).name == "asynch":
            resolve_asynch(sub)
        elif celery_app_target(sub):
            importlib.import_module(celery_app_target(sub).partition(":")[0])


def test_dockerfile_ships_what_the_commands_need(dockerfile):
    """`pip install .` needs every package pyproject lists, and `asynch db
    upgrade` finds alembic.ini and alembic/ next to app/ (app/cli/__init__.py ROOT),
    which the installed copy in site-packages does not have: the source tree
    must be importable first (PYTHONPATH)."""
    import app.cli

    # dest dir -> names copied there
    workdir = "/"
    copied: dict[str, set[str]] = {}
    for name, args in dockerfile:
        if name == "WORKDIR":
            workdir = args if args.startswith("/") else str(Path(workdir) / args)
        elif name in ("COPY", "ADD"):
            parts = [p for p in shlex.split(args) if not p.startswith("--")]
            *srcs, dest = parts
            dest_abs = dest if dest.startswith("/") else str(Path(workdir) / dest)
            for src in srcs:
                if dest.endswith("/") or len(srcs) > 1 or dest in (".", "./"):
                    copied.setdefault(str(Path(dest_abs)), set()).add(Path(src).name)
                else:
                    copied.setdefault(str(Path(dest_abs).parent), set()).add(Path(dest_abs).name)

    homes = [d for d, names in copied.items() if "app" in names]
    assert len(homes) == 1, f"app/ must be copied once, found in {homes}"
    home = homes[0]
    shipped = copied[home]

    cfg = tomllib.loads(PYPROJECT_PATH.read_text())["tool"]["setuptools"]
    found = cfg.get("packages", {})
    listed = found if isinstance(found, list) else found.get("find", {}).get("include", [])
    needed = {p.rstrip("*").split(".")[0] for p in listed}
    needed |= {f"{m}.py" for m in cfg.get("py-modules", [])}
    needed |= {"pyproject.toml", "alembic.ini", "alembic"}
    cli_root = Path(app.cli.__file__).resolve().parents[2]
    assert (cli_root / "alembic.ini").is_file() and (cli_root / "alembic").is_dir(), \
        "app/cli/ no longer finds alembic next to app/: update this check"
    missing = needed - shipped
    assert not missing, f"the image lacks {sorted(missing)} next to app/ ({home})"

    env = " ".join(instr(dockerfile, "ENV"))
    m = re.search(r"PYTHONPATH[= ](\S+)", env)
    assert m and home in m.group(1).split(":"), \
        f"PYTHONPATH must include {home} so app/cli/__init__.py finds alembic.ini next to it"


def test_dockerfile_names_only_real_asynch_variables():
    unknown = set(ASYNCH_VAR.findall(DOCKERFILE_PATH.read_text())) - real_env_vars()
    assert not unknown, f"the Dockerfile names unknown ASYNCH_ variables: {sorted(unknown)}"


# --- docs/operations.md -------------------------------------------------------------------

# Every setting's row and default: tests/test_config.py.


def test_operations_doc_commands_exist():
    text = DOCS_PATH.read_text()
    snippets = re.findall(r"`(asynch [^`]+)`", text)
    for block in re.findall(r"```[a-z]*\n(.*?)```", text, re.S):
        for line in block.splitlines():
            m = re.match(r"^\s*(?:docker compose (?:exec|run)(?:\s+-\S+)*\s+\S+\s+)?(asynch\s[^#\n]*)$", line)
            if m:
                snippets.append(m.group(1))
    checked = 0
    for snip in snippets:
        argv = shlex.split(snip.replace("...", ""))
        if len(argv) < 2 or argv[1].startswith(("<", "-")):
            continue  # `asynch --help`, `asynch <command> --help`
        path = command_path(argv)
        assert len(path) > 1, f"docs: `{snip}` is not an asynch command"
        cmd = _lookup(path)
        if isinstance(cmd, click.Group):
            assert len(argv) == len(path), f"docs: `{snip}`: no such subcommand of {' '.join(path)}"
            continue
        opts = {o for p in cmd.params for o in list(getattr(p, "opts", [])) + list(getattr(p, "secondary_opts", []))}
        for tok in argv[len(path):]:
            if tok.startswith("-"):
                assert tok.split("=", 1)[0] in opts | {"--help"}, \
                    f"docs: `{snip}`: {tok} is not an option of `{' '.join(path)}`"
        checked += 1
    assert checked >= 8, f"only {checked} asynch commands found in docs/operations.md"


def _lookup(path: tuple[str, ...]) -> click.Command:
    cmd: click.Command = cli_main
    ctx = click.Context(cli_main, info_name="asynch")
    for tok in path[1:]:
        cmd = cmd.get_command(ctx, tok)
    return cmd


# --- the API's serving path -----------------------------------------------------------------

def test_api_serves_on_gevent_with_descriptors_for_its_waiters(compose, services):
    """The api service runs the gevent worker class (through its own
    gunicorn configuration, which patches first), and its container's
    descriptor limit covers every connection a worker may hold plus the
    spare the hooks reserve (app/web/gunicorn_conf.py)."""
    from app.cli.processes import CONNECTIONS_BEYOND_WAITERS, api_argv
    from app.web.gunicorn_conf import SPARE_DESCRIPTORS

    argv = service_argv(services["api"])
    cmd = resolve_asynch(argv)
    params = cmd.make_context("api", argv[2:]).params
    assert params["worker_class"] == "gevent", "api: must serve with --worker-class gevent"
    settings = load_settings({k: interpolate(str(v)) for k, v in compose["x-asynch-env"].items()})
    conns = params["worker_connections"] or settings.waiters_max + CONNECTIONS_BEYOND_WAITERS
    assert conns > settings.waiters_max, "worker connections must leave room beyond the waiters' cap"
    gunicorn = api_argv(params["bind"], params["workers"], params["threads"], params["worker_class"],
                        params["worker_connections"])
    assert gunicorn[gunicorn.index("--config") + 1] == "python:app.web.gunicorn_gevent"
    assert gunicorn[gunicorn.index("--worker-class") + 1] == "gevent"
    nofile = (services["api"].get("ulimits") or {}).get("nofile")
    assert nofile, "api: set ulimits.nofile (each waiting client holds a descriptor)"
    soft = nofile["soft"] if isinstance(nofile, dict) else int(nofile)
    assert soft >= conns + SPARE_DESCRIPTORS, f"api: nofile {soft} < {conns} connections + {SPARE_DESCRIPTORS} spare"


def test_dev_script_runs_the_dev_stack():
    """./scripts/dev.sh ends in `asynch dev`, which serves the API through
    api_argv's gevent path (app/cli/processes.py), and needs no system
    service: no apt-get, no scripts/services.sh (issue 22)."""
    import inspect

    from app.cli import devstack, processes

    script = (ROOT / "scripts" / "dev.sh").read_text()
    assert re.search(r"^exec \S*asynch dev\b", script, re.M), "scripts/dev.sh must exec `asynch dev`"
    code = "\n".join(ln for ln in script.splitlines() if not ln.lstrip().startswith("#"))
    assert "apt-get" not in code and "services.sh" not in code, "scripts/dev.sh must start no system service"
    # Nor does the test script start, restart or flush the machine's PostgreSQL or Redis: the suite brings its own.
    for name in ("test.sh", "services.sh"):
        code = "\n".join(ln for ln in (ROOT / "scripts" / name).read_text().splitlines()
                         if not ln.lstrip().startswith("#"))
        for word in ("pg_ctlcluster", "pg_ctl ", "redis-server --", "redis-cli", "flushdb", "flushall", "5432", "6379"):
            assert word not in code.lower(), f"scripts/{name} must leave the machine's PostgreSQL and Redis alone: {word}"
    src = inspect.getsource(devstack._start_children)
    assert "api_argv(" in src and "make_server" not in src, "asynch dev must run the API as `asynch api` does"
    assert "python:app.web.gunicorn_gevent" in processes.api_argv()
