"""The seed-002 routes (docs/api.md, "Seed-002 routes") over the same
services and the same declarations as v1: the shapes are validated by their
camelCase aliases (``face="seed"``), answers come in the envelope
{"code": 0, "message": "ok", "data": ...}, and errors are enveloped by the
one handler (app/web/errors.py).  Model and model-type writes and the
maintenance triggers (runWork, cleanWork, autoTune) need an admin key."""
from __future__ import annotations

from typing import Annotated

from flask import Blueprint
from pydantic import Field

from app.catalog import model_types, registry
from app.catalog.schemas import (ModelInput, ModelNameBody, ModelTypeInput, ModelTypeView, SeedModelTypeUpdate,
                                 SeedModelUpdate, SeedModelView, TypeIdBody, model_view)
from app.contract import NO_NUL, Int, Loose, Params, rule
from app.jobs import service as jobs, stats, submission
from app.jobs.seed_schemas import CreatedTask, CreateTask, SeedTask, TaskHeaders, TaskIds
from app.jobs.stats import Usage, UsageQuery
from app.maintenance import autotune, passes
from app.maintenance.schemas import AutotuneReport, AutotuneRequest, Report
from app.web.auth import current_principal
from app.web.contract import Ok, endpoint
from app.web.v1_jobs import caller

bp = Blueprint("seed", __name__)
SEED = {"face": "seed", "tag": "seed"}
# The maintenance triggers: admins only, optional bodies that are only read.
MAINTENANCE = {**SEED, "auth": "admin", "body_required": False, "nul_allowed": ("",)}


class ModelQuery(Params):
    modelName: Annotated[str, Field(min_length=1, pattern=NO_NUL)] = rule("a model name")  # noqa: N815


class TaskQuery(Params):
    taskId: Annotated[str, Field(min_length=1, pattern=NO_NUL)] = rule("a task id")  # noqa: N815


def _model(row) -> object:
    return model_view(row, current_principal().is_admin, face="seed")


@bp.post("/model/createModel")
@endpoint("Create a model", auth="admin", body=ModelInput, errors=(409,), ok=Ok(SeedModelView, "the model"), **SEED)
def create_model(body: ModelInput):
    return _model(registry.create_model(body))


@bp.post("/model/updateModel")
@endpoint("Update a model: modelName names it, the other fields given change", auth="admin", body=SeedModelUpdate,
          errors=(404,), ok=Ok(SeedModelView, "the model"), **SEED)
def update_model(body: SeedModelUpdate):
    return _model(registry.update_model(body.model_name, body))


@bp.get("/model/getModel")
@endpoint("A model (users: enabled ones, fewer fields)", query=ModelQuery, ok=Ok(model_view.seed_any, "the model"),
          errors=(404,), **SEED)
def get_model(query: ModelQuery):
    return _model(registry.get_model(current_principal(), query.modelName))


@bp.get("/model/listModel")
@endpoint("Models (users: enabled ones, fewer fields)", ok=Ok(model_view.seed_any, "the models", many=True), **SEED)
def list_models():
    return [_model(r) for r in registry.visible_models(current_principal())]


@bp.post("/model/deleteModel")
@endpoint("Delete a model (409 while it has active tasks)", auth="admin", body=ModelNameBody, errors=(404, 409),
          ok=Ok(ModelNameBody, "deleted"), **SEED)
def delete_model(body: ModelNameBody):
    registry.delete_model(body.model_name)
    return body


@bp.post("/modelType/create")
@endpoint("Create a model type (without typeId: the next free id)", auth="admin", body=ModelTypeInput,
          errors=(409,), ok=Ok(ModelTypeView, "the type"), **SEED)
def create_type(body: ModelTypeInput):
    return ModelTypeView.from_row(model_types.create_type(body))


@bp.post("/modelType/update")
@endpoint("Update a model type", auth="admin", body=SeedModelTypeUpdate, errors=(404,),
          ok=Ok(ModelTypeView, "the type"), **SEED)
