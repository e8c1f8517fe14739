#!/usr/bin/env bash
# Starts the whole mmserve stack on this machine: router + encoder(s) +
# language (role both), with the bundled demo model unless told otherwise.
# Installs missing packages, builds optimised binaries, starts the processes
# through the launcher (deploy/launcher), waits until every service is
# healthy, prints the addresses and a client call, and on Ctrl-C or SIGTERM
# stops every child (each drains and frees its blocks).
#
#   ./deploy/serve.sh [--model_dir=DIR] [--model_id=NAME] [--encoders=N]
#                     [--host=ADDR] [--port=50051] [--http_port=8000]
#                     [--api_key_file=FILE] [--cluster_token_file=FILE]
#                     [--quantize=int8|int8_g32|int4_g32|int4_g128|int4_g32_zp|int4_g128_zp]
#                     [--max_model_len=N] [--kv_cache_mb=N]
#                     [--profile=shm|tcp] [--tp=N] [--prefill=N --decode=N [--prefill_tp=N]]
#                     [--elastic=N] [--elastic_step_models=FILE]
#                     [--router_flags=F,...] [--encoder_flags=F,...]
#                     [--language_flags=F,...]
# --model_id=NAME: the model name clients send and /v1/models lists
#   (default: the model directory's name).
# --host=ADDR: the address every service listens on, the internal ports
#   included (default 127.0.0.1). 0.0.0.0 serves other machines: set
#   --api_key_file and --cluster_token_file then (docs/security.md).
# --api_key_file=FILE: API keys, one a line; calls without one of them get
#   UNAUTHENTICATED (HTTP 401). Default: open.
# --cluster_token_file=FILE: the internal plane's token (the file's first
#   line), given to the router, the encoders and the language instances:
#   an internal call without it is refused. Default: none.
# --quantize=MODE: the language model's weights quantized at load (int8: one
#   scale per output row, int8_g32: one per 32 columns; 4-bit int4_g32,
#   int4_g128: one per 32 or 128 columns, _zp: with zero points).
# --max_model_len=N: the context length clients are held to (router and
#   language; 0: the model's). --kv_cache_mb=N: each language instance's KV
#   cache in MiB (0: a share of free memory).
# --tp=N: the language instance runs as N tensor-parallel rank processes.
# --prefill=N --decode=N: N prefill and N decode language instances (KV over
#   UCX; text and image prompts) instead of one role-both instance; with
#   --tp=N each decode instance has N ranks, with --prefill_tp=N each prefill
#   instance.
# --elastic=N: N elastic language instances (--role=elastic) pooled by the
#   router's elastic manager (router --elastic; docs/elastic.md): a long prompt
#   is prefilled by a group of them, its KV spread over their pools.
# --elastic_step_models=FILE (or ELASTIC_STEP_MODELS=FILE): with --elastic, the
#   router's per-degree step-time models, fitted on this hardware by
#   bench:elastic_profile (docs/elastic.md); default: the router's own.
# --router_flags=, --encoder_flags=, --language_flags=: any other flags of
#   that process, comma-separated (--language_flags=--max_num_seqs=16,--threads=4);
#   each name must be one of its flags (docs/reference/flags.md).
# An unknown option, a bad value or a file that cannot be read stops serve.sh
# with exit status 2 before anything starts.
set -euo pipefail
caller_dir=$PWD
cd "$(dirname "$0")/.."
root=$PWD

