#!/usr/bin/env bash
# Starts the whole mmserve stack on this machine: router + encoder(s) +
# language (role both), with the bundled demo model unless told otherwise.
# Installs missing packages, builds optimised binaries, starts the processes
# through the launcher (deploy/launcher), waits until every service is
# healthy, prints the addresses and a client call, and on Ctrl-C or SIGTERM
# stops every child (each drains and frees its blocks).
#
#   ./deploy/serve.sh [--model_dir=DIR] [--encoders=N] [--profile=shm|tcp]
#                     [--port=50051] [--http_port=8000] [--tp=N]
#                     [--prefill=N --decode=N] [--elastic=N]
#                     [--esp_step_models=FILE]
# --tp=N: the language instance runs as N tensor-parallel rank processes.
# --prefill=N --decode=N: N prefill and N decode language instances (KV over
# UCX; text and image prompts) instead of one role-both instance; with
# --tp=N each decode instance has N ranks (prefill instances run one).
# --elastic=N: N elastic language instances (--role=elastic) pooled by the
# router's elastic manager (router --esp; docs/elastic.md): a long prompt
# is prefilled by a group of them, its KV spread over their pools.
# --esp_step_models=FILE (or ESP_STEP_MODELS=FILE): with --elastic, the
# router's per-degree step-time models, fitted on this hardware by
# bench:esp_profile (docs/elastic.md); default: the router's own.
set -euo pipefail
caller_dir=$PWD
cd "$(dirname "$0")/.."
root=$PWD

model_dir="$root/models/shapes-demo"
encoders=1
profile=shm
port=50051
http_port=8000
tp=1
prefill=0
decode=0
elastic=0
esp_step_models=${ESP_STEP_MODELS:-}
for arg in "$@"; do
  case "$arg" in
    --model_dir=*) model_dir="${arg#*=}" ;;
    --encoders=*) encoders="${arg#*=}" ;;
    --profile=*) profile="${arg#*=}" ;;
    --port=*) port="${arg#*=}" ;;
    --http_port=*) http_port="${arg#*=}" ;;
    --tp=*) tp="${arg#*=}" ;;
    --prefill=*) prefill="${arg#*=}" ;;
    --decode=*) decode="${arg#*=}" ;;
    --elastic=*) elastic="${arg#*=}" ;;
    --esp_step_models=*) esp_step_models="${arg#*=}" ;;
    -h|--help) sed -n '2,22p' "$0"; exit 0 ;;
    *) echo "serve.sh: unknown argument $arg" >&2; exit 2 ;;
  esac
done
model_dir=$(cd "$model_dir" && pwd)
esp_args=()
if [[ -n "$esp_step_models" ]]; then
  [[ "$esp_step_models" == /* ]] || esp_step_models="$caller_dir/$esp_step_models"
  [[ -r "$esp_step_models" ]] || { echo "serve.sh: cannot read $esp_step_models" >&2; exit 2; }
  ((elastic > 0)) || { echo "serve.sh: --esp_step_models needs --elastic" >&2; exit 2; }
  esp_args=(--esp_step_models="$esp_step_models")
fi

deploy/install_deps.sh
cache="${MMSERVE_BAZEL_CACHE:-$HOME/.cache/mmserve/bazel-disk}"
mkdir -p "$cache"
# MMSERVE_SERVE_OPT=0 builds the default (unoptimised) configuration: the
# test suite uses it to reuse what `bazel test` already built.
config=(--config=opt)
[[ "${MMSERVE_SERVE_OPT:-1}" == 0 ]] && config=()
echo "serve.sh: building ${config[*]:-default} binaries"
bazel build --disk_cache="$cache" "${config[@]}" --color=no --curses=no \
  //router:router //encoder_service:encoder //language_service:language \
  //worker:tp_shard //deploy/launcher:mmserve_launch //client:cli //client:reflection_list \
  //client:health_probe 2>&1 | grep -vE '^(INFO|Loading|Analyzing|\[)' || true
bin=$(bazel info "${config[@]}" bazel-bin 2>/dev/null)
for b in router/router encoder_service/encoder language_service/language \
         deploy/launcher/mmserve_launch client/cli; do
  [[ -x "$bin/$b" ]] || { echo "serve.sh: $bin/$b was not built" >&2; exit 1; }
done

logs=$(mktemp -d /tmp/mmserve-logs-XXXXXX)
out="$logs/launcher.out"
"$bin/deploy/launcher/mmserve_launch" --bin_dir="$bin" --model_dir="$model_dir" \
  --encoders="$encoders" --profile="$profile" --port="$port" --http_port="$http_port" \
  --tp="$tp" --prefill="$prefill" --decode="$decode" --elastic="$elastic" ${esp_args[@]+"${esp_args[@]}"} \
  --log_dir="$logs" >"$out" 2>"$logs/launcher.log" &
launcher=$!
stop() {
  kill -TERM "$launcher" 2>/dev/null || true
  wait "$launcher" 2>/dev/null || true
  echo "serve.sh: stopped (logs in $logs)"
}
trap 'stop; exit 0' INT TERM

until grep -q '^READY launcher' "$out" 2>/dev/null; do
  if ! kill -0 "$launcher" 2>/dev/null; then
    echo "serve.sh: the stack did not start:" >&2
    tail -n 30 "$logs"/*.log >&2
    exit 1
  fi
  sleep 0.2
done
grep -v '^READY' "$out"
addr=$(sed -n 's/^READY launcher stack grpc=\([^ ]*\).*/\1/p' "$out")
cat <<TXT

Ask it (gRPC, streaming):
  $bin/client/cli --address=$addr --image=$root/tools/demo/eval_set/0000.png --prompt="How many shapes are in the picture?"
Or over HTTP (OpenAI-compatible):
  curl -s http://127.0.0.1:$http_port/v1/chat/completions -H 'Content-Type: application/json' \\
    -d '{"messages":[{"role":"user","content":"Hello"}],"max_tokens":8}'
Ctrl-C stops everything.
TXT
echo "READY serve.sh grpc=$addr http=$http_port"
wait "$launcher"
