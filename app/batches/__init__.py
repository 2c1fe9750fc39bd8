"""Batches (/v1/batches, OpenAI's Batch API): create and validate a JSONL input (create), admit its lines as jobs
through the one admission path (feed), collect their outcomes into output and error files and end the batch
(progress), and the caller's reads and cancel (service).  All of a batch's state is in PostgreSQL."""
