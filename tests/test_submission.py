"""One submission rule (app/jobs/submission.py): v1 single, v1 batch and
seed createTask judge a job's options by the same function, so a refused
option is the same 422 on every face (at that face's own pointer), and
takes no slot and writes no row."""
from __future__ import annotations

import pytest
from helpers import auth
from sqlalchemy import func, select

from app.config import set_settings
from app.infra.db import transaction
from app.infra.tables import tasks


def _v1(client, key, option):
    header = {"model_key": "X-Model-Key", "callback_url": "X-Callback-Url", "priority": "X-Priority"}
    resp = client.post("/v1/models/m/jobs", json={}, headers={**auth(key), header[option[0]]: str(option[1])})
    assert resp.status_code == 422, resp.get_json()
    return resp.get_json()["errors"]


def _batch(client, key, option):
    resp = client.post("/v1/models/m/jobs:batch", headers=auth(key),
                       json={"jobs": [{"payload": {}, option[0]: option[1]}]})
    assert resp.status_code == 207, resp.get_json()
    (item,) = resp.get_json()["results"]
    assert item["status"] == 422, item
    return item["errors"]


def _seed(client, key, option):
    field = {"model_key": "modelKey", "callback_url": "callbackUrl", "priority": "priority"}
    resp = client.post("/task/createTask", headers=auth(key),
                       json={"modelName": "m", "requestPayload": {}, field[option[0]]: option[1]})
    assert resp.status_code == 422, resp.get_json()
    return resp.get_json()["errors"]


# (option, value, pointer on the v1 / batch / seed face, what the message says)
CASES = [
    (("model_key", "Host:admin.internal"), ("/modelKey", "/jobs/0/model_key", "/modelKey"), "may not be set"),
    (("callback_url", "http://10.0.0.1/cb"), ("/callbackUrl", "/jobs/0/callback_url", "/callbackUrl"),
     "refused address"),
    (("callback_url", "ftp://example.com/cb"), ("/callbackUrl", "/jobs/0/callback_url", "/callbackUrl"),
     "http(s) URL"),
    # The seed's createTask has no priority (seed 002 has none): there the field is unknown.
    (("priority", 12), ("/priority", "/jobs/0/priority", "/priority"), None),
]


@pytest.mark.parametrize("face", [0, 1, 2], ids=["v1", "batch", "seed"])
@pytest.mark.parametrize("option, pointers, says", CASES, ids=[f"{c[0][0]}={c[0][1]}" for c in CASES])
def test_a_refused_option_is_the_same_422_on_every_face(client, make_model, user_key, settings, r, face, option,
                                                       pointers, says):
    set_settings(settings.with_overrides(callback_allow_hosts=""))
    make_model("m", model_key_headers="X-Custom")
    errors = (_v1, _batch, _seed)[face](client, user_key, option)
    assert [e["pointer"] for e in errors] == [pointers[face]], errors
    if says is not None:
        assert says in errors[0]["message"], errors
    elif face < 2:
        assert errors[0]["message"] == "must be from 0 to 9 (9 first; default 5)", errors
    assert r.zcard("asynch:gate:{m}") == 0
    with transaction() as conn:
        assert conn.execute(select(func.count()).select_from(tasks)).scalar_one() == 0


def test_the_faces_judge_alike_what_the_rule_admits(client, make_model, user_key, r):
    """The same allowed options are admitted on every face, with the same stored values."""
    make_model("m", model_key_headers="X-Custom")
    assert client.post("/v1/models/m/jobs", json={}, headers={**auth(user_key), "X-Model-Key": "X-Custom:1",
                                                              "X-Priority": "7", "X-Biz-Name": "b"}).status_code == 202
    assert client.post("/v1/models/m/jobs:batch", headers=auth(user_key), json={"jobs": [
        {"payload": {}, "model_key": "X-Custom:1", "priority": 7, "biz_name": "b"}]}).get_json()["admitted"] == 1
    assert client.post("/task/createTask", headers=auth(user_key), json={
        "modelName": "m", "requestPayload": {}, "modelKey": "X-Custom:1", "bizName": "b"}).status_code == 200
    with transaction() as conn:
        rows = conn.execute(select(tasks.c.model_key, tasks.c.biz_name, tasks.c.priority)
                            .order_by(tasks.c.created_at)).all()
    assert [tuple(x) for x in rows] == [("X-Custom:1", "b", 7), ("X-Custom:1", "b", 7), ("X-Custom:1", "b", 5)]
    assert r.zcard("asynch:gate:{m}") == 3


# --- issue 32 item 8: numbers JSON cannot carry, and deadlines that are not numbers ------------

def _nothing_taken(r, model="m"):
    assert r.zcard(f"asynch:gate:{{{model}}}") == 0
    with transaction() as conn:
        assert conn.execute(select(func.count()).select_from(tasks)).scalar_one() == 0


