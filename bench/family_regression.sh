#!/usr/bin/env bash
# Qwen2-VL's figures before and after a change, in one run: builds
# //bench:lm_bench and //bench:vision_bench (--config=opt) at an older
# commit (in a git worktree of it) and at this checkout, runs both on
# Qwen2-VL-2B's dimensions (random bf16 weights) in alternation, old then
# new, `rounds` times, so that both sides see the same machine load, and
# prints one JSON line: each side's runs and median per figure and the ratio
# new/old of the medians (for rates, > 1 is faster; for times, < 1 is
# faster).
#
#   bench/family_regression.sh <old-commit> [rounds] [--disk_cache=...]
#   BENCHES=vision_bench bench/family_regression.sh ...   # one of the two
#
# The old checkout is kept in $TMPDIR/mmserve-before-<commit> for the next
# run. A shared machine's load moves every figure: read the ratios with the
# load average, which the JSON carries at the start and the end.
set -euo pipefail
old=${1:?usage: bench/family_regression.sh <old-commit> [rounds] [bazel flags...]}
rounds=${2:-3}
shift $(($# >= 2 ? 2 : 1))
root=$(git rev-parse --show-toplevel)
sha=$(git -C "$root" rev-parse --short=12 "$old^{commit}")
before=${TMPDIR:-/tmp}/mmserve-before-$sha
[[ -d $before ]] || git -C "$root" worktree add --detach "$before" "$sha" >&2
targets=(//bench:lm_bench //bench:vision_bench)
for dir in "$before" "$root"; do
  (cd "$dir" && bazel build --config=opt "$@" "${targets[@]}" >&2)
done
# Short runs: the ratio is what matters, and each round runs both sides.
lm_args=(--dims=qwen2-vl-2b --pp=64 --tg=16 --batch=4 --reps=1)
vision_args=(--sizes=448 --depth=8)
out=$(mktemp)
trap 'rm -f "$out" "$out.cpu"' EXIT
load0=$(cut -d' ' -f1-3 /proc/loadavg)
for ((i = 1; i <= rounds; i++)); do
  for side in old new; do
    dir=$before
    [[ $side == new ]] && dir=$root
    for bin in ${BENCHES:-lm_bench vision_bench}; do
      args=("${lm_args[@]}")
      [[ $bin == vision_bench ]] && args=("${vision_args[@]}")
      # The process's CPU seconds (user + system) beside its own figures:
      # less moved by other processes' load than wall-clock times are.
      line=$(cd "$dir" && /usr/bin/time -f "cpu_s %U %S" -o "$out.cpu" \
        "bazel-out/k8-opt/bin/bench/$bin" "${args[@]}" 2>/dev/null | tail -n 1)
      echo "$side $bin $(awk '/^cpu_s/ {print $2 + $3}' "$out.cpu") $line" >>"$out"
    done
  done
done
load1=$(cut -d' ' -f1-3 /proc/loadavg)
/usr/bin/python3 - "$out" "$sha" "$(git -C "$root" rev-parse --short=12 HEAD)" "$load0" \
  "$load1" <<'EOF'
import json, statistics, sys

path, old_sha, new_sha, load0, load1 = sys.argv[1:]
figures = {"old": {}, "new": {}}
for line in open(path):
    side, bin, cpu_s, text = line.split(" ", 3)
    row = json.loads(text)
    got = {bin + "_process_cpu_s": float(cpu_s)}
    if bin == "lm_bench":
        for k, v in row.items():
            if k.endswith("_tok_s") or k == "tg_step_ms":
                got["lm_" + k] = v
    else:
        for s in row["sizes"]:
            for k, v in s.items():
                if k.endswith("_ms") or k.endswith("_share") or k == "kernel_gflops":
                    got["vision_%d_%s" % (s["size"], k)] = v
    for k, v in got.items():
        figures[side].setdefault(k, []).append(float(v))
report = {"bench": "family_regression", "dims": "qwen2-vl-2b", "old": old_sha, "new": new_sha,
          "loadavg_start": load0, "loadavg_end": load1, "figures": {}}
for k in sorted(set(figures["new"]) & set(figures["old"])):
    o, n = statistics.median(figures["old"][k]), statistics.median(figures["new"][k])
    report["figures"][k] = {"old": o, "new": n, "new_over_old": round(n / o, 3) if o else None,
                            "old_runs": figures["old"][k], "new_runs": figures["new"][k]}
print(json.dumps(report))
EOF
