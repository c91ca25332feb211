"""The moto S3 server of the cache tests, for the records' S3 store."""
from tests.cache.conftest import bucket, moto_server, s3_client  # noqa: F401 - fixtures
