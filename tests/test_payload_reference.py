"""Inputs by reference (issue 33 item 3): a submit names an uploaded file as its payload (X-Payload-File), or a
batch line does (payload_file_id); the worker streams the file to the upstream; the row holds only the
reference.  Real workers, the stub model (which records what it received)."""
from __future__ import annotations

import io
import json

import openai
import pytest
import requests
from helpers import auth, job_row, wait_until

from app.batches import progress

pytestmark = pytest.mark.e2e


def _upload(api_url: str, key: str, data: bytes, purpose: str = "user_data") -> str:
    oa = openai.OpenAI(base_url=f"{api_url}/v1", api_key=key, max_retries=0)
    return oa.files.create(file=("payload.json", io.BytesIO(data)), purpose=purpose).id


def test_a_submit_by_reference_sends_the_files_bytes(api_url, workers, make_model, user_key, model_server, settings):
    make_model("echo", form=[{"field": "prompt", "type": "string", "required": True}])
    image = "A" * (settings.max_body_bytes * 4)  # a base64 image past the body limit
    payload = {"prompt": "describe", "image": image}
    fid = _upload(api_url, user_key, json.dumps(payload).encode())
    r = requests.post(f"{api_url}/v1/models/echo/jobs", json={}, headers={**auth(user_key), "X-Payload-File": fid})
    assert r.status_code == 202, r.text
    job = r.json()["job_id"]
    wait_until(lambda: job_row(job).state == 2, timeout=30, what="done")
    row = job_row(job)
    assert row.request_payload == "{}" and row.payload_file_id == fid  # the row holds only the reference
    call = next(c for c in model_server.state.calls if c["headers"].get("X-Asynch-Job-Id") == job)
    assert call["payload"] == payload and call["headers"]["Content-Type"] == "application/json"


def test_a_reference_is_refused_unless_it_is_yours_and_the_body_is_empty(api_url, make_model, user_key, other_key):
    make_model("echo")
    theirs = _upload(api_url, other_key, b'{"prompt": "x"}')
    mine = _upload(api_url, user_key, b'{"prompt": "x"}')
    for fid, body in ((theirs, {}), ("file-0000", {}), (mine, {"prompt": "also"}), ("nope", {})):
        r = requests.post(f"{api_url}/v1/models/echo/jobs", json=body,
                          headers={**auth(user_key), "X-Payload-File": fid})
        assert r.status_code == 422 and r.json()["errors"][0]["pointer"] == "/X-Payload-File", r.text
    assert requests.get(f"{api_url}/v1/jobs", headers=auth(user_key)).json()["jobs"] == []


def test_a_batch_line_by_reference(api_url, workers, make_model, user_key, model_server):
    make_model("echo")
    oa = openai.OpenAI(base_url=f"{api_url}/v1", api_key=user_key, max_retries=0)
    fid = _upload(api_url, user_key, b'{"prompt": "from a file"}')
    lines = [{"custom_id": "r", "method": "POST", "url": "/v1/completions", "payload_file_id": fid,
              "body": {"model": "echo"}},
             {"custom_id": "i", "method": "POST", "url": "/v1/completions", "body": {"model": "echo", "prompt": "in"}}]
    src = "".join(json.dumps(x) + "\n" for x in lines).encode()
    b = oa.batches.create(input_file_id=_upload(api_url, user_key, src, "batch"), endpoint="/v1/completions",
                          completion_window="1h")

    def done():
        progress.advance_all()
        return oa.batches.retrieve(b.id).status == "completed"
    wait_until(done, timeout=60, interval=0.2, what="batch completed")
    out = {json.loads(x)["custom_id"]: json.loads(x) for x in
           oa.files.content(oa.batches.retrieve(b.id).output_file_id).text.splitlines()}
    assert out["r"]["response"]["body"]["echo"] == {"prompt": "from a file"}
    assert out["i"]["response"]["body"]["echo"] == {"model": "echo", "prompt": "in"}
    bad = [{**lines[0], "payload_file_id": "file-00"}]
    failed = oa.batches.create(input_file_id=_upload(api_url, user_key, json.dumps(bad[0]).encode() + b"\n",
                                                     "batch"), endpoint="/v1/completions", completion_window="1h")
    assert failed.status == "failed" and failed.errors.data[0].param == "payload_file_id"
