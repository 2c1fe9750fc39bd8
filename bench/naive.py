"""The baselines: what a user writes by hand.

- ``naive_app``: Flask ``POST /jobs`` doing Celery ``.delay()`` (nothing else).
- ``naive_celery``: bare Celery tasks on the same worker settings as ours
  (acks_late, prefetch 1, results ignored): a no-op and one HTTP call.
Run as ``gunicorn bench.naive:naive_app`` and ``celery -A bench.naive worker``.
"""
from __future__ import annotations

import os

import redis
import requests
from celery import Celery
from flask import Flask, jsonify, request

BROKER = os.environ.get("BENCH_NAIVE_BROKER", "redis://127.0.0.1:6379/4")
COUNTER = os.environ.get("BENCH_NAIVE_COUNTER", "redis://127.0.0.1:6379/3")

celery = Celery("naive", broker=BROKER)
celery.conf.update(task_acks_late=True, task_reject_on_worker_lost=True, worker_prefetch_multiplier=1,
                   task_ignore_result=True, task_default_queue="naive", worker_hijack_root_logger=False)
_session = requests.Session()
_counter = redis.Redis.from_url(COUNTER)


@celery.task(name="naive.noop")
def noop() -> None:
    _counter.incr("naive:done")


@celery.task(name="naive.http_call")
def http_call(url: str, payload: dict) -> None:
    resp = _session.post(url, json=payload, timeout=30)
    resp.content  # read the body, as ours does
    _counter.incr("naive:done")


naive_app = Flask("naive")


@naive_app.post("/jobs")
def submit():
    payload = request.get_json()
    r = http_call.delay(os.environ.get("BENCH_MODEL_URL", "http://127.0.0.1:9/"), payload)
    return jsonify({"job_id": r.id, "state": "pending"}), 202


@naive_app.get("/hello")
def hello():
    return "hello"
