"""Result storage behind one small interface.

``put`` returns a location that ``get`` and ``delete`` accept, shown to callers as ``oss_file``. Deleting what is
gone is fine; ``delete_many`` (one request per 1,000 objects on S3) answers what it could not delete (location ->
reason) instead of raising.  Backends: a local directory (default), S3, and the seed's OSS file service
(``oss+http(s)://host:port/base``; only it uses ``put``'s ``context``: the job's headers to pass through).

``put_stream`` stores an iterator of chunks as it comes (a local temp file renamed at the end; an S3 multipart
upload of PART-byte parts, aborted on any failure): the object is never whole in memory.  ``stream`` raises ObjectMissing/StorageError before it returns (the caller can still answer 410/503), then yields
CHUNK-byte pieces, never the whole object.  ``presign`` (S3 only) gives a time-limited GET URL.  OSS downloads
follow no redirects and stop at ASYNCH_MAX_RESULT_BYTES.
"""
from __future__ import annotations

import logging
import mimetypes
import os
import tempfile
import threading
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Iterator, Sequence
from urllib.parse import quote, urlparse

import requests

from app.config import Settings, get_settings

log = logging.getLogger(__name__)


class StorageError(Exception):
    """An upload/download failed; uploads are retried by the caller."""


class ObjectMissing(StorageError):
    pass


CHUNK = 64 * 1024
PART = 8 * 1024 * 1024  # an S3 multipart part (S3's least is 5 MiB but for the last)


@contextmanager
def _failures(location: str, missing, what: str = "") -> Iterator[None]:
    """``missing`` (exception types) is ObjectMissing; any other failure a StorageError."""
    try:
        yield
    except missing as exc:
        raise ObjectMissing(location) from exc
    except Exception as exc:  # botocore and the OS raise many types; all mean "not done"
        raise StorageError(f"{what}{exc}") from exc


class Storage:
    """A backend: ``put(key, data, content_type, context=None)`` -> location, ``stream``, ``delete``
    of its own; shared here: ``get`` is the whole stream, no presigned URL, one delete each."""

    def get(self, location: str) -> bytes:
        return b"".join(self.stream(location))

    def presign(self, location: str, seconds: int) -> str | None:
        return None

    def stream_from(self, location: str, offset: int) -> Iterator[bytes]:
        """``stream`` from byte ``offset`` on (a batch reads its lines by offset)."""
        def skipped(chunks: Iterator[bytes], left: int) -> Iterator[bytes]:
            for chunk in chunks:
                if left >= len(chunk):
                    left -= len(chunk)
                    continue
                yield chunk[left:]
                left = 0
        return skipped(self.stream(location), offset)

    def location_of(self, key: str) -> str:
        """The location ``put``/``put_stream`` of ``key`` answers (without writing anything)."""
        raise StorageError(f"{type(self).__name__} cannot name a location before it is written")

    def put_stream(self, key: str, chunks: Iterator[bytes], content_type: str) -> str:
        raise StorageError(f"{type(self).__name__} takes no streamed upload")
    def exists(self, location: str) -> bool:
        """Whether the object is there (ObjectMissing: no; another failure raises StorageError)."""
        try:
            self.stream(location).close()
        except ObjectMissing:
            return False
        return True

    def delete_many(self, locations: Sequence[str]) -> dict[str, str]:
        failed = {}
        for loc in locations:
            try:
                self.delete(loc)
            except (StorageError, OSError) as exc:
                failed[loc] = str(exc)
        return failed


