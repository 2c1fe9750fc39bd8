"""The stress test once more with RabbitMQ as the broker (amqp://): the
publisher goes through Celery's producer, workers consume from RabbitMQ."""
from __future__ import annotations

import os

import pytest
from helpers import WorkerProcess
from test_stress import run_stress

from app.config import set_settings
from app.infra.publisher import reset_producer

pytestmark = [pytest.mark.slow, pytest.mark.e2e]
AMQP = os.environ.get("ASYNCH_TEST_AMQP", "amqp://guest:guest@127.0.0.1:5672//")


@pytest.fixture(scope="module")
def amqp_worker(test_env, tmp_path_factory):
    env = {**test_env, "ASYNCH_BROKER_URL": AMQP}
    w = WorkerProcess(env, concurrency=2, log_path=tmp_path_factory.mktemp("amqp") / "worker.log", name="amqp")
    w.start()
    yield w
    w.stop()


@pytest.fixture
def amqp_api(settings):
    set_settings(settings.with_overrides(broker_url=AMQP))
    reset_producer()
    yield
    set_settings(settings)
    reset_producer()


def test_stress_with_rabbitmq(api_url, amqp_worker, amqp_api, make_model, user_key, model_server, r):
    from app.infra.publisher import producer_app

    assert producer_app().conf.broker_url.startswith("amqp://")
    make_model("rabbit", queue_limit=6, max_concurrency=4, retry_times=1)
    out = run_stress(api_url, user_key, "rabbit", model_server, r)
    print(f"\nstress over RabbitMQ: {out}")
    assert out["admitted"] > 30 and out["codes"].get(429, 0) > 0
