# Sourced by the deploy tests (compose_test.sh, swarm_test.sh): runs the
# sourcing script again under `timeout` once, so that the whole test, its
# cleanup included, is bounded:
#
#   cd "$(dirname "$0")/.." && root=$PWD
#   source deploy/bounded.sh
#   bound_script compose_test 600 "$root/deploy/compose_test.sh" "$@"
#
# bound_script returns only in the inner run.
#
# The outer run exits with the inner one's status, after printing
# "<name>: FAIL not done within N minutes" when it was cut off.
bound_script() {  # name, seconds, script, its arguments...
  local name=$1 seconds=$2 script=$3
  shift 3
  local mark="MMSERVE_BOUNDED_${name}"
  [[ -n "${!mark:-}" ]] && return 0
  export "$mark=1"
  timeout -k 60 "$seconds" "$script" "$@"
  local rc=$?
  [[ $rc == 124 || $rc == 137 ]] && echo "$name: FAIL not done within $((seconds / 60)) minutes"
  exit $rc
}
