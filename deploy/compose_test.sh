#!/usr/bin/env bash
# The docker-compose deployment, tested as a user runs it: installs docker.io
# and docker-compose if missing, starts dockerd if none runs (and stops only
# the one it started), builds the image (deploy/build_images.sh), brings
# deploy/docker-compose.yml up under its own project name, waits for every
# healthcheck and for the router to see 2 encoders and 1 language instance,
# then from the host with bench/loadgen:
#   1. 100 demo questions over gRPC and 100 over HTTP, every answer identical
#      to the in-process engine's (token ids too over gRPC);
#   2. 150 requests at 15 req/s, each with a new synthetic image, while one
#      encoder container is killed (docker kill): every request must
#      succeed; the encoder is started again, must rejoin and serve;
#   3. no block or live request left on any service (metrics);
# then `down -v` and checks that no container, network or volume of the
# project is left; then the same for deploy/docker-compose.pd.yml (encoder,
# prefill, decode with two TP ranks): 100 demo questions over gRPC identical
# to the in-process engine, no leaks, nothing left after `down -v`; then the
# same for deploy/docker-compose.elastic.yml (router --elastic, encoder, two
# elastic instances). Before any of that, even where no Docker engine runs,
# every compose file must pass `docker-compose config` and the elastic
# file's topology is checked (router --elastic, two --role=elastic instances
# with their own ids and addresses). Bounded to 10 minutes; prints its duration.
#
# MMSERVE_COMPOSE_IMAGE=dynamic (default) builds the image from the default
# configuration's binaries, which `bazel test //...` has already built;
# =static from --config=static binaries (deploy/build_images.sh --static: a
# second compile of the tree in that configuration).
#
# Last line: "compose_test: PASS (...)", "compose_test: FAIL <why>" or
# "compose_test: SKIPPED <why>" (no Docker engine can run here). Exit status
# 0, 1 and 77 respectively.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
source deploy/bounded.sh
bound_script compose_test 600 "$root/deploy/compose_test.sh" "$@"

docker=/usr/bin/docker  # Debian's client, which matches Debian's dockerd
dockerd=${MMSERVE_DOCKERD:-/usr/sbin/dockerd}
compose=(/usr/bin/docker-compose -f "$root/deploy/docker-compose.yml" -p "mmserve-ci-$$")
project="mmserve-ci-$$"
cache="${MMSERVE_BAZEL_CACHE:-$HOME/.cache/mmserve/bazel-disk}"
logs=$(mktemp -d /tmp/mmserve-compose-test-XXXXXX)
started_dockerd=""
brought_up=""
step() { printf '== [%3ds] %s\n' "$SECONDS" "$*"; }

cleanup() {
  if [[ -n "$brought_up" ]]; then
    "${compose[@]}" logs --no-color >"$logs/compose.log" 2>&1 || true
    "${compose[@]}" down -v --remove-orphans >/dev/null 2>&1 || true
  fi
  if [[ -n "$started_dockerd" ]]; then
    kill -TERM "$started_dockerd" 2>/dev/null || true
    for _ in $(seq 1 100); do kill -0 "$started_dockerd" 2>/dev/null || break; sleep 0.2; done
  fi
}
trap cleanup EXIT
trap 'exit 1' TERM INT
skip() { echo "compose_test: SKIPPED $* (${SECONDS} s)"; exit 77; }
fail() {
  echo "compose_test: FAIL $* (${SECONDS} s; logs in $logs)"
  exit 1
}

# 1. The engine.
busybox=/bin/busybox  # Debian's busybox-static: the probe container's programs
if ! [[ -x $dockerd && -x $docker && -x /usr/bin/docker-compose && -x $busybox ]]; then
  step "installing docker.io docker-compose busybox-static"
  if [[ $(id -u) != 0 ]]; then skip "docker.io/docker-compose/busybox-static are not installed and this is not root"; fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q docker.io docker-compose busybox-static >"$logs/apt.log" 2>&1 ||
    skip "apt-get install docker.io docker-compose busybox-static failed: $(tail -n 2 "$logs/apt.log" | tr '\n' ' ')"
fi
# 0. The compose files' configuration, without an engine.
step "static checks of the compose files"
for f in docker-compose.yml docker-compose.pd.yml docker-compose.elastic.yml; do
  if [[ -x /usr/bin/docker-compose ]]; then
    /usr/bin/docker-compose -f "$root/deploy/$f" config -q >"$logs/config.log" 2>&1 ||
      fail "docker-compose config refuses deploy/$f: $(tail -n 2 "$logs/config.log" | tr '\n' ' ')"
  fi
