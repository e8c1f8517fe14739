#!/usr/bin/env bash
# The disaggregated-against-colocated experiment: on the same
# machine (its two cores) and at the same offered load, E + language(role
# both) against E + P + D (one prefill and one decode instance), goodput
# under one SLO on TTFT and TPOT, for a text-heavy or an image-heavy mix at
# a few offered rates. At each rate the two configurations alternate ROUNDS
# times, the order flipping every round, so that machine noise hits both;
# every run gets a fresh stack from the launcher on ports it picks at run
# time (--port=0, no fixed port). Prints every loadgen JSON line (with
# "config", "mix" and "round" added), then a summary JSON line (last) with
# the median goodput of each configuration at each rate and its min-max.
#
#   bench/loadgen/disagg_experiment.sh MIX [RATES="4 8 16 32"] [N=160] [ROUNDS=2]
#
#   MIX text:  text-only requests, 256 prompt words, 32 tokens (EOS ignored);
#   MIX image: 4 images of 224x224 (fresh ones), 16 prompt words, 32 tokens.
#
# SLO: SLO_TTFT_MS (default 300) and SLO_TPOT_MS (default 20). The compute
# threads per language process: COLOC_THREADS (default 2, the machine's
# cores) for role both, PD_THREADS (default 1: one core's worth each) for
# prefill and decode. Uses the default configuration's binaries (bazel build
# //deploy/launcher:mmserve_launch //bench/loadgen:loadgen and the services
# first), or those under $BIN (for example BIN=$(bazel info --config=opt
# bazel-bin)). tools/plot_load.py --disagg plots the lines.
set -euo pipefail
cd "$(dirname "$0")/../.."
mix=${1:?usage: disagg_experiment.sh text|image [RATES] [N] [ROUNDS]}
rates=${2:-"4 8 16 32"}
n=${3:-160}
rounds=${4:-2}
slo_ttft=${SLO_TTFT_MS:-300}
slo_tpot=${SLO_TPOT_MS:-20}
coloc_threads=${COLOC_THREADS:-2}
pd_threads=${PD_THREADS:-1}
bin=${BIN:-$(bazel info bazel-bin 2>/dev/null)}
case "$mix" in
  text) shape=(--images=0 --prompt_tokens=256 --output_tokens=32) ;;
  image) shape=(--images=4 --image_width=224 --image_height=224 --prompt_tokens=16
                --output_tokens=32 --repeat_share=0) ;;
  *) echo "disagg_experiment.sh: MIX must be text or image, not $mix" >&2; exit 2 ;;
esac
out=$(mktemp -d /tmp/mmserve-disagg-exp-XXXXXX)
# shellcheck source=bench/loadgen/stack_lib.sh
source bench/loadgen/stack_lib.sh

run() {  # config rate round -> one JSON line
  local config=$1 rate=$2 round=$3 roles=() threads=$coloc_threads address ports
  if [[ "$config" == disaggregated ]]; then roles=(--prefill=1 --decode=1); threads=$pd_threads; fi
  stack_start "$config" "${roles[@]}" --language_flags="--threads=$threads"
  "$bin/bench/loadgen/loadgen" --target=router --address="$address" --dataset=synthetic \
    "${shape[@]}" --num_requests="$n" --request_rate="$rate" --seed="$round" --warmup=4 \
    --slo_ttft_ms="$slo_ttft" --slo_tpot_ms="$slo_tpot" --leak_ports="$ports" \
    --label="$config" | tail -n 1 >"$out/line.json"
  stack_stop
  python3 -c '
import json, sys
j = json.loads(open(sys.argv[1]).read())
j["config"], j["mix"], j["round"] = sys.argv[2], sys.argv[3], int(sys.argv[4])
j["threads_per_language"] = int(sys.argv[5])
print(json.dumps(j))' "$out/line.json" "$config" "$mix" "$round" "$threads"
}

for rate in $rates; do
  for round in $(seq 1 "$rounds"); do
    if (( round % 2 )); then order="colocated disaggregated"; else order="disaggregated colocated"; fi
    for config in $order; do run "$config" "$rate" "$round"; done
  done
done | tee "$out/all.jsonl"
python3 - "$out/all.jsonl" "$mix" "$n" "$slo_ttft" "$slo_tpot" <<'PY'
import collections, json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
by = collections.defaultdict(list)
for r in runs:
    by[(r["config"], r["request_rate"])].append(r)
rates = sorted({r["request_rate"] for r in runs})
print("%-8s %-14s %18s %14s %14s %14s" % ("rate", "config", "goodput (min-max)", "TTFT p50",
                                           "TTFT p99", "TPOT p99"))
summary = {"bench": "disagg_experiment", "mix": sys.argv[2], "requests": int(sys.argv[3]),
           "slo_ttft_ms": float(sys.argv[4]), "slo_tpot_ms": float(sys.argv[5]), "points": []}
for rate in rates:
    point = {"rate": rate}
    for config in ("colocated", "disaggregated"):
        rs = by[(config, rate)]
        med = lambda k: statistics.median(r[k] for r in rs)
        g = [r["goodput"] for r in rs]
        print("%-8g %-14s %8.2f (%.2f-%.2f) %11.1f ms %11.1f ms %11.1f ms" % (
            rate, config, med("goodput"), min(g), max(g), med("ttft_p50_ms"), med("ttft_p99_ms"),
            med("tpot_p99_ms")))
        point[config] = {"goodput": med("goodput"), "goodput_min": min(g), "goodput_max": max(g),
                         "ttft_p99_ms": med("ttft_p99_ms"), "tpot_p99_ms": med("tpot_p99_ms"),
                         "errors": sum(r["requests"] - r["ok"] for r in rs),
                         "leaked": sum(r.get("leaked", 0) for r in rs)}
    # disaggregated / colocated; null when colocated has no goodput at all.
    c = point["colocated"]["goodput"]
    point["goodput_ratio"] = point["disaggregated"]["goodput"] / c if c > 0 else None
    summary["points"].append(point)
print(json.dumps(summary))
PY