class LocalStorage(Storage):
    """Files under a root directory; location is the key relative to it."""

    def __init__(self, root: str):
        self.root = Path(root).resolve()

    def _path(self, location: str) -> Path:
        p = (self.root / location.removeprefix("file:")).resolve()
        if self.root not in p.parents:
            raise StorageError(f"location outside the storage root: {location}")
        return p

    def put(self, key: str, data: bytes, content_type: str, context: dict | None = None) -> str:
        p = self._path(key)
        p.parent.mkdir(parents=True, exist_ok=True)
        # Write to a temp file and rename: a reader never sees half a result.
        fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, p)
        except OSError as exc:
            with suppress(OSError):
                os.unlink(tmp)
            raise StorageError(str(exc)) from exc
        return "file:" + key

    def location_of(self, key: str) -> str:
        return "file:" + key

    def put_stream(self, key: str, chunks: Iterator[bytes], content_type: str) -> str:
        p = self._path(key)
        p.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as f:
                for chunk in chunks:
                    f.write(chunk)
            os.replace(tmp, p)
        except BaseException as exc:  # the chunks' own errors (a size limit) too: no half file stays
            with suppress(OSError):
                os.unlink(tmp)
            if isinstance(exc, OSError):
                raise StorageError(str(exc)) from exc
            raise
        return "file:" + key

    def stream(self, location: str) -> Iterator[bytes]:
        with _failures(location, FileNotFoundError):
            f = self._path(location).open("rb")
        return self._chunks(f)

    def stream_from(self, location: str, offset: int) -> Iterator[bytes]:
        with _failures(location, FileNotFoundError):
            f = self._path(location).open("rb")
            f.seek(offset)
        return self._chunks(f)

    @staticmethod
    def _chunks(f) -> Iterator[bytes]:
        with f:
            while chunk := f.read(CHUNK):
                yield chunk

    def delete(self, location: str) -> None:
        with suppress(FileNotFoundError):
            self._path(location).unlink()

    def exists(self, location: str) -> bool:
        return self._path(location).is_file()


class S3Storage(Storage):
    """An S3 bucket (or MinIO, or moto) with an optional key prefix."""

    BULK = 1000  # the most keys a DeleteObjects request takes

    def __init__(self, bucket: str, prefix: str, settings: Settings):
        import boto3
        from botocore.config import Config

        self.bucket, self.prefix = bucket, prefix.strip("/")
        key = settings.s3_access_key or None  # None: boto3's own credential chain
        self.client = boto3.client("s3", region_name=settings.s3_region, endpoint_url=settings.s3_endpoint_url or None,
                                   aws_access_key_id=key, aws_secret_access_key=settings.s3_secret_key if key else None,
                                   config=Config(retries={"max_attempts": 3, "mode": "standard"},
                                                 connect_timeout=5, read_timeout=60))

    def _key(self, location: str) -> str:
        head = f"s3://{self.bucket}/"
        if location.startswith(head):
            return location[len(head):]
        return f"{self.prefix}/{location}" if self.prefix else location

    def put(self, key: str, data: bytes, content_type: str, context: dict | None = None) -> str:
        full = self._key(key)
        with _failures(key, (), "s3 put failed: "):
            self.client.put_object(Bucket=self.bucket, Key=full, Body=data, ContentType=content_type)
        return f"s3://{self.bucket}/{full}"

    def location_of(self, key: str) -> str:
        return f"s3://{self.bucket}/{self._key(key)}"

    def put_stream(self, key: str, chunks: Iterator[bytes], content_type: str) -> str:
        full = self._key(key)
        with _failures(key, (), "s3 upload failed: "):
            upload = self.client.create_multipart_upload(Bucket=self.bucket, Key=full, ContentType=content_type)
        uid, parts, buf = upload["UploadId"], [], bytearray()

        def send(data: bytes) -> None:
            with _failures(key, (), "s3 upload failed: "):
                n = len(parts) + 1
                etag = self.client.upload_part(Bucket=self.bucket, Key=full, UploadId=uid, PartNumber=n,
                                               Body=data)["ETag"]
            parts.append({"ETag": etag, "PartNumber": n})

        try:
            for chunk in chunks:
                buf += chunk
                if len(buf) >= PART:
                    send(bytes(buf[:PART]))
                    del buf[:PART]
            if not parts and not buf:  # nothing at all: an empty object, no multipart upload
                with _failures(key, (), "s3 put failed: "):
                    self.client.abort_multipart_upload(Bucket=self.bucket, Key=full, UploadId=uid)
                    self.client.put_object(Bucket=self.bucket, Key=full, Body=b"", ContentType=content_type)
                return f"s3://{self.bucket}/{full}"
            if buf:
                send(bytes(buf))
            with _failures(key, (), "s3 upload failed: "):
                self.client.complete_multipart_upload(Bucket=self.bucket, Key=full, UploadId=uid,
                                                      MultipartUpload={"Parts": parts})
        except BaseException:
            with suppress(Exception):
                self.client.abort_multipart_upload(Bucket=self.bucket, Key=full, UploadId=uid)
            raise
        return f"s3://{self.bucket}/{full}"

    def stream(self, location: str) -> Iterator[bytes]:
        with _failures(location, self.client.exceptions.NoSuchKey, "s3 get failed: "):
            body = self.client.get_object(Bucket=self.bucket, Key=self._key(location))["Body"]
        return self._chunks(body, location)

    def stream_from(self, location: str, offset: int) -> Iterator[bytes]:
        with _failures(location, self.client.exceptions.NoSuchKey, "s3 get failed: "):
            body = self.client.get_object(Bucket=self.bucket, Key=self._key(location), Range=f"bytes={offset}-")["Body"]
        return self._chunks(body, location)

    @staticmethod
    def _chunks(body, location: str) -> Iterator[bytes]:
        with _failures(location, (), "s3 get failed: "):
            try:
                yield from body.iter_chunks(CHUNK)
            finally:
                body.close()

    def presign(self, location: str, seconds: int) -> str | None:
        with _failures(location, (), "s3 presign failed: "):
            return self.client.generate_presigned_url(
                "get_object", Params={"Bucket": self.bucket, "Key": self._key(location)}, ExpiresIn=seconds)

    def exists(self, location: str) -> bool:
        from botocore.exceptions import ClientError

        try:
            self.client.head_object(Bucket=self.bucket, Key=self._key(location))
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                return False
            raise StorageError(f"s3 head failed: {exc}") from exc
        return True

    def delete(self, location: str) -> None:
        with _failures(location, (), "s3 delete failed: "):  # DeleteObject succeeds for a missing key
            self.client.delete_object(Bucket=self.bucket, Key=self._key(location))

    def delete_many(self, locations: Sequence[str]) -> dict[str, str]:
        failed: dict[str, str] = {}
        for i in range(0, len(locations), self.BULK):
            chunk = {self._key(loc): loc for loc in locations[i:i + self.BULK]}
            try:
                # Quiet: the answer lists only the keys that failed.
                resp = self.client.delete_objects(Bucket=self.bucket, Delete={
                    "Objects": [{"Key": k} for k in chunk], "Quiet": True})
            except Exception as exc:  # the whole request failed: none is known deleted
                failed.update((loc, f"s3 delete failed: {exc}") for loc in chunk.values())
                continue
            for err in resp.get("Errors", []):
                loc = chunk.get(err.get("Key"))
                if loc is not None:
                    failed[loc] = f"s3 delete failed: {err.get('Code')}: {err.get('Message')}"
        return failed