done
python3 - "$root/deploy/docker-compose.elastic.yml" >"$logs/elastic-config.log" 2>&1 <<'PY' ||
import sys
import yaml

services = yaml.safe_load(open(sys.argv[1]))["services"]
router = services["router"]["command"]
assert "--elastic" in router, "the router runs without --elastic"
elastic = {n: s for n, s in services.items() if "--role=elastic" in s.get("command", [])}
assert len(elastic) == 2, f"{len(elastic)} elastic instances, not 2"
ids, ports = set(), set()
for name, s in elastic.items():
    flags = dict(f.split("=", 1) for f in s["command"][1:] if "=" in f)
    assert flags.get("--instance_id") == name, f"{name}: --instance_id is not the service name"
    assert flags.get("--advertise", "").startswith(name + ":"), f"{name}: --advertise"
    assert flags.get("--router") == "router:50052", f"{name}: --router is not the internal plane"
    assert flags.get("--profile") == "tcp", f"{name}: containers need --profile=tcp"
    ids.add(flags["--instance_id"])
    ports.add(flags["--port"])
assert len(ids) == 2 and len(ports) == 2, "the elastic instances share an id or a port"
assert any("--role" not in " ".join(s["command"]) and "encoder" in s["command"][0]
           for s in services.values()), "no encoder"
PY
  fail "deploy/docker-compose.elastic.yml: $(tail -n 1 "$logs/elastic-config.log")"

if ! $docker info >/dev/null 2>&1; then
  [[ $(id -u) == 0 ]] || skip "no Docker engine answers and only root can start dockerd"
  step "starting dockerd"
  setsid "$dockerd" >"$logs/dockerd.log" 2>&1 &
  started_dockerd=$!
  for _ in $(seq 1 60); do
    $docker info >/dev/null 2>&1 && break
    kill -0 "$started_dockerd" 2>/dev/null || break
    sleep 0.5
  done
  if ! $docker info >/dev/null 2>&1; then
    why="no answer within 30 s"
    if ! kill -0 "$started_dockerd" 2>/dev/null; then
      wait "$started_dockerd"
      why="$dockerd exited with status $?"
      started_dockerd=""
    fi
    skip "dockerd does not start here ($why): $(grep -iE 'error|fatal|failed' "$logs/dockerd.log" | tail -n 2 | tr '\n' ' ')"
  fi
fi
# What the compose file needs of the engine, tried with a busybox container
# before anything of ours: a container runs (namespaces, overlay), under an
# init, with CPU and memory limits and a read-only bind mount, on a
# user-defined bridge network, with a port published on 127.0.0.1 that the
# host reaches, and a second container reaches the first by its name
# (Docker's DNS). An engine that cannot do one
# of these cannot run the stack: the test says which and counts as skipped.
probe_img="mmserve-probe-$$:latest"
probe_net="mmserve-probe-$$"
probe_port=50459
probe_cleanup() {
  $docker rm -f "mmserve-probe-srv-$$" >/dev/null 2>&1
  $docker network rm "$probe_net" >/dev/null 2>&1
  $docker rmi "$probe_img" >/dev/null 2>&1
}
probe_skip() {
  local what=$1
  probe_cleanup
  skip "the Docker engine here cannot $what: $(grep -v '^$' "$logs/probe.log" | tail -n 2 | tr '\n' ' ')"
}
step "probing the engine (limits, bind mount, bridge network, published port, DNS)"
probe=$(mktemp -d)
mkdir -p "$probe/bin"
cp -L "$busybox" "$probe/bin/busybox"
tar -C "$probe" -c . | $docker import - "$probe_img" >/dev/null 2>"$logs/probe.log"
rm -rf "$probe"
# The page comes from a read-only bind mount of a host folder, as the model
# does (an engine on another host would not see it).
www="$logs/www"
mkdir -p "$www"
echo "mmserve-probe-$$" >"$www/index.html"
chmod -R a+rX "$logs"
$docker run --rm --network none "$probe_img" /bin/busybox true >>"$logs/probe.log" 2>&1 ||
  probe_skip "run a container"
$docker network create "$probe_net" >>"$logs/probe.log" 2>&1 || probe_skip "create a bridge network"
$docker run -d --name "mmserve-probe-srv-$$" --network "$probe_net" --init --cpus 1.0 --memory 256m \
  -v "$www:/www:ro" -p "127.0.0.1:$probe_port:8080" "$probe_img" /bin/busybox httpd -f -p 8080 -h /www \
  >>"$logs/probe.log" 2>&1 ||
  probe_skip "start a container with an init, CPU and memory limits, a bind mount and a published port"
