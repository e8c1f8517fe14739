# Sourced by the experiment scripts (disagg_experiment.sh, elastic_experiment.sh):
# a fresh launcher stack per run on ports the launcher picks (--port=0),
# the demo model (or $model_dir: a text model, whose encoder then serves the
# demo's vision tower), one encoder, UCX shm, no HTTP, no restarts.
#
#   bin=...; out=$(mktemp -d ...); source bench/loadgen/stack_lib.sh
#   stack_start NAME [launcher flags...]  # sets $launcher, $address, $ports
#   ...                                   # (exits 1 if it does not come up)
#   stack_stop
#
# Sets an EXIT trap that stops a stack still running and removes $out.
launcher=
stack_cleanup() {
  if [[ -n "$launcher" ]]; then kill -TERM "$launcher" 2>/dev/null || true; wait "$launcher" || true; fi
  rm -rf "$out"
}
trap stack_cleanup EXIT

stack_start() {
  local name=$1
  shift
  local demo="$PWD/models/shapes-demo" enc=()
  [[ "${model_dir:-$demo}" == "$demo" ]] || enc=(--encoder_flags=--model_dir="$demo")
  rm -f "$out/launch.out"
  "$bin/deploy/launcher/mmserve_launch" --model_dir="${model_dir:-$demo}" --encoders=1 "${enc[@]}" \
    --profile=shm --port=0 --http_port=-1 --log_dir="$out" --restart=false "$@" \
    >"$out/launch.out" 2>"$out/launch.err" &
  launcher=$!
  for _ in $(seq 1 240); do grep -q '^READY' "$out/launch.out" 2>/dev/null && break; sleep 0.5; done
  address=$(sed -n 's/^READY launcher stack grpc=\([^ ]*\) .*/\1/p' "$out/launch.out")
  if [[ -z "$address" ]]; then
    echo "$(basename "$0"): the $name stack did not come up:" >&2
    cat "$out/launch.err" >&2
    exit 1
  fi
  # Every service's metrics port: loadgen checks that no block leaked.
  ports=$(sed -n 's/.*metrics :\([0-9]*\)$/\1/p' "$out/launch.out" | paste -sd, -)
}

stack_stop() {
  kill -TERM "$launcher"
  wait "$launcher" || true
  launcher=
}
