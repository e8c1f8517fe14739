#!/usr/bin/env bash
# The compose topology as a Docker Swarm stack (deploy/docker-stack.yml), on
# a single-node swarm of a Docker engine of its own: the test starts dockerd
# in a network namespace it creates (own data root, exec root and socket, its
# iptables rules and bridges inside that namespace), so that an engine the
# host already runs, and its swarm state, stay untouched, and nothing the
# test creates is reachable from outside. Then:
#   1. `docker swarm init` on the namespace's address, the image imported
#      from the project's binaries (deploy/build_images.sh), `docker stack
#      deploy` with its overlay network; waits for every task healthy and
#      for the router to see 2 encoders and 1 language instance;
#   2. 100 demo questions over gRPC and 50 over HTTP, every answer identical
#      to the in-process engine's (bench/loadgen --check=inprocess, run in
#      the namespace);
#   3. 60 requests with a new synthetic image each at 10 req/s while the
#      task container of encoder-1 is killed (docker kill): every request
#      succeeds, and the orchestrator replaces the task (a new container,
#      healthy, that encodes images of new requests again);
#   4. the language task killed while idle: replaced, answering again;
#   5. 20 demo questions identical to the in-process engine, and no block or
#      live request left on any service (metrics);
#   6. `docker stack rm`: no container or network of the stack left;
#      `docker swarm leave --force`, the engine stopped, the namespace and
#      the data root removed. The cleanup runs on failure too.
# Bounded to 10 minutes; prints its duration.
#
# Last line: "swarm_test: PASS (...)", "swarm_test: FAIL <why>" or
# "swarm_test: SKIPPED <why>" (not root, no docker.io, or no engine or swarm
# can run here). Exit status 0, 1 and 77 respectively.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
source deploy/bounded.sh
bound_script swarm_test 600 "$root/deploy/swarm_test.sh" "$@"

docker=/usr/bin/docker  # Debian's client, which matches Debian's dockerd
dockerd=/usr/sbin/dockerd
cache="${MMSERVE_BAZEL_CACHE:-$HOME/.cache/mmserve/bazel-disk}"
stack=mmserve
ns="mmserve-swarm-$$"
# An address of the test's own, on a veth pair inside the namespace (the
# swarm needs a non-loopback address to advertise).
addr=10.231.$(($$ % 250)).1
work=$(mktemp -d /tmp/mmserve-swarm-XXXXXX)
logs="$work/logs"
mkdir -p "$logs" "$work/data" "$work/exec"
export DOCKER_HOST="unix://$work/docker.sock"
in_ns() { nsenter --net="/run/netns/$ns" "$@"; }
step() { printf '== [%3ds] %s\n' "$SECONDS" "$*"; }
dockerd_pid=""
ns_made=""

cleanup() {
  if [[ -n "$dockerd_pid" ]]; then
    if $docker stack ls 2>/dev/null | grep -q "^$stack "; then
      for s in $($docker stack services -q "$stack" 2>/dev/null); do
        $docker service logs --no-task-ids "$s" >>"$logs/services.log" 2>&1
      done
      $docker stack rm "$stack" >/dev/null 2>&1
    fi
    $docker swarm leave --force >/dev/null 2>&1
    kill -TERM "$dockerd_pid" 2>/dev/null
    for _ in $(seq 1 150); do kill -0 "$dockerd_pid" 2>/dev/null || break; sleep 0.2; done
    if kill -0 "$dockerd_pid" 2>/dev/null; then
      kill -KILL "$dockerd_pid" 2>/dev/null
      for _ in $(seq 1 50); do kill -0 "$dockerd_pid" 2>/dev/null || break; sleep 0.2; done
    fi
  fi
  # Whatever the engine left mounted under its roots (lazily), then the
  # roots themselves, never crossing into another file system.
  grep -o " $work/[^ ]*" /proc/mounts | sort -r | xargs -r -n1 umount -l 2>/dev/null
  [[ -n "$ns_made" ]] && ip netns del "$ns" 2>/dev/null
  if [[ -f "$logs/failed" ]]; then
    mv "$logs" "/tmp/mmserve-swarm-logs-$$"
  fi
  rm -rf --one-file-system "$work"
}
trap cleanup EXIT
trap 'fail "interrupted"' TERM INT
skip() { echo "swarm_test: SKIPPED $* (${SECONDS} s)"; exit 77; }
fail() {
  touch "$logs/failed"
  echo "swarm_test: FAIL $* (${SECONDS} s; logs in /tmp/mmserve-swarm-logs-$$)"
  exit 1
}