model_dir="$root/models/shapes-demo"
encoders=1
profile=shm
host=127.0.0.1
port=50051
http_port=8000
tp=1
prefill_tp=1
prefill=0
decode=0
elastic=0
elastic_step_models=${ELASTIC_STEP_MODELS:-}
model_id=
api_key_file=
cluster_token_file=
quantize=
max_model_len=
kv_cache_mb=
router_flags=
encoder_flags=
language_flags=
usage_end=$(grep -n '^set -euo pipefail' "$0" | cut -d: -f1)
die() { echo "serve.sh: $*" >&2; exit 2; }
# A file option's path, relative to where serve.sh was started; refused
# when it cannot be read.
readable() {  # option, path
  local path=$2
  [[ "$path" == /* ]] || path="$caller_dir/$path"
  [[ -f "$path" && -r "$path" ]] || die "$1: cannot read the file $2"
  echo "$path"
}
for arg in "$@"; do
  case "$arg" in
    --model_dir=*) model_dir="${arg#*=}" ;;
    --model_id=*) model_id="${arg#*=}" ;;
    --encoders=*) encoders="${arg#*=}" ;;
    --profile=*) profile="${arg#*=}" ;;
    --host=*) host="${arg#*=}" ;;
    --port=*) port="${arg#*=}" ;;
    --http_port=*) http_port="${arg#*=}" ;;
    --api_key_file=*) api_key_file="${arg#*=}" ;;
    --cluster_token_file=*) cluster_token_file="${arg#*=}" ;;
    --quantize=*) quantize="${arg#*=}" ;;
    --max_model_len=*) max_model_len="${arg#*=}" ;;
    --kv_cache_mb=*) kv_cache_mb="${arg#*=}" ;;
    --tp=*) tp="${arg#*=}" ;;
    --prefill_tp=*) prefill_tp="${arg#*=}" ;;
    --prefill=*) prefill="${arg#*=}" ;;
    --decode=*) decode="${arg#*=}" ;;
    --elastic=*) elastic="${arg#*=}" ;;
    --elastic_step_models=*) elastic_step_models="${arg#*=}" ;;
    --router_flags=*) router_flags="${arg#*=}" ;;
    --encoder_flags=*) encoder_flags="${arg#*=}" ;;
    --language_flags=*) language_flags="${arg#*=}" ;;
    -h|--help) sed -n "2,$((usage_end - 1))p" "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown option ${arg%%=*} (./deploy/serve.sh --help lists the options)" ;;
  esac
done
# Whole numbers at or above a floor.
for spec in encoders:1 tp:1 prefill_tp:1 prefill:0 decode:0 elastic:0 port:1 http_port:-1 \
            max_model_len:0 kv_cache_mb:0; do
  name=${spec%%:*} floor=${spec#*:} value=${!name}
  [[ -z "$value" && ( $name == max_model_len || $name == kv_cache_mb ) ]] && continue
  [[ "$value" =~ ^-?[0-9]+$ ]] && ((value >= floor)) ||
    die "--$name=$value: expected a whole number >= $floor"
done
((port <= 65535 && http_port <= 65535)) || die "--port and --http_port must be <= 65535"
[[ "$profile" == shm || "$profile" == tcp ]] || die "--profile=$profile: expected shm or tcp"
[[ -z "$quantize" || "$quantize" =~ ^(int8|int8_g32|int4_g32|int4_g128|int4_g32_zp|int4_g128_zp)$ ]] ||
  die "--quantize=$quantize: expected int8, int8_g32, int4_g32, int4_g128, int4_g32_zp or int4_g128_zp"
[[ "$host" =~ ^[A-Za-z0-9.:-]+$ ]] || die "--host=$host: expected an address such as 127.0.0.1 or 0.0.0.0"
[[ -z "$model_id" || "$model_id" =~ ^[A-Za-z0-9._:/-]+$ ]] ||
  die "--model_id=$model_id: letters, digits and . _ : / - only"
[[ -d "$model_dir" ]] || die "--model_dir=$model_dir: no such directory"
model_dir=$(cd "$model_dir" && pwd)
[[ -n "$api_key_file" ]] && api_key_file=$(readable --api_key_file "$api_key_file")
if [[ -n "$api_key_file" ]] && ! grep -q '[^[:space:]]' "$api_key_file"; then
  die "--api_key_file: $api_key_file holds no key"
fi
[[ -n "$cluster_token_file" ]] && cluster_token_file=$(readable --cluster_token_file "$cluster_token_file")
if [[ -n "$cluster_token_file" ]] && ! head -n 1 "$cluster_token_file" | grep -q '[^[:space:]]'; then
  die "--cluster_token_file: the first line of $cluster_token_file is empty"
fi
elastic_args=()
if [[ -n "$elastic_step_models" ]]; then
  elastic_step_models=$(readable --elastic_step_models "$elastic_step_models")
  ((elastic > 0)) || die "--elastic_step_models needs --elastic"
  elastic_args=(--elastic_step_models="$elastic_step_models")
fi
# The named options become flags of the processes they belong to, ahead of
# the --*_flags a user passes (a later flag wins).
join() { local IFS=,; echo "$*"; }
router_extra=() encoder_extra=() language_extra=()
if [[ -n "$cluster_token_file" ]]; then
  router_extra+=("--cluster_token_file=$cluster_token_file")
  encoder_extra+=("--cluster_token_file=$cluster_token_file")
  language_extra+=("--cluster_token_file=$cluster_token_file")
fi
[[ -n "$model_id" ]] && router_extra+=("--model_id=$model_id")
[[ -n "$max_model_len" ]] && router_extra+=("--max_model_len=$max_model_len") &&
  language_extra+=("--max_model_len=$max_model_len")
[[ -n "$quantize" ]] && language_extra+=("--quantize=$quantize")
[[ -n "$kv_cache_mb" ]] && language_extra+=("--kv_cache_mb=$kv_cache_mb")
[[ -n "$router_flags" ]] && router_extra+=("$router_flags")
[[ -n "$encoder_flags" ]] && encoder_extra+=("$encoder_flags")
[[ -n "$language_flags" ]] && language_extra+=("$language_flags")
router_flags=$(join ${router_extra[@]+"${router_extra[@]}"})
encoder_flags=$(join ${encoder_extra[@]+"${encoder_extra[@]}"})
language_flags=$(join ${language_extra[@]+"${language_extra[@]}"})

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
# Each passed-through flag must be one of its process's own flags (the
# process would refuse it only once started, and the launcher restart it).
check_flags() {  # option, binary, comma-separated flags
  local known name
  [[ -n "$3" ]] || return 0
  # --helpfull exits 1 after printing.
  known=$({ "$bin/$2" --helpfull 2>/dev/null || true; } | sed -n 's/^ *--\([A-Za-z0-9_]*\) .*/\1/p')
  [[ -n "$known" ]] || { echo "serve.sh: $bin/$2 --helpfull listed no flags" >&2; exit 1; }
  local IFS=,
  for flag in $3; do
    [[ "$flag" == --?* ]] || die "$1: '$flag' is not a flag (write --name=value, comma-separated)"
    name=${flag#--}
    name=${name%%=*}
    grep -qx -e "$name" -e "${name#no}" <<<"$known" ||
      die "$1: $2 has no flag --$name (docs/reference/flags.md lists its flags)"
  done
}
check_flags --router_flags router/router "$router_flags"
check_flags --encoder_flags encoder_service/encoder "$encoder_flags"
check_flags --language_flags language_service/language "$language_flags"

logs=$(mktemp -d /tmp/mmserve-logs-XXXXXX)
out="$logs/launcher.out"
"$bin/deploy/launcher/mmserve_launch" --bin_dir="$bin" --model_dir="$model_dir" \
  --encoders="$encoders" --profile="$profile" --host="$host" --port="$port" --http_port="$http_port" \
  --api_key_file="$api_key_file" --router_flags="$router_flags" --encoder_flags="$encoder_flags" \
  --language_flags="$language_flags" \
  --tp="$tp" --prefill_tp="$prefill_tp" --prefill="$prefill" --decode="$decode" --elastic="$elastic" ${elastic_args[@]+"${elastic_args[@]}"} \
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
