"""gunicorn configuration of the gevent API (`asynch api`'s default):
``-c python:app.web.gunicorn_gevent -k gevent``.

Invariant: gevent patches before anything else is imported, in the master
too.  The gevent worker patches only after the master imported this config
(and through it redis, ssl, prometheus_client, our modules): locks and
classes bound then would be the blocking originals, and a real lock held by
one greenlet while another waits stops the whole process.
"""
from gevent import monkey

monkey.patch_all()

from app.web.gunicorn_conf import child_exit, on_exit, on_starting, post_worker_init  # noqa: E402,F401

worker_class = "gevent"