# 1. An engine of our own in a namespace of our own, in swarm mode.
[[ $(id -u) == 0 ]] || skip "needs root (network namespace, dockerd)"
for t in "$dockerd" "$docker" /usr/bin/nsenter /usr/bin/curl /usr/sbin/ip; do
  [[ -x $t ]] || skip "$t is not installed (docker.io, util-linux, curl, iproute2; deploy/compose_test.sh installs docker.io)"
done
step "network namespace $ns ($addr) and a dockerd of its own"
ip netns add "$ns" 2>"$logs/netns.log" || skip "cannot create a network namespace: $(cat "$logs/netns.log")"
ns_made=1
{ ip -n "$ns" link set lo up &&
  ip -n "$ns" link add sw0 type veth peer name sw1 &&
  ip -n "$ns" addr add "$addr/24" dev sw0 &&
  ip -n "$ns" link set sw0 up && ip -n "$ns" link set sw1 up; } 2>>"$logs/netns.log" ||
  skip "cannot set up the namespace's interfaces: $(tail -n 1 "$logs/netns.log")"
# nsenter --net, not `ip netns exec`: the latter remounts /sys, which hides
# the cgroup hierarchies dockerd needs.
nsenter --net="/run/netns/$ns" setsid "$dockerd" --data-root "$work/data" --exec-root "$work/exec" \
  --pidfile "$work/dockerd.pid" -H "$DOCKER_HOST" >"$logs/dockerd.log" 2>&1 &
dockerd_pid=$!  # nsenter and setsid exec: dockerd itself
for _ in $(seq 1 120); do
  $docker info >/dev/null 2>&1 && break
  kill -0 "$dockerd_pid" 2>/dev/null || break
  sleep 0.5
done
[[ -s "$work/dockerd.pid" ]] && dockerd_pid=$(cat "$work/dockerd.pid")
$docker info >/dev/null 2>&1 ||
  skip "dockerd does not start here: $(grep -iE 'error|fatal|failed' "$logs/dockerd.log" | tail -n 2 | tr '\n' ' ')"
step "docker swarm init --advertise-addr $addr"
$docker swarm init --advertise-addr "$addr" >"$logs/swarm-init.log" 2>&1 ||
  skip "docker swarm init failed: $(tail -n 2 "$logs/swarm-init.log" | tr '\n' ' ')"
state=$($docker info --format '{{.Swarm.LocalNodeState}}/{{.Swarm.ControlAvailable}}')
[[ $state == active/true ]] || fail "after swarm init the node is $state, not an active manager"

# 2. Image (imported into this engine) and load generator.
step "building the image into the test's engine (deploy/build_images.sh)"
DOCKER=$docker deploy/build_images.sh >"$logs/build_images.log" 2>&1 ||
  fail "build_images.sh failed: $(tail -n 2 "$logs/build_images.log" | tr '\n' ' ')"
grep '^build_images.sh: built' "$logs/build_images.log"
step "building bench/loadgen"
bazel build --disk_cache="$cache" --color=no --curses=no //bench/loadgen:loadgen >"$logs/bazel.log" 2>&1 ||
  fail "bazel build //bench/loadgen:loadgen failed: $(tail -n 2 "$logs/bazel.log" | tr '\n' ' ')"
loadgen="$(bazel info bazel-bin 2>/dev/null)/bench/loadgen/loadgen"

