#!/usr/bin/env bash
# Builds every libFuzzer target (//fuzz, tag fuzz_target) with clang, ASan and
# UBSan (--config=fuzz, own output base) and runs each for SECONDS on top of
# its committed corpus fuzz/corpus/<name> (plus dicts/<name>.dict when
# present). New inputs go to a scratch corpus, never into the repository.
#
#   tools/fuzz/run_all.sh SECONDS [TARGET_NAME...]
#
# Prints one line per target: "fuzz <name>: passed|failed, <runs> runs in <s> s
# (<exec/s> exec/s), cov <c> ft <f>, corpus <n>" and exits 1 if any target
# found a crash, leak, timeout or broken property; the reproducer is kept
# under $FUZZ_OUT/<name>/ (crash-*, leak-*, timeout-*) with the log. A crash
# becomes a regression test by copying the reproducer into
# fuzz/corpus/<name>/ with the fix: <name>_corpus_test replays it.
#
# The clang build has its own output base, per user and per checkout
# (${TMPDIR:-/tmp}/mmserve_fuzz-<user>-<hash of the checkout path>), so that
# two checkouts never share (and fight over) one.
#
# Environment: FUZZ_OUT (default <that folder>/runs),
# FUZZ_JOBS (targets run at once, default 1), FUZZ_RSS_MB (default 2048),
# MMSERVE_BAZEL_CACHE (disk cache, default ~/.cache/mmserve/bazel-disk).
set -uo pipefail
seconds="${1:?usage: run_all.sh SECONDS [TARGET_NAME...]}"
shift
cd "$(dirname "$0")/../.."
root="$PWD"
base="${TMPDIR:-/tmp}/mmserve_fuzz-$(id -un)-$(printf '%s' "$root" | md5sum | cut -c1-8)"
out="${FUZZ_OUT:-$base/runs}"
cache="${MMSERVE_BAZEL_CACHE:-$HOME/.cache/mmserve/bazel-disk}"
mkdir -p "$out" "$cache"

bazel_fuzz=(bazel --output_base="$base/output_base")
flags=(--config=fuzz --disk_cache="$cache" --symlink_prefix=/ --color=no --curses=no)
if [[ $# -gt 0 ]]; then
  targets=("$@")
else
  mapfile -t targets < <("${bazel_fuzz[@]}" query 'attr(tags, fuzz_target, kind(cc_binary, //fuzz:*))' \
    2>/dev/null | sed 's|^//fuzz:||')
fi
if [[ ${#targets[@]} -eq 0 ]]; then
  echo "run_all: no fuzz targets found" >&2
  exit 1
fi
if ! "${bazel_fuzz[@]}" build "${flags[@]}" "${targets[@]/#///fuzz:}" >"$out/build.log" 2>&1; then
  tail -30 "$out/build.log"
  echo "run_all: the fuzz build failed (log: $out/build.log)" >&2
  exit 1
fi
bin="$("${bazel_fuzz[@]}" info "${flags[@]}" bazel-bin 2>/dev/null)/fuzz"

run_one() {
  local name="$1" dir="$out/$1"
  rm -rf "$dir"
  mkdir -p "$dir/corpus"
  local args=(-max_total_time="$seconds" -rss_limit_mb="${FUZZ_RSS_MB:-2048}" -timeout=10
    -print_final_stats=1 -artifact_prefix="$dir/")
  [[ -f "fuzz/dicts/$name.dict" ]] && args+=(-dict="fuzz/dicts/$name.dict")
  # Targets read their data (e.g. the test tokenizer) relative to the root.
  ASAN_OPTIONS="detect_leaks=1:allocator_may_return_null=1" \
    UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1" \
    "$bin/$name" "${args[@]}" "$dir/corpus" "fuzz/corpus/$name" >"$dir/log" 2>&1
  local rc=$?
  local runs cov ft eps
  runs=$(grep -oE 'stat::number_of_executed_units: *[0-9]+' "$dir/log" | grep -oE '[0-9]+$')
  eps=$(grep -oE 'stat::average_exec_per_sec: *[0-9]+' "$dir/log" | grep -oE '[0-9]+$')
  cov=$(grep -oE 'cov: [0-9]+' "$dir/log" | tail -1 | grep -oE '[0-9]+')
  ft=$(grep -oE 'ft: [0-9]+' "$dir/log" | tail -1 | grep -oE '[0-9]+')
  local found=$(ls "$dir"/crash-* "$dir"/leak-* "$dir"/timeout-* "$dir"/oom-* 2>/dev/null | head -1)
  local result=passed
  if [[ $rc -ne 0 || -n "$found" ]]; then
    result=failed
  fi
  echo "fuzz $name: $result, ${runs:-?} runs in $seconds s (${eps:-?} exec/s), cov ${cov:-?} ft ${ft:-?}, corpus $(ls "$dir/corpus" | wc -l) new + $(ls "fuzz/corpus/$name" | wc -l) seeds${found:+, reproducer $found}"
  [[ $result == passed ]]
}

jobs="${FUZZ_JOBS:-1}"
status=0
pids=()
for name in "${targets[@]}"; do
  run_one "$name" >"$out/$name.result" &
  pids+=($!)
  if [[ ${#pids[@]} -ge $jobs ]]; then
    wait "${pids[0]}" || status=1
    pids=("${pids[@]:1}")
  fi
done
for pid in "${pids[@]}"; do wait "$pid" || status=1; done
for name in "${targets[@]}"; do cat "$out/$name.result"; done
exit $status
