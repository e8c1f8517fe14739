#!/usr/bin/env bash
# The README's main command, tested as a user runs it: ./deploy/serve.sh
# starts the stack, the CLI and the Python client answer a demo question over
# gRPC, server reflection lists the services, curl gets an answer over HTTP,
# SIGTERM stops it, and no process, port or SysV shared-memory segment of
# the stack is left behind. Then the options serve.sh passes through: a second stack with
# --api_key_file, --cluster_token_file, --model_id, --quantize and
# --language_flags comes up (its processes register with the token) and refuses a call
# without a key (UNAUTHENTICATED over gRPC, 401 over HTTP), lists the model
# id in /v1/models, answers with the key, and its language process runs with
# the flags; an unknown option, an unreadable file, a bad value and a flag
# the process does not have are each refused with exit status 2 and a
# message that names them.
# Prints "serve_test: PASS" or "serve_test: FAIL <why>"; exit status likewise.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
port=${SERVE_TEST_PORT:-50391}
http=${SERVE_TEST_HTTP_PORT:-8391}
out=$(mktemp)
fail() { echo "serve_test: FAIL $*"; tail -n 40 "$out"; exit 1; }

MMSERVE_SERVE_OPT=${MMSERVE_SERVE_OPT:-0} setsid ./deploy/serve.sh --port="$port" --http_port="$http" >"$out" 2>&1 &
serve=$!
for _ in $(seq 1 600); do
  grep -q '^READY serve.sh' "$out" && break
  kill -0 "$serve" 2>/dev/null || fail "serve.sh exited before it was ready"
  sleep 0.5
done
grep -q '^READY serve.sh' "$out" || { kill -TERM "$serve"; fail "not ready in 300 s"; }

# The client call serve.sh printed, as a user would paste it.
call=$(grep -m1 'client/cli --address' "$out" | sed 's/^ *//')
answer=$(eval "$call --temperature=0" 2>/dev/null)
[[ "$answer" == "two" ]] || { kill -TERM "$serve"; fail "CLI answered '$answer', expected 'two'"; }
bin=$(dirname "$(dirname "${call%% *}")")
services=$("$bin/client/reflection_list" --address="127.0.0.1:$port" 2>&1)
for s in mmserve.v1.Inference grpc.health.v1.Health; do
  grep -q "$s" <<<"$services" || { kill -TERM "$serve"; fail "reflection does not list $s: $services"; }
done
# The README's Python example, against the live stack (Debian's python3-grpcio).
stubs=$(mktemp -d)
client/python/gen_stubs.sh "$stubs" >/dev/null || { kill -TERM "$serve"; fail "gen_stubs.sh failed"; }
py_answer=$(MMSERVE_STUBS_DIR="$stubs" /usr/bin/python3 client/python/mmserve_client.py \
  --address="127.0.0.1:$port" --image=tools/demo/eval_set/0000.png \
  --prompt="How many shapes are in the picture?" --temperature=0 2>"$stubs/stderr")
py_err=$(cat "$stubs/stderr")
rm -rf "$stubs"
[[ "$py_answer" == "two" ]] ||
  { kill -TERM "$serve"; fail "Python client answered '$py_answer' ($py_err), expected 'two'"; }
body=$(curl -s "http://127.0.0.1:$http/v1/chat/completions" -H 'Content-Type: application/json' \
  -d '{"messages":[{"role":"user","content":"Hello"}],"max_tokens":4,"temperature":0}')
grep -q '"chat.completion"' <<<"$body" || { kill -TERM "$serve"; fail "HTTP answered: $body"; }

# Stops serve.sh ($1) and checks that nothing of its stack is left.
stop_and_check() {
  local serve=$1 port=$2 pids segments
  # serve.sh runs under setsid: every process of the stack shares its SID.
  # Only their segments count: other stacks on this machine have their own.
  pids=$(ps -e -o sid=,pid= | awk -v sid="$serve" '$1 == sid {print $2}')
  kill -TERM "$serve"
  for _ in $(seq 1 100); do kill -0 "$serve" 2>/dev/null || break; sleep 0.2; done
  kill -0 "$serve" 2>/dev/null && fail "serve.sh still runs 20 s after SIGTERM"
  sleep 0.5
  left=$(ps -e -o sid=,pid=,args= | awk -v sid="$serve" '$1 == sid' || true)
  [[ -z "$left" ]] || fail "processes left behind: $left"
  # ipcs -m -p: shmid, owner, creator pid, last-op pid.
  segments=$(ipcs -m -p | awk 'NF == 4 && $1 ~ /^[0-9]+$/ {print $1, $3}' |
    while read -r id cpid; do grep -qx "$cpid" <<<"$pids" && echo "$id"; done || true)
  [[ -z "$segments" ]] || fail "SysV segments of the stack left: $(tr '\n' ' ' <<<"$segments")"
  if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then fail "port $port still open"; fi
}
stop_and_check "$serve" "$port"
first="answer '$answer', Python '$py_answer'; $(grep -c . <<<"$services") services listed"

