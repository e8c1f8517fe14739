#!/usr/bin/env bash
# The multi-turn routing experiment: the same conversations (K turns over
# the same image, think time between turns) through a P/D stack of two
# prefill instances and one decode instance, placed by load alone
# (router --prefix_weight=0 --skip_cached_images=false) and cache-aware (the
# defaults: a later turn's picture goes to no encoder while the instance
# placed on holds its KV), on the same cores, alternated ROUNDS times so
# that machine noise hits both.
# Per run: encoder work per request (Encode calls and images the encoder
# computed, from its metrics), the share of images placed on an instance
# holding their KV (the router's mmserve_router_media_placed_total),
# prompt tokens the prefill
# instances computed per request (mmserve_language_prompt_tokens_total), TTFT
# p50/p99 of the turns after the first, and goodput under the SLO. Prints
# every loadgen JSON line with those added, then a summary JSON line (last)
# with the ratios cache-aware / load-only: encoder_work_ratio (Encode calls
# per request; lowered by the later turns whose picture went to no
# encoder, at most media_on_held_kv_share, the cache-aware share of images
# placed on an instance holding their KV), prefill_tokens_ratio,
# ttft_p50_ratio_later_turns, ttft_p99_ratio_later_turns, goodput_ratio.
#
#   bench/loadgen/routing_experiment.sh [CONVERSATIONS=16] [TURNS=4] [THINK_S=0.5] [RATE=2] [ROUNDS=1]
#
# TOPOLOGY=both runs one role-both instance instead: placement has no
# choice there, so the ratios are the encoder skip's alone. Each JSON line
# has encoder_skipped_per_request and skip_fallbacks_per_request (the
# router's mmserve_router_encoder_skip*_total).
#
# Uses the default configuration's binaries (bazel build them first:
# //deploy/launcher:mmserve_launch //bench/loadgen:loadgen and the services),
# or those under $BIN. SLO: $SLO_TTFT_MS (default 500) and $SLO_TPOT_MS
# (default 100).
set -euo pipefail
cd "$(dirname "$0")/../.."
conversations=${1:-16}
turns=${2:-4}
think=${3:-0.5}
rate=${4:-2}
rounds=${5:-1}
bin=${BIN:-$(bazel info bazel-bin 2>/dev/null)}
out=$(mktemp -d /tmp/mmserve-routing-exp-XXXXXX)
source bench/loadgen/stack_lib.sh

metric() {  # port name -> the sum of the family's samples
  curl -s "127.0.0.1:$1/metrics" |
    awk -v m="$2" '$1 == m || index($1, m "{") == 1 { s += $2 } END { print s + 0 }'
}

