"""``asynch files ...`` and ``asynch batches ...``: OpenAI's Files and Batch APIs from a shell, through the Python
client (model_asynch/batches.py), with the client commands' --url/--key/--debug and one-line errors
(app/cli/client_cmds.py).  Output is the server's JSON on stdout (``files content``: the bytes)."""
from __future__ import annotations

import json
import sys

import click

from app.cli.client_cmds import client_command
from model_asynch import Client


def _show(data: dict) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=True))


@click.group("files", help="Upload, list, show, download and delete files (OpenAI's Files API).")
def files() -> None:
    pass


@files.command("upload", help="Upload PATH (streamed). Prints the file object; -q: only its id.")
@click.argument("path", type=click.Path(exists=True, dir_okay=False))
@click.option("--purpose", default="batch", show_default=True, help="batch, user_data, ...")
@click.option("--expires-after", type=click.IntRange(3600, 2592000), help="Seconds until it is deleted.")
@click.option("-q", "--quiet", is_flag=True, help="Print only the file id.")
@client_command
def upload(c: Client, path: str, purpose: str, expires_after: int | None, quiet: bool) -> None:
    f = c.upload_file(path, purpose, expires_after_seconds=expires_after)
    click.echo(f["id"]) if quiet else _show(f)


@files.command("list", help="List your files, newest first.")
@click.option("--purpose", help="Only files of this purpose.")
@click.option("--limit", type=click.IntRange(1, 10000), default=100, show_default=True, help="At most this many.")
@client_command
def list_files(c: Client, purpose: str | None, limit: int) -> None:
    _show(c.files(purpose, limit))


@files.command("show", help="Show a file object.")
@click.argument("file_id")
@client_command
def show_file(c: Client, file_id: str) -> None:
    _show(c.file(file_id))


@files.command("content", help="Write a file's bytes to stdout or --output (streamed).")
@click.argument("file_id")
@click.option("-o", "--output", type=click.Path(dir_okay=False, writable=True), help="Write to this path.")
@client_command
def content(c: Client, file_id: str, output: str | None) -> None:
    if output:
        c.file_content(file_id, to=output)
    else:
        sys.stdout.buffer.write(c.file_content(file_id))


@files.command("delete", help="Delete a file.")
@click.argument("file_id")
@client_command
def delete_file(c: Client, file_id: str) -> None:
    _show(c.delete_file(file_id))


@click.group("batches", help="Create, show, list, wait for and cancel batches (OpenAI's Batch API).")
def batches() -> None:
    pass


@batches.command("create", help="A batch over an uploaded JSONL file (INPUT_FILE_ID), or --input PATH (uploaded "
                 "first). Prints the batch; -q: only its id.")
@click.argument("input_file_id", required=False)
@click.option("--input", "input_path", type=click.Path(exists=True, dir_okay=False), help="Upload this JSONL first.")
@click.option("--endpoint", default="/v1/chat/completions", show_default=True, help="Every line's url.")
@click.option("--window", "completion_window", default="24h", show_default=True,
              help="The completion window: 24h, 30m, 2h, 7d ... (refused at once when the queue cannot meet it).")
@click.option("--metadata", multiple=True, metavar="KEY=VALUE", help="Up to 16 pairs.")
@click.option("-q", "--quiet", is_flag=True, help="Print only the batch id.")
@client_command
def create(c: Client, input_file_id: str | None, input_path: str | None, endpoint: str, completion_window: str,
           metadata: tuple[str, ...], quiet: bool) -> None:
    if bool(input_file_id) == bool(input_path):
        raise click.UsageError("name the input: INPUT_FILE_ID or --input PATH (one of them)")
    if input_path:
        input_file_id = c.upload_file(input_path, "batch")["id"]
    meta = dict(m.split("=", 1) for m in metadata if "=" in m) or None
    b = c.create_batch(input_file_id, endpoint, completion_window, meta)
    click.echo(b["id"]) if quiet else _show(b)


@batches.command("show", help="Show a batch (status, request_counts, output_file_id, error_file_id).")
@click.argument("batch_id")
@client_command
def show_batch(c: Client, batch_id: str) -> None:
    _show(c.get_batch(batch_id))


@batches.command("list", help="List your batches, newest first.")
@click.option("--limit", type=click.IntRange(1, 100), default=20, show_default=True, help="At most this many.")
@click.option("--after", help="The last id of the previous page.")
@client_command
def list_batches(c: Client, limit: int, after: str | None) -> None:
    _show(c.list_batches(limit, after))


@batches.command("wait", help="Wait until the batch ends and print it; exit 0 completed, 1 failed/expired/"
                 "cancelled, 2 still running at --timeout.")
@click.argument("batch_id")
@click.option("--timeout", type=click.FloatRange(0), default=None, help="Give up after this many seconds.")
@click.option("--poll", type=click.FloatRange(0.1), default=1.0, show_default=True, help="Seconds between looks.")
@client_command
def wait_batch(c: Client, batch_id: str, timeout: float | None, poll: float) -> None:
    b = c.wait_batch(batch_id, timeout, poll)
    _show(b)
    sys.exit(0 if b["status"] == "completed" else 2 if b["status"] in ("in_progress", "finalizing",
                                                                         "cancelling") else 1)


@batches.command("cancel", help="Cancel a batch: pending lines cancelled, running ones stopped.")
@click.argument("batch_id")
@client_command
def cancel_batch(c: Client, batch_id: str) -> None:
    _show(c.cancel_batch(batch_id))
