#!/usr/bin/env bash
# Installs the Debian packages mmserve builds and tests with. Idempotent and
# quiet when nothing is missing; safe to run before every build.
#
#   deploy/install_deps.sh          # install what is missing
#   deploy/install_deps.sh --check  # list what is missing, exit 1 if any
set -euo pipefail

packages=(
  bazel-bootstrap          # Bazel 4.2, runs offline with third_party/ stubs
  g++
  python3                  # deploy/test_summary.py
  protobuf-compiler        # protoc
  protobuf-compiler-grpc   # grpc_cpp_plugin
  libprotobuf-dev
  libgrpc++-dev
  libabsl-dev
  libucx-dev               # UCX 1.13: transfer/
  ucx-utils                # ucx_perftest, the transfer benchmark's baseline
  libnuma-dev              # UCX's static archives need libnuma.a
  libstb-dev               # stb_image: PNG, BMP, GIF
  libjpeg62-turbo-dev      # libjpeg-turbo: JPEG as Pillow decodes it
  libavformat-dev          # FFmpeg 5.1: video containers (model/video_decode.h)
  libavcodec-dev
  libswscale-dev
  libavutil-dev
  catch2                   # Catch2 v2 (header-only)
  libxxhash-dev            # XXH3 content hashes
  libopenblas-dev          # CPU GEMM
  nlohmann-json3-dev       # JSON: config.json, tokenizer.json, safetensors headers
  libicu-dev               # Unicode categories and NFC for the tokenizer
  libcpp-httplib-dev       # HTTP: /metrics and the OpenAI-compatible endpoint
  libssl-dev               # OpenSSL: TLS of the router's remote media fetch (router/media_http.h)
  python3-grpcio           # the Python client (client/python) and its test
  python3-protobuf
  python3-yaml             # //deploy/k8s:manifests_test reads the manifests
  python3-jsonschema       # //grammar:schema_validation_test validates generated JSON
  curl                     # deploy/serve_test.sh asks the HTTP API
  clang                    # fuzz targets (--config=fuzz, tools/fuzz/run_all.sh)
  libclang-rt-14-dev       # libFuzzer and the sanitizer runtimes for clang 14
  iproute2                 # `ip netns`: the test hosts of tests/net_stack_test
)

missing=()
for p in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null || true)
  [[ "$status" == "installed" ]] || missing+=("$p")
done

if [[ ${#missing[@]} -eq 0 ]]; then
  exit 0
fi
if [[ "${1:-}" == "--check" ]]; then
  echo "missing: ${missing[*]}"
  exit 1
fi

echo "install_deps: installing ${missing[*]}"
sudo=""
[[ $(id -u) -eq 0 ]] || sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "install_deps: done"