# 3. Deploy. The namespace is the test's own: the default ports are free.
metrics_ports=9100,9101,9102,9103
step "docker stack deploy -c deploy/docker-stack.yml $stack"
MMSERVE_MODEL_DIR="$root/models/shapes-demo" $docker stack deploy -c deploy/docker-stack.yml "$stack" \
  >"$logs/deploy.log" 2>&1 || fail "docker stack deploy failed: $(tail -n 2 "$logs/deploy.log" | tr '\n' ' ')"
router_sees() {  # e.g. router_sees encoder 2
  in_ns curl -s --max-time 2 127.0.0.1:9100/metrics |
    grep -q "^mmserve_router_healthy_instances{role=\"$1\"} $2\$"
}
task_of() {  # the container id of service $1's running task
  $docker ps -q --filter "label=com.docker.swarm.service.name=${stack}_$1" --filter status=running
}
healthy() {  # four healthy task containers; the router sees 2 + 1 instances
  local n
  n=$($docker ps -q --filter "label=com.docker.stack.namespace=$stack" --filter health=healthy | wc -l)
  [[ $n == 4 ]] && router_sees encoder 2 && router_sees language 1
}
stack_state() {
  $docker stack ps --no-trunc --format '{{.Name}}={{.CurrentState}} {{.Error}}' "$stack" 2>&1 | tr '\n' ';'
}
wait_healthy() {  # within $1 seconds
  for _ in $(seq 1 $(($1 * 2))); do healthy && return 0; sleep 0.5; done
  return 1
}
wait_healthy 180 || fail "the stack was not healthy within 180 s: $(stack_state)"
step "healthy: $($docker stack services --format '{{.Name}} {{.Replicas}}' "$stack" | tr '\n' ' ')"

# 4. Answers against the in-process engine, from inside the namespace.
first_error() {
  grep -E '^(first error|errors|answers|identical|leaks)' "$logs/$1.out" | tr '\n' ' ' | cut -c1-250
}
run_loadgen() {  # name, args...
  local name=$1
  shift
  in_ns "$loadgen" --eval_dir="$root/tools/demo/eval_set" --check=inprocess --fail_on_error \
    --label="swarm $name" "$@" >"$logs/$name.out" 2>&1
  local rc=$?
  grep -E '^(answers:|identical|leaks|first error|TTFT |E2E )' "$logs/$name.out" | sed "s/^/   $name: /"
  return $rc
}
step "100 demo questions over gRPC"
run_loadgen grpc --target=router --address=127.0.0.1:50051 --num_requests=100 --max_concurrency=8 ||
  fail "gRPC answers: $(first_error grpc)"
step "50 demo questions over HTTP"
run_loadgen http --target=http --address=127.0.0.1:8000 --num_requests=50 --max_concurrency=8 ||
  fail "HTTP answers: $(first_error http)"

# 5. A task killed under load: the orchestrator, not the test, starts it again.
replaced() {  # service $1's task runs in a container other than $2, healthy
  local now
  now=$($docker ps -q --filter "label=com.docker.swarm.service.name=${stack}_$1" --filter health=healthy)
  [[ -n $now && $now != "$2" ]]
}
encoded1() {  # images encoder-1's current task has encoded
  in_ns curl -s --max-time 2 127.0.0.1:9102/metrics | sed -n 's/^mmserve_encoder_images_encoded_total //p'
}
encoder1_used() { [[ $(encoded1) -ge 1 ]]; }
# Service $1's task replaced (a container other than $2, healthy), the stack
# healthy, and then a round of 8 requests with new images all answered with
# `$3` true after it, within 90 s. The requests, not the router's gauges,
# say the stack serves again: a re-registered instance counts as healthy
# for a moment before the router's channel to its new address reconnects.
round=0
serving_again() {
  local svc=$1 old=$2 check=$3 deadline=$((SECONDS + 90))
  while ((SECONDS < deadline)); do
    round=$((round + 1))
    if replaced "$svc" "$old" && healthy &&
      in_ns "$loadgen" --target=router --address=127.0.0.1:50051 --dataset=synthetic --images=1 \
        --image_width=64 --image_height=64 --prompt_tokens=8 --output_tokens=2 --num_requests=8 \
        --max_concurrency=2 --seed=$((1000 + round)) --fail_on_error --label="swarm $svc back" \
        >"$logs/back-$round.out" 2>&1 && $check; then
      return 0
    fi
    sleep 0.5
  done
  return 1
}
victim=$(task_of encoder-1)
[[ -n $victim ]] || fail "no running task of encoder-1"
start1=$(encoded1)
step "60 requests with a new 224x224 image each at 10 req/s; docker kill encoder-1's task 2 s into the load"
in_ns "$loadgen" --target=router --address=127.0.0.1:50051 --dataset=synthetic --images=1 \
  --image_width=224 --image_height=224 --prompt_tokens=16 --output_tokens=8 --num_requests=60 \
  --request_rate=10 --fail_on_error --label="swarm kill" >"$logs/kill.out" 2>&1 &
