"""Phase 3's checks of the resume capability, on the survivor, in the deployment's configuration
(records sealed with the fleet's resume secret, handler.resume.seal):

- an edited record: one cut stream's record in the shared store with a token id changed (its seal
  kept); resuming it must be refused, not stream different text;
- the public id: an OpenAI stream's chunk `id` must not hold the resume key its events' `id:` carry
  (whoever logs ids must not be able to resume, or replay, the answer).
"""
from __future__ import annotations

import json
from pathlib import Path

import requests

RECORDS = "resume"  # handler.resume.records: <store>/resume/<key>.json


def edited_record_accepted(store: Path, url: str) -> dict[str, object]:
    """Edit the first native stream's record's first generated token, then resume its stream from the start."""
    records = [(path, *path.read_bytes().partition(b"\n")[::2]) for path in sorted((store / RECORDS).glob("*.json"))]
    native = [(path, seal, json.loads(body)) for path, seal, body in records if b'"api":"native"' in body]
    if not native:
        return {"checked": False, "why": "no native stream's record in the store: none was cut"}
    path, seal, record = native[0]
    ids = record["samples"][0]["output_ids"]
    ids[0] = ids[0] + 1 if ids[0] < 100 else 1
    path.write_bytes(seal + b"\n" + json.dumps(record, separators=(",", ":")).encode())
    with requests.post(url, json={"resume": f"{path.stem}.0"}, stream=True, timeout=(5.0, 120.0)) as response:
        text = response.text
    return {"checked": True, "accepted": int(response.status_code == 200), "status": response.status_code,
            "answer": text[:200]}


def resume_token_in_public_id(url: str) -> dict[str, object]:
    """One streamed chat completion: its events' resume ids against its chunks' `id`."""
    body = json.dumps({"model": "llm", "messages": [{"role": "user", "content": "Name three colours."}],
                       "max_tokens": 8, "stream": True})
    keys, public = set(), set()
    with requests.post(url, data=body, headers={"Content-Type": "application/json"}, stream=True,
                       timeout=(5.0, 120.0)) as response:
        response.raise_for_status()
        for raw in response.iter_lines():
            line = raw.decode()
            if line.startswith("id: "):
                keys.add(line[4:].split(".", 1)[0])
            elif line.startswith("data: {"):
                public.add(json.loads(line[6:])["id"])
    if not keys:
        raise AssertionError("the stream's events carry no resume id: the replica has no resume store")
    return {"in_public_id": any(key in chunk_id for key in keys for chunk_id in public),
            "public_ids": sorted(public)[:2], "key_chars": len(next(iter(keys)))}
