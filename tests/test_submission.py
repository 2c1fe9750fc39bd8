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
