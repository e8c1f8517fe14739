#!/bin/bash
# Runs Bazel tests under ThreadSanitizer with Debian's abseil made visible to
# it: builds absl_sync_tsan_shim.so (LD_PRELOADed into every test and the
# processes it spawns) and applies suppressions.txt, and turns off UCX's
# memory hooks (libucm's madvise hook runs in exiting threads after TSan tore
# their state down: SIGSEGV in __tsan::MutexPreReadLock from ucm_madvise). Uses
# its own output base so the tsan build does not evict the normal one.
# No convenience symlinks (--symlink_prefix=/): bazel-<workspace> pointing
# into this output base would make the next plain `bazel test //...` descend
# into it. history_size=7 keeps the stacks of earlier accesses, which suppressions
# need to match.
#   tools/tsan/run_tsan_tests.sh //transfer/...
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="${TMPDIR:-/tmp}/mmserve_tsan"
mkdir -p "$out"
g++ -O1 -fPIC -shared -fsanitize=thread -o "$out/absl_sync_tsan_shim.so" \
  "$here/absl_sync_tsan_shim.cc" -ldl
cd "$here/../.."
exec bazel --output_base="$out/output_base" test --config=tsan --symlink_prefix=/ \
  --test_env=LD_PRELOAD="$out/absl_sync_tsan_shim.so" \
  --test_env=UCX_MEM_MMAP_HOOK_MODE=none --test_env=UCX_MEM_MALLOC_HOOKS=no \
  --test_env=TSAN_OPTIONS="suppressions=$here/suppressions.txt halt_on_error=0 history_size=7" \
  "${@:-//transfer/...}"
