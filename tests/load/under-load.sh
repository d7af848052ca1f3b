#!/usr/bin/env bash
# Runs a test command while the machine is kept busy: one spinning process
# per core, plus as many again (a load average of about twice the cores,
# the 8-15 on 2 cores seen when other work shares the machine). The suite
# must pass so: every wait in it has a deadline long enough for a busy
# machine and no test decides on how fast the machine is.
#
#   tests/load/under-load.sh                       # cargo test --workspace --locked
#   tests/load/under-load.sh cargo test -p nmo --test suite operator::
#   NMO_LOAD_FACTOR=3 tests/load/under-load.sh     # three spinners per core
set -euo pipefail
cd "$(dirname "$0")/../.."
cores=$(nproc)
factor=${NMO_LOAD_FACTOR:-2}
spinners=()
stop() {
  for p in "${spinners[@]}"; do kill "$p" 2>/dev/null || true; done
}
trap stop EXIT
for _ in $(seq $((cores * factor))); do
  ( while :; do :; done ) &
  spinners+=("$!")
done
echo "under-load: ${#spinners[@]} spinners on $cores cores"
if [ "$#" -eq 0 ]; then
  set -- cargo test --workspace --locked
fi
started=$(date +%s)
status=0
"$@" || status=$?
echo "under-load: '$*' exited $status after $(( $(date +%s) - started )) s; load average $(cut -d' ' -f1-3 /proc/loadavg)"
exit "$status"
