"""Traces (issue 34 item 1, app/infra/tracing.py): a job's W3C trace context from its submit, on every face,
through its claim on a worker, to its upstream model call and its callback; exported over OTLP only when the
OTEL_* environment says so.  The acceptance test runs the API (in this process), a Celery worker node and a
callback worker (processes of their own), the stub upstream and an in-process OTLP receiver, and finds one
trace per job across the three services and the traceparent the stub upstream received."""
from __future__ import annotations

import os
import time

import pytest
import requests
from helpers import WorkerProcess, auth, job_row, submit_job, wait_until
from otlp_receiver import OtlpReceiver

from app.config import get_settings, set_settings
from app.infra import tracing
from app.jobs import execution
from app.maintenance import passes as maintenance
from app.states import JobState

CALLER = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def sent_traceparent(call: dict) -> str | None:
    return next((v for k, v in call["headers"].items() if k.lower() == "traceparent"), None)


@pytest.fixture
def otel_env(monkeypatch):
    """Tracing on in this process (the API), exporting to an in-process receiver; off again afterwards."""
    rx = OtlpReceiver()
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": rx.url, "OTEL_BSP_SCHEDULE_DELAY": "100"}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr(tracing, "service_name", "model-asynch-api")  # this process is the API
    tracing.reset()
    yield rx, env
    tracing.reset()  # flushes and shuts the provider down while the receiver still listens
    rx.stop()


@pytest.fixture(autouse=True)
def _tracing_read_again():
    tracing.reset()  # each test reads the environment it set up
    yield
    tracing.reset()


def test_off_by_default_and_the_callers_traceparent_still_goes_upstream(make_model, model_server, client,
                                                                        user_key):
    assert not any(k.startswith("OTEL_") for k in os.environ)
    assert tracing.enabled() is False
    make_model("m")
    resp = client.post("/v1/models/m/jobs", json={"n": 1},
                       headers={**auth(user_key), "traceparent": CALLER, "tracestate": "vendor=1"})
    job = resp.get_json()["job_id"]
    row = job_row(job)
    assert (row.traceparent, row.tracestate) == (CALLER, "vendor=1")  # kept as received, nothing generated
    plain = submit_job("m", {"n": 2})
    assert job_row(plain).traceparent is None  # off: no root is made
    assert execution.run_attempt(job) == "done" and execution.run_attempt(plain) == "done"
    sent = {c["payload"]["n"]: c for c in model_server.state.calls}
    assert sent_traceparent(sent[1]) == CALLER
    assert sent_traceparent(sent[2]) is None
    assert tracing._sdk.peek() is None  # the SDK was never built


@pytest.mark.parametrize("bad", ["junk", "00-" + "0" * 32 + "-00f067aa0ba902b7-01",
                                 "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
                                 "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
                                 "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01"])
def test_a_malformed_traceparent_is_ignored_never_refused(make_model, client, user_key, bad):
    make_model("m")
    resp = client.post("/v1/models/m/jobs", json={"n": 1}, headers={**auth(user_key), "traceparent": bad})
    assert resp.status_code == 202
    assert job_row(resp.get_json()["job_id"]).traceparent is None


