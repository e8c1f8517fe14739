#!/usr/bin/env bash
# Runs every mmserve test on this machine: installs missing packages, builds
# and tests everything with Bazel (CPU), compiles the CUDA backend when nvcc
# is installed, links and runs a fully static binary, runs the whole suite
# again under ASan + UBSan (leaks fail), runs transfer/ and the services'
# threading under TSan, brings the docker-compose deployment up and tests it
# (deploy/compose_test.sh), deploys the same topology as a Docker Swarm
# stack on a single-node swarm of its own and tests it
# (deploy/swarm_test.sh), runs every fuzz target for
# FUZZ_SECONDS (default 20) on top of its committed corpus, then prints one
# closing line "tests: N passed, M failed". Exit status 0 only when all passed.
# MMSERVE_SKIP_ASAN=1 / MMSERVE_SKIP_TSAN=1 / MMSERVE_SKIP_FUZZ=1 /
# MMSERVE_SKIP_COMPOSE=1 / MMSERVE_SKIP_SWARM=1 / MMSERVE_SKIP_AVX2=1 skip those steps (reported as skipped, never as
# passed).
#
# Bazel keeps a disk cache under ~/.cache/mmserve so later runs are fast.
set -uo pipefail
cd "$(dirname "$0")/.."

deploy/install_deps.sh || exit 1

cache="${MMSERVE_BAZEL_CACHE:-$HOME/.cache/mmserve/bazel-disk}"
mkdir -p "$cache"
flags=(--disk_cache="$cache" --test_summary=short --color=no --curses=no)
out=$(mktemp)
asan_out=$(mktemp)
tsan_out=$(mktemp)
avx2_out=$(mktemp)
trap 'rm -f "$out" "$asan_out" "$tsan_out" "$avx2_out"' EXIT
extra=()
runs=()

# Each step's heading carries the minutes and seconds spent so far.
phase() { printf '== [%dm%02ds] %s\n' $((SECONDS / 60)) $((SECONDS % 60)) "$1"; }

phase "bazel test //... (CPU)"
bazel test "${flags[@]}" //... 2>&1 | tee "$out" | grep -vE '^(\[|INFO: From|Loading|Analyzing)'

phase "static link (--config=static)"
if bazel test "${flags[@]}" --config=static //tests:link_smoke_test >/dev/null 2>&1; then
  extra+=("static link smoke=passed")
else
  bazel test "${flags[@]}" --config=static //tests:link_smoke_test 2>&1 | tail -20
  extra+=("static link smoke=failed")
fi

phase "./deploy/serve.sh: start, answer over gRPC and HTTP, reflection, SIGTERM, nothing left"
if deploy/serve_test.sh; then
  extra+=("serve.sh smoke=passed")
else
  extra+=("serve.sh smoke=failed")
fi

phase "docs: every page's runnable blocks against a stack, links, paths in docs and comments, generated references (tools/docs_test.py)"
if /usr/bin/python3 tools/docs_test.py; then
  extra+=("docs test=passed")
else
  extra+=("docs test=failed")
fi

# A deploy test (compose_test.sh, swarm_test.sh) as one summary row: its
# last line carries the reason of a failure or skip, so that it is in the
# part of the output CI shows. Exit status 77 is a skip.
deploy_step() {  # row name, script, skip variable
  local name=$1 script=$2 skip_var=$3 log rc why
  if [[ "${!skip_var:-0}" == 1 ]]; then
    extra+=("$name=skipped")
    return
  fi
  log=$(mktemp)
  "$script" 2>&1 | tee "$log"
  rc=${PIPESTATUS[0]}
  why=$(tail -n 1 "$log" | sed -E 's/^[a-z_]+: (FAIL|SKIPPED) //; s/=/:/g' | cut -c1-300)
  rm -f "$log"
  case $rc in
    0) extra+=("$name=passed") ;;
    77) extra+=("$name ($why)=skipped") ;;  # no Docker engine (or swarm) can run here
    *) extra+=("$name ($why)=failed") ;;
  esac
}

phase "docker-compose: deploy/compose_test.sh (images, up, answers, encoder kill, down -v)"
deploy_step compose deploy/compose_test.sh MMSERVE_SKIP_COMPOSE

phase "docker swarm: deploy/swarm_test.sh (own engine, swarm init, stack deploy, answers, task kills, stack rm, swarm leave)"
deploy_step swarm deploy/swarm_test.sh MMSERVE_SKIP_SWARM

