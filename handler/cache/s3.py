"""S3Store: artifacts in any S3-compatible object store, through an injected boto3 client."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from itertools import count
from pathlib import Path
from typing import Any

import boto3
from boto3.exceptions import RetriesExceededError
from boto3.s3.transfer import TransferConfig
from botocore.config import Config
from botocore.exceptions import (
    ClientError,
    ConnectionError as BotoConnectionError,
    CredentialRetrievalError,
    HTTPClientError,
    NoCredentialsError,
    PartialCredentialsError,
)

from handler.cache.errors import ArtifactNotFound, CacheStoreError, StoreUnavailable
from handler.cache.progress import ByteCallback, copy_chunks, file_chunks
from handler.cache.store import BlobStore

log = logging.getLogger(__name__)

# Below this size one request moves the whole file; above, parts move separately.
MULTIPART_THRESHOLD = 64 * 1024 * 1024
PART_BYTES = 16 * 1024 * 1024  # also the memory held per in-flight upload
_CREDENTIAL_CODES = {"403", "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch",
                     "ExpiredToken", "InvalidToken", "TokenRefreshRequired", "AllAccessDisabled"}
_REGION_CODES = {"301", "PermanentRedirect", "AuthorizationHeaderMalformed",
                 "IllegalLocationConstraintException"}
_MISSING_CODES = {"404", "NoSuchKey", "NotFound"}
# 412: the object exists. 409: a concurrent conditional write is in flight and will win.
_LOST_RACE_CODES = {"412", "PreconditionFailed", "409", "ConditionalRequestConflict"}


def make_s3_client(endpoint_url: str | None = None, region: str | None = None, *,
                   connect_timeout: float = 5.0, read_timeout: float = 60.0, max_attempts: int = 3,
                   max_pool_connections: int = 32) -> Any:
    """A boto3 S3 client with bounded timeouts and retries, so a dead store fails fast.

    Credentials come from the standard chain (environment, profile, instance role).
    A custom endpoint (MinIO, Ceph, R2, moto) gets path-style addressing, which they all accept.
    """
    options: dict[str, Any] = {
        "connect_timeout": connect_timeout,
        "read_timeout": read_timeout,
        "retries": {"max_attempts": max_attempts, "mode": "standard"},
        "max_pool_connections": max_pool_connections,
    }
    if endpoint_url:
        options["s3"] = {"addressing_style": "path"}
    # A session per client: boto3 clients are thread-safe, the default session is not.
    return boto3.session.Session().client("s3", endpoint_url=endpoint_url, region_name=region,
                                          config=Config(**options))


def _code(e: ClientError) -> str:
    error = e.response.get("Error", {})
    status = e.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return str(error.get("Code") or status)


def _lost_race(e: ClientError) -> bool:
    return _code(e) in _LOST_RACE_CODES


class S3Store(BlobStore):
    def __init__(self, bucket: str, prefix: str, client: Any, **kwargs: Any) -> None:
        """kwargs: BlobStore options (metrics, progress, workers)."""
        super().__init__(**kwargs)
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.client = client
        self._bucket_ok = False
        self._transfer = TransferConfig(multipart_threshold=MULTIPART_THRESHOLD,
                                        multipart_chunksize=PART_BYTES, max_concurrency=self.workers)

    @property
    def endpoint(self) -> str:
        return str(self.client.meta.endpoint_url)

    def describe(self) -> str:
        return f"s3://{self.bucket}/{self.prefix} at {self.endpoint}"

    def _key(self, name: str) -> str:
        return f"{self.prefix}/{name}" if self.prefix else name

    def _preflight(self) -> None:
        # One HEAD up front: an object 404 cannot tell a missing bucket from a cache miss.
        if not self._bucket_ok:
            with self._errors(None):
                self.client.head_bucket(Bucket=self.bucket)
            self._bucket_ok = True

    # ---- primitives

    def _put_bytes(self, name: str, data: bytes) -> bool:
        with self._errors(name):
            try:
                self.client.put_object(Bucket=self.bucket, Key=self._key(name), Body=data, IfNoneMatch="*")
            except ClientError as e:
                if _lost_race(e):
                    return False
                raise
        return True

    def _overwrite_bytes(self, name: str, data: bytes) -> None:
        with self._errors(name):
            self.client.put_object(Bucket=self.bucket, Key=self._key(name), Body=data)

    def _replace_bytes(self, name: str, data: bytes, version: str) -> bool:
        with self._errors(name):
            try:
                self.client.put_object(Bucket=self.bucket, Key=self._key(name), Body=data, IfMatch=version)
            except ClientError as e:
                if _lost_race(e) or _code(e) in _MISSING_CODES:  # replaced or purged since we read it
                    return False
                raise
        return True

    def _put_file(self, name: str, src: Path, on_bytes: ByteCallback, overwrite: bool = False) -> bool:
        size = src.stat().st_size
        condition = {} if overwrite else {"IfNoneMatch": "*"}
        with self._errors(name):
            try:
                if size <= MULTIPART_THRESHOLD:
                    with open(src, "rb") as f:
                        self.client.put_object(Bucket=self.bucket, Key=self._key(name), Body=f, **condition)
                    on_bytes(size)
                else:
                    self._put_multipart(self._key(name), src, on_bytes, condition)
            except ClientError as e:
                if _lost_race(e):
                    return False
                raise
        return True

    def _put_multipart(self, key: str, src: Path, on_bytes: ByteCallback, condition: dict[str, str]) -> None:
        # boto3's upload_file cannot send If-None-Match, so the parts are driven here.
        upload_id = self.client.create_multipart_upload(Bucket=self.bucket, Key=key)["UploadId"]
        try:
            parts = []
            with open(src, "rb") as f:
                for number, chunk in zip(count(1), file_chunks(f, PART_BYTES)):
                    r = self.client.upload_part(Bucket=self.bucket, Key=key, UploadId=upload_id,
                                                PartNumber=number, Body=chunk)
                    parts.append({"PartNumber": number, "ETag": r["ETag"]})
                    on_bytes(len(chunk))
            self.client.complete_multipart_upload(Bucket=self.bucket, Key=key, UploadId=upload_id,
                                                  MultipartUpload={"Parts": parts}, **condition)
        except BaseException:
            self._abort(key, upload_id)  # unfinished parts are billed until aborted
            raise

    def _abort(self, key: str, upload_id: str) -> None:
        try:
            self.client.abort_multipart_upload(Bucket=self.bucket, Key=key, UploadId=upload_id)
        except (ClientError, BotoConnectionError, HTTPClientError) as e:
            # Cleanup must not hide the failure that caused it; a lifecycle rule reaps the rest.
            log.warning("could not abort multipart upload of %s: %s", key, e)

    def _get_file(self, name: str, size: int, dest: Path, on_bytes: ByteCallback) -> None:
        with self._errors(name):
            if size > MULTIPART_THRESHOLD:  # ranged GETs in parallel
                self.client.download_file(self.bucket, self._key(name), str(dest), Callback=on_bytes,
                                          Config=self._transfer)
                return
            body = self.client.get_object(Bucket=self.bucket, Key=self._key(name))["Body"]
            with body, open(dest, "wb") as f:
                copy_chunks(body.iter_chunks(1 << 20), f, on_bytes)

    def _get_bytes(self, name: str) -> tuple[bytes, str]:
        with self._errors(name):
            response = self.client.get_object(Bucket=self.bucket, Key=self._key(name))
            with response["Body"] as body:
                return bytes(body.read()), str(response["ETag"])

    def _version(self, name: str) -> str | None:
        with self._errors(name):
            try:
                return str(self.client.head_object(Bucket=self.bucket, Key=self._key(name))["ETag"])
            except ClientError as e:
                if _code(e) in _MISSING_CODES:
                    return None
                raise

    def _list(self, prefix: str) -> list[tuple[str, float]]:
        out = []
        strip = len(self._key(""))
        with self._errors(prefix):
            for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=self._key(prefix)):
                out += [(o["Key"][strip:], o["LastModified"].timestamp()) for o in page.get("Contents", [])]
        return out

    def _delete(self, name: str) -> None:
        with self._errors(name):
            self.client.delete_object(Bucket=self.bucket, Key=self._key(name))

    # ---- errors

    @contextmanager
    def _errors(self, name: str | None) -> Iterator[None]:
        """Translate botocore failures into CacheStoreError subclasses that say what to fix."""
        try:
            yield
        except ClientError as e:
            raise self._client_error(e, name) from e
        except (NoCredentialsError, PartialCredentialsError, CredentialRetrievalError) as e:
            raise StoreUnavailable(
                f"no usable AWS credentials for {self.describe()} ({e}): set AWS_ACCESS_KEY_ID and "
                "AWS_SECRET_ACCESS_KEY, AWS_PROFILE, or attach an instance role") from e
        except (BotoConnectionError, HTTPClientError, RetriesExceededError) as e:
            raise StoreUnavailable(
                f"cannot reach S3 endpoint {self.endpoint} ({e}): check the network and the "
                "endpoint override (--aws-endpoint-url / aws_endpoint_url; unset means AWS S3)") from e

    def _client_error(self, e: ClientError, name: str | None) -> CacheStoreError:
        code = _code(e)
        message = e.response.get("Error", {}).get("Message", "")
        if code == "NoSuchBucket" or (name is None and code in _MISSING_CODES):
            return StoreUnavailable(f"bucket '{self.bucket}' does not exist at endpoint {self.endpoint}: "
                                    "create it or fix the bucket in --cache-store "
                                    "s3://BUCKET/PREFIX (cache_store)")
        if code in _MISSING_CODES:
            return ArtifactNotFound(f"{self._key(name or '')} not found in {self.describe()}")
        if code in _CREDENTIAL_CODES:
            return StoreUnavailable(
                f"credentials refused by {self.endpoint} for bucket '{self.bucket}' ({code} {message}): "
                "check AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or AWS_PROFILE, and that the identity "
                "may s3:GetObject, s3:PutObject and s3:ListBucket on it")
        if code in _REGION_CODES:
            return StoreUnavailable(f"bucket '{self.bucket}' is in another region than the client's "
                                    f"({code} {message}): set --aws-region (aws_region) or "
                                    "AWS_DEFAULT_REGION to the bucket's region")
        status = e.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        if status >= 500:
            return StoreUnavailable(f"S3 endpoint {self.endpoint} failed ({code} {message}); "
                                    "retry later")
        return CacheStoreError(f"S3 request for {self._key(name or '')} in {self.describe()} failed: "
                               f"{code} {message}")