@pytest.mark.parametrize("literal", [b"1e999999", b"1e400", b"-1e400"])
def test_a_number_beyond_a_double_is_400_on_every_face_and_takes_nothing(client, make_model, user_key, admin_key,
                                                                          r, literal):
    """Python's parser reads 1e400 as inf, which went into the payload as
    the non-JSON ``Infinity``: admitted (202), a slot taken, the job failing
    on the worker.  docs/api.md promises 400 for what JSON cannot carry."""
    make_model("m")
    h = {**auth(user_key), "Content-Type": "application/json"}
    bodies = {"/v1/models/m/jobs": b'{"a": %s}' % literal,
              "/v1/models/m/jobs:batch": b'{"jobs": [{"payload": {"a": %s}}]}' % literal,
              "/task/createTask": b'{"modelName": "m", "requestPayload": {"a": %s}}' % literal}
    for path, raw in bodies.items():
        resp = client.post(path, data=raw, headers=h)
        assert resp.status_code == 400, (path, resp.status_code, resp.get_data(as_text=True))
        assert "invalid JSON" in resp.get_data(as_text=True), resp.get_data(as_text=True)
    # The seed's payload as a string holding JSON: the same strict parser, its field's 422.
    seeded = client.post("/task/createTask", headers=h,
                         data=b'{"modelName": "m", "requestPayload": "{\\"a\\": %s}"}' % literal)
    assert seeded.status_code == 422 and seeded.get_json()["errors"][0]["pointer"] == "/requestPayload"
    # A model's form default (an admin body) is JSON too.
    made = client.post("/v1/models", headers={**auth(admin_key), "Content-Type": "application/json"},
                       data=b'{"model_name": "n", "base_url": "http://127.0.0.1:9", "form": [{"field": "x", '
                            b'"type": "number", "default": %s}]}' % literal)
    assert made.status_code == 400, made.get_data(as_text=True)
    assert client.get("/v1/models/n", headers=auth(admin_key)).status_code == 404
    _nothing_taken(r)
    # A large finite number is still a number (and an integer of any length is JSON's).
    assert client.post("/v1/models/m/jobs", data=b'{"a": 1.7e308, "b": 1e-400, "c": 1%s}' % (b"0" * 400),
                       headers=h).status_code == 202


DEADLINE_FACES = {  # how each face sends a deadline, and the pointer its 422 names
    "v1": (lambda c, h, v: c.post("/v1/models/m/jobs", json={}, headers={**h, "X-Deadline": v}), "/X-Deadline"),
    "batch": (lambda c, h, v: c.post("/v1/models/m/jobs:batch", headers=h,
                                     json={"jobs": [{"payload": {}, "deadline_seconds": v}]}), "/jobs/0/deadline_seconds"),
    "seed": (lambda c, h, v: c.post("/task/createTask", headers=h,
                                    json={"modelName": "m", "requestPayload": {}, "deadline": v}), "/deadline"),
}


def _errors(resp):
    body = resp.get_json()
    if resp.status_code == 207:
        (body,) = body["results"]
        assert body["status"] == 422, body
    else:
        assert resp.status_code == 422, body
    return body["errors"]


@pytest.mark.parametrize("face", list(DEADLINE_FACES))
def test_a_deadline_is_a_number_above_zero_on_every_face(client, make_model, user_key, r, face):
    """``"deadline_seconds": true`` was a 1 s deadline (seed ``"deadline":
    true`` too), the string "5" was taken, and 0 was refused with "must be
    >= 0.0".  A JSON face takes JSON numbers only; the header is text, read
    as a decimal number."""
    make_model("m")
    send, pointer = DEADLINE_FACES[face]
    h = auth(user_key)
    if face == "v1":  # a header is text
        refused = [("0", "must be > 0"), ("-1", "must be > 0"), ("true", "must be a number"),
                   ("abc", "must be a number")]
    else:  # the JSON faces: values as JSON has them
        refused = [(0, "must be > 0"), (-1, "must be > 0"), (True, "must be a number"), (False, "must be a number"),
                   ("5", "must be a number"), ([5], "must be a number")]
    for value, says in refused:
        assert _errors(send(client, h, value)) == [{"pointer": pointer, "message": says}], value
    _nothing_taken(r)
    ok = send(client, h, "60" if face == "v1" else 60)
    assert ok.status_code in (200, 202, 207) and "errors" not in str(ok.get_json()), ok.get_json()
    with transaction() as conn:
        (row,) = conn.execute(select(tasks.c.created_at, tasks.c.caller_deadline_at)).all()
    assert (row.caller_deadline_at - row.created_at).total_seconds() == 60


@pytest.mark.parametrize("face", ["v1", "batch"])
def test_a_priority_is_an_integer_on_the_json_face(client, make_model, user_key, r, face):
    """The batch item's priority had the same lax number: true was 1, "7" was 7."""
    make_model("m")
    h = auth(user_key)
    if face == "v1":
        bad = [client.post("/v1/models/m/jobs", json={}, headers={**h, "X-Priority": v}) for v in ("true", "7.5")]
    else:
        bad = [client.post("/v1/models/m/jobs:batch", headers=h, json={"jobs": [{"payload": {}, "priority": v}]})
               for v in (True, "7", 7.5)]
    for resp in bad:
        assert [e["message"] for e in _errors(resp)] == ["must be from 0 to 9 (9 first; default 5)"]
    _nothing_taken(r)
