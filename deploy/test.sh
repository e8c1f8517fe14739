#!/usr/bin/env bash
# Runs every mmserve test on this machine: installs missing packages, builds
# and tests everything with Bazel (CPU), compiles the CUDA backend when nvcc
# is installed, links and runs a fully static binary, then prints one closing
# line "tests: N passed, M failed". Exit status 0 only when all passed.
#
# Bazel keeps a disk cache under ~/.cache/mmserve so later runs are fast.
set -uo pipefail
cd "$(dirname "$0")/.."

deploy/install_deps.sh || exit 1

cache="${MMSERVE_BAZEL_CACHE:-$HOME/.cache/mmserve/bazel-disk}"
mkdir -p "$cache"
flags=(--disk_cache="$cache" --test_summary=short --color=no --curses=no)
out=$(mktemp)
trap 'rm -f "$out"' EXIT
extra=()

echo "== bazel test //... (CPU)"
bazel test "${flags[@]}" //... 2>&1 | tee "$out" | grep -vE '^(\[|INFO: From|Loading|Analyzing)'

echo "== static link (--config=static)"
if bazel test "${flags[@]}" --config=static //tests:link_smoke_test >/dev/null 2>&1; then
  extra+=("static link smoke=passed")
else
  bazel test "${flags[@]}" --config=static //tests:link_smoke_test 2>&1 | tail -20
  extra+=("static link smoke=failed")
fi

echo "== ./deploy/serve.sh: start, answer over gRPC and HTTP, reflection, SIGTERM, nothing left"
if deploy/serve_test.sh; then
  extra+=("serve.sh smoke=passed")
else
  extra+=("serve.sh smoke=failed")
fi

echo "== CUDA backend compiles (--config=cuda)"
nvcc="${CUDA_HOME:-/usr/local/cuda}/bin/nvcc"
if [[ -x "$nvcc" ]] || command -v nvcc >/dev/null; then
  if bazel build "${flags[@]}" --config=cuda //model/cuda/... >/dev/null 2>&1; then
    extra+=("cuda build=passed")
  else
    bazel build "${flags[@]}" --config=cuda //model/cuda/... 2>&1 | tail -20
    extra+=("cuda build=failed")
  fi
else
  echo "   nvcc not found: CUDA compile check skipped"
fi

echo "== summary"
python3 deploy/test_summary.py "$(bazel info "${flags[@]}" bazel-testlogs 2>/dev/null)" "$out" "${extra[@]}"
