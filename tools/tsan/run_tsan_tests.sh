#!/bin/bash
# Runs Bazel tests under ThreadSanitizer with Debian's abseil made visible to
# it: builds absl_sync_tsan_shim.so (LD_PRELOADed into every test and the
# processes it spawns) and applies suppressions.txt, and turns off UCX's
# memory hooks (libucm's madvise hook runs in exiting threads after TSan tore
# their state down: SIGSEGV in __tsan::MutexPreReadLock from ucm_madvise).
#
# Default targets: transfer/ and the services' threading that TSan can judge:
# the encoder's embedding cache, the router's instance table and its calls'
# deferred actions, the metrics registry (callbacks, scrapes) and its HTTP
# exporter, each with a test that hammers it from several threads.
#
# Not by default: the stack tests (//tests:stack_fault_test passes its 1613
# assertions under TSan but takes ~8 minutes on 2 cores, and its router,
# encoder, language and test processes report hundreds of races, every one
# with a frame of Debian's uninstrumented gRPC or abseil internals, e.g.
# OnCancel vs OnDone of one reactor, which gRPC orders with an atomic
# refcount inside libgrpc++ that TSan cannot see). The gRPC-driven code
# (common/server_stream, GenerateCall, the services' reactors, the launcher)
# needs an instrumented gRPC before TSan can say anything about it; pass
# //tests:stack_fault_test explicitly to see the reports (likewise
# //router:generate_call_test: its 96 assertions pass under TSan, and each of
# its ~70 reports has a frame of libgrpc, libgpr, libupb or Debian's abseil).
#
# Every process writes its reports to $out/reports/<run>/tsan.<pid>
# (TSAN_OPTIONS log_path), so a race in a spawned service process is not
# lost in its log: the run fails when any report file exists, even if every
# test passed, and prints the first lines of each.
#
# Uses its own output base, per user and per checkout
# (${TMPDIR:-/tmp}/mmserve_tsan-<user>-<hash of the checkout path>), so the
# tsan build neither evicts the normal one nor collides with another
# checkout's run. No convenience symlinks (--symlink_prefix=/): bazel-<workspace>
# pointing into this output base would make the next plain `bazel test //...`
# descend into it. history_size=7 keeps the stacks of earlier accesses, which
# suppressions need to match.
#   tools/tsan/run_tsan_tests.sh [bazel flags] [targets]
#   tools/tsan/run_tsan_tests.sh --testlogs   # prints the test log folder
#   MMSERVE_BAZEL_CACHE=... (default ~/.cache/mmserve/bazel-disk)
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
out="${TMPDIR:-/tmp}/mmserve_tsan-$(id -un)-$(printf '%s' "$root" | md5sum | cut -c1-8)"
cache="${MMSERVE_BAZEL_CACHE:-$HOME/.cache/mmserve/bazel-disk}"
mkdir -p "$out" "$cache"
if [[ "${1:-}" == "--testlogs" ]]; then
  cd "$root" && exec bazel --output_base="$out/output_base" info --config=tsan --symlink_prefix=/ \
    bazel-testlogs 2>/dev/null
fi
g++ -O1 -fPIC -shared -fsanitize=thread -o "$out/absl_sync_tsan_shim.so" \
  "$here/absl_sync_tsan_shim.cc" -ldl || exit 1
reports="$out/reports/$(date +%Y%m%d-%H%M%S)-$$"
mkdir -p "$reports"
args=("$@")
has_target=0
for a in "${args[@]}"; do [[ "$a" == //* || "$a" == -//* ]] && has_target=1; done
if [[ $has_target -eq 0 ]]; then
  args+=(//transfer/... //encoder_service:embedding_cache_test //router:instance_table_test
    //router:deferred_actions_test //common:metrics_test //common:metrics_http_test
    //common:event_loop_test //common:worker_pool_test)
fi
cd "$root"
bazel --output_base="$out/output_base" test --config=tsan --symlink_prefix=/ \
  --disk_cache="$cache" \
  --test_env=LD_PRELOAD="$out/absl_sync_tsan_shim.so" \
  --test_env=UCX_MEM_MMAP_HOOK_MODE=none --test_env=UCX_MEM_MALLOC_HOOKS=no \
  --test_env=TSAN_OPTIONS="suppressions=$here/suppressions.txt halt_on_error=0 history_size=7 log_path=$reports/tsan" \
  "${args[@]}"
rc=$?
found=$(ls "$reports" 2>/dev/null | wc -l)
if [[ $found -gt 0 ]]; then
  for f in "$reports"/*; do
    echo "== TSan report $f"
    grep -E '^(WARNING|SUMMARY|    #[0-3] )' "$f" | head -40
  done
  echo "run_tsan_tests: $found process(es) reported races; full reports in $reports" >&2
  [[ $rc -eq 0 ]] && rc=1
else
  echo "run_tsan_tests: no TSan reports ($reports is empty)"
fi
exit $rc
