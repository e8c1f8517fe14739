#!/usr/bin/env bash
# Runs Bazel tests under ASan + UBSan (--config=asan in .bazelrc: gcc,
# -fsanitize=address,undefined, UBSan findings and leaks fail the test). The
# config's --platform_suffix keeps its outputs and test logs in
# bazel-out/k8-fastbuild-asan, beside the normal build's; no convenience
# symlinks are touched (--symlink_prefix=/). Same output base on purpose: a
# second one would load the bazel-<workspace> symlink as packages under //...
#   tools/asan/run_asan_tests.sh [bazel test flags] [targets, default //...]
#   tools/asan/run_asan_tests.sh --testlogs   # prints the test log folder
set -uo pipefail
cd "$(dirname "$0")/../.."
flags=(--config=asan --symlink_prefix=/)
# Tests only: benchmarks and tools are built (and their code tested) by the
# normal run; under ASan they would only cost a cold CI run their compile time.
# Tests tagged no_asan are timing checks of benchmark references (peaks,
# bandwidth) that mean nothing at -O0 under ASan.
test_flags=(--build_tests_only --test_tag_filters=-no_asan)
if [[ "${1:-}" == "--testlogs" ]]; then
  exec bazel info "${flags[@]}" bazel-testlogs 2>/dev/null
fi
args=("$@")
has_target=0
for a in "${args[@]}"; do [[ "$a" == //* || "$a" == -//* ]] && has_target=1; done
[[ $has_target -eq 1 ]] || args+=(//...)
exec bazel test "${flags[@]}" "${test_flags[@]}" "${args[@]}"
