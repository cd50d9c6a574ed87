#!/usr/bin/env bash
# `make demo`: a data-parallel Fashion-MNIST job on 4 workers and a spare. Once training is
# under way, one worker is killed with kill -9 from outside (`keel inject kill`); the spare
# takes its rank, receives the state from a survivor, and the job finishes. Prints the
# recovery's time broken down and the final test accuracy.
set -euo pipefail
build=${1:-build}
keel=$build/bin/keel
events=$build/demo-events.jsonl
output=$build/demo-output.txt
steps=${DEMO_STEPS:-600}
kill_at_step=${DEMO_KILL_AT:-150}
rm -f "$events" "$output"
export OPENBLAS_NUM_THREADS=1

echo "demo: 4 workers + 1 spare train an MLP on Fashion-MNIST for $steps steps;"
echo "      at step $kill_at_step one worker is killed (kill -9) and replaced by the spare."
"$keel" run -n 4 --spares 1 --on-failure replace --events "$events" --timeout 300s -- \
  "$build/bin/fashion_mnist" --steps "$steps" >"$output" &
job=$!
trap 'kill "$job" 2>/dev/null || true; wait "$job" 2>/dev/null || true' EXIT

# Wait for rank 0 to report the step, then kill rank 2 from outside, as an operator would.
for _ in $(seq 1 1200); do
  if grep -q '"event":"progress"' "$events" 2>/dev/null &&
     grep '"event":"progress"' "$events" | grep '"rank":0' | tail -n 1 |
       sed -n 's/.*"step":\([0-9]*\).*/\1/p' | awk -v k="$kill_at_step" '$1 >= k {found=1} END {exit !found}'; then
    break
  fi
  kill -0 "$job" 2>/dev/null || break
  sleep 0.1
done
job_id=$(sed -n 's/.*"event":"job_start".*"job_id":"\([0-9]*\)".*/\1/p' "$events" | head -n 1)
"$keel" inject kill 2 --job "$job_id" || echo "demo: could not inject the failure (job already over?)"

set +e
wait "$job"
status=$?
set -e
trap - EXIT
echo
echo "recovery (from the event log $events):"
"$keel" report "$events" || true
echo
tail -n 1 "$output"
echo "demo: keel run exited with $status"
exit "$status"
