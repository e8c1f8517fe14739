#!/usr/bin/env bash
# mmserve's lm_bench side by side with llama.cpp on the same machine, in one
# run. A benchmark, not part of .ci/run.
#
#   bench/peer/llamacpp_side_by_side.sh            # 3 rounds, 2 threads
#   ROUNDS=1 THREADS=2 bench/peer/llamacpp_side_by_side.sh
#   DIMS=qwen2-vl-2b bench/peer/llamacpp_side_by_side.sh   # rows K-quants take whole
#   ROUNDS=0 bench/peer/llamacpp_side_by_side.sh   # quality only (minutes)
#   REPACK=0 ...   # llama.cpp without its repacked layouts: on a Xeon whose OS
#                  # does not grant AMX tiles, Q8_0 and Q4_0 fault with them
#
# 1. llama.cpp from the PyPI llama-cpp-python sdist's vendored tree (the only
#    download: tools/llamacpp_sdist.py, the file itself from pip's index,
#    sha256 checked; `pip download` would build its metadata first), built with cmake
#    -DGGML_NATIVE=ON (otherwise its defaults), targets llama-bench,
#    llama-batched-bench, llama-quantize, llama-perplexity and llama-tokenize,
#    into $CACHE (default
#    $HOME/.cache/mmserve/llamacpp; kept between runs);
# 2. random weights at DIMS (default qwen2-0.5b; lm_bench's --dims: the same
#    shapes and value distribution) written as GGUF bf16, f16, Q8_0 and Q4_0
#    by tools/llamacpp_gguf.py with the tree's own gguf-py, and Q4_K by the
#    tree's llama-quantize --pure from the bf16 file (gguf-py has no K-quant
#    quantizer). K-quants take rows in blocks of 256: at qwen2-0.5b (hidden
#    896) llama-quantize gives the 896-wide matrices its fallback type
#    instead (it prints which), so the Q4_K file is Q4_K only in part; at
#    qwen2-vl-2b (1536, 8960) it is Q4_K throughout;
# 3. quality on the same tokens: QUALITY_MODEL (default models/shapes-demo, a
#    trained fp32 checkpoint: random weights' next-token distributions are
#    near uniform, so every format's KL divergence would be noise-small) as
#    GGUF f32, bf16, f16, Q8_0, Q4_0 (tools/llamacpp_gguf.py --checkpoint,
#    with the checkpoint's tokenizer) and Q4_K (llama-quantize --pure from
#    f32; the demo model's rows are 128 wide, so its Q4_K file is llama.cpp's
#    fallback Q5_0: the report says so). llama-perplexity --kl-divergence-base
#    on f32 then --kl-divergence per format, over QTOKENS tokens of CORPUS
#    (default 1024 of /usr/share/common-licenses/GPL-3) in chunks of QCHUNK
#    (256) scoring each chunk's second half, as llama-perplexity does; and
#    bench:quality on the same checkpoint, tokens and positions (its bf16
#    modes on the checkpoint rounded to bf16). The token ids of both sides
#    are compared first (llama-tokenize against bench:quality --tokens_out);
#    the run stops if they differ;
# 4. ROUNDS rounds, each running every side once in turn (so that both see the
#    same machine load): lm_bench (pp512, tg128, 32 sequences) with bf16
#    weights and f32 or bf16 activations, int8 weights (per row or per 32
#    columns) with int16 or int8 activations, and int4 weights (int4_g32, int4_g128, int4_g32_zp,
#    int4_g128_zp; always int8 activations); llama-bench (pp512, tg128) and
#    llama-batched-bench (1, 8, 32 sequences of 128 decode steps) on each
#    GGUF;
# 5. tools/llamacpp_report.py: medians over rounds as a table with each
#    mode's KL divergence, and the ratios as a last JSON line: speed at real
#    dims (random weights) joined with KL divergence on QUALITY_MODEL (see
#    the report's docstring for the keys).
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
repack=${REPACK:-1}
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
    python3 "$root/tools/llamacpp_sdist.py" --version="$version" --dest="$cache"
  fi
  tar -xzf "$sdist" -C "$cache"
fi
tools=(llama-bench llama-batched-bench llama-quantize llama-perplexity llama-tokenize)
missing=0
for t in "${tools[@]}"; do [[ -x $build/bin/$t ]] || missing=1; done
if ((missing)); then
  log "building llama.cpp (GGML_NATIVE=ON) in $build"
  cmake -S "$src" -B "$build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
    -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF >&2
  cmake --build "$build" --target "${tools[@]}" -j "$(nproc)" >&2
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

