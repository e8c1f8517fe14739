#!/usr/bin/env bash
# Generates the Python gRPC stubs of mmserve's public API (and the standard
# health service) with Debian's protoc and grpc_python_plugin, into
# client/python/gen/ (git-ignored) or the folder given as $1.
#
#   client/python/gen_stubs.sh            # -> client/python/gen/proto/*_pb2*.py
#   client/python/gen_stubs.sh /tmp/stubs
#
# Needs protobuf-compiler and protobuf-compiler-grpc (deploy/install_deps.sh).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
out="${1:-$here/gen}"
plugin="${GRPC_PYTHON_PLUGIN:-$(command -v grpc_python_plugin || echo /usr/bin/grpc_python_plugin)}"
if [[ ! -x "$plugin" ]]; then
  echo "gen_stubs: grpc_python_plugin not found (apt-get install protobuf-compiler-grpc)" >&2
  exit 1
fi
mkdir -p "$out"
cd "$root"
protoc -I. --python_out="$out" --grpc_python_out="$out" \
  --plugin=protoc-gen-grpc_python="$plugin" \
  proto/common.proto proto/inference.proto proto/health.proto
echo "gen_stubs: wrote $out/proto"