def test_environment_rules():
    env = os.environ
    try:
        for setting, on in [({}, False), ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:4318"}, True),
                            ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://x:4318/v1/traces"}, True),
                            ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://x"}, False),
                            ({"OTEL_TRACES_EXPORTER": "otlp"}, True),
                            ({"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "otlp"}, False)]:
            for k in [k for k in env if k.startswith("OTEL_")]:
                del env[k]
            env.update(setting)
            tracing.reset()
            assert tracing.enabled() is on, setting
    finally:
        for k in [k for k in env if k.startswith("OTEL_")]:
            del env[k]


def _spans(rx, trace_id: str, names: set[str], timeout: float = 30) -> list[dict]:
    def have():
        tracing.flush()
        got = rx.of_trace(trace_id)
        return got if names <= {s["name"] for s in got} else None
    return wait_until(have, timeout, interval=0.2, what=f"spans {sorted(names)} of trace {trace_id}")


@pytest.mark.e2e
def test_one_trace_per_job_across_the_api_the_worker_and_the_upstream(
        otel_env, make_model, model_server, receiver, api_url, user_key, test_env, settings, tmp_path):
    rx, env = otel_env
    set_settings(settings.with_overrides(delivery_allow_hosts="127.0.0.1", seed000_model="traced"))
    make_model("traced", retry_times=2, retry_queue_max_seconds=60)
    node_env = {**test_env, **env, "ASYNCH_DELIVERY_ALLOW_HOSTS": "127.0.0.1", "ASYNCH_RETRY_BACKOFF_SECONDS": "0.1"}
    w = WorkerProcess(node_env, concurrency=2, log_path=tmp_path / "w.log").start()
    cb = WorkerProcess(node_env, concurrency=2, log_path=tmp_path / "cb.log", name="cb", callbacks=True).start()
    try:
        h = auth(user_key)
        # Every face: v1 with the caller's context, v1 and its batch without, seed 000, seed 002's createTask.
        traced = requests.post(f"{api_url}/v1/models/traced/jobs", json={"n": 1, "tag": "t1", "fail_first": 1},
                               headers={**h, "traceparent": CALLER, "X-Callback-Url": f"{receiver.url}/cb"},
                               timeout=10).json()["job_id"]
        plain = requests.post(f"{api_url}/v1/models/traced/jobs", json={"n": 2}, headers=h, timeout=10).json()["job_id"]
        batch = [x["job_id"] for x in requests.post(f"{api_url}/v1/models/traced/jobs:batch", json={"jobs": [
            {"payload": {"n": 3}}, {"payload": {"n": 4}}]}, headers=h, timeout=10).json()["results"]]
        seed0 = requests.post(f"{api_url}/jobs", json={"n": 5}, headers=h, timeout=10).json()["job_id"]
        seed2 = requests.post(f"{api_url}/task/createTask", json={"modelName": "traced", "requestPayload": {"n": 6}},
                              headers=h, timeout=10).json()["data"]["task_id"]
        jobs = [traced, plain, *batch, seed0, seed2]

        def all_done() -> bool:
            maintenance.retry_due()  # beat's retry pass (the retried job's backoff)
            return all(job_row(j).state == JobState.DONE for j in jobs)
        wait_until(all_done, 60, interval=0.2, what="every job done")
        rows = {j: job_row(j) for j in jobs}
        trace_of = {j: r.traceparent.split("-")[1] for j, r in rows.items()}
        assert trace_of[traced] == CALLER.split("-")[1]  # the caller's trace, joined
        assert len(set(trace_of.values())) == len(jobs)  # one trace per job
        calls = {c["payload"]["n"]: [] for c in model_server.state.calls}
        for c in model_server.state.calls:
            calls[c["payload"]["n"]].append(sent_traceparent(c))
        wanted = {"asynch.submit", "asynch.admission", "asynch.queue_wait", "asynch.claim", "asynch.model_call",
                  "asynch.storage", "asynch.terminal_write"}
        for n, j in zip(range(1, 7), jobs):
            spans = _spans(rx, trace_of[j], wanted | ({"asynch.delivery"} if j == traced else set()))
            by_name: dict[str, list[dict]] = {}
            for s in spans:
                by_name.setdefault(s["name"], []).append(s)
            services = {s["name"]: s["service"] for s in spans}
            assert services["asynch.submit"] == services["asynch.admission"] == "model-asynch-api"
            assert services["asynch.model_call"] == services["asynch.claim"] == "model-asynch-worker"
            (submit,) = by_name["asynch.submit"]
            assert submit["parent"] == (CALLER.split("-")[2] if j == traced else "")  # a child, or the root
            # Every other span hangs under the job's own (asynch.submit), whatever process made it.
            assert {s["parent"] for s in spans if s["name"] not in ("asynch.submit",)} == {submit["span_id"]}
            # The upstream got the model call's own span as its parent: its spans would join this trace.
            call_ids = {s["span_id"] for s in by_name["asynch.model_call"]}
            assert len(calls[n]) == len(call_ids) and all(
                tp.split("-")[1] == trace_of[j] and tp.split("-")[2] in call_ids for tp in calls[n])
            call = by_name["asynch.model_call"][-1]
            assert call["attributes"]["http.request.method"] == "POST"
            assert call["attributes"]["url.full"] == model_server.url + "/v1/echo"
            assert call["attributes"]["http.response.status_code"] == 200
        # The retried job: two attempts, two model-call spans (the first in error, HTTP 500), one trace.
        first, second = sorted([s for s in rx.of_trace(trace_of[traced]) if s["name"] == "asynch.model_call"],
                               key=lambda s: s["start"])
        assert (first["attributes"]["http.response.status_code"], first["status"]) == (500, 2)
        assert second["attributes"]["asynch.attempt"] == 2
        waits = sorted([s for s in rx.of_trace(trace_of[traced]) if s["name"] == "asynch.queue_wait"],
                       key=lambda s: s["start"])
        assert [s["attributes"]["asynch.wait.reasons"] for s in waits] == [["no_worker"],
                                                                           ["retry_backoff", "no_worker"]]
        # The callback carried the delivery attempt's span.
        (delivery,) = [s for s in rx.of_trace(trace_of[traced]) if s["name"] == "asynch.delivery"]
        (got,) = [r for r in receiver.requests if r["path"] == "/cb"]
        assert sent_traceparent(got) == f"00-{trace_of[traced]}-{delivery['span_id']}-01"
        assert delivery["attributes"]["http.request.method"] == "GET"
    finally:
        w.stop()
        cb.stop()
        set_settings(settings)


def test_an_unsampled_trace_makes_no_spans_and_is_still_passed_on(otel_env, make_model, model_server, client,
                                                                   user_key):
    rx, _env = otel_env
    make_model("m")
    unsampled = CALLER[:-2] + "00"
    resp = client.post("/v1/models/m/jobs", json={"n": 1}, headers={**auth(user_key), "traceparent": unsampled})
    job = resp.get_json()["job_id"]
    sampled = client.post("/v1/models/m/jobs", json={"n": 2}, headers=auth(user_key)).get_json()["job_id"]
    assert execution.run_attempt(job) == "done" and execution.run_attempt(sampled) == "done"
    kept = job_row(job).traceparent
    assert kept.split("-")[1] == CALLER.split("-")[1] and kept.endswith("-00")
    (call,) = [c for c in model_server.state.calls if c["payload"]["n"] == 1]
    assert sent_traceparent(call) == kept  # passed on as kept: the upstream may still join (or not sample) it
    # The sampled job's spans arrive; the unsampled one's never do.
    _spans(rx, job_row(sampled).traceparent.split("-")[1], {"asynch.model_call"})
    tracing.flush()
    assert rx.of_trace(CALLER.split("-")[1]) == []
