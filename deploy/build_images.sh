#!/usr/bin/env bash
# Builds the mmserve container image without any registry: the services'
# binaries, exactly the shared libraries `ldd` says they need (and UCX's cma
# plugin), copied from this Debian machine, and nothing else (no shell, no
# package manager), imported with `docker import`. One image serves every
# service; the compose file picks the binary.
#
#   deploy/build_images.sh [--tag=mmserve:latest] [--opt] [--static]
#
# By default the binaries are the default configuration's (what `bazel test
# //...` has built already), linked against Debian's shared gRPC, protobuf,
# abseil, OpenBLAS and UCX: 107 MiB, the libraries stored once for all five
# binaries. --static takes --config=static binaries instead (only glibc,
# libstdc++ and cpp-httplib with its TLS/compression libraries stay shared):
# 144 MiB, as each binary carries its own copy of everything, and a second
# compile of the tree in that configuration. --opt adds --config=opt (slower
# to build, faster to run). Prints the image's size. Needs a running Docker
# engine (deploy/compose_test.sh starts one) and the Debian packages of
# deploy/install_deps.sh.
set -euo pipefail
cd "$(dirname "$0")/.."

tag=mmserve:latest
opt=""
static=""
for arg in "$@"; do
  case "$arg" in
    --tag=*) tag="${arg#*=}" ;;
    --opt) opt=1 ;;
    --static) static=1 ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "build_images.sh: unknown argument $arg" >&2; exit 2 ;;
  esac
done
config=()
[[ -n "$static" ]] && config+=(--config=static)
[[ -n "$opt" ]] && config+=(--config=opt)
docker=${DOCKER:-/usr/bin/docker}
cache="${MMSERVE_BAZEL_CACHE:-$HOME/.cache/mmserve/bazel-disk}"
mkdir -p "$cache"

targets=(//router:router //encoder_service:encoder //language_service:language
         //client:health_probe //client:cli //worker:tp_shard)
echo "build_images.sh: bazel build ${config[*]:-(default configuration)}"
bazel build --disk_cache="$cache" "${config[@]}" --color=no --curses=no "${targets[@]}" 2>&1 |
  grep -vE '^(INFO|Loading|Analyzing|\[)' || true
bin=$(bazel info "${config[@]}" bazel-bin 2>/dev/null)

root=$(mktemp -d /tmp/mmserve-image-XXXXXX)
trap 'rm -rf "$root"' EXIT
mkdir -p "$root/usr/local/bin" "$root/etc" "$root/tmp" "$root/model" "$root/dev/shm"
chmod 1777 "$root/tmp"
copy_with_libs() {  # copies a file and every shared library ldd lists for it
  local f=$1 dest=$2
  mkdir -p "$root$(dirname "$dest")"
  cp -L "$f" "$root$dest"
  for lib in $(ldd "$f" | grep -o '/[^ ]*' | sort -u); do
    [[ -e "$root$lib" ]] && continue
    mkdir -p "$root$(dirname "$lib")"
    cp -L "$lib" "$root$lib"
  done
}
for b in router/router encoder_service/encoder language_service/language client/health_probe \
         client/cli worker/tp_shard; do
  [[ -x "$bin/$b" ]] || { echo "build_images.sh: $bin/$b was not built" >&2; exit 1; }
  copy_with_libs "$bin/$b" "/usr/local/bin/$(basename "$b")"
  strip --strip-unneeded "$root/usr/local/bin/$(basename "$b")"
done
# Static binaries have UCX's transports tcp, posix, sysv and self linked in;
# its plugins (cma, InfiniBand) do not load into them (UCX warns "transport
# 'cma' is not available" on the host too), so none is copied. Dynamic ones
# load libuct's built-in transports from the shared library and cma from the
# plugin directory.
if [[ -z "$static" ]]; then
  ucx=/usr/lib/x86_64-linux-gnu/ucx
  copy_with_libs "$ucx/libuct_cma.so.0" "$ucx/libuct_cma.so.0"
  ln -sf libuct_cma.so.0 "$root$ucx/libuct_cma.so"
fi
cat >"$root/etc/nsswitch.conf" <<'TXT'
hosts: files dns
TXT
cat >"$root/etc/passwd" <<'TXT'
root:x:0:0:root:/:/nonexistent
mmserve:x:65534:65534:mmserve:/tmp:/nonexistent
TXT
echo "mmserve:x:65534:" >"$root/etc/group"

tar -C "$root" -c . | "$docker" import \
  -c 'USER 65534' -c 'WORKDIR /tmp' -c 'ENV PATH=/usr/local/bin' \
  -m "mmserve services ($([[ -n "$static" ]] && echo static || echo dynamic) binaries, $(git rev-parse --short HEAD 2>/dev/null || echo unknown))" \
  - "$tag" >/dev/null
size=$("$docker" image inspect -f '{{.Size}}' "$tag")
echo "build_images.sh: built $tag, $((size / 1024 / 1024)) MiB"
