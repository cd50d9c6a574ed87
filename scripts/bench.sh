#!/usr/bin/env bash
# `make bench`: the allreduce benchmark at 2 and 4 ranks (plain and resilient) and the
# recovery benchmark (shrink and replace), printed as tables; BENCH_JSON=1 prints JSON
# lines only (notes go to stderr). Usage: scripts/bench.sh BUILD_DIR
# (BENCH_SIZES=4KiB,1MiB overrides the allreduce sizes; BENCHMARKS.md has the method.)
set -euo pipefail

build=${1:-build}
keel="$build/bin/keel"
allreduce="$build/bench/allreduce"
recovery="$build/bench/recovery"
json=${BENCH_JSON:-0}
sizes=${BENCH_SIZES:-4KiB,1MiB,64MiB}

# Notes are for people: on stdout with the tables, on stderr when stdout is JSON.
note() {
  if [ "$json" = 1 ]; then echo "$*" >&2; else echo "$*"; fi
}

for program in "$keel" "$allreduce" "$recovery"; do
  if [ ! -x "$program" ]; then
    echo "bench: $program is missing (build first: make build, or cmake --build $build)" >&2
    exit 1
  fi
done

flags=()
[ "$json" = 1 ] && flags+=(--json)

note "# keel benchmarks, $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
for resilient in "" "--resilient"; do
  for ranks in 2 4; do
    note "# keel run -n $ranks -- $allreduce --sizes $sizes ${resilient}"
    "$keel" run -n "$ranks" --quiet -- "$allreduce" --sizes "$sizes" ${resilient:+"$resilient"} "${flags[@]}"
    note ""
  done
done

note "# $recovery --policy both"
"$recovery" --policy both "${flags[@]}"
note ""
note "peers: gloo/openmpi comparison is not part of this benchmark yet (issue 3)"
