"""v1 batches: OpenAI's Batch API (docs/api.md, "Batches")."""
from __future__ import annotations

from flask import Blueprint

from app.batches import service as batches
from app.batches.schemas import BatchCreate, BatchList, BatchListQuery, BatchObject
from app.web.auth import current_principal
from app.web.contract import Ok, endpoint

bp = Blueprint("v1_batches", __name__, url_prefix="/v1")

_BATCH = {"batch_id": {"description": "batch id (batch_...)"}}


@bp.post("/batches")
@endpoint("Create a batch", tag="batches", body=BatchCreate, errors=(404, 422, 429),
          ok=Ok(BatchObject, "the batch: in_progress, or failed with its errors (line numbers) and nothing admitted"),
          description="Every line of the input file is judged first (JSONL, unique custom_id, POST, url = "
                      "endpoint, body.model a configured model, the model's form); any problem fails the batch. "
                      "Then the completion window is judged against the queue: a window the estimate cannot "
                      "meet is 429 deadline_unmeetable (with the estimate) and nothing is written.")
def create_batch(body: BatchCreate):
    return batches.view(batches.create(current_principal().tenant_id, body))


@bp.get("/batches")
@endpoint("List batches, newest first", tag="batches", query=BatchListQuery, errors=(404,),
          ok=Ok(BatchList, "a page (404: `after` names no batch of yours)"))
def list_batches(query: BatchListQuery):
    rows, more = batches.list_batches(current_principal().tenant_id, query.after, query.limit)
    data = [batches.view(r) for r in rows]
    return BatchList.model_construct(object="list", data=data, first_id=data[0].id if data else None,
                                     last_id=data[-1].id if data else None, has_more=more)


@bp.get("/batches/<batch_id>")
@endpoint("Retrieve a batch", tag="batches", path=_BATCH, errors=(404,), ok=Ok(BatchObject, "the batch"))
def get_batch(batch_id: str):
    return batches.view(batches.get(current_principal().tenant_id, batch_id))


@bp.post("/batches/<batch_id>/cancel")
@endpoint("Cancel a batch", tag="batches", path=_BATCH, errors=(404,),
          ok=Ok(BatchObject, "the batch: cancelling (its running lines are being stopped) or cancelled"))
def cancel_batch(batch_id: str):
    return batches.view(batches.cancel(current_principal().tenant_id, batch_id))
