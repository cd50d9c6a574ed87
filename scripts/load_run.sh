#!/bin/bash
# No false deaths under load (issue 15): a failure-free toy_train job of 4 ranks runs for
# MINUTES (default 30) beside two busy loops, while uid 1 computes (a busy loop) 5 s longer
# than its other steps once a minute, well within the 30 s collective deadline. Then the
# events must show no death declared: no suspicion, recovery, fence or death, and every
# process ended by the interrupt that ends the run. Not part of `make test`: it takes its
# minutes. Usage: scripts/load_run.sh BUILD_DIR [MINUTES]
set -u
build=$(cd "${1:?usage: scripts/load_run.sh BUILD_DIR [MINUTES]}" && pwd)
minutes=${2:-30}
long_every_ms=${KEEL_LOAD_LONG_EVERY_MS:-60000} # once a minute
folder=$(mktemp -d /tmp/keel-load-run-XXXXXX)
busy_pids=()
end_busy_loops() {
  for pid in "${busy_pids[@]}"; do kill "$pid" 2>/dev/null; done
}
trap end_busy_loops EXIT
for _ in 1 2; do
  yes >/dev/null &
  busy_pids+=($!)
done
echo "load run: $minutes min, two busy loops (pids ${busy_pids[*]}), folder $folder"
start=$(date +%s)
# One SIGINT at the end stops the job in order (exit 130). Not `timeout`: it signals the
# command's process group as well, and a second SIGINT makes keel run kill the job at once.
"$build/bin/keel" run -n 4 --events "$folder/events.jsonl" \
  -- "$build/tests/programs/toy_train" --steps 1000000000 --compute-ms 10 --params 100000 \
  --long-every-ms "$long_every_ms" --long-ms 5000 --long-spin >"$folder/output.txt" 2>&1 &
launcher=$!
deadline=$((SECONDS + minutes * 60))
while [ "$SECONDS" -lt "$deadline" ] && kill -0 "$launcher" 2>/dev/null; do sleep 1; done
kill -INT "$launcher" 2>/dev/null
code=0
wait "$launcher" || code=$?
end_busy_loops
elapsed=$(($(date +%s) - start))
count() { grep -c "\"event\":\"$1\"" "$folder/events.jsonl"; }
long_works=$(grep -c "long work" "$folder/output.txt")
last_step=$(grep '"event":"progress"' "$folder/events.jsonl" | tail -1 | grep -o '"step":[0-9]*' | cut -d: -f2)
echo "elapsed ${elapsed}s, keel run exit $code, last step ${last_step:-none}, long works $long_works"
verdict=pass
for event in suspect recovery fence node_fence dead timeout; do
  n=$(count "$event")
  echo "  $event events: $n"
  [ "$n" -eq 0 ] || verdict=fail
done
# Every exit is the interrupt's: orderly code 75-77 or 130, never a signal or a failure.
bad_exits=$(grep '"event":"exit"' "$folder/events.jsonl" | grep -v -E '"code":(75|76|77|130)[,}]' | wc -l)
echo "  exits other than the interrupt's: $bad_exits"
[ "$bad_exits" -eq 0 ] || verdict=fail
[ "$code" -eq 130 ] || verdict=fail
[ "$long_works" -ge $((minutes * 60000 / long_every_ms - 1)) ] || verdict=fail
echo "verdict: $verdict"
[ "$verdict" = pass ] && rm -rf "$folder"
[ "$verdict" = pass ]