# Options passed through to the processes.
port2=$((port + 1))
http2=$((http + 1))
keys=$(mktemp)
printf '# serve_test\nserve-test-key\n' >"$keys"
token=$(mktemp)
echo serve-test-cluster-token >"$token"
MMSERVE_SERVE_OPT=${MMSERVE_SERVE_OPT:-0} setsid ./deploy/serve.sh --port="$port2" --http_port="$http2" \
  --api_key_file="$keys" --cluster_token_file="$token" --model_id=shapes-int8 --quantize=int8 \
  --language_flags=--max_num_seqs=8 >"$out" 2>&1 &
serve=$!
for _ in $(seq 1 600); do
  grep -q '^READY serve.sh' "$out" && break
  kill -0 "$serve" 2>/dev/null || fail "serve.sh with pass-through options exited before it was ready"
  sleep 0.5
done
grep -q '^READY serve.sh' "$out" || { kill -TERM "$serve"; fail "not ready in 300 s (pass-through options)"; }
unauth=$("$bin/client/cli" --address="127.0.0.1:$port2" --prompt=Hello --max_tokens=2 2>&1 >/dev/null)
grep -q 'UNAUTHENTICATED' <<<"$unauth" ||
  { kill -TERM "$serve"; fail "--api_key_file: a gRPC call without a key got '$unauth'"; }
code=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$http2/v1/chat/completions" \
  -H 'Content-Type: application/json' -d '{"messages":[{"role":"user","content":"Hello"}],"max_tokens":2}')
[[ "$code" == 401 ]] || { kill -TERM "$serve"; fail "--api_key_file: HTTP without a key got $code, expected 401"; }
models=$(curl -s -H 'Authorization: Bearer serve-test-key' "http://127.0.0.1:$http2/v1/models")
grep -q '"id": *"shapes-int8"' <<<"$models" ||
  { kill -TERM "$serve"; fail "--model_id: /v1/models answered $models"; }
keyed=$(MMSERVE_API_KEY=serve-test-key "$bin/client/cli" --address="127.0.0.1:$port2" --model=shapes-int8 \
  --prompt=Hello --max_tokens=2 --temperature=0 2>&1)
[[ $? == 0 && -n "$keyed" ]] || { kill -TERM "$serve"; fail "a call with the key failed: $keyed"; }
lang=$(ps -e -o sid=,args= | awk -v sid="$serve" '$1 == sid' | grep "$bin/language_service/language " || true)
grep -q -- '--quantize=int8' <<<"$lang" && grep -q -- '--max_num_seqs=8' <<<"$lang" ||
  { kill -TERM "$serve"; fail "the language process does not run with the options: $lang"; }
for b in router/router encoder_service/encoder language_service/language; do
  ps -e -o sid=,args= | awk -v sid="$serve" '$1 == sid' | grep "$bin/$b " | grep -q -- "--cluster_token_file=$token" ||
    { kill -TERM "$serve"; fail "$b does not run with --cluster_token_file"; }
done
stop_and_check "$serve" "$port2"
rm -f "$keys" "$token"

# Refused before anything starts: exit status 2 and a message naming the option.
refused() {  # what the message must contain, serve.sh arguments...
  local want=$1 msg rc
  shift
  msg=$(MMSERVE_SERVE_OPT=${MMSERVE_SERVE_OPT:-0} ./deploy/serve.sh --port="$port2" "$@" 2>&1 >/dev/null)
  rc=$?
  [[ $rc == 2 ]] || fail "serve.sh $* exited $rc, expected 2 ($msg)"
  grep -qF -- "$want" <<<"$msg" || fail "serve.sh $*: the message '$msg' does not say '$want'"
}
refused "unknown option --no_such_option (./deploy/serve.sh --help" --no_such_option=1
refused "cannot read the file /nonexistent/keys" --api_key_file=/nonexistent/keys
refused "--quantize=int4: expected int8, int8_g32, int4_g32" --quantize=int4
refused "--tp=0: expected a whole number >= 1" --tp=0
refused "language_service/language has no flag --no_such_flag" --language_flags=--kv_cache_mb=64,--no_such_flag=1
echo "serve_test: PASS ($first; pass-through: UNAUTHENTICATED without the key, 401 over HTTP, model shapes-int8 listed, language ran with --quantize=int8, every service with the cluster token; 5 bad options refused)"
