"""Azure Scheduled Events watcher: Preempt events and their acknowledgement."""

from __future__ import annotations

import random
import time

from handler.sidecar.notice.azure import AzureWatcher
from handler.sidecar.notice.termination import NoticeKind, parse_http_date
from handler.testing.metadata_emulator import MetadataEmulator


def watcher(url: str, clock=time.time) -> AzureWatcher:
    return AzureWatcher(url, clock=clock, rng=random.Random(5), sleep=lambda s: None,
                        timeout_s=1.0)


def test_no_events_no_notice(emulator: MetadataEmulator) -> None:
    assert watcher(emulator.url).poll() is None


def test_preempt_becomes_a_notice_with_not_before_deadline(emulator: MetadataEmulator) -> None:
    event_id = emulator.raise_azure_event("Preempt", in_seconds=30)
    notice = watcher(emulator.url).poll()
    event = emulator.state.azure_document()["Events"][0]
    assert notice is not None and notice.kind is NoticeKind.PREEMPTION
    assert notice.detail["event_id"] == event_id
    assert notice.deadline_epoch == parse_http_date(event["NotBefore"])


def test_freeze_is_not_a_termination(emulator: MetadataEmulator) -> None:
    emulator.raise_azure_event("Freeze", in_seconds=900)
    assert watcher(emulator.url).poll() is None


def test_acknowledgement_is_recorded_and_starts_the_event(emulator: MetadataEmulator) -> None:
    emulator.raise_azure_event("Preempt")
    azure = watcher(emulator.url)
    notice = azure.poll()
    azure.acknowledge(notice.detail["event_id"])
    document = emulator.state.azure_document()
    assert emulator.state.acks == [notice.detail["event_id"]]
    assert document["Events"][0]["EventStatus"] == "Started"
    assert document["DocumentIncarnation"] == 3  # one for the event, one for its start


def test_started_event_without_not_before_uses_the_minimum_notice(
        emulator: MetadataEmulator, clock) -> None:
    event_id = emulator.raise_azure_event("Preempt")
    emulator.state.acknowledge([event_id])  # acknowledged elsewhere: NotBefore is now ""
    notice = watcher(emulator.url, clock=clock).poll()
    assert notice.deadline_epoch == clock() + 30.0


def test_each_event_reported_once(emulator: MetadataEmulator) -> None:
    emulator.raise_azure_event("Preempt")
    azure = watcher(emulator.url)
    assert azure.poll() is not None
    assert azure.poll() is None