got=""
for _ in $(seq 1 20); do
  got=$(curl -s --max-time 2 "127.0.0.1:$probe_port/index.html") && [[ -n $got ]] && break
  sleep 0.5
done
[[ $got == "mmserve-probe-$$" ]] || { echo "curl 127.0.0.1:$probe_port got '$got'" >>"$logs/probe.log"; probe_skip "serve a bind-mounted file on a published port to the host"; }
# nc, not wget: busybox's wget crashes here in static glibc's resolver.
got=$($docker run --rm --network "$probe_net" "$probe_img" /bin/busybox sh -c \
  "printf 'GET /index.html HTTP/1.0\r\n\r\n' | /bin/busybox nc mmserve-probe-srv-$$ 8080" 2>>"$logs/probe.log")
grep -q "^mmserve-probe-$$" <<<"$got" || { echo "nc mmserve-probe-srv-$$ 8080 got '$got'" >>"$logs/probe.log"; false; } ||
  probe_skip "reach one container from another by its name"
probe_cleanup

# 2. Image and load generator.
image_mode=${MMSERVE_COMPOSE_IMAGE:-dynamic}
case "$image_mode" in
  dynamic) image_flags=(); bazel_config=() ;;
  static) image_flags=(--static); bazel_config=(--config=static) ;;
  *) fail "MMSERVE_COMPOSE_IMAGE must be dynamic or static, not '$image_mode'" ;;
esac
step "building the $image_mode image (deploy/build_images.sh ${image_flags[*]})"
deploy/build_images.sh "${image_flags[@]}" >"$logs/build_images.log" 2>&1 || { tail -n 20 "$logs/build_images.log"; fail "build_images.sh failed: $(tail -n 2 "$logs/build_images.log" | tr '\n' ' ')"; }
grep '^build_images.sh: built' "$logs/build_images.log"
step "building bench/loadgen"
# The image's configuration, so that Bazel keeps what it just built instead
# of switching configurations twice.
bazel build --disk_cache="$cache" "${bazel_config[@]}" --color=no --curses=no \
  //bench/loadgen:loadgen >"$logs/bazel.log" 2>&1 ||
  { tail -n 20 "$logs/bazel.log"; fail "bazel build //bench/loadgen:loadgen failed"; }
loadgen="$(bazel info "${bazel_config[@]}" bazel-bin 2>/dev/null)/bench/loadgen/loadgen"

# 3. Up, on ports nothing else here is likely to use.
export MMSERVE_GRPC_PORT=50451 MMSERVE_HTTP_PORT=8451 MMSERVE_ROUTER_METRICS_PORT=9450
export MMSERVE_ENCODER0_METRICS_PORT=9451 MMSERVE_ENCODER1_METRICS_PORT=9452
export MMSERVE_LANGUAGE_METRICS_PORT=9453
metrics_ports=9450,9451,9452,9453
step "docker-compose up (project $project)"
brought_up=1
"${compose[@]}" up -d >"$logs/up.log" 2>&1 ||
  { cat "$logs/up.log"; fail "docker-compose up failed: $(grep -v '^$' "$logs/up.log" | tail -n 2 | tr '\n' ' ')"; }
stack_state() {  # each container's state and health, one line
  $docker ps -a --filter "label=com.docker.compose.project=$project" \
    --format '{{.Label "com.docker.compose.service"}}={{.Status}}' | tr '\n' ' '
  echo -n "router sees: "
  curl -s "127.0.0.1:$MMSERVE_ROUTER_METRICS_PORT/metrics" | grep '^mmserve_router_healthy_instances' |
    sed 's/^mmserve_router_healthy_instances//' | tr '\n' ' '
}
first_error() {  # what loadgen said went wrong, one line
  grep -E '^(first error|errors|answers|identical|leaks)' "$logs/$1.out" | tr '\n' ' ' | cut -c1-250
  echo " (log $logs/$1.out)"
}
nothing_left() {  # no container, network or volume of $project after $1
  local c n v
  c=$($docker ps -a --filter "label=com.docker.compose.project=$project" -q | wc -l)
  n=$($docker network ls --filter "label=com.docker.compose.project=$project" -q | wc -l)
  v=$($docker volume ls --filter "label=com.docker.compose.project=$project" -q | wc -l)
  [[ "$c$n$v" == 000 ]] || fail "left after $1: $c containers, $n networks, $v volumes"
}
healthy() {  # all four containers healthy and the router sees 2 + 1 instances
  local n
  n=$($docker ps --filter "label=com.docker.compose.project=$project" --filter health=healthy -q | wc -l)
  [[ $n == 4 ]] || return 1
  local m
  m=$(curl -s "127.0.0.1:$MMSERVE_ROUTER_METRICS_PORT/metrics")
  grep -q '^mmserve_router_healthy_instances{role="encoder"} 2$' <<<"$m" &&
    grep -q '^mmserve_router_healthy_instances{role="language"} 1$' <<<"$m"
}
for _ in $(seq 1 240); do healthy && break; sleep 0.5; done
healthy || { "${compose[@]}" ps; fail "the stack was not healthy within 120 s: $(stack_state)"; }
step "healthy"

