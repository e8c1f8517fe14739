#!/usr/bin/env bash
# mmserve's lm_bench side by side with llama.cpp on the same machine, in one
# run. A benchmark, not part of .ci/run.
#
#   bench/peer/llamacpp_side_by_side.sh            # 3 rounds, 2 threads
#   ROUNDS=1 THREADS=2 bench/peer/llamacpp_side_by_side.sh
#   DIMS=qwen2-vl-2b bench/peer/llamacpp_side_by_side.sh   # rows K-quants take whole
#
# 1. llama.cpp from the PyPI llama-cpp-python sdist's vendored tree (the only
#    download: `pip download --no-binary :all: --no-deps`), built with cmake
#    -DGGML_NATIVE=ON (otherwise its defaults), targets llama-bench,
#    llama-batched-bench and llama-quantize, into $CACHE (default
#    $HOME/.cache/mmserve/llamacpp; kept between runs);
# 2. random weights at DIMS (default qwen2-0.5b; lm_bench's --dims: the same
#    shapes and value distribution) written as GGUF bf16, f16, Q8_0 and Q4_0
#    by tools/llamacpp_gguf.py with the tree's own gguf-py, and Q4_K by the
#    tree's llama-quantize --pure from the bf16 file (gguf-py has no K-quant
#    quantizer). K-quants take rows in blocks of 256: at qwen2-0.5b (hidden
#    896) llama-quantize gives the 896-wide matrices its fallback type
#    instead (it prints which), so the Q4_K file is Q4_K only in part; at
#    qwen2-vl-2b (1536, 8960) it is Q4_K throughout;
# 3. ROUNDS rounds, each running every side once in turn (so that both see the
#    same machine load): lm_bench (pp512, tg128, 32 sequences) with bf16
#    weights and f32 or bf16 activations, int8 weights with int16 or int8
#    activations, and int4 weights (int4_g32, int4_g128, int4_g32_zp,
#    int4_g128_zp; always int8 activations); llama-bench (pp512, tg128) and
#    llama-batched-bench (1, 8, 32 sequences of 128 decode steps) on each
#    GGUF;
# 4. tools/llamacpp_report.py: medians over rounds as a table, and the ratios
#    as a last JSON line (int4_tg_vs_q4_0: int4_g32 against Q4_0, both
#    symmetric in groups of 32; int4_tg_vs_q4_k: int4_g32_zp against Q4_K,
#    both with a scale and an offset per 32 weights).
# Quality is not compared here: the weights are random and the GGUFs carry
# no tokenizer, so llama-perplexity --kl-divergence has no text to read.
# bench:quality measures mmserve's modes' KL divergence on a real model.
#
# Needs: python with numpy (PY, default the tools venv of tools/README.md if
# present, else python3), pip, cmake, a C++ compiler, bazel (unless LM_BENCH
# names a built lm_bench). Raw outputs stay in $OUT (default a new temp dir).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cache=${CACHE:-$HOME/.cache/mmserve/llamacpp}
version=${LLAMA_CPP_PYTHON_VERSION:-0.3.36}
rounds=${ROUNDS:-3}
threads=${THREADS:-2}
dims=${DIMS:-qwen2-0.5b}
venv_py=$HOME/.cache/mmserve-tools-venv/bin/python
[[ -x $venv_py ]] || venv_py=/root/.cache/mmserve-tools-venv/bin/python
py=${PY:-$([[ -x $venv_py ]] && echo "$venv_py" || echo python3)}
out=${OUT:-$(mktemp -d /tmp/llamacpp_side_by_side.XXXXXX)}
mkdir -p "$cache" "$out"
log() { echo "llamacpp_side_by_side: $*" >&2; }