load=$!
for _ in $(seq 1 120); do grep -q '^loadgen: sending' "$logs/kill.out" && break; sleep 0.5; done
sleep 2
now1=$(encoded1)
before=$((${now1:-0} - ${start1:-0}))
$docker kill "$victim" >/dev/null || fail "docker kill of encoder-1's task"
killed_at=$SECONDS
wait "$load" || fail "requests failed while encoder-1's task was killed: $(grep -E '^(first error|requests|errors)' "$logs/kill.out" | tr '\n' ' ')"
grep -E '^(requests|TTFT|E2E) ' "$logs/kill.out" | sed 's/^/   kill: /'
[[ $before -ge 1 ]] || fail "encoder-1 had encoded no image of the load when it was killed (the kill missed the load)"
serving_again encoder-1 "$victim" encoder1_used ||
  fail "encoder-1's task was not replaced and encoding again within 90 s: $(stack_state)"
step "every request succeeded (encoder-1 had encoded $before of their images when killed); encoder-1's task replaced and encoding again $((SECONDS - killed_at)) s after the kill"

victim=$(task_of language-0)
[[ -n $victim ]] || fail "no running task of language-0"
step "docker kill language-0's task (idle)"
$docker kill "$victim" >/dev/null || fail "docker kill of language-0's task"
killed_at=$SECONDS
serving_again language-0 "$victim" true ||
  fail "language-0's task was not replaced and answering within 90 s: $(stack_state)"
step "language-0's task replaced and answering $((SECONDS - killed_at)) s after the kill"
failed_tasks=$($docker stack ps --filter desired-state=shutdown -q "$stack" | wc -l)

step "20 demo questions after the replacements; leaks on every service"
run_loadgen after --target=router --address=127.0.0.1:50051 --num_requests=20 --max_concurrency=4 \
  --leak_ports="$metrics_ports" || fail "after the replacements: $(first_error after)"

# 6. Remove the stack, leave the swarm.
step "docker stack rm $stack"
$docker stack rm "$stack" >"$logs/rm.log" 2>&1 || fail "docker stack rm failed: $(tail -n 1 "$logs/rm.log")"
left() {
  echo $(($($docker ps -aq --filter "label=com.docker.stack.namespace=$stack" | wc -l) +
    $($docker network ls -q --filter "label=com.docker.stack.namespace=$stack" | wc -l)))
}
for _ in $(seq 1 120); do [[ $(left) == 0 ]] && break; sleep 0.5; done
[[ $(left) == 0 ]] || fail "left 60 s after docker stack rm: $(left) containers and networks"
step "docker swarm leave --force"
$docker swarm leave --force >"$logs/leave.log" 2>&1 || fail "docker swarm leave failed: $(tail -n 1 "$logs/leave.log")"
state=$($docker info --format '{{.Swarm.LocalNodeState}}')
[[ $state == inactive ]] || fail "after swarm leave the node is $state"
echo "swarm_test: PASS (single-node swarm, overlay network; 100 gRPC + 50 HTTP answers identical to the in-process engine; 60 requests with encoder-1's task killed, 0 errors; encoder-1 and language-0 tasks replaced by the orchestrator ($failed_tasks shut down), 20 answers identical after, no leaks; nothing left; ${SECONDS} s)"
