"""The seed-002 document's own createModel example, sent verbatim, succeeds
on a fresh install (issue 13 item 3): migration 0012_seed_dropin puts in the
model types 1, 2, 3 its ``modelsType`` names (docs/migrating.md).

Real pieces: a scratch PostgreSQL database migrated from empty, the API app."""
from __future__ import annotations

import json

import psycopg2
from helpers import PG_ADMIN_DSN, auth, make_key

from app.config import set_settings
from app.infra.caches import clear_all
from app.infra.db import reset_engine

# Section 2, step one of the seed document, character for character.
SEED_EXAMPLE = """{
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
  "remark": "Model-Service 模型服务"
}"""


def _upgrade(url: str) -> None:
    from argparse import Namespace

    from alembic import command
    from app.cli import alembic_config

    cfg = alembic_config()
    cfg.cmd_opts = Namespace(x=[f"url={url}"])
    command.upgrade(cfg, "head")


def test_the_seed_create_model_example_succeeds_on_a_fresh_install(settings):
    name = "asynch_fresh_install_h"
    admin = psycopg2.connect(PG_ADMIN_DSN)
    admin.autocommit = True
    base = PG_ADMIN_DSN.rsplit("/", 1)[0]
    try:
        with admin.cursor() as cur:
            cur.execute(f'DROP DATABASE IF EXISTS "{name}"')
            cur.execute(f'CREATE DATABASE "{name}"')
        url = base.replace("postgresql://", "postgresql+psycopg2://") + f"/{name}"
        _upgrade(url)
        set_settings(settings.with_overrides(database_url=url))
        reset_engine()
        clear_all()
        try:
            from app import create_app

            client = create_app().test_client()
            resp = client.post("/model/createModel", data=SEED_EXAMPLE.encode(),
                               headers={**auth(make_key("ops", admin=True)), "Content-Type": "application/json"})
            body = resp.get_json()
            assert resp.status_code == 200 and body["code"] == 0, body
            assert body["data"]["modelName"] == "model-service" and body["data"]["modelsType"] == "1,2,3"
            types = client.get("/modelType/list", headers=auth(make_key("ops", admin=True))).get_json()["data"]
            assert [t["typeId"] for t in types] == [1, 2, 3]
            assert json.loads(SEED_EXAMPLE)["modelsType"] == "1,2,3"
        finally:
            set_settings(settings)
            reset_engine()
            clear_all()
    finally:
        with admin.cursor() as cur:
            cur.execute(f'DROP DATABASE IF EXISTS "{name}"')
        admin.close()
