"""The seed-002 face's field names: the ONE camelCase <-> snake_case table.

Requests are mapped to the service layer's snake_case names on the way in,
model and model-type views back to camelCase on the way out, and the first
segment of 422 pointers too (payload field names below /requestPayload are
the caller's own and stay as they are).  Task views keep the seed's own
snake_case answer fields (task_id, state, oss_file).
"""
from __future__ import annotations

# URL prefixes of the seed routes: errors under them get the envelope form
# even when no route matched (404/405).
PATH_PREFIXES = ("/model/", "/modelType/", "/task/", "/stat/")

CAMEL_TO_SNAKE = {
    "modelName": "model_name",
    "modelsType": "models_type",
    "baseUrl": "base_url",
    "httpMethod": "http_method",
    "headMsg": "head_msg",
    "maxConcurrency": "max_concurrency",
    "queueLimit": "queue_limit",
    "timeoutSeconds": "timeout_seconds",
    "expectedSeconds": "expected_seconds",
    "retryTimes": "retry_times",
    "retryQueueMaxSeconds": "retry_queue_max_seconds",
    "autoCleanSeconds": "auto_clean_seconds",
    "createdAt": "created_at",
    "updatedAt": "updated_at",
    "typeId": "type_id",
    "typeName": "type_name",
    "taskIds": "task_ids",
}
SNAKE_TO_CAMEL = {v: k for k, v in CAMEL_TO_SNAKE.items()}


def to_snake(data: dict) -> dict:
    return {CAMEL_TO_SNAKE.get(k, k): v for k, v in data.items()}


def to_camel(data: dict) -> dict:
    return {SNAKE_TO_CAMEL.get(k, k): v for k, v in data.items()}


def camel_pointer(pointer: str) -> str:
    """"/models_type" -> "/modelsType"; "/form/0/type" unchanged."""
    if not pointer.startswith("/"):
        return pointer
    head, sep, rest = pointer[1:].partition("/")
    return "/" + SNAKE_TO_CAMEL.get(head, head) + sep + rest
