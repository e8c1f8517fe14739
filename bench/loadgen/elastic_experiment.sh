#!/usr/bin/env bash
# The elastic sequence parallelism experiment, in the regime elastic
# instances exist for: a model whose compute dominates the serving overheads
# (Qwen2-0.5B's width: hidden 896, 14 heads, 2 KV heads, intermediate 4864;
# LAYERS decoder layers, default 2; a VOCAB of 2048, enough for the demo
# tokenizer; random bf16 weights from tools/make_random_qwen2.py, or
# MODEL_DIR), KV pools smaller than the longest prompts, a length-variance
# mix and rates found by a probe. Four configurations of the language side,
# each behind one router and one (idle) encoder, text-only requests:
#
#   elastic    2 language --role=elastic x 1 thread under router --elastic, with
#              step-time models fitted at start-up (step 2);
#   static_dp  the same 2 instances x 1 thread with router --elastic=false (the
#              router routes them as role both: static data parallel);
#   pd         1 prefill + 1 decode instance, 1 thread each;
#   single_2t  1 role-both instance with 2 threads and the summed pool.
#
# Steps, each recorded as JSON lines:
#
# 1. bench:elastic_bench at the same dimensions (first, with no stack up): the
#    machine's parallel ceiling (two independent one-thread jobs' throughput
#    against one's), a prompt's TTFT at degree 2 against 1, the decode step
#    spread over 2 against one instance's. Its unloaded times set the SLO:
#    TTFT <= SLO_SCALE (5) x the degree-1 prefill time per prompt word, TPOT
#    <= SLO_SCALE x one instance's decode step (SLO_TTFT_PER_TOKEN_MS and
#    SLO_TPOT_MS override).
# 2. bench:elastic_profile on the served model: per-degree step-time models for
#    the elastic router (--elastic_step_models; ELASTIC_STEP_MODELS=FILE skips it).
# 3. Probe: on a fresh stack per configuration, one request at a time with
#    prompts of increasing words (doubling, then bisection to PROBE_STEP
#    words) until refused: the longest prompt each configuration serves.
# 4. The mix (loadgen --prompt_tokens_mix, entries drawn uniformly;
#    MIX_COUNTS "10 6 3 1" copies of each): SHORT words, FIT/4, FIT (0.9 x
#    one instance's longest) and OVER (0.8 x elastic's longest, past one
#    instance's pool: static data parallel and P/D refuse it).
# 5. Rate probe: Poisson rates from RATE0 doubling until the better static
#    configuration (static_dp, pd) falls below 90% SLO attainment: the knee.
# 6. Load: at knee x RATE_FACTORS ("0.5 1 2"), the four configurations
#    alternate ROUNDS times, the order reversed every other round, each run
#    on a fresh stack (ports picked by the launcher, --port=0).
#
# After each load run every service's /metrics gives
# mmserve_language_kv_bytes_moved_total (by kind: elastic_prefill, elastic_decode,
# handoff; sent and received), summed into the run's "kv_bytes_moved".
#
# Prints every JSON line (load runs with "config", "round", "loadavg";
# rate-probe runs with "rate_probe"; "probe" lines; the elastic_bench and
# elastic_profile lines), a table, then a summary JSON line (last):
# longest_prompt_ratio, goodput_vs_best_static, ttft_dop2_vs_dop1,
# decode_step_spread_ratio, parallel_ceiling, kv_bytes_moved, the run's
# dates and load averages at start and end, and the figures per
# configuration. tools/plot_load.py --elastic plots it.
#
#   bench/loadgen/elastic_experiment.sh [--quick] [N=40] [ROUNDS=2]
#
# --quick: a smoke check under 5 minutes on free cores (8 requests, one
# round, the knee rate only, probe rates 1, 2 and 4 at most, a 1 MiB pool). Binaries: the default
# configuration's (bazel build //deploy/launcher:mmserve_launch
# //bench/loadgen:loadgen //router:router //language_service:language
# //encoder_service:encoder //bench:elastic_bench //bench:elastic_profile) or those
# under $BIN (e.g. a --config=opt bazel-bin).
set -euo pipefail
quick=0
if [[ "${1:-}" == "--quick" ]]; then quick=1; shift; fi
step_models=${ELASTIC_STEP_MODELS:-}
[[ -z "$step_models" || "$step_models" == /* ]] || step_models="$PWD/$step_models"
model_dir=${MODEL_DIR:-}
[[ -z "$model_dir" || "$model_dir" == /* ]] || model_dir="$PWD/$model_dir"
cd "$(dirname "$0")/../.."
date_start=$(date -u +%Y-%m-%dT%H:%M:%SZ)
load_start=$(cut -d' ' -f1-3 /proc/loadavg)
if ((quick)); then
  n=${1:-8} rounds=${2:-1} factors=${RATE_FACTORS:-1} probe_rates=${PROBE_RATES:-3}
  rate0=${RATE0:-1}
  kv_mb=${KV_MB:-1} probe_step=${PROBE_STEP:-128}
  bench_flags="--prompt=512 --rounds=1" profile_flags="--tokens=128,256,512 --reps=1"
else
  n=${1:-40} rounds=${2:-2} factors=${RATE_FACTORS:-"0.5 1 2"} probe_rates=${PROBE_RATES:-6}
  rate0=${RATE0:-0.5}
  kv_mb=${KV_MB:-2} probe_step=${PROBE_STEP:-64}
  bench_flags="--prompt=1024 --rounds=3" profile_flags="--tokens=256,512,1024,2048 --reps=3"
fi
layers=${LAYERS:-2}
short=${SHORT:-32}
output=${OUTPUT:-16}
mix_counts=${MIX_COUNTS:-"10 6 3 1"}
slo_scale=${SLO_SCALE:-5}
bin=${BIN:-$(bazel info bazel-bin 2>/dev/null)}
out=$(mktemp -d /tmp/mmserve-elastic-exp-XXXXXX)
# shellcheck source=bench/loadgen/stack_lib.sh
source bench/loadgen/stack_lib.sh

if [[ -z "$model_dir" ]]; then
  model_dir="$out/model"
  python3 tools/make_random_qwen2.py --out "$model_dir" --layers "$layers" \
    --vocab "${VOCAB:-2048}" >&2
fi
read -r layers vocab < <(python3 -c '
import json, sys
c = json.load(open(sys.argv[1]))
print(c["num_hidden_layers"], c["vocab_size"])' "$model_dir/config.json")

loadavg() { cut -d' ' -f1 /proc/loadavg; }

# 1. The machine's parallel ceiling and the degree-2 ratios, before any load.
# shellcheck disable=SC2086
"$bin/bench/elastic_bench" --layers="$layers" --vocab="$vocab" $bench_flags 2>/dev/null | tail -n 1 | python3 -c '
import json, sys
j = json.loads(sys.stdin.read())
j["bench"] = "elastic_bench"
j["loadavg"] = float(open("/proc/loadavg").read().split()[0])
print(json.dumps(j))' | tee "$out/elastic_bench.jsonl"
read -r slo_ttft_tok slo_tpot < <(python3 - "$out/elastic_bench.jsonl" "$slo_scale" <<'PY'
import json, sys
j = json.loads(open(sys.argv[1]).read())
s = float(sys.argv[2])
print("%.4f %.1f" % (s * 1e3 * j["prefill_dop1_s"] / j["prompt"], s * j["decode_step_single_ms"]))
PY
)
slo_ttft_tok=${SLO_TTFT_PER_TOKEN_MS:-$slo_ttft_tok}
slo_tpot=${SLO_TPOT_MS:-$slo_tpot}
slo_ttft=$(python3 -c "print(round(float('$slo_ttft_tok') * $short, 1))")

# 2. Step-time models of the served model, on this machine.
if [[ -z "$step_models" ]]; then
  step_models="$out/step_models.txt"
  # shellcheck disable=SC2086
  "$bin/bench/elastic_profile" --model_dir="$model_dir" --layers="$layers" --degrees=2 \
    $profile_flags --fit_out="$step_models" 2>/dev/null | tail -n 1 | tee "$out/profile.jsonl"
fi

start() {  # config -> $launcher, the router's address in $address, metrics ports in $ports
  local config=$1 args=() lang="--threads=1,--kv_cache_mb=$kv_mb"
  case "$config" in
    elastic) args=(--elastic=2 --elastic_step_models="$step_models") ;;
    static_dp) args=(--elastic=2 --router_flags=--elastic=false) ;;
    pd) args=(--prefill=1 --decode=1) ;;
    single_2t) lang="--threads=2,--kv_cache_mb=$((2 * kv_mb))" ;;
    *) echo "elastic_experiment.sh: unknown config $config" >&2; exit 2 ;;
  esac
  stack_start "$config" "${args[@]}" --language_flags="$lang"
}

kv_moved() {  # $ports -> {"kind": {"sent": B, "received": B}} summed over the services
  python3 - "$ports" <<'PY'
import json, re, sys, urllib.request
tot = {k: {"sent": 0.0, "received": 0.0} for k in ("elastic_prefill", "elastic_decode", "handoff")}
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
    --images=0 --prompt_tokens="$1" --output_tokens=4 --num_requests=1 --timeout_s=300 \
    --label=probe 2>/dev/null | tail -n 1 | python3 -c '
import json, sys
sys.exit(0 if json.loads(sys.stdin.read()).get("ok") == 1 else 1)'
}

probe() {  # config -> one JSON line {"probe": config, "longest_words": N}
  local config=$1 lo=0 hi=0 w=128
  start "$config"
  while served "$w"; do lo=$w; w=$((w * 2)); ((w <= 32768)) || break; done
  hi=$w
  while ((hi - lo > probe_step)); do
    local mid=$(((lo + hi) / 2))
    if served "$mid"; then lo=$mid; else hi=$mid; fi
  done
  stack_stop
  echo "{\"probe\": \"$config\", \"longest_words\": $lo, \"refused_words\": $hi, \"loadavg\": $(loadavg)}"
}

run() {  # config rate round key -> one JSON line, the run under "key" (config or rate_probe)
  local config=$1 rate=$2 round=$3 key=$4 before
  start "$config"
  before=$(loadavg)
  "$bin/bench/loadgen/loadgen" --target=router --address="$address" --dataset=synthetic \
    --images=0 --prompt_tokens_mix="$mix" --output_tokens="$output" --num_requests="$n" \
    --request_rate="$rate" --seed="$round" --warmup=2 --timeout_s=300 \
    --slo_ttft_ms="$slo_ttft" --slo_ttft_ms_per_prompt_token="$slo_ttft_tok" \
    --slo_tpot_ms="$slo_tpot" --leak_ports="$ports" --label="$config" | tail -n 1 >"$out/line.json"
  kv_moved >"$out/kv.json"
  stack_stop
  python3 -c '
import json, sys
j = json.loads(open(sys.argv[1]).read())
j[sys.argv[7]], j["round"] = sys.argv[2], int(sys.argv[3])
j["loadavg"] = [float(sys.argv[4]), float(open("/proc/loadavg").read().split()[0])]
j["kv_mb_per_instance"] = int(sys.argv[5])
j["kv_bytes_moved"] = json.loads(open(sys.argv[6]).read())
print(json.dumps(j))' "$out/line.json" "$config" "$round" "$before" "$kv_mb" "$out/kv.json" "$key"
}

# 3. The longest prompt each configuration serves.
configs="elastic static_dp pd single_2t"
for config in $configs; do probe "$config"; done | tee "$out/probe.jsonl"

# 4. The mix: SHORT, FIT/4, FIT, OVER, MIX_COUNTS copies each.
mix=$(python3 - "$out/probe.jsonl" "$short" "$mix_counts" <<'PY'
import json, sys
p = {j["probe"]: j["longest_words"] for j in map(json.loads, open(sys.argv[1]))}
fit, over = int(0.9 * p["static_dp"]), int(0.8 * p["elastic"])
words = [int(sys.argv[2]), fit // 4, fit, max(over, fit + 1)]
counts = [int(c) for c in sys.argv[3].split()]
print(",".join(str(w) for w, c in zip(words, counts) for _ in range(c)))
PY
)
echo "{\"mix_words\": [$mix]}"

# 5. The knee: the rate where the better static configuration falls below 90%.
knee=$rate0 knee_found=0
touch "$out/rate_probe.jsonl"
for _ in $(seq 1 "$probe_rates"); do
  for config in static_dp pd; do run "$config" "$knee" 0 rate_probe >>"$out/rate_probe.jsonl"; done
  tail -n 2 "$out/rate_probe.jsonl" | python3 -c '
import json, sys
sys.exit(0 if max(json.loads(l)["slo_attainment"] for l in sys.stdin) < 0.9 else 1)' &&
    knee_found=1 && break
  knee=$(python3 -c "print($knee * 2)")
done
cat "$out/rate_probe.jsonl"
rates=$(python3 -c "print(' '.join('%g' % (float(f) * $knee) for f in '$factors'.split()))")
echo "{\"knee_rate\": $knee, \"rates\": [$(echo "$rates" | tr ' ' ',')]}"

# 6. Load at rates around and past the knee, the configurations alternated.
for rate in $rates; do
  for round in $(seq 1 "$rounds"); do
    if ((round % 2)); then order=$configs; else order=$(echo "$configs" | tr ' ' '\n' | tac | paste -sd' ' -); fi
    for config in $order; do run "$config" "$rate" "$round" config; done
  done
done | tee "$out/runs.jsonl"

date_end=$(date -u +%Y-%m-%dT%H:%M:%SZ)
load_end=$(cut -d' ' -f1-3 /proc/loadavg)
python3 bench/loadgen/elastic_summary.py --dir="$out" --requests="$n" --kv_mb="$kv_mb" \
  --mix="$mix" --knee="$knee" --knee_found="$knee_found" --date_start="$date_start" --date_end="$date_end" \
  --loadavg_start="$load_start" --loadavg_end="$load_end" --model="${MODEL_DIR:-random Qwen2-0.5B width, $layers layers}" \
  --step_models="${ELASTIC_STEP_MODELS:-fitted at start-up}" --quick="$quick"