lm_bench=${LM_BENCH:-}
quality=${QUALITY:-}
if [[ -z $lm_bench || -z $quality ]]; then
  (cd "$root" && bazel build --config=opt --disk_cache="$HOME/.cache/mmserve/bazel-disk" \
    //bench:lm_bench //bench:quality >&2)
  lm_bench=${lm_bench:-$root/bazel-out/k8-opt/bin/bench/lm_bench}
  quality=${quality:-$root/bazel-out/k8-opt/bin/bench/quality}
fi

# 3. Quality on the same tokens.
qmodel=${QUALITY_MODEL:-models/shapes-demo}
[[ $qmodel == /* ]] || qmodel=$root/$qmodel
qstem=$(basename "$qmodel")
corpus=${CORPUS:-/usr/share/common-licenses/GPL-3}
qchunk=${QCHUNK:-256}
qtokens=${QTOKENS:-1024}
PYTHONPATH=$src/gguf-py "$py" "$root/tools/llamacpp_gguf.py" --checkpoint="$qmodel" \
  --types=f32,bf16,f16,q8_0,q4_0 --out_dir="$models" --bf16_dir="$out/$qstem-bf16"
if [[ ! -f $models/$qstem-q4_k.gguf ]]; then
  "$build/bin/llama-quantize" --pure "$models/$qstem-f32.gguf" "$models/$qstem-q4_k.gguf.tmp" \
    Q4_K_M "$threads" >"$models/$qstem-q4_k.quantize.log" 2>&1
  mv "$models/$qstem-q4_k.gguf.tmp" "$models/$qstem-q4_k.gguf"
fi
cp "$models/$qstem-q4_k.quantize.log" "$out/quality.q4_k.quantize.log" 2>/dev/null || true
log "bench:quality on $qstem ($qtokens tokens, chunks of $qchunk, second halves scored)"
(cd "$root" && "$quality" --model_dir="$qmodel" --bf16_model_dir="$out/$qstem-bf16" \
  --corpus="$corpus" --tokens="$qtokens" --chunk="$qchunk" --score_from=$((qchunk / 2)) \
  --threads="$threads" --tokens_out="$out/quality.mmserve.tokens" | tee "$out/quality.txt" >&2)
tail -n 1 "$out/quality.txt" >"$out/quality.json"
"$build/bin/llama-tokenize" -m "$models/$qstem-f32.gguf" -f "$corpus" --ids --log-disable \
  2>/dev/null | tr -d '[] ' | tr ',' '\n' | awk -v n="$qtokens" 'NR <= n' \
  >"$out/quality.llamacpp.tokens"
if ! cmp -s "$out/quality.mmserve.tokens" "$out/quality.llamacpp.tokens"; then
  log "token ids differ between bench:quality and llama-tokenize (see $out/quality.*.tokens)"
  exit 1
fi
log "the same $(wc -l <"$out/quality.mmserve.tokens") token ids on both sides"
"$build/bin/llama-perplexity" -m "$models/$qstem-f32.gguf" -f "$corpus" -c "$qchunk" \
  -b "$qchunk" --chunks $((qtokens / qchunk)) -t "$threads" --no-repack \
  --kl-divergence-base "$out/quality.base.kld" >"$out/quality.f32.log" 2>&1
# llama.cpp's logger writes from a thread that can lose its last lines at
# exit (the summary with the mean KL divergence): a run whose log lacks it is
# repeated (seconds each). --no-repack: the same arithmetic without the
# repacked (AMX on Xeons) layouts, which fault on machines whose OS does not
# grant AMX tiles; quality does not depend on the layout.
for t in bf16 f16 q8_0 q4_0 q4_k; do
  log "llama-perplexity --kl-divergence, $t"
  for attempt in 1 2 3 4 5; do
    "$build/bin/llama-perplexity" -m "$models/$qstem-$t.gguf" -c "$qchunk" -b "$qchunk" \
      -t "$threads" --no-repack --kl-divergence-base "$out/quality.base.kld" --kl-divergence \
      --log-file "$out/quality.$t.log" >"$out/quality.$t.out" 2>&1
    grep -q "Same top p:" "$out/quality.$t.log" && break
    log "llama-perplexity $t: no summary in its log (attempt $attempt)"
  done
done

# 4. Interleaved rounds.
mm_modes=("bf16 f32" "bf16 bf16" "int8 f32" "int8 int8" "int8_g32 f32" "int8_g32 int8"
  "int4_g32 int8" "int4_g128 int8" "int4_g32_zp int8" "int4_g128_zp int8")
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
      --repack "$repack" -o json 2>/dev/null >"$out/r$i.llama-bench.$t.json" || true
    "$build/bin/llama-batched-bench" -m "$models/$dims-$t.gguf" -c 8192 -b 2048 -ub 512 \
      -npp 16 -ntg 128 -npl 1,8,32 -t "$threads" -tb "$threads" --output-format jsonl \
      $( ((repack)) || echo --no-repack) 2>/dev/null | grep '^{' >"$out/r$i.batched.$t.jsonl" || true
  done
done

# 5. Report.
log "raw outputs in $out"
"$py" "$root/tools/llamacpp_report.py" --dir="$out" --threads="$threads" --dims="$dims" \
  --llamacpp="llama-cpp-python $version sdist" --quality_model="$qstem"
