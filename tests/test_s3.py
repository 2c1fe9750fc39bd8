"""Results in S3: boto3 against moto's standalone server over HTTP, with a
Celery worker process configured for S3."""
from __future__ import annotations

import boto3
import pytest
import requests
from helpers import WorkerProcess, auth, free_port, job_row, submit, wait_until

from app.config import set_settings
from app.infra.storage import S3Storage, get_storage

pytestmark = pytest.mark.e2e
BUCKET = "asynch-results"


@pytest.fixture(scope="module")
def s3_endpoint():
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    server.start()
    url = f"http://127.0.0.1:{port}"
    boto3.client("s3", endpoint_url=url, region_name="us-east-1", aws_access_key_id="test",
                 aws_secret_access_key="test").create_bucket(Bucket=BUCKET)
    yield url
    server.stop()


@pytest.fixture(scope="module")
def s3_env(test_env, s3_endpoint):
    return {**test_env, "ASYNCH_STORAGE_URL": f"s3://{BUCKET}/results", "ASYNCH_S3_ENDPOINT_URL": s3_endpoint,
            "ASYNCH_S3_ACCESS_KEY": "test", "ASYNCH_S3_SECRET_KEY": "test"}


@pytest.fixture(scope="module")
def s3_worker(s3_env, tmp_path_factory):
    w = WorkerProcess(s3_env, log_path=tmp_path_factory.mktemp("s3w") / "worker.log", name="s3").start()
    yield w
    w.stop()


@pytest.fixture
def s3_settings(settings, s3_endpoint):
    s = settings.with_overrides(storage_url=f"s3://{BUCKET}/results", s3_endpoint_url=s3_endpoint,
                                s3_access_key="test", s3_secret_key="test")
    set_settings(s)
    return s


def test_result_round_trips_through_s3(api_url, s3_worker, s3_settings, make_model, user_key, s3_endpoint):
    make_model("img")
    payload = {"content_type": "image/svg+xml", "body": "<svg xmlns='http://www.w3.org/2000/svg'/>"}
    job = submit(api_url, user_key, "img", payload).json()
    wait_until(lambda: job_row(job["job_id"]).state == 2, what="done", timeout=30)
    row = job_row(job["job_id"])
    assert row.result_location.startswith(f"s3://{BUCKET}/results/")
    res = requests.get(f"{api_url}{job['result_url']}", headers=auth(user_key), timeout=10)
    assert res.status_code == 200
    assert res.headers["Content-Type"] == "image/svg+xml"
    assert res.content == payload["body"].encode()
    # The object really is in the bucket, with its content type.
    s3 = boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1",
                      aws_access_key_id="test", aws_secret_access_key="test")
    key = row.result_location[len(f"s3://{BUCKET}/"):]
    obj = s3.get_object(Bucket=BUCKET, Key=key)
    assert obj["ContentType"] == "image/svg+xml" and obj["Body"].read() == payload["body"].encode()


def test_s3_storage_interface(s3_settings):
    st = get_storage()
    assert isinstance(st, S3Storage)
    loc = st.put("a/b/c", b"\x00\x01bytes", "application/octet-stream")
    assert st.get(loc) == b"\x00\x01bytes"
    st.delete(loc)
    st.delete(loc)  # already gone: not an error
    from app.infra.storage import ObjectMissing

    with pytest.raises(ObjectMissing):
        st.get(loc)


def test_s3_delete_many_is_one_bulk_call_and_reports_what_failed(s3_settings):
    st = get_storage()
    locs = [st.put(f"bulk/{i}", b"x", "text/plain") for i in range(5)]
    calls = []
    real = st.client.delete_objects

    def counting(**kw):
        calls.append(len(kw["Delete"]["Objects"]))
        return real(**kw)

    st.client.delete_objects = counting
    try:
        missing = f"s3://{BUCKET}/results/bulk/never-stored"
        assert st.delete_many(locs + [missing]) == {}  # a missing object is not a failure
    finally:
        del st.client.delete_objects
    assert calls == [6]
    from app.infra.storage import ObjectMissing

    for loc in locs:
        with pytest.raises(ObjectMissing):
            st.get(loc)
    # A bucket that is not there: every location is reported, none raised.
    gone = S3Storage("no-such-bucket", "", s3_settings)
    failed = gone.delete_many(["a", "b"])
    assert set(failed) == {"a", "b"} and all("s3 delete failed" in v for v in failed.values())