# 1. llama.cpp.
src=$cache/llama_cpp_python-$version/vendor/llama.cpp
build=$cache/build-$version
if [[ ! -d $src ]]; then
  sdist=$cache/llama_cpp_python-$version.tar.gz
  if [[ ! -f $sdist ]]; then
    log "downloading the llama-cpp-python $version sdist"
    "$py" -m pip download --no-binary :all: --no-deps "llama-cpp-python==$version" -d "$cache" >&2
  fi
  tar -xzf "$sdist" -C "$cache"
fi
if [[ ! -x $build/bin/llama-bench || ! -x $build/bin/llama-batched-bench ||
  ! -x $build/bin/llama-quantize ]]; then
  log "building llama.cpp (GGML_NATIVE=ON) in $build"
  cmake -S "$src" -B "$build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
    -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF >&2
  cmake --build "$build" --target llama-bench llama-batched-bench llama-quantize \
    -j "$(nproc)" >&2
fi

# 2. GGUF weights.
models=$cache/models
PYTHONPATH=$src/gguf-py "$py" "$root/tools/llamacpp_gguf.py" --dims=$dims \
  --types=bf16,f16,q8_0,q4_0 --out_dir="$models"
if [[ ! -f $models/$dims-q4_k.gguf ]]; then
  log "llama-quantize --pure Q4_K_M (its log: $out/q4_k.quantize.log; fallbacks below)"
  "$build/bin/llama-quantize" --pure "$models/$dims-bf16.gguf" "$models/$dims-q4_k.gguf.tmp" \
    Q4_K_M "$threads" >"$out/q4_k.quantize.log" 2>&1
  grep -i "fallback" "$out/q4_k.quantize.log" | sort | uniq -c | head -20 >&2 || true
  mv "$models/$dims-q4_k.gguf.tmp" "$models/$dims-q4_k.gguf"
fi

# 3. Interleaved rounds.
lm_bench=${LM_BENCH:-}
if [[ -z $lm_bench ]]; then
  (cd "$root" && bazel build --config=opt --disk_cache="$HOME/.cache/mmserve/bazel-disk" \
    //bench:lm_bench >&2)
  lm_bench=$root/bazel-out/k8-opt/bin/bench/lm_bench
fi
mm_modes=("bf16 f32" "bf16 bf16" "int8 f32" "int8 int8" "int4_g32 int8" "int4_g128 int8"
  "int4_g32_zp int8" "int4_g128_zp int8")
for ((i = 1; i <= rounds; i++)); do
  for mode in "${mm_modes[@]}"; do
    read -r dtype act <<<"$mode"
    log "round $i: lm_bench $dtype weights, $act activations"
    # lm_bench exits 1 when a ratio passes its peak (its stderr says which):
    # the run goes on, the JSON line is kept, and the failure is shown.
    (cd "$root" && "$lm_bench" --dims=$dims --threads="$threads" --pp=512 --tg=128 --batch=32 \
      --dtype="$dtype" --activation_dtype="$act" 2>"$out/r$i.lm.$dtype-$act.err" | tail -n 1) \
      >"$out/r$i.lm.$dtype-$act.json" || grep FAILED "$out/r$i.lm.$dtype-$act.err" >&2 || true
  done
  for t in bf16 f16 q8_0 q4_0 q4_k; do
    log "round $i: llama-bench and llama-batched-bench, $t"
    "$build/bin/llama-bench" -m "$models/$dims-$t.gguf" -p 512 -n 128 -t "$threads" -r 3 \
      -o json 2>/dev/null >"$out/r$i.llama-bench.$t.json"
    "$build/bin/llama-batched-bench" -m "$models/$dims-$t.gguf" -c 8192 -b 2048 -ub 512 \
      -npp 16 -ntg 128 -npl 1,8,32 -t "$threads" -tb "$threads" --output-format jsonl \
      2>/dev/null | grep '^{' >"$out/r$i.batched.$t.jsonl"
  done
done

# 4. Report.
log "raw outputs in $out"
"$py" "$root/tools/llamacpp_report.py" --dir="$out" --threads="$threads" --dims="$dims" \
  --llamacpp="llama-cpp-python $version sdist"
