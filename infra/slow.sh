#!/usr/bin/env bash
# Run a command on a machine made slow on purpose: SAS_SLOW_BURNERS processes (default: one per
# core) spin on the CPU at the same priority as the command for as long as it runs, so every
# CPU-bound part of it (LocalStack, the roles, the simulation, the property tests) gets about half
# the machine it would have alone. CI runs `make test` this way (.ci/run): a test that assumes how
# fast the machine is fails there, not on a user's laptop. SAS_SLOW_BURNERS=0 runs the command as is.
#   infra/slow.sh make test
set -euo pipefail

n="${SAS_SLOW_BURNERS:-$(nproc)}"
[[ "$n" =~ ^[0-9]+$ ]] || { echo "[slow] SAS_SLOW_BURNERS must be a number, not '$n'" >&2; exit 2; }
pids=()
# shellcheck disable=SC2317 # invoked by the EXIT trap
stop_burners() {
  local p
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait "${pids[@]}" 2>/dev/null || true
}
trap stop_burners EXIT
for ((i = 0; i < n; i++)); do
  bash -c 'while :; do :; done' &
  pids+=("$!")
done
echo "[slow] $n CPU burner(s) running beside: $* (SAS_SLOW_BURNERS=0 for none)"
start=$SECONDS
rc=0
"$@" || rc=$?
echo "[slow] $* took $((SECONDS - start)) s beside $n burner(s); exit $rc"
exit "$rc"
