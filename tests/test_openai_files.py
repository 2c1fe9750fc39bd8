"""The Files API through the real OpenAI client (openai.files.*) against the test API: upload (multipart,
streamed), retrieve, list, content, delete, expires_after, per-tenant isolation, the size limit, and the
S3 multipart upload (moto's server) the stream goes into."""
from __future__ import annotations

import io
from datetime import timedelta

import boto3
import openai
import pytest
import requests
from helpers import auth, free_port

from app.clock import now, set_clock
from app.config import set_settings
from app.files import service as files_service

BUCKET = "asynch-files"


def client(api_url: str, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{api_url}/v1", api_key=key, max_retries=0, timeout=30)


def test_upload_retrieve_list_content_delete(api_url, user_key):
    oa = client(api_url, user_key)
    data = b'{"custom_id": "a"}\n' * 1000
    f = oa.files.create(file=("in.jsonl", io.BytesIO(data)), purpose="batch")
    assert f.id.startswith("file-") and f.bytes == len(data) and f.filename == "in.jsonl" and f.purpose == "batch"
    assert oa.files.retrieve(f.id).bytes == len(data)
    assert oa.files.content(f.id).read() == data
    g = oa.files.create(file=("b.txt", b"hello"), purpose="user_data")
    listed = oa.files.list()
    assert [x.id for x in listed.data] == [g.id, f.id]
    assert [x.id for x in oa.files.list(purpose="batch").data] == [f.id]
    page = requests.get(f"{api_url}/v1/files", params={"limit": 1}, headers=auth(user_key)).json()
    assert page["has_more"] is True and page["data"][0]["id"] == g.id
    page2 = requests.get(f"{api_url}/v1/files", params={"limit": 1, "after": g.id}, headers=auth(user_key)).json()
    assert [x["id"] for x in page2["data"]] == [f.id] and page2["has_more"] is False
    assert oa.files.delete(f.id).deleted is True
    with pytest.raises(openai.NotFoundError):
        oa.files.retrieve(f.id)
    with pytest.raises(openai.NotFoundError):
        oa.files.content(f.id)


def test_another_tenant_gets_404(api_url, user_key, other_key):
    f = client(api_url, user_key).files.create(file=("x.jsonl", b"{}\n"), purpose="batch")
    other = client(api_url, other_key)
    for call in (lambda: other.files.retrieve(f.id), lambda: other.files.content(f.id),
                 lambda: other.files.delete(f.id)):
        with pytest.raises(openai.NotFoundError):
            call()
    assert other.files.list().data == []
    assert client(api_url, user_key).files.retrieve(f.id).id == f.id  # the delete above did nothing


def test_expires_after_is_honoured(api_url, user_key, settings):
    oa = client(api_url, user_key)
    f = oa.files.create(file=("e.jsonl", b"{}\n"), purpose="batch",
                        expires_after={"anchor": "created_at", "seconds": 3600})
    assert f.expires_at == f.created_at + 3600
    assert oa.files.retrieve(f.id).id == f.id
    later = now() + timedelta(seconds=3601)
    set_clock(lambda: later)  # the API runs in this process: its clock moves too
    with pytest.raises(openai.NotFoundError):
        oa.files.retrieve(f.id)
    assert files_service.sweep_expired() == 1
    with pytest.raises(openai.UnprocessableEntityError):
        oa.files.create(file=("e.jsonl", b"{}\n"), purpose="batch", expires_after={"anchor": "created_at",
                                                                                   "seconds": 60})


def test_bad_uploads_are_refused_and_keep_nothing(api_url, user_key, settings, test_env):
    oa = client(api_url, user_key)
    with pytest.raises(openai.UnprocessableEntityError):
        oa.files.create(file=("x.jsonl", b"{}\n"), purpose="nonsense")
    r = requests.post(f"{api_url}/v1/files", headers=auth(user_key), data={"purpose": "batch"})
    assert r.status_code == 400  # not multipart
    r = requests.post(f"{api_url}/v1/files", headers=auth(user_key), files={"purpose": (None, "batch")})
    assert r.status_code == 422 and r.json()["errors"][0]["pointer"] == "/file"
    assert oa.files.list().data == []


def test_size_limit_is_the_files_setting_not_the_body_limit(api_url, user_key, settings):
    oa = client(api_url, user_key)
    body_cap = settings.max_body_bytes
    big = b"x" * (body_cap * 3)  # past ASYNCH_MAX_BODY_BYTES: the files route takes it
    assert oa.files.create(file=("big.bin", big), purpose="user_data").bytes == len(big)
    set_settings(settings.with_overrides(files_max_bytes=body_cap))
    with pytest.raises(openai.APIStatusError) as exc:
        oa.files.create(file=("big.bin", big), purpose="user_data")
    assert exc.value.status_code == 413
    assert len(oa.files.list().data) == 1
    # other routes keep the body limit
    r = requests.post(f"{api_url}/v1/models/echo/jobs", headers=auth(user_key), data=b"{" + b" " * body_cap + b"}")
    assert r.status_code == 413


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


def test_s3_upload_is_a_multipart_upload_in_parts(api_url, user_key, settings, s3_endpoint):
    set_settings(settings.with_overrides(storage_url=f"s3://{BUCKET}/f", s3_endpoint_url=s3_endpoint,
                                         s3_access_key="test", s3_secret_key="test"))
    data = bytes(range(256)) * (20 * 4096 + 7)  # ~20 MiB: three parts
    oa = client(api_url, user_key)
    f = oa.files.create(file=("big.bin", data), purpose="user_data")
    row = files_service.get("tenant-a", f.id)
    s3 = boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1", aws_access_key_id="test",
                      aws_secret_access_key="test")
    head = s3.head_object(Bucket=BUCKET, Key=row.location[len(f"s3://{BUCKET}/"):])
    assert head["ContentLength"] == len(data) and head["ETag"].strip('"').endswith("-3")  # a 3-part upload
    assert oa.files.content(f.id).read() == data
    set_settings(settings.with_overrides(storage_url=f"s3://{BUCKET}/f", s3_endpoint_url=s3_endpoint,
                                         s3_access_key="test", s3_secret_key="test", files_max_bytes=10 << 20))
    with pytest.raises(openai.APIStatusError):
        oa.files.create(file=("big.bin", data), purpose="user_data")
    assert s3.list_multipart_uploads(Bucket=BUCKET).get("Uploads", []) == []  # the refused one was aborted


def test_odd_multipart_bodies_are_4xx_never_500(api_url, user_key):
    h = auth(user_key)
    cases = [
        ({"Content-Type": "multipart/form-data; boundary=xyz"}, b""),  # nothing at all
        ({"Content-Type": "multipart/form-data; boundary=xyz"}, b"--xyz\r\nContent-Disposition: form-data; "
                                                                 b'name="file"; filename="a"\r\n\r\nabc'),  # cut off
        ({"Content-Type": "multipart/form-data"}, b"--xyz--\r\n"),  # no boundary
        ({"Content-Type": "multipart/form-data; boundary=xyz"},
         b'--xyz\r\nContent-Disposition: form-data; name="purpose"\r\n\r\n' + b"p" * 70000 + b"\r\n--xyz--\r\n"),
    ]
    for headers, body in cases:
        r = requests.post(f"{api_url}/v1/files", headers={**h, **headers}, data=body)
        assert r.status_code in (400, 422), (r.status_code, r.text)
    r = requests.post(f"{api_url}/v1/files", headers=h, files={"purpose": (None, "batch"),
                                                               "file": ("a\x00b.jsonl", b"{}\n")})
    assert r.status_code == 200 and r.json()["filename"] == "ab.jsonl"
