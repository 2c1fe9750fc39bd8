"""Sends doorbells (``asynch.pull``) and other messages by task name: the API needs a producer, not the task code
(app/ never imports workers/).  A message is a doorbell; the row is the truth, so a lost message is repaired by
recovery, not by the caller.

With a Redis broker a doorbell is written with one LPUSH in exactly the form Celery's own producer writes
(protocol 2, kombu's Redis transport): ``send_task`` costs more CPU than the rest of an admission
(bench/bench_admission.py; tests/test_publisher.py compares the two forms).  Any other broker (amqp://) goes through
Celery's producer.

Priorities are semantic (``Priority``) and mapped per transport: kombu's Redis transport BRPOPs its per-priority
lists in ascending order (0 first), RabbitMQ (``x-max-priority``) serves the HIGHEST number first.
"""
from __future__ import annotations

import base64
import enum
import json
import logging
import os
import socket
import uuid
from dataclasses import dataclass
from urllib.parse import urlparse

import redis
from celery import Celery

from app.config import get_settings
from app.infra.celery_config import MAX_PRIORITY, PULL_TASK, celery_settings, queue_for
from app.infra.process import PerProcess

log = logging.getLogger(__name__)
_ORIGIN = f"{os.getpid()}@{socket.gethostname()}"
_REPLY_TO = str(uuid.uuid4())
_EMBED = {"callbacks": None, "errbacks": None, "chain": None, "chord": None}


class Priority(enum.Enum):
    HIGH = "high"      # retries jumping the queue, maintenance tasks
    NORMAL = "normal"  # submissions, retries waiting at the tail


_AMQP_SCHEMES = {"amqp", "amqps", "pyamqp", "librabbitmq"}
# (HIGH, NORMAL) on each scale; NORMAL leaves room below and above it.
_AMQP = {Priority.HIGH: MAX_PRIORITY, Priority.NORMAL: MAX_PRIORITY // 2}
_KOMBU_VIRTUAL = {Priority.HIGH: 0, Priority.NORMAL: (MAX_PRIORITY + 1) // 2}


def broker_priority(priority: Priority, broker_url: str | None = None) -> int:
    url = broker_url if broker_url is not None else get_settings().effective_broker_url
    scheme = urlparse(url).scheme.split("+")[0].lower()
    return (_AMQP if scheme in _AMQP_SCHEMES else _KOMBU_VIRTUAL)[priority]


@dataclass(frozen=True)
class _Producer:
    app: Celery
    broker: redis.Redis | None  # the broker's Redis, for the one-LPUSH fast path
    sep: str                    # kombu's priority-list separator, read once


def _producer() -> _Producer:
    s = get_settings()
    app = Celery("asynch-producer", set_as_current=False)
    conf = celery_settings(s)
    app.conf.update(conf)
    # Read once: building the settings (kombu Queue objects) costs ~40 us per publish.
    url = s.effective_broker_url
    broker = (redis.Redis.from_url(url, socket_connect_timeout=5, socket_timeout=10)
              if url.startswith(("redis://", "rediss://")) else None)
    return _Producer(app, broker, conf["broker_transport_options"]["sep"])


_current: PerProcess[_Producer] = PerProcess(_producer)


def producer_app() -> Celery:
    return _current.get().app


reset_producer = _current.reset


def redis_message(task: str, args: list, queue: str, priority: int | None) -> tuple[str, bytes]:
    """(list key, payload) of a Celery protocol-2 message on kombu's Redis
    transport, as ``send_task(task, args, queue=queue, priority=...)`` writes it."""
    tid = str(uuid.uuid4())
    pri = min(MAX_PRIORITY, max(0, int(priority or 0)))
    body = json.dumps([list(args), {}, _EMBED]).encode()
    msg = {
        "body": base64.b64encode(body).decode(),
        "content-encoding": "utf-8",
        "content-type": "application/json",
        "headers": {
            "lang": "py", "task": task, "id": tid, "shadow": None, "eta": None, "expires": None,
            "group": None, "group_index": None, "retries": 0, "timelimit": [None, None],
            "root_id": tid, "parent_id": None, "argsrepr": repr(list(args)), "kwargsrepr": "{}",
            "origin": _ORIGIN, "ignore_result": False, "replaced_task_nesting": 0,
            "stamped_headers": None, "stamps": {},
        },
        "properties": {
            "correlation_id": tid, "reply_to": _REPLY_TO, "delivery_mode": 2,
            "delivery_info": {"exchange": "", "routing_key": queue},
            "priority": pri, "body_encoding": "base64", "delivery_tag": str(uuid.uuid4()),
        },
    }
    key = f"{queue}{_current.get().sep}{pri}" if pri else queue
    return key, json.dumps(msg).encode()


def publish_bell(model: str, priority: Priority = Priority.NORMAL) -> bool:
    """Ring a model's doorbell: one ``asynch.pull`` message (a worker with free call slots answers it by pulling
    the jobs the fair dispatcher picks then: app/jobs/slots.py).  On Redis one LPUSH; False (logged) if the broker
    refused (the doorbell is rung again when its lease passes: app/infra/redis/dispatch.py)."""
    try:
        producer, s = _current.get(), get_settings()
        number = broker_priority(priority)
        if producer.broker is not None:
            producer.broker.lpush(*redis_message(PULL_TASK, [model], s.queue_name, number))
        else:
            producer.app.send_task(PULL_TASK, args=[model], queue=s.queue_name, priority=number)
        return True
    except Exception:
        log.exception("doorbell of %s not rung; it is rung again when its lease passes", model)
        return False


def publish_task(name: str, args: list, countdown: float | None = None) -> bool:
    """Publish any task by name on its queue, due in ``countdown`` seconds; False (logged) if the
    broker refused: for work whose durable record is a row that a sweep re-publishes."""
    try:
        producer_app().send_task(name, args=args, queue=queue_for(name, get_settings()), countdown=countdown)
        return True
    except Exception:
        log.exception("publish of %s failed; the sweep will re-publish", name)
        return False
