#!/usr/bin/env bash
# The README's main command, tested as a user runs it: ./deploy/serve.sh
# starts the stack, the CLI and the Python client answer a demo question over
# gRPC, server reflection lists the services, curl gets an answer over HTTP,
# SIGTERM stops it, and no process, port or SysV shared-memory segment is
# left behind.
# Prints "serve_test: PASS" or "serve_test: FAIL <why>"; exit status likewise.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
port=${SERVE_TEST_PORT:-50391}
http=${SERVE_TEST_HTTP_PORT:-8391}
out=$(mktemp)
fail() { echo "serve_test: FAIL $*"; tail -n 40 "$out"; exit 1; }

segments_before=$(ipcs -m | grep -c '^0x' || true)
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

kill -TERM "$serve"
for _ in $(seq 1 100); do kill -0 "$serve" 2>/dev/null || break; sleep 0.2; done
kill -0 "$serve" 2>/dev/null && fail "serve.sh still runs 20 s after SIGTERM"
sleep 0.5
left=$(pgrep -f "$bin/(router/router|encoder_service/encoder|language_service/language|deploy/launcher/mmserve_launch)" || true)
[[ -z "$left" ]] || fail "processes left behind: $left"
segments_after=$(ipcs -m | grep -c '^0x' || true)
[[ "$segments_after" -le "$segments_before" ]] || fail "SysV segments left: $segments_before -> $segments_after"
if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then fail "port $port still open"; fi
echo "serve_test: PASS (answer '$answer', Python '$py_answer'; $(grep -c . <<<"$services") services listed)"