def update_type(body: SeedModelTypeUpdate):
    return ModelTypeView.from_row(model_types.update_type(body.type_id, body))


@bp.get("/modelType/list")
@endpoint("Model types", ok=Ok(ModelTypeView, "the types", many=True), **SEED)
def list_types():
    return [ModelTypeView.from_row(r) for r in model_types.list_types()]


@bp.post("/modelType/delete")
@endpoint("Delete a model type (409 while a model's modelsType names it)", auth="admin", body=TypeIdBody,
          errors=(404, 409), ok=Ok(TypeIdBody, "deleted"), **SEED)
def delete_type(body: TypeIdBody):
    model_types.delete_type(body.type_id)
    return body


@bp.post("/task/createTask")
@endpoint("Submit a task (the v1 submit with the seed's fields)", body=CreateTask, headers=TaskHeaders,
          nul_allowed=("/requestPayload",), errors=(404, 429), ok=Ok(CreatedTask, "admitted"), **SEED,
          description="404: unknown or disabled model; 422: bad fields or the model's form (pointers under "
                      "/requestPayload), a reused Idempotency-Key with another body; 429: the queue is full.")
def create_task(body: CreateTask, headers: TaskHeaders):
    opts = submission.given(body, headers, **caller(headers, body.creator))
    out = jobs.submit(current_principal(), body.model_name, body.request_payload, opts, submission.SEED)
    return CreatedTask.model_construct(task_id=out.row.id)


@bp.post("/task/getTaskBatch")
@endpoint("Tasks by id; done ones are claimed (2 -> 4, expire_at set) by exactly one call", body=TaskIds,
          ok=Ok(SeedTask, "one entry per distinct id, in order", many=True), **SEED,
          description="Unknown ids and other tenants' ids are answered as not found and never touched.")
def get_task_batch(body: TaskIds):
    return jobs.get_task_batch(current_principal(), body.task_ids)


@bp.get("/task/getTaskResult")
@endpoint("One task (another tenant's: 404)", query=TaskQuery, errors=(404,), ok=Ok(SeedTask, "the task"), **SEED)
def get_task_result(query: TaskQuery):
    return SeedTask.from_row(jobs.read_result_row(current_principal(), query.taskId))


@bp.get("/stat/getModelStat")
@endpoint("Usage counts (as /v1/stats)", query=UsageQuery, errors=(403,), ok=Ok(Usage, "counts"), **SEED)
def model_stat(query: UsageQuery):
    return stats.usage(current_principal(), query)


class Ignored(Loose):
    """An optional body whose fields are ignored."""


class RunWorkRequest(Loose):
    """runWork's optional body; other fields are ignored."""

    max_tasks: Int(0, 10000) | None = rule(
        "pending jobs to claim and run in this call, 0-10000 (absent: ASYNCH_RUN_WORK_MAX_TASKS)", None)


@bp.post("/task/runWork")
@endpoint("Run the worker pass now: the retry pass (as POST /v1/maintenance/retry), then up to maxTasks "
          "pending jobs claimed and run by this call", body=RunWorkRequest, ok=Ok(Report, "its report"), **MAINTENANCE)
def run_work(body: RunWorkRequest):
    return passes.run_work(body.max_tasks).as_dict()


@bp.post("/task/cleanWork")
@endpoint("Run cleanup, due retries, then recovery, now", body=Ignored,
          ok=Ok(Report, "{cleanup: {...}, recover: {...}}"), **MAINTENANCE)
def clean_work(body: Ignored):
    return passes.clean_work().as_dict()


@bp.post("/model/autoTune")
@endpoint("Run autotune now", body=AutotuneRequest, ok=Ok(AutotuneReport, "the decisions"), **MAINTENANCE)
def auto_tune(body: AutotuneRequest):
    return autotune.autotune(body.window_seconds, body.dry_run).as_dict()
