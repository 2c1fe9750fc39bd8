"""Result storage behind one small interface.

``put`` returns a location string that ``get`` and ``delete`` accept and that
is shown to callers as ``oss_file``.  Deleting what is already gone is fine.
Backends: a local directory (default) and S3 via boto3.
"""
from __future__ import annotations

import os
import tempfile
import threading
from pathlib import Path
from typing import Protocol
from urllib.parse import urlparse

from app.config import Settings, get_settings


class StorageError(Exception):
    """An upload/download failed; uploads are retried by the caller."""


class ObjectMissing(StorageError):
    pass


class Storage(Protocol):
    def put(self, key: str, data: bytes, content_type: str) -> str: ...
    def get(self, location: str) -> bytes: ...
    def delete(self, location: str) -> None: ...


class LocalStorage:
    """Files under a root directory; location is the key relative to it."""

    def __init__(self, root: str):
        self.root = Path(root).resolve()

    def _path(self, location: str) -> Path:
        key = location[len("file:"):] if location.startswith("file:") else location
        p = (self.root / key).resolve()
        if self.root not in p.parents:
            raise StorageError(f"location outside the storage root: {location}")
        return p

    def put(self, key: str, data: bytes, content_type: str) -> str:
        p = self._path(key)
        p.parent.mkdir(parents=True, exist_ok=True)
        # Write to a temp file and rename: a reader never sees half a result.
        fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, p)
        except OSError as exc:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise StorageError(str(exc)) from exc
        return "file:" + key

    def get(self, location: str) -> bytes:
        try:
            return self._path(location).read_bytes()
        except FileNotFoundError as exc:
            raise ObjectMissing(location) from exc
        except OSError as exc:
            raise StorageError(str(exc)) from exc

    def delete(self, location: str) -> None:
        try:
            self._path(location).unlink()
        except FileNotFoundError:
            pass


class S3Storage:
    """An S3 bucket (or MinIO, or moto) with an optional key prefix."""

    def __init__(self, bucket: str, prefix: str, settings: Settings):
        import boto3
        from botocore.config import Config

        self.bucket = bucket
        self.prefix = prefix.strip("/")
        kw = {"region_name": settings.s3_region,
              "config": Config(retries={"max_attempts": 3, "mode": "standard"},
                               connect_timeout=5, read_timeout=60)}
        if settings.s3_endpoint_url:
            kw["endpoint_url"] = settings.s3_endpoint_url
        if settings.s3_access_key:
            kw["aws_access_key_id"] = settings.s3_access_key
            kw["aws_secret_access_key"] = settings.s3_secret_key
        self.client = boto3.client("s3", **kw)

    def _key(self, location: str) -> str:
        head = f"s3://{self.bucket}/"
        if location.startswith(head):
            return location[len(head):]
        return f"{self.prefix}/{location}" if self.prefix else location

    def put(self, key: str, data: bytes, content_type: str) -> str:
        full = self._key(key)
        try:
            self.client.put_object(Bucket=self.bucket, Key=full, Body=data, ContentType=content_type)
        except Exception as exc:  # botocore raises many types; all mean "not stored"
            raise StorageError(f"s3 put failed: {exc}") from exc
        return f"s3://{self.bucket}/{full}"

    def get(self, location: str) -> bytes:
        try:
            return self.client.get_object(Bucket=self.bucket, Key=self._key(location))["Body"].read()
        except self.client.exceptions.NoSuchKey as exc:
            raise ObjectMissing(location) from exc
        except Exception as exc:
            raise StorageError(f"s3 get failed: {exc}") from exc

    def delete(self, location: str) -> None:
        # S3 DeleteObject succeeds for a missing key.
        try:
            self.client.delete_object(Bucket=self.bucket, Key=self._key(location))
        except Exception as exc:
            raise StorageError(f"s3 delete failed: {exc}") from exc


def storage_from_url(url: str, settings: Settings) -> Storage:
    parsed = urlparse(url)
    if parsed.scheme == "file":
        # file:///abs/path or file://relative/path
        path = parsed.netloc + parsed.path if parsed.netloc else parsed.path
        return LocalStorage(path)
    if parsed.scheme == "s3":
        if not parsed.netloc:
            raise ValueError(f"storage URL needs a bucket: {url}")
        return S3Storage(parsed.netloc, parsed.path, settings)
    raise ValueError(f"unsupported storage URL: {url}")


_lock = threading.Lock()
_storage: tuple[str, Storage] | None = None


def get_storage() -> Storage:
    global _storage
    s = get_settings()
    cur = _storage
    if cur is None or cur[0] != s.storage_url:
        with _lock:
            cur = _storage
            if cur is None or cur[0] != s.storage_url:
                cur = (s.storage_url, storage_from_url(s.storage_url, s))
                _storage = cur
    return cur[1]
