"""Resume records in a real store (a directory, and S3 through a moto server): written at a
cut, read anywhere, expired by age (410) and count, 404 when unknown; sealed with the fleet's
secret or keys, so a bucket writer cannot put words in a resumed answer."""
from __future__ import annotations

import json
import time

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from handler.cache.local import LocalStore
from handler.cache.s3 import S3Store
from handler.cache.signing import ManifestSigner, ManifestVerifier, Signing
from handler.engine.sampling import SamplingParams
from handler.resume.ids import new_key
from handler.resume.record import RecordedSample, ResumeRecord
from handler.resume.records import (
    ExpiryPolicy,
    RecordExpired,
    RecordNotFound,
    RecordRefused,
    ResumeRecords,
    StoreFailed,
    record_name,
)
from handler.resume.seal import FleetKeySeal, NoSeal, SecretSeal

VOCAB = 100
FLEET_KEY = Ed25519PrivateKey.generate()
FLEET = Signing(ManifestSigner(FLEET_KEY), ManifestVerifier(FLEET_KEY.public_key()))


def _record(key: str | None = None, cut_at: float | None = None) -> ResumeRecord:
    return ResumeRecord(key or new_key(), "llm", "native", time.time() if cut_at is None else cut_at, (1, 2),
                        (RecordedSample((3,), 1),), SamplingParams(max_new_tokens=8))


@pytest.fixture(params=["local", "s3"])
def make_store(request, tmp_path):
    def make():
        if request.param == "local":
            return LocalStore(tmp_path / "store", progress=False)
        client, bucket = request.getfixturevalue("s3_client"), request.getfixturevalue("bucket")
        return S3Store(bucket, "fleet-a", client, progress=False)
    return make


def test_a_record_written_at_a_cut_is_read_back(make_store):
    records = ResumeRecords(make_store(), NoSeal(), ExpiryPolicy())
    record = _record()
    records.put(record)
    assert records.get(record.key, VOCAB) == record


def test_an_unknown_stream_is_404_and_one_begun_before_the_ttl_is_410(make_store):
    records = ResumeRecords(make_store(), NoSeal(), ExpiryPolicy(ttl_s=60))
    with pytest.raises(RecordNotFound) as err:
        records.get(new_key(), VOCAB)
    assert err.value.status == 404
    with pytest.raises(RecordExpired) as gone:
        records.get(new_key(now=time.time() - 61), VOCAB)  # its record, if any, has expired
    assert gone.value.status == 410


def test_a_record_older_than_the_ttl_is_410_then_pruned(make_store):
    store = make_store()
    records = ResumeRecords(store, NoSeal(), ExpiryPolicy(ttl_s=60))
    record = _record()
    records.put(record)
    later = ResumeRecords(store, records.seal, records.policy, clock=lambda: time.time() + 61)
    with pytest.raises(RecordExpired, match="resume_ttl_s"):
        later.get(record.key, VOCAB)
    assert later.prune() == 1 and store.list_records("resume/") == []


def test_prune_keeps_the_newest_max_records(make_store):
    store = make_store()
    records = ResumeRecords(store, NoSeal(), ExpiryPolicy(max_records=2))
    keys = []
    for _ in range(3):
        keys.append(_record().key)
        records.put(_record(keys[-1]))
        time.sleep(1.05)  # S3's LastModified has whole seconds
    assert records.prune() == 1
    assert sorted(name for name, _ in store.list_records("resume/")) == sorted(record_name(k) for k in keys[1:])


def test_signed_records_verify_and_a_forged_one_is_refused(make_store):
    records = ResumeRecords(make_store(), FleetKeySeal(FLEET), ExpiryPolicy())
    record = _record()
    records.put(record)
    assert records.get(record.key, VOCAB) == record
    forger = Ed25519PrivateKey.generate()  # a bucket writer without the fleet's key
    forged = json.loads(record.encode())
    forged["samples"][0]["output_ids"] = [7]
    records.store.write_record(record_name(record.key), ManifestSigner(forger).sign(json.dumps(forged).encode()))
    with pytest.raises(RecordRefused, match="signature does not verify"):
        records.get(record.key, VOCAB)
    records.store.write_record(record_name(record.key), json.dumps(forged).encode())
    with pytest.raises(RecordRefused, match="unsigned"):
        records.get(record.key, VOCAB)


def test_sealed_records_open_and_an_edited_or_unsealed_one_is_refused(make_store):
    records = ResumeRecords(make_store(), SecretSeal(b"s" * 32), ExpiryPolicy())
    record = _record()
    records.put(record)
    assert records.get(record.key, VOCAB) == record
    stored = records.store.read_record(record_name(record.key))
    records.store.write_record(record_name(record.key), stored.replace(b'"output_ids":[3]', b'"output_ids":[7]'))
    with pytest.raises(RecordRefused, match="edited after it was written"):
        records.get(record.key, VOCAB)
    records.store.write_record(record_name(record.key), record.encode())
    with pytest.raises(RecordRefused, match="not sealed"):
        records.get(record.key, VOCAB)


def test_a_record_stored_under_another_streams_name_is_refused(make_store):
    records = ResumeRecords(make_store(), NoSeal(), ExpiryPolicy())
    record, other = _record(), new_key()
    records.store.write_record(record_name(other), record.encode())
    with pytest.raises(RecordRefused, match="names stream"):
        records.get(other, VOCAB)


def test_a_replica_that_verifies_but_cannot_sign_writes_nothing(make_store):
    records = ResumeRecords(make_store(), FleetKeySeal(Signing(verifier=FLEET.verifier)), ExpiryPolicy())
    assert not records.writable
    with pytest.raises(StoreFailed, match="resume_signing_key"):
        records.put(_record())


def test_an_unreachable_store_is_a_store_failure(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    records = ResumeRecords(LocalStore(blocker, progress=False), NoSeal(), ExpiryPolicy())
    with pytest.raises(StoreFailed) as err:
        records.put(_record())
    assert err.value.status == 503
