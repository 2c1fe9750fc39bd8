"""The seed-002 business flow (its section 2, "使用流程"), as a client written
only from the seed document: it knows nothing of this implementation.

  1. createModel: the seed's own example body (an operator's step; it needs
     an admin credential);
  2. createTask: modelName + requestPayload + bizName + callbackUrl + modelKey,
     keep the task_id;
  3. getTaskBatch until the task leaves 0/1; on state 2 download oss_file
     (the batch call marks it 4, "downloaded");
  4. getTaskResult for the single view;
  5. the success callback, GET {callbackUrl}/{bizName}?task_id&state&oss_file&file_type,
     arrives at the business service (outside this script: see --callback-url).

Usage:
  python examples/seed_flow.py --base http://asynch:8000 \\
      --auth "Bearer <credential>" --admin-auth "Bearer <admin key>" \\
      --model-url http://model:8000 [--callback-url http://biz/notify]

``--auth`` is whatever the business service sends as Authorization: an API
key of ours (ASYNCH_AUTH_MODE=key), or, behind the business gateway
(ASYNCH_AUTH_MODE=gateway), the user's own token, which the middleware
passes to the OSS file service unchanged.  Prints one JSON line: what the
flow saw.  Exit status 0 when the flow completed with the task done.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import requests

# The seed's createModel example (section 2, step one), verbatim but for baseUrl.
SEED_MODEL = {
    "modelName": "model-service",
    "modelsType": "1,2,3",
    "baseUrl": "http://127.0.0.1:8000",
    "route": "/api/v1/chat",
    "httpMethod": "POST",
    "headMsg": "API_KEY:model-key,API_STATE:true,API_NUM:123",
    "enabled": 1,
    "maxConcurrency": 5,
    "queueLimit": 20,
    "timeoutSeconds": 1800,
    "expectedSeconds": 600,
    "retryTimes": 3,
    "retryQueueMaxSeconds": 600,
    "autoCleanSeconds": 3600,
    "remark": "Model-Service 模型服务",
}


def call(method: str, url: str, auth: str, **kw) -> object:
    """One seed call: the envelope {"code": 0, "message", "data"}; anything else is a failure."""
    resp = requests.request(method, url, headers={"Authorization": auth, **kw.pop("headers", {})}, timeout=30, **kw)
    body = resp.json()
    if body.get("code") != 0:
        raise SystemExit(f"{method} {url}: {resp.status_code} {body}")
    return body["data"]


def run(base: str, auth: str, admin_auth: str, model_url: str, callback_url: str | None,
        timeout: float = 60) -> dict:
    # Step one: the model configuration (the seed's example).
    call("POST", f"{base}/model/createModel", admin_auth, json={**SEED_MODEL, "baseUrl": model_url})

    # Step two: create a task, keep its task_id.
    task = {"modelName": "model-service", "requestPayload": {"prompt": "你好"}, "bizName": "order",
            "modelKey": "X-API-Key:per-request"}
    if callback_url:
        task["callbackUrl"] = callback_url
    task_id = call("POST", f"{base}/task/createTask", auth, json=task)["task_id"]

    # Step three: sync progress in batches; download what is in state 2.
    seen, downloaded, item = [], None, None
    deadline = time.time() + timeout
    while time.time() < deadline:
        (item,) = call("POST", f"{base}/task/getTaskBatch", auth, json={"taskIds": [task_id]})
        seen.append(item["state"])
        if item["state"] == 2:
            got = requests.get(item["oss_file"], timeout=30)
            got.raise_for_status()
            downloaded = got.content
            break
        if item["state"] not in (0, 1):
            break
        time.sleep(0.2)

    # Or one at a time.
    single = call("GET", f"{base}/task/getTaskResult", auth, params={"taskId": task_id})
    return {"task_id": task_id, "states_seen": seen, "batch_item": item, "downloaded": len(downloaded or b""),
            "content": downloaded.decode("utf-8", "replace") if downloaded else None,
            "result_state": single["state"], "oss_file": single.get("oss_file")}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", required=True)
    ap.add_argument("--auth", required=True, help="the Authorization the business service sends")
    ap.add_argument("--admin-auth", required=True, help="the operator's Authorization (createModel)")
    ap.add_argument("--model-url", required=True)
    ap.add_argument("--callback-url")
    ap.add_argument("--timeout", type=float, default=60)
    a = ap.parse_args(argv)
    out = run(a.base, a.auth, a.admin_auth, a.model_url, a.callback_url, a.timeout)
    print(json.dumps(out, ensure_ascii=False))
    return 0 if out["states_seen"][-1:] == [2] and out["downloaded"] and out["result_state"] == 4 else 1


if __name__ == "__main__":
    sys.exit(main())
