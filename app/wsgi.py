"""WSGI entry point: ``gunicorn app.wsgi:app``.  psycopg2 is made cooperative
here too (idempotent with the gunicorn hook): a plain ``gunicorn -k gevent``
never blocks the hub on PostgreSQL."""
from app import create_app
from app.config import get_settings
from app.infra.serving import make_green
from app.secret_settings import check_startup

# A plain `gunicorn app.wsgi:app` refuses weak secrets too (outside dev mode).
check_startup(get_settings())
make_green()
app = create_app()
