#!/usr/bin/env bash
# Alternates a benchmark between two builds on the same machine, A then B,
# `rounds` times, and prints each run's last JSON line tagged with its side:
# the before/after comparison a refactor owes, with the noise of a
# shared machine spread over both sides.
#
#   tools/ab_bench.sh /work/wt/before /work/main 3 bench/lm_bench --dims=qwen2-0.5b
#
# Each side is a checkout whose bazel-out/k8-opt/bin holds the benchmark built with
# --config=opt; the benchmark runs from that checkout's root (runfiles and
# models/ resolve there).
set -euo pipefail
a=$1 b=$2 rounds=$3 bin=$4
shift 4
for ((i = 1; i <= rounds; i++)); do
  for side in A B; do
    dir=$a
    [[ $side == B ]] && dir=$b
    line=$(cd "$dir" && "bazel-out/k8-opt/bin/$bin" "$@" 2>/dev/null | tail -n 1)
    echo "$side $i $line"
  done
done