run() {  # weight round -> one JSON line, with the encoder's work added
  local weight=$1 round=$2
  # Load only: no repeat-turn encoder skip either.
  local skip=true topology=(--prefill=2 --decode=1)
  [[ "$weight" == 0 ]] && skip=false
  [[ "${TOPOLOGY:-pd}" == both ]] && topology=()
  stack_start "prefix_weight=$weight" "${topology[@]}" \
    --router_flags="--prefix_weight=$weight,--skip_cached_images=$skip"
  local enc router prefills
  enc=$(sed -n 's/^  encoder-0 at .*, metrics :\([0-9]*\)$/\1/p' "$out/launch.out")
  router=$(sed -n 's/^  router metrics :\([0-9]*\)$/\1/p' "$out/launch.out")
  prefills=$(sed -n 's/^  \(prefill\|language\)-[0-9]* at .*, metrics :\([0-9]*\)$/\2/p' \
    "$out/launch.out")
  "$bin/bench/loadgen/loadgen" --target=router --address="$address" --dataset=synthetic \
    --images=1 --image_width=448 --image_height=448 --prompt_tokens=32 --output_tokens=16 \
    --turns="$turns" --think_time_s="$think" --num_requests=$((conversations * turns)) \
    --request_rate="$rate" --warmup=1 --seed=11 --slo_ttft_ms="${SLO_TTFT_MS:-500}" \
    --slo_tpot_ms="${SLO_TPOT_MS:-100}" --label="prefix_weight=$weight round $round" |
    tail -n 1 >"$out/line.json"
  local calls hits misses held not_held computed=0 p skipped fallbacks
  held=$(curl -s "127.0.0.1:$router/metrics" |
    sed -n 's/^mmserve_router_media_placed_total{kv="held"} //p')
  not_held=$(curl -s "127.0.0.1:$router/metrics" |
    sed -n 's/^mmserve_router_media_placed_total{kv="not_held"} //p')
  for p in $prefills; do
    computed=$(python3 -c 'import sys; print(float(sys.argv[1]) + float(sys.argv[2] or 0))' \
      "$computed" "$(curl -s "127.0.0.1:$p/metrics" |
        sed -n 's/^mmserve_language_prompt_tokens_total{kv="computed"} //p')")
  done
  skipped=$(metric "$router" mmserve_router_encoder_skipped_total)
  fallbacks=$(metric "$router" mmserve_router_encoder_skip_fallbacks_total)
  calls=$(metric "$enc" mmserve_encoder_requests_total)
  hits=$(metric "$enc" mmserve_encoder_cache_hits_total)
  misses=$(metric "$enc" mmserve_encoder_cache_misses_total)
  stack_stop
  python3 -c '
import json, sys
j = json.loads(open(sys.argv[1]).read())
calls, hits, misses = (float(x) for x in sys.argv[2:5])
n = max(1, j["requests"] + int(sys.argv[6]))  # the warm-up conversation too
j["prefix_weight"] = float(sys.argv[5])
j["encoder_calls_per_request"] = calls / n
j["encoder_images_computed_per_request"] = misses / n
j["encoder_images_per_request"] = (hits + misses) / n
j["media_on_held_kv_share"] = float(sys.argv[7] or 0) / max(1.0, float(sys.argv[7] or 0) + float(sys.argv[8] or 0))
j["prefill_tokens_per_request"] = float(sys.argv[9]) / n
j["encoder_skipped_per_request"] = float(sys.argv[10]) / n
j["skip_fallbacks_per_request"] = float(sys.argv[11]) / n
print(json.dumps(j))' "$out/line.json" "$calls" "$hits" "$misses" "$weight" "$turns" "$held" \
    "$not_held" "$computed" "$skipped" "$fallbacks"
}

for round in $(seq 1 "$rounds"); do
  run 0 "$round"
  run 1 "$round"
done | tee "$out/all.jsonl"
python3 - "$out/all.jsonl" <<'PY'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
aware = [r for r in runs if r["prefix_weight"] > 0]
load = [r for r in runs if r["prefix_weight"] == 0]
med = lambda rs, k: statistics.median(r[k] for r in rs)
ratio = lambda k: med(aware, k) / med(load, k) if med(load, k) else float("nan")
errors = sum(r["requests"] - r["ok"] for r in runs)
rows = (("encoder_calls_per_request", "Encode calls / request"),
        ("media_on_held_kv_share", "images on a holder of KV"),
        ("encoder_images_computed_per_request", "images computed / request"),
        ("prefill_tokens_per_request", "prefill tokens / request"),
        ("later_ttft_p50_ms", "TTFT p50, later turns"),
        ("later_ttft_p99_ms", "TTFT p99, later turns"),
        ("goodput", "goodput (req/s)"))
print("%-28s %12s %12s %8s" % ("", "load only", "cache-aware", "ratio"))
for k, name in rows:
    print("%-28s %12.3f %12.3f %8.3f" % (name, med(load, k), med(aware, k), ratio(k)))
print(json.dumps({"bench": "routing_experiment", "conversations": runs[0]["requests"] // runs[0]["turns"],
                  "turns": runs[0]["turns"], "think_time_s": runs[0]["think_time_s"],
                  "rounds": len(aware), "errors": errors,
                  "encoder_skipped_per_request": med(aware, "encoder_skipped_per_request"),
                  "skip_fallbacks_per_request": med(aware, "skip_fallbacks_per_request"),
                  "media_on_held_kv_share": med(aware, "media_on_held_kv_share"),
                  "encoder_work_ratio": ratio("encoder_calls_per_request"),
                  "prefill_tokens_ratio": ratio("prefill_tokens_per_request"),
                  "ttft_p50_ratio_later_turns": ratio("later_ttft_p50_ms"),
                  "ttft_p99_ratio_later_turns": ratio("later_ttft_p99_ms"),
                  "goodput_ratio": ratio("goodput")}))
PY
