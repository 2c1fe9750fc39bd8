# syntax=docker/dockerfile:1
#
# One image for every process of model-asynch: the API (default CMD), the
# Celery worker, Celery beat, Flower and the one-shot migration.  The process
# is chosen by the command (`asynch api|worker|beat|db upgrade`, or
# `celery -A workers.celery_app flower`); configuration comes only from
# ASYNCH_* environment variables (see docs/operations.md).
#
#   docker build -t model-asynch .
#   docker run --rm -p 8000:8000 -e ASYNCH_DATABASE_URL=... model-asynch
#
# Only PyPI is needed at build time: psycopg2-binary ships manylinux wheels, so
# no compiler or libpq packages are installed.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /opt/model-asynch

# Dependencies first, from pyproject.toml alone, so a code change does not
# reinstall them.  Flower (the Celery monitor of the compose file) is not a
# dependency of the package, so it is added here.
COPY pyproject.toml ./
RUN python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" \
        > /tmp/requirements.txt \
    && pip install -r /tmp/requirements.txt "flower>=2,<3" \
    && rm /tmp/requirements.txt

# The code.  README* is optional (pyproject names README.md; the glob keeps the
# build working whether or not it exists).  alembic.ini and alembic/ must sit
# next to app/: `asynch db upgrade` finds them relative to app/cli/.
COPY beat_schedule.py alembic.ini README* ./
COPY app ./app
COPY workers ./workers
COPY model_asynch ./model_asynch
COPY alembic ./alembic
RUN pip install . \
    && rm -rf build \
    && python -m compileall -q app workers alembic beat_schedule.py

# `pip install .` installs the dependencies' metadata and the `asynch` console
# script; PYTHONPATH makes the source tree above shadow the copy in
# site-packages, because app/cli/ locates alembic.ini and alembic/ relative
# to its own file (Path(__file__).parents[2]), which in site-packages has
# neither.
ENV PYTHONPATH=/opt/model-asynch

# Non-root.  Its home is the working directory: beat writes its
# celerybeat-schedule file there, and the default local result store
# (file://data/results, when ASYNCH_STORAGE_URL is not set) lives under it.
RUN useradd --system --uid 10001 --user-group --create-home \
        --home-dir /var/lib/asynch --shell /usr/sbin/nologin asynch
USER asynch
WORKDIR /var/lib/asynch

EXPOSE 8000

# Liveness of the API (the default command).  The compose file overrides this
# for the worker, beat and Flower, and disables it for the one-shot migration.
HEALTHCHECK --interval=30s --timeout=5s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=4)"]

CMD ["asynch", "api"]
