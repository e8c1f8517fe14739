#!/usr/bin/env bash
# The elastic sequence parallelism experiment: on the same
# machine (its two cores) four configurations of the language side, each
# behind one router and one (idle) encoder, text-only requests:
#
#   elastic    2 language --role=elastic x 1 thread under router --esp;
#   static_dp  the same 2 instances x 1 thread with router --esp=false (the
#              router routes them as role both: static data parallel);
#   pd         1 prefill + 1 decode instance, 1 thread each;
#   single_2t  1 role-both instance with 2 threads.
#
# Every 1-thread instance gets the same KV pool (KV_MB, default 3 MiB: 2048
# token slots of the demo model, standing in for GPU memory pressure); the
# 2-thread instance gets the sum. Steps:
#
# 1. Probe: on a fresh stack per configuration, one request at a time with
#    prompts of increasing words (doubling, then bisection to PROBE_STEP
#    words) until refused: the longest prompt each configuration serves.
# 2. Load: a length-variance mix (loadgen --prompt_tokens_mix: a third each
#    SHORT words, LONG/4 and LONG words, LONG = 0.9 x the static data
#    parallel probe, near one instance's pool), Poisson arrivals at RATES;
#    at each rate the configurations alternate ROUNDS times, the order
#    reversed every other round, each run on a fresh stack from the launcher
#    on ports it picks (--port=0). Each JSON line carries the load average.
# 3. bench:esp_bench (Qwen2-0.5B dims): a long prompt's TTFT at degree 2
#    against degree 1, the decode step spread over 2 against one instance's,
#    and the machine's parallel ceiling (ESP_BENCH_FLAGS).
#
# After each load run, before its stack stops, every service's /metrics
# gives mmserve_language_kv_bytes_moved_total (by kind: esp_prefill,
# esp_decode, handoff; sent and received): the run's JSON line carries the
# sums as "kv_bytes_moved" (the 2 warm-up requests included).
# ESP_STEP_MODELS=FILE: the elastic configuration's router gets
# --esp_step_models=FILE (per-degree step-time models fitted by
# bench:esp_profile for the model served, docs/elastic.md); without it the
# router's default models (no degree faster than one instance).
#
# Prints every JSON line (loadgen runs with "config", "rate", "round" and
# "loadavg" added; probe lines; the esp_bench line), then a summary JSON
# line (last): longest_prompt_ratio (elastic over one instance),
# goodput_vs_best_static (elastic's peak goodput over the better of static
# data parallel's and P/D's), ttft_dop2_vs_dop1, decode_step_spread_ratio,
# parallel_ceiling, kv_bytes_moved (per configuration: bytes sent per
# request, by kind), and the raw figures per configuration.
#
#   bench/loadgen/esp_experiment.sh [RATES="1 2 4"] [N=30] [ROUNDS=2]
#
# SLO: TTFT <= max(SLO_TTFT_MS (300), SLO_TTFT_PER_TOKEN_MS (0.5) x prompt
# words) and TPOT <= SLO_TPOT_MS (50). OUTPUT tokens per request (16).
# Binaries: the default configuration's (bazel build
# //deploy/launcher:mmserve_launch //bench/loadgen:loadgen //router:router
# //language_service:language //encoder_service:encoder) or those under
# $BIN; esp_bench from $ESP_BENCH (default: bazel build -c opt
# //bench:esp_bench). tools/plot_load.py --esp plots the output.
set -euo pipefail
step_models=${ESP_STEP_MODELS:-}
[[ -z "$step_models" || "$step_models" == /* ]] || step_models="$PWD/$step_models"
cd "$(dirname "$0")/../.."
rates=${1:-"1 2 4"}
n=${2:-30}
rounds=${3:-2}
kv_mb=${KV_MB:-3}
short=${SHORT:-32}
output=${OUTPUT:-16}
probe_step=${PROBE_STEP:-32}
slo_ttft=${SLO_TTFT_MS:-300}
slo_ttft_tok=${SLO_TTFT_PER_TOKEN_MS:-0.5}
slo_tpot=${SLO_TPOT_MS:-50}
esp_flags=${ESP_BENCH_FLAGS:-"--prompt=1024 --layers=4 --rounds=3"}
bin=${BIN:-$(bazel info bazel-bin 2>/dev/null)}
out=$(mktemp -d /tmp/mmserve-esp-exp-XXXXXX)
# shellcheck source=bench/loadgen/stack_lib.sh
source bench/loadgen/stack_lib.sh

start() {  # config -> $launcher, the router's address in $address, metrics ports in $ports
  local config=$1 args=() lang="--threads=1,--kv_cache_mb=$kv_mb"
  case "$config" in
    elastic) args=(--elastic=2 ${step_models:+--esp_step_models="$step_models"}) ;;
    static_dp) args=(--elastic=2 --router_flags=--esp=false) ;;
    pd) args=(--prefill=1 --decode=1) ;;
    single_2t) lang="--threads=2,--kv_cache_mb=$((2 * kv_mb))" ;;
    *) echo "esp_experiment.sh: unknown config $config" >&2; exit 2 ;;
  esac
  stack_start "$config" "${args[@]}" --language_flags="$lang"
}

loadavg() { cut -d' ' -f1 /proc/loadavg; }

kv_moved() {  # $ports -> {"kind": {"sent": B, "received": B}} summed over the services
  python3 - "$ports" <<'PY'
import json, re, sys, urllib.request
tot = {k: {"sent": 0.0, "received": 0.0} for k in ("esp_prefill", "esp_decode", "handoff")}
for port in filter(None, sys.argv[1].split(",")):
    try:
        body = urllib.request.urlopen("http://127.0.0.1:%s/metrics" % port, timeout=5).read()
    except OSError:
        continue
    for m in re.finditer(r"^mmserve_language_kv_bytes_moved_total\{([^}]*)\} (\S+)$",
                         body.decode(), re.M):
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
        tot.setdefault(labels["kind"], {"sent": 0.0, "received": 0.0})[labels["dir"]] += float(
            m.group(2))
print(json.dumps(tot))
PY
}

served() {  # words -> 0 when one request of that many prompt words is served
  "$bin/bench/loadgen/loadgen" --target=router --address="$address" --dataset=synthetic \
    --images=0 --prompt_tokens="$1" --output_tokens=4 --num_requests=1 --timeout_s=120 \
    --label=probe 2>/dev/null | tail -n 1 | python3 -c '
import json, sys
sys.exit(0 if json.loads(sys.stdin.read()).get("ok") == 1 else 1)'
}

probe() {  # config -> one JSON line {"probe": config, "longest_words": N}
  local config=$1 lo=0 hi=0 w=128
  start "$config"
  while served "$w"; do lo=$w; w=$((w * 2)); ((w <= 16384)) || break; done
  hi=$w
  while ((hi - lo > probe_step)); do
    local mid=$(((lo + hi) / 2))
    if served "$mid"; then lo=$mid; else hi=$mid; fi
  done
  stack_stop
  echo "{\"probe\": \"$config\", \"longest_words\": $lo, \"refused_words\": $hi, \"loadavg\": $(loadavg)}"
}

run() {  # config rate round -> one JSON line
  local config=$1 rate=$2 round=$3 before
  start "$config"
  before=$(loadavg)
  "$bin/bench/loadgen/loadgen" --target=router --address="$address" --dataset=synthetic \
    --images=0 --prompt_tokens_mix="$mix" --output_tokens="$output" --num_requests="$n" \
    --request_rate="$rate" --seed="$round" --warmup=2 --timeout_s=120 \
    --slo_ttft_ms="$slo_ttft" --slo_ttft_ms_per_prompt_token="$slo_ttft_tok" \
    --slo_tpot_ms="$slo_tpot" --leak_ports="$ports" --label="$config" | tail -n 1 >"$out/line.json"
  kv_moved >"$out/kv.json"
  stack_stop
  python3 -c '
import json, sys
j = json.loads(open(sys.argv[1]).read())
j["config"], j["round"] = sys.argv[2], int(sys.argv[3])
j["loadavg"] = [float(sys.argv[4]), float(open("/proc/loadavg").read().split()[0])]
j["kv_mb_per_instance"] = int(sys.argv[5])
j["kv_bytes_moved"] = json.loads(open(sys.argv[6]).read())
print(json.dumps(j))' "$out/line.json" "$config" "$round" "$before" "$kv_mb" "$out/kv.json"
}

configs="elastic static_dp pd single_2t"
{
  for config in $configs; do probe "$config"; done
} | tee "$out/probe.jsonl"
long=$(python3 -c '
import json, sys
p = {j["probe"]: j["longest_words"] for j in map(json.loads, open(sys.argv[1]))}
print(int(0.9 * p["static_dp"]))' "$out/probe.jsonl")
mix="$short,$((long / 4)),$long"
echo "{\"mix_words\": [$mix]}"

for rate in $rates; do
  for round in $(seq 1 "$rounds"); do
    if ((round % 2)); then order=$configs; else order=$(echo "$configs" | tr ' ' '\n' | tac | paste -sd' ' -); fi
    for config in $order; do run "$config" "$rate" "$round"; done
  done
done | tee "$out/runs.jsonl"

esp_bench=${ESP_BENCH:-}
if [[ -z "$esp_bench" ]]; then
  bazel build -c opt //bench:esp_bench >/dev/null 2>&1
  esp_bench="$(bazel info -c opt bazel-bin 2>/dev/null)/bench/esp_bench"
fi
# shellcheck disable=SC2086
"$esp_bench" $esp_flags | tail -n 1 | python3 -c '
import json, sys
j = json.loads(sys.stdin.read())
j["bench"] = "esp_bench"
j["loadavg"] = float(open("/proc/loadavg").read().split()[0])
print(json.dumps(j))' | tee "$out/esp_bench.jsonl"

python3 - "$out" "$n" "$kv_mb" "$mix" "${step_models:-default}" <<'PY'
import collections, json, statistics, sys
d = sys.argv[1]
WARMUP = 2  # loadgen --warmup: their bytes are in the counters too
probes = {j["probe"]: j["longest_words"] for j in map(json.loads, open(d + "/probe.jsonl"))}
runs = [json.loads(l) for l in open(d + "/runs.jsonl") if l.startswith("{")]
esp = json.loads(open(d + "/esp_bench.jsonl").read().strip().splitlines()[-1])
by = collections.defaultdict(list)
for r in runs:
    by[(r["config"], r["request_rate"])].append(r)
rates = sorted({r["request_rate"] for r in runs})
configs = ["elastic", "static_dp", "pd", "single_2t"]
def sent(r):  # a run's KV bytes sent, every kind
    return sum(k["sent"] for k in r.get("kv_bytes_moved", {}).values())
print("%-6s %-10s %18s %10s %12s %12s %8s %10s" % ("rate", "config", "goodput (min-max)",
                                                   "attain", "TTFT p99", "TPOT p99", "errors",
                                                   "KV MB/run"))
per = {c: {"longest_prompt_words": probes[c], "points": []} for c in configs}
for rate in rates:
    for c in configs:
        rs = by[(c, rate)]
        if not rs:
            continue
        med = lambda k: statistics.median(r[k] for r in rs)
        g = [r["goodput"] for r in rs]
        errors = sum(r["requests"] - r["ok"] for r in rs)
        kv = statistics.median(sent(r) for r in rs)
        print("%-6g %-10s %8.2f (%.2f-%.2f) %10.2f %9.0f ms %9.1f ms %8d %10.1f" % (
            rate, c, med("goodput"), min(g), max(g), med("slo_attainment"), med("ttft_p99_ms"),
            med("tpot_p99_ms"), errors, kv / 1e6))
        per[c]["points"].append({
            "rate": rate, "goodput": med("goodput"), "goodput_min": min(g), "goodput_max": max(g),
            "slo_attainment": med("slo_attainment"), "ttft_p99_ms": med("ttft_p99_ms"),
            "tpot_p99_ms": med("tpot_p99_ms"), "errors": errors,
            "leaked": sum(r.get("leaked", 0) for r in rs), "kv_bytes_sent_per_run": kv,
            "loadavg": [r["loadavg"] for r in rs]})
for c in configs:
    pts = per[c]["points"]
    ok = [p["rate"] for p in pts if p["slo_attainment"] >= 0.9]
    per[c]["max_rate_at_90pct_slo"] = max(ok) if ok else None
    per[c]["peak_goodput"] = max((p["goodput"] for p in pts), default=0)
best_static = max(per["static_dp"]["peak_goodput"], per["pd"]["peak_goodput"])
# KV bytes moved per request (sent; every byte sent was received elsewhere),
# by kind, over all of a configuration's load runs.
moved = {}
for c in configs:
    rs = [r for r in runs if r["config"] == c]
    reqs = sum(r["requests"] + WARMUP for r in rs)
    kinds = collections.Counter()
    for r in rs:
        for k, v in r.get("kv_bytes_moved", {}).items():
            kinds[k] += v["sent"]
    moved[c] = {"per_request": sum(kinds.values()) / reqs if reqs else None,
                "per_request_by_kind": {k: v / reqs for k, v in kinds.items()} if reqs else None}
print("KV bytes moved per request: " + ", ".join(
    "%s %.0f" % (c, moved[c]["per_request"] or 0) for c in configs))
loads = [x for r in runs for x in r["loadavg"]]
summary = {
    "bench": "esp_experiment", "date": "2026-11-26", "requests": int(sys.argv[2]),
    "kv_mb_per_instance": int(sys.argv[3]), "mix_words": [int(x) for x in sys.argv[4].split(",")],
    "longest_prompt_ratio": probes["elastic"] / probes["static_dp"] if probes["static_dp"] else None,
    "goodput_vs_best_static": per["elastic"]["peak_goodput"] / best_static if best_static else None,
    "ttft_dop2_vs_dop1": esp["ttft_dop2_vs_dop1"],
    "decode_step_spread_ratio": esp["decode_step_spread_ratio"],
    "parallel_ceiling": esp["parallel_ceiling"],
    "kv_bytes_moved": moved, "esp_step_models": sys.argv[5],
    "loadavg_min_max": [min(loads), max(loads)] if loads else None,
    "configs": per, "esp_bench": esp,
}
print(json.dumps(summary))
PY