class OssStorage(Storage):
    """The seed's OSS file service: ``POST {base}/oss/file/uploadFile`` with a multipart ``file`` part; the job's
    ``Authorization`` and ``X-User-Info`` are passed through (else the operator's ASYNCH_OSS_AUTHORIZATION, and then
    without X-User-Info: the operator's credential is never combined with an identity the job brought).  The
    location (oss_file) is the answer's file URL: ``data`` (a string), ``data.url`` / ``data.fileUrl`` /
    ``data.path``, or a top-level ``url``; a ``code`` other than 0/200 or ``success: false`` is a failed upload.  No
    delete: ``delete`` only logs (the file service's own retention applies)."""

    PASS_THROUGH = ("Authorization", "X-User-Info")

    def __init__(self, base_url: str, settings: Settings):
        self.base = base_url.rstrip("/")
        self.timeout, self.default_auth = settings.oss_timeout_seconds, settings.oss_authorization
        self.max_bytes = settings.max_result_bytes
        self.session = requests.Session()
        self.session.trust_env = False

    def put(self, key: str, data: bytes, content_type: str, context: dict | None = None) -> str:
        headers = {name: (context or {})[name] for name in self.PASS_THROUGH if (context or {}).get(name)}
        if "Authorization" not in headers and self.default_auth:
            headers.pop("X-User-Info", None)
            headers["Authorization"] = self.default_auth
        ext = mimetypes.guess_extension((content_type or "").split(";")[0].strip()) or ".bin"
        filename = key.strip("/").replace("/", "-") + ext
        try:
            resp = self.session.post(f"{self.base}/oss/file/uploadFile", headers=headers, timeout=self.timeout,
                                     files={"file": (filename, data, content_type or "application/octet-stream")},
                                     allow_redirects=False)
        except requests.RequestException as exc:
            raise StorageError(f"oss upload failed: {type(exc).__name__}") from exc
        if resp.status_code != 200:
            raise StorageError(f"oss upload failed: HTTP {resp.status_code}")
        try:
            body = resp.json()
        except ValueError as exc:
            raise StorageError("oss upload answered with no JSON") from exc
        url = self._file_url(body)
        if not url:
            raise StorageError(f"oss upload refused: {str(body)[:200]}")
        return url

    @staticmethod
    def _file_url(body) -> str | None:
        ok = isinstance(body, dict) and body.get("success") is not False and body.get("code", 0) in (0, 200, "0", "200")
        if not ok:
            return None
        data = body.get("data")
        found = [data.get(k) for k in ("url", "fileUrl", "path")] if isinstance(data, dict) else [data]
        return next((url for url in (*found, body.get("url")) if isinstance(url, str) and url), None)

    def stream(self, location: str) -> Iterator[bytes]:
        try:
            resp = self.session.get(location, timeout=self.timeout, stream=True, allow_redirects=False)
        except requests.RequestException as exc:
            raise StorageError(f"oss download failed: {type(exc).__name__}") from exc
        if resp.status_code != 200:
            resp.close()
            if resp.status_code == 404:
                raise ObjectMissing(location)
            raise StorageError(f"oss download failed: HTTP {resp.status_code}"
                               + (" (redirects are not followed)" if 300 <= resp.status_code < 400 else ""))
        declared = resp.headers.get("Content-Length", "").strip()
        if declared.isdigit() and int(declared) > self.max_bytes:
            resp.close()
            raise StorageError(f"oss download exceeds {self.max_bytes} bytes")
        return self._capped(resp)

    def _capped(self, resp: requests.Response) -> Iterator[bytes]:
        seen = 0
        try:
            for chunk in resp.iter_content(CHUNK):
                seen += len(chunk)
                if seen > self.max_bytes:
                    raise StorageError(f"oss download exceeds {self.max_bytes} bytes")
                yield chunk
        except requests.RequestException as exc:
            raise StorageError(f"oss download failed: {type(exc).__name__}") from exc
        finally:
            resp.close()

    def delete(self, location: str) -> None:
        log.info("oss file service has no delete; left to its retention: %s", location)

    def delete_many(self, locations: Sequence[str]) -> dict[str, str]:
        if locations:
            log.info("oss file service has no delete; %d files left to its retention", len(locations))
        return {}