# 4. Answers over gRPC and HTTP against the in-process engine.
run_loadgen() {  # name, args...
  local name=$1
  shift
  "$loadgen" --eval_dir="$root/tools/demo/eval_set" --check=inprocess --fail_on_error \
    --label="compose $name" "$@" >"$logs/$name.out" 2>&1
  local rc=$?
  grep -E '^(answers|identical|leaks|first error)' "$logs/$name.out" | sed "s/^/   $name: /"
  grep -E '^(TTFT|E2E) ' "$logs/$name.out" | sed "s/^/   $name: /"
  tail -n 1 "$logs/$name.out" >"$logs/$name.json"
  return $rc
}
step "100 demo questions over gRPC"
run_loadgen grpc --target=router --address="127.0.0.1:$MMSERVE_GRPC_PORT" --num_requests=100 \
  --max_concurrency=8 || fail "gRPC answers: $(first_error grpc)"
step "100 demo questions over HTTP"
run_loadgen http --target=http --address="127.0.0.1:$MMSERVE_HTTP_PORT" --num_requests=100 \
  --max_concurrency=8 || fail "HTTP answers: $(first_error http)"

# 5. An encoder killed during a load: fresh synthetic images (every one a
# cache miss, so both encoders are busy when one dies).
encoded1() {  # images encoder-1 has encoded since it started
  curl -s "127.0.0.1:$MMSERVE_ENCODER1_METRICS_PORT/metrics" |
    sed -n 's/^mmserve_encoder_images_encoded_total //p'
}
start1=$(encoded1)
step "150 requests with a new 224x224 image each at 15 req/s; docker kill encoder-1 3 s into the load"
"$loadgen" --target=router --address="127.0.0.1:$MMSERVE_GRPC_PORT" --dataset=synthetic \
  --images=1 --image_width=224 --image_height=224 --prompt_tokens=16 --output_tokens=8 \
  --num_requests=150 --request_rate=15 --fail_on_error --label="compose kill" >"$logs/kill.out" 2>&1 &
load=$!
for _ in $(seq 1 120); do grep -q '^loadgen: sending' "$logs/kill.out" && break; sleep 0.5; done
sleep 3
# The kill must land in the load: encoder-1 has encoded some of its images.
now1=$(encoded1)
before=$((${now1:-0} - ${start1:-0}))
victim=$("${compose[@]}" ps -q encoder-1)
$docker kill "$victim" >/dev/null || fail "docker kill encoder-1"
wait "$load" || { grep -E '^(first error|requests|errors)' "$logs/kill.out"; fail "requests failed while an encoder was killed: $(first_error kill)"; }
grep -E '^(requests|TTFT|E2E) ' "$logs/kill.out" | sed 's/^/   kill: /'
[[ $before -ge 1 ]] || fail "encoder-1 had encoded no image of the load when it was killed (the kill missed the load)"
# Requests in flight on encoder-1, or placed there before the router saw it
# down, moved to encoder-0. How many depends on timing (none when the kill
# fell between two images), so it is reported, not required.
moved=$("${compose[@]}" logs --no-color router 2>/dev/null | grep -c 'leave encoder encoder-1')
images=$(curl -s "127.0.0.1:$MMSERVE_ENCODER0_METRICS_PORT/metrics" |
  sed -n 's/^mmserve_encoder_images_encoded_total //p')
step "every request succeeded; encoder-1 had encoded $before of its images when killed; $moved request(s) moved images off it; encoder-0 encoded ${images:-?} images; starting encoder-1 again"
"${compose[@]}" start encoder-1 >/dev/null 2>&1 || fail "docker-compose start encoder-1"
for _ in $(seq 1 120); do healthy && break; sleep 0.5; done
healthy || fail "encoder-1 did not rejoin within 60 s: $(stack_state)"
run_loadgen rejoined --target=router --address="127.0.0.1:$MMSERVE_GRPC_PORT" --num_requests=20 \
  --max_concurrency=4 --leak_ports="$metrics_ports" || fail "after the restart: $(first_error rejoined)"
