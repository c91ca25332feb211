#!/usr/bin/env bash
# A 30 s SIGTERM grace with a cache store, after a measured stop: does a stream that needs
# ~ grace - stop - 3 s finish while the drain publishes the compile cache?
#
#     bash bench/grace.sh        # ~2 minutes on 2 cores; writes docs/results/grace.json
#
# The VM recipe's entrypoint (docs/operations.md) in front of a real TorchServe (eager .mar, token
# auth on, the default ports 8080-8082 and 8090 must be free), with a directory cache store and a
# cache dir holding a 64 MiB artifact the store lacks (the worker does not use it: eager .mar, no
# TS_LLM_CACHE_DIR). A first replica's SIGTERM measures the stop and shares it with the fleet
# (<store>/fleet/stop-seconds.json). The second replica starts with no stop record of its own (it
# copies the fleet's) and the artifact gone from the store again, so its drain really uploads,
# beside the wait: its decode speed is measured (a 128-token request after a warm-up), a stream sized to need
# grace - measured stop - 3.5 s is started, and SIGTERM follows 0.5 s later.
set -u
REPO=$(cd "$(dirname "$0")/.." && pwd)
RUN=$(mktemp -d "${TMPDIR:-/tmp}/ts-llm-grace.XXXX")
GRACE=30
source "$REPO/.venv/bin/activate"
STORE="$RUN/model_store"
python -m handler.packing.cli --compile eager --drain-flag-file "$RUN/draining" --model-store "$STORE" > "$RUN/archive.log" 2>&1 \
    || { echo "archive failed: see $RUN/archive.log"; exit 1; }
cd "$RUN"
sed "s|^metrics_config=.*|metrics_config=$REPO/metrics.yaml|" "$REPO/config.properties" > config.properties
CACHE_STORE="$RUN/cache-store"
CACHE_DIR="$RUN/cache/aot"
mkdir -p "$CACHE_DIR"
python -c "
import json
from handler.cache.key import CacheKey
key = CacheKey('bench', 'none', 'cpu', 'grace.sh', 'w' * 16, 'c' * 16, '0')
open('$CACHE_DIR/cache-key.json', 'w').write(json.dumps(key.describe()))"
head -c 64M /dev/urandom > "$CACHE_DIR/artifact.bin"

# $1: the replica; each has a stop record of its own (the second starts without one).
# --publish-after-start false: the artifact reaches the store in the drain, not before it.
start() {
  python -m handler.sidecar.app.entrypoint --listen-port 8090 --signal-grace-s $GRACE \
    --drain-flag-file "$RUN/draining" --stop-record-file "$RUN/stop-seconds-$1.json" \
    --cache-store "$CACHE_STORE" --cache-dir "$CACHE_DIR" --publish-after-start false \
    --report-file "$RUN/drain-report-$1.json" -- \
    torchserve --start --foreground --ncs --model-store "$STORE" --models llm=llm.mar \
    --ts-config config.properties > "$RUN/entry-$1.log" 2>&1 &
  EP=$!
  for _ in $(seq 1 300); do curl -sf localhost:8090/ready > /dev/null && break; sleep 1; done
  KEY=$(python -c "import json; print(json.load(open('$RUN/key_file.json'))['inference']['key'])")
}

start 1
kill -TERM $EP; wait $EP
FLEET="$CACHE_STORE/fleet/stop-seconds.json"
[ -f "$FLEET" ] || { echo "no fleet stop record $FLEET after the first drain: see $RUN/entry-1.log"; exit 1; }
[ -f "$RUN/stop-seconds-2.json" ] && { echo "the second replica must start without a stop record"; exit 1; }
# The store keeps the fleet's record and loses the artifact: the second drain uploads it again.
find "$CACHE_STORE" -mindepth 1 -maxdepth 1 ! -name fleet -exec rm -rf {} +
start 2
ask() {
  curl -s -H "Authorization: Bearer $KEY" -H "Content-Type: application/json" localhost:8080/predictions/llm \
    -d "{\"prompt\": \"Hello\", \"max_new_tokens\": $1, \"ignore_eos\": true}" > /dev/null
}
ask 16  # warm-up: a fresh worker's first request is slower than its decode
T0=$(date +%s.%N)
ask 128
T1=$(date +%s.%N)
read -r RATE STOP TOKENS < <(python -c "
import json
rate = 128 / ($T1 - $T0)
stop = max(json.load(open('$FLEET'))['stop_seconds'])
print(rate, stop, int(rate * ($GRACE - stop - 3.5)))")
( curl -sN -H "Authorization: Bearer $KEY" -H "Content-Type: application/json" localhost:8080/predictions/llm \
    -d "{\"prompt\": \"Hello\", \"max_new_tokens\": $TOKENS, \"ignore_eos\": true, \"stream\": true}" > "$RUN/stream.out"
  date +%s.%N > "$RUN/stream.end" ) &
SP=$!
sleep 0.5
TS=$(date +%s.%N)
kill -TERM $EP
wait $SP
wait $EP
EXIT=$?
python - "$REPO/docs/results/grace.json" <<PY
import json, sys
lines = [l for l in open("$RUN/stream.out").read().splitlines() if l.strip()]
last = json.loads(lines[-1]) if lines else {}
report = json.load(open("$RUN/drain-report-2.json"))
plan = report["plan"]
result = {
    "command": "bash bench/grace.sh", "grace_s": $GRACE, "cache_store": True,
    "measured_stop_s": $STOP, "stop_from": "fleet record (<store>/fleet/stop-seconds.json)",
    "decode_tokens_per_s": round($RATE, 2), "stream_tokens": $TOKENS,
    "stream_finish_reason": last.get("finish_reason"),
    "stream_ended_after_sigterm_s": round(float(open("$RUN/stream.end").read()) - $TS, 2),
    "target_stream_s": round($GRACE - $STOP - 3, 2),
    "stop_reserve_s": plan["policy"]["stop_reserve_s"], "margin_s": plan["policy"]["margin_s"],
    "wait_budget_s": round(plan["wait_until"] - plan["started_epoch"], 2),
    "published": report["published"],
    "publish_seconds": None if report["publish_seconds"] is None else round(report["publish_seconds"], 2),
    "drain_seconds": round(report["drain_seconds"], 2), "drain_exit_code": report["exit_code"],
    "drain_errors": report["errors"],
    "entrypoint_exit_code": $EXIT,
    "steps": {s["name"]: round(s["ended_epoch"] - s["started_epoch"], 2) for s in report["steps"]},
}
open(sys.argv[1], "w").write(json.dumps(result, indent=2) + "\n")
print(json.dumps(result))
PY
