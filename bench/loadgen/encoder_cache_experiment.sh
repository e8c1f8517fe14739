#!/usr/bin/env bash
# The encoder cache experiment: the same synthetic workload (one
# image per request, a share of them repeating earlier ones) through a
# launcher stack with the encoder's embedding cache on and off, alternated
# ROUNDS times so that machine noise hits both. Prints every loadgen JSON
# line, then a summary JSON line (last) with the cache hit rate and the
# TTFT p50/p99 and throughput ratios off / on.
#
#   bench/loadgen/encoder_cache_experiment.sh [RATE=20] [N=200] [SIZE=448] [REPEAT=0.5] [ROUNDS=2]
#
# Uses the default configuration's binaries (bazel build them first:
# //deploy/launcher:mmserve_launch //bench/loadgen:loadgen and the services),
# or those under $BIN (for example BIN=$(bazel info --config=opt bazel-bin)).
# The per-run lines (one per cache setting and round, with cache_mb and
# cache_hit_rate) are what tools/plot_load.py --cache plots.
set -euo pipefail
cd "$(dirname "$0")/../.."
rate=${1:-20}
n=${2:-200}
size=${3:-448}
repeat=${4:-0.5}
rounds=${5:-2}
bin=${BIN:-$(bazel info bazel-bin 2>/dev/null)}
out=$(mktemp -d /tmp/mmserve-cache-exp-XXXXXX)

run() {  # cache_mb round -> one JSON line, with the hit rate added
  local cache=$1 round=$2
  "$bin/deploy/launcher/mmserve_launch" --model_dir="$PWD/models/shapes-demo" --encoders=1 \
    --profile=shm --port=50456 --http_port=-1 --log_dir="$out" --restart=false \
    --encoder_flags="--cache_mb=$cache" >"$out/launch.out" 2>"$out/launch.err" &
  local launcher=$!
  for _ in $(seq 1 240); do grep -q '^READY' "$out/launch.out" && break; sleep 0.5; done
  local metrics
  metrics=$(sed -n 's/^  encoder-0 at .*, metrics :\([0-9]*\)$/\1/p' "$out/launch.out")
  "$bin/bench/loadgen/loadgen" --target=router --address=127.0.0.1:50456 --dataset=synthetic \
    --images=1 --image_width="$size" --image_height="$size" --prompt_tokens=32 \
    --output_tokens=16 --repeat_share="$repeat" --num_requests="$n" --request_rate="$rate" \
    --seed=7 --label="cache_mb=$cache round $round" | tail -n 1 >"$out/line.json"
  local hits misses
  hits=$(curl -s "127.0.0.1:$metrics/metrics" | sed -n 's/^mmserve_encoder_cache_hits_total //p')
  misses=$(curl -s "127.0.0.1:$metrics/metrics" | sed -n 's/^mmserve_encoder_cache_misses_total //p')
  kill -TERM "$launcher"
  wait "$launcher" || true
  python3 -c '
import json, sys
j = json.loads(open(sys.argv[1]).read())
h, m = float(sys.argv[2] or 0), float(sys.argv[3] or 0)
j["cache_mb"] = int(sys.argv[4]); j["cache_hit_rate"] = h / max(1.0, h + m)
print(json.dumps(j))' "$out/line.json" "$hits" "$misses" "$cache"
}

for round in $(seq 1 "$rounds"); do
  run 256 "$round"
  run 0 "$round"
done | tee "$out/all.jsonl"
python3 - "$out/all.jsonl" "$rate" "$n" "$size" "$repeat" <<'PY'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
on = [r for r in runs if r["cache_mb"] > 0]
off = [r for r in runs if r["cache_mb"] == 0]
med = lambda rs, k: statistics.median(r[k] for r in rs)
errors = sum(r["requests"] - r["ok"] for r in runs)
print("%-22s %12s %12s %8s" % ("", "cache on", "cache off", "off/on"))
for k, name in (("ttft_p50_ms", "TTFT p50 (ms)"), ("ttft_p99_ms", "TTFT p99 (ms)"),
                ("e2e_p50_ms", "E2E p50 (ms)"), ("request_throughput", "throughput (req/s)")):
    print("%-22s %12.2f %12.2f %8.3f" % (name, med(on, k), med(off, k), med(off, k) / med(on, k)))
print("cache hit rate: on %.3f, off %.3f; errors %d" % (med(on, "cache_hit_rate"),
                                                         med(off, "cache_hit_rate"), errors))
print(json.dumps({"bench": "encoder_cache_experiment", "rate": float(sys.argv[2]),
                  "requests": int(sys.argv[3]), "image_size": int(sys.argv[4]),
                  "repeat_share": float(sys.argv[5]), "rounds": len(on),
                  "hit_rate_on": med(on, "cache_hit_rate"),
                  "ttft_p50_ratio": med(off, "ttft_p50_ms") / med(on, "ttft_p50_ms"),
                  "ttft_p99_ratio": med(off, "ttft_p99_ms") / med(on, "ttft_p99_ms"),
                  "throughput_ratio": med(off, "request_throughput") / med(on, "request_throughput"),
                  "errors": errors}))
PY
rm -rf "$out"
