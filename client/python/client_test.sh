#!/usr/bin/env bash
# //client:python_client_test: generates the Python stubs into the test's
# temporary folder, then runs mmserve_client_test.py (the Python client and
# the C++ cli against a fake grpcio server) with Debian's python3.
set -euo pipefail
stubs="$TEST_TMPDIR/stubs"
client/python/gen_stubs.sh "$stubs" >/dev/null
export MMSERVE_STUBS_DIR="$stubs"
export MMSERVE_CLI="$PWD/client/cli"
exec "${MMSERVE_PYTHON:-/usr/bin/python3}" client/python/mmserve_client_test.py -v