phase "CUDA backend compiles (--config=cuda)"
nvcc="${CUDA_HOME:-/usr/local/cuda}/bin/nvcc"
if [[ -x "$nvcc" ]] || command -v nvcc >/dev/null; then
  if bazel build "${flags[@]}" --config=cuda //model/cuda/... //worker/nccl/... >/dev/null 2>&1; then
    extra+=("cuda build=passed")
  else
    bazel build "${flags[@]}" --config=cuda //model/cuda/... //worker/nccl/... 2>&1 | tail -20
    extra+=("cuda build=failed")
  fi
else
  echo "   nvcc not found: CUDA compile check skipped"
fi

phase "ASan + UBSan: bazel test --config=asan //... (tools/asan/run_asan_tests.sh)"
if [[ "${MMSERVE_SKIP_ASAN:-0}" == 1 ]]; then
  extra+=("asan suite=skipped")
else
  # A stack test (real processes, timing under load) gets a second attempt
  # under ASan; the summary lists it as FLAKY with its first attempt's reason.
  tools/asan/run_asan_tests.sh "${flags[@]}" --flaky_test_attempts='//tests:.*stack.*@2' 2>&1 |
    tee "$asan_out" |
    grep -E '^//.* (FAILED|TIMEOUT|NO STATUS|INCOMPLETE|FLAKY)|^Executed|^ERROR' || true
  runs+=("--run=asan,$asan_out,$(tools/asan/run_asan_tests.sh --testlogs)")
fi

phase "TSan: transfer/ and the services' threading (tools/tsan/run_tsan_tests.sh)"
if [[ "${MMSERVE_SKIP_TSAN:-0}" == 1 ]]; then
  extra+=("tsan suite=skipped")
else
  tools/tsan/run_tsan_tests.sh "${flags[@]}" >"$tsan_out" 2>&1
  grep -E '^//.* (FAILED|TIMEOUT|NO STATUS|INCOMPLETE)|^Executed|^ERROR|^== TSan report|^run_tsan_tests' \
    "$tsan_out" || true
  runs+=("--run=tsan,$tsan_out,$(tools/tsan/run_tsan_tests.sh --testlogs)")
  # A race reported by any process fails the run even when its test passed.
  if grep -q '^run_tsan_tests: no TSan reports' "$tsan_out"; then
    extra+=("tsan reports=passed")
  else
    extra+=("tsan reports=failed")
  fi
fi

phase "fuzz targets, ${FUZZ_SECONDS:-20} s each (tools/fuzz/run_all.sh)"
if [[ "${MMSERVE_SKIP_FUZZ:-0}" == 1 ]]; then
  extra+=("fuzz=skipped")
else
  fuzz_lines=$(MMSERVE_BAZEL_CACHE="$cache" FUZZ_JOBS=2 tools/fuzz/run_all.sh "${FUZZ_SECONDS:-20}" 2>&1)
  echo "$fuzz_lines" | sed 's/^/   /'
  results=$(echo "$fuzz_lines" | sed -nE 's/^fuzz ([a-z0-9_]+): (passed|failed),.*/fuzz \1=\2/p')
  if [[ -z "$results" ]]; then
    extra+=("fuzz build=failed")
  else
    while IFS= read -r r; do extra+=("$r"); done <<<"$results"
  fi
fi

# The kernels pick the widest instruction set at start (model/cpu/cpu_isa.h);
# the packages whose results depend on them run once more on the AVX2 ones.
phase "AVX2 kernels forced: bazel test --test_env=MMSERVE_CPU_ISA=avx2 (model, worker, services)"
if [[ "${MMSERVE_SKIP_AVX2:-0}" == 1 ]]; then
  extra+=("avx2 kernels=skipped")
else
  bazel test "${flags[@]}" --test_env=MMSERVE_CPU_ISA=avx2 //model/... //worker/... \
    //encoder_service/... //language_service/... >"$avx2_out" 2>&1
  grep -E '^//.* (FAILED|TIMEOUT|NO STATUS|INCOMPLETE)|^Executed|^ERROR' "$avx2_out" || true
  runs+=("--run=avx2,$avx2_out,$(bazel info "${flags[@]}" bazel-testlogs 2>/dev/null)")
fi

phase "summary"
python3 deploy/test_summary.py "$(bazel info "${flags[@]}" bazel-testlogs 2>/dev/null)" "$out" \
  "${runs[@]}" "${extra[@]}"