served=$(curl -s "127.0.0.1:$MMSERVE_ENCODER1_METRICS_PORT/metrics" |
  sed -n 's/^mmserve_encoder_images_encoded_total //p')
step "encoder-1 rejoined and encoded ${served:-?} images; no leaks"

# 6. Down, and nothing left.
step "docker-compose down -v"
"${compose[@]}" down -v --remove-orphans >"$logs/down.log" 2>&1 || fail "docker-compose down failed"
brought_up=""
nothing_left "down -v"

# 7 and 8. The other files, each brought up alone: four containers
# healthy and the router seeing each "role=count" of $4, $5 demo questions
# over gRPC identical to the in-process engine with no leak on the metrics
# ports $6, then down -v and nothing left. $1 names the project and logs,
# $2 is the file, $3 says what it runs.
healthy_with() {
  local n m rc
  n=$($docker ps --filter "label=com.docker.compose.project=$project" --filter health=healthy -q | wc -l)
  [[ $n == 4 ]] || return 1
  m=$(curl -s "127.0.0.1:$MMSERVE_ROUTER_METRICS_PORT/metrics")
  for rc in $1; do
    grep -q "^mmserve_router_healthy_instances{role=\"${rc%=*}\"} ${rc#*=}\$" <<<"$m" || return 1
  done
}
other_file() {
  local name=$1 file=$2 what=$3 roles=$4 questions=$5 leak_ports=$6
  project="mmserve-ci-$name-$$"
  compose=(/usr/bin/docker-compose -f "$root/deploy/$file" -p "$project")
  step "$file up (project $project: $what)"
  brought_up=1
  "${compose[@]}" up -d >"$logs/up-$name.log" 2>&1 ||
    { cat "$logs/up-$name.log"; fail "$file up failed: $(grep -v '^$' "$logs/up-$name.log" | tail -n 2 | tr '\n' ' ')"; }
  for _ in $(seq 1 240); do healthy_with "$roles" && break; sleep 0.5; done
  healthy_with "$roles" || { "${compose[@]}" ps; fail "the $name stack was not healthy within 120 s: $(stack_state)"; }
  step "$questions demo questions over gRPC ($what)"
  run_loadgen "$name" --target=router --address="127.0.0.1:$MMSERVE_GRPC_PORT" \
    --num_requests="$questions" --max_concurrency=8 --leak_ports="$leak_ports" ||
    fail "$name answers: $(first_error "$name")"
  step "$file down -v"
  "${compose[@]}" down -v --remove-orphans >"$logs/down-$name.log" 2>&1 || fail "$file down failed"
  brought_up=""
  nothing_left "the $name down -v"
}
# 7. The disaggregated file: router, encoder, prefill, decode with two ranks;
# KV and embeddings over UCX tcp between containers.
export MMSERVE_PREFILL_METRICS_PORT=9454 MMSERVE_DECODE_METRICS_PORT=9455
other_file pd docker-compose.pd.yml "encoder, prefill, decode --tp=2; KV over UCX tcp" \
  "encoder=1 prefill=1 decode=1" 100 \
  "9450,9451,$MMSERVE_PREFILL_METRICS_PORT,$MMSERVE_DECODE_METRICS_PORT"
# 8. The elastic file: router --elastic, encoder, two elastic instances (the
# demo questions fit one instance each: degree 1 through the manager).
export MMSERVE_ELASTIC0_METRICS_PORT=9456 MMSERVE_ELASTIC1_METRICS_PORT=9457
other_file elastic docker-compose.elastic.yml "encoder, 2 elastic instances, router --elastic" \
  "encoder=1 elastic=2" 40 \
  "9450,9451,$MMSERVE_ELASTIC0_METRICS_PORT,$MMSERVE_ELASTIC1_METRICS_PORT"

size=$($docker image inspect -f '{{.Size}}' mmserve:latest)
rm -rf "$logs"  # kept only when something failed
echo "compose_test: PASS ($image_mode image $((size / 1024 / 1024)) MiB; 100 gRPC + 100 HTTP answers identical to the in-process engine; 150 requests with encoder-1 killed, 0 errors ($moved moved); P/D file (decode --tp=2): 100 answers identical; elastic file: 40 answers identical; nothing left; ${SECONDS} s)"