def public_location(location: str | None, model_name: str, job_id: str) -> str | None:
    """A result's location as callers see it (oss_file): as is, except an S3 location (the
    bucket is ours, not the tenant's business), which becomes the job's v1 result path."""
    if location and location.startswith("s3://"):
        return f"/v1/models/{quote(model_name, safe='')}/jobs/{job_id}/result"
    return location


def storage_from_url(url: str, settings: Settings) -> Storage:
    parsed = urlparse(url)
    if parsed.scheme == "file":
        return LocalStorage(parsed.netloc + parsed.path)  # file:///abs/path or file://relative/path
    if parsed.scheme == "s3":
        if not parsed.netloc:
            raise ValueError(f"storage URL needs a bucket: {url}")
        return S3Storage(parsed.netloc, parsed.path, settings)
    if parsed.scheme in ("oss+http", "oss+https"):
        return OssStorage(url[len("oss+"):], settings)
    raise ValueError(f"unsupported storage URL: {url}")


_lock = threading.Lock()
_storage: tuple[str, Storage] | None = None


def get_storage() -> Storage:
    global _storage
    s = get_settings()
    with _lock:
        if _storage is None or _storage[0] != s.storage_url:
            _storage = (s.storage_url, storage_from_url(s.storage_url, s))
        return _storage[1]
