"""gunicorn configuration of the gevent API (`asynch api`'s default):
``-c python:app.web.gunicorn_gevent -k gevent``.

Invariant: gevent's monkey-patching runs before anything else is imported,
in the master too.  gunicorn's gevent worker patches only inside each
worker, after the master has imported this configuration (and through it
redis, ssl, prometheus_client and our modules): locks, queues and classes
bound at import time would then be the blocking originals, and a real lock
held by one greenlet while another waits on it stops the whole process.
Patching here, first, makes every one of them gevent's.  The master itself
only forks, reaps and signals; it works the same patched.
"""
from gevent import monkey

monkey.patch_all()

from app.web.gunicorn_conf import child_exit, on_exit, on_starting, post_worker_init  # noqa: E402,F401

worker_class = "gevent"
