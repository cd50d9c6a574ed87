#!/usr/bin/env bash
# `make bench-netns`: allreduce across 4 nodes that are network namespaces (keel run --netns),
# each on a link shaped to 1 and to 10 Gbit/s, for keel and for Gloo and Open MPI over the
# same namespaces; then the steady-state overhead of in-memory checkpoints on such nodes
# (bench/mem_overhead). Needs root (namespaces); without it, says so and exits 0.
# Usage: scripts/bench_netns.sh BUILD_DIR
#
#   keel-netns    keel run --netns --nnodes 4 --nproc-per-node 1 --link-rate R -- bench/allreduce
#   gloo-ring     bench/peers/gloo_allreduce --netns NS0,.. --hosts A0,..: rank i in namespace
#   gloo-default  i at its address (the namespaces of a keel job that only holds them, below)
#   openmpi-tcp   mpirun.openmpi MPMD, rank i as `ip netns exec NSi`, btl tcp on eth0 (mpirun
#                 and PMIx over the job's bridge)
#
# The peers run in the namespaces of a second keel job whose workers only sleep: the same
# bridge, veths and tbf shaping keel's own run had, set up and torn down by keel. Prints, per
# rate and size, each implementation's median time and bus bandwidth (2(n-1)/n bytes / time)
# as a fraction of the link rate. BENCH_NETNS_SIZES (default 1MiB,16MiB,64MiB),
# BENCH_NETNS_RATES (default 1gbit,10gbit), BENCH_TIMEOUT_S (default 300 per command).
#
#   mem-overhead  bench/mem_overhead: ZeRO Fashion-MNIST on 4 netns nodes with shaped links, a
#                 checkpoint every step (--ckpt mem, 2 replicas) against none, and Gemini's
#                 Figure 16 ablation (blocking, at once, idle windows with 1 and 4 buffers);
#                 its own table, after the allreduce one. About 9 minutes; its own time limit,
#                 BENCH_MEM_TIMEOUT_S (default 1200); BENCH_MEM_OVERHEAD=0 skips it, and
#                 BENCH_MEM_FLAGS passes flags to it (e.g. "--trials 5 --link-rate 2gbit").
set -euo pipefail

build=${1:-build}
keel="$build/bin/keel"
allreduce="$build/bench/allreduce"
mem_overhead="$build/bench/mem_overhead"
peers="$build/bench/peers"
sizes=${BENCH_NETNS_SIZES:-1MiB,16MiB,64MiB}
rates=${BENCH_NETNS_RATES:-1gbit,10gbit}
limit=${BENCH_TIMEOUT_S:-300}
mem_limit=${BENCH_MEM_TIMEOUT_S:-1200}
nodes=4
root=$(cd "$(dirname "$0")/.." && pwd)

if [ "$(id -u)" != 0 ]; then
  echo "bench-netns: skipped: network namespaces need root"
  exit 0
fi
for program in "$keel" "$allreduce" "$mem_overhead"; do
  if [ ! -x "$program" ]; then
    echo "bench-netns: $program is missing (build first: make build)" >&2
    exit 1
  fi
done
"$root/bench/peers/build.sh" "$build" >/dev/null || true

work=$(mktemp -d "${TMPDIR:-/tmp}/keel-bench-netns.XXXXXX")
holder=
stop_holder() {
  [ -n "$holder" ] || return 0
  kill -INT "$holder" 2>/dev/null || true
  wait "$holder" 2>/dev/null || true
  holder=
}
trap 'stop_holder; rm -rf -- "$work"' EXIT
results="$work/results.jsonl"
: >"$results"

# keep RATE IMPL: the JSON lines of the last command's output, tagged with the link rate.
keep() {
  grep '^{' "$work/out" | sed "s/^{/{\"rate\":\"$1\",/" >>"$results" || true
}

# run NAME COMMAND...: one measurement under the time limit; a failure is noted, not fatal.
run() {
  local name=$1
  shift
  echo "bench-netns: $name" >&2
  if ! timeout -k 10 "$limit" "$@" >"$work/out" 2>"$work/err"; then
    echo "# $name: FAILED: $(tail -n 3 "$work/err" | tr '\n' ' ')"
    return 1
  fi
}

# holder_start RATE: a keel job of $nodes namespaces whose workers sleep; sets the arrays
# namespaces and addresses once every node's address is up.
holder_start() {
  "$keel" run --netns --nnodes "$nodes" --nproc-per-node 1 --link-rate "$1" --quiet \
    -- sleep "$limit" >"$work/holder.out" 2>&1 &
  holder=$!
  namespaces=() addresses=()
  for _ in $(seq 100); do
    namespaces=() addresses=()
    for ((i = 0; i < nodes; i++)); do
      local ns="keel-$holder-$i" address
      address=$(ip -n "$ns" -4 -o addr show dev eth0 2>/dev/null | awk '{split($4, a, "/"); print a[1]}')
      [ -n "$address" ] || break
      namespaces+=("$ns")
      addresses+=("$address")
    done
    [ "${#addresses[@]}" = "$nodes" ] && return 0
    sleep 0.1
  done
  echo "# holder job: its namespaces did not come up: $(tail -n 3 "$work/holder.out" | tr '\n' ' ')"
  return 1
}

joined() {
  local IFS=,
  echo "$*"
}

# The checkpoint overhead runs its own jobs, one after another: no holder job, and a limit of
# its own (15 jobs of 20-40 s). Its table waits in $work/mem_overhead.txt for the end.
mem_overhead_run() {
  [ "${BENCH_MEM_OVERHEAD:-1}" != 0 ] || return 0
  echo "bench-netns: mem-overhead" >&2
  local flags=()
  read -r -a flags <<<"${BENCH_MEM_FLAGS:-}"
  if ! timeout -k 10 "$mem_limit" "$mem_overhead" --keel "$keel" "${flags[@]}" \
    >"$work/mem_overhead.txt" 2>"$work/mem_overhead.err"; then
    echo "# mem-overhead: FAILED: $(tail -n 3 "$work/mem_overhead.err" | tr '\n' ' ')" \
      >>"$work/mem_overhead.txt"
  fi
}

IFS=, read -r -a rate_list <<<"$rates"
for rate in "${rate_list[@]}"; do
  if run "keel-netns@$rate" "$keel" run --netns --nnodes "$nodes" --nproc-per-node 1 \
    --link-rate "$rate" --quiet -- "$allreduce" --sizes "$sizes" --json; then
    keep "$rate"
  fi
  holder_start "$rate" || {
    stop_holder
    continue
  }
  if [ -x "$peers/gloo_allreduce" ]; then
    run "gloo@$rate" "$peers/gloo_allreduce" --ranks "$nodes" --sizes "$sizes" \
      --netns "$(joined "${namespaces[@]}")" --hosts "$(joined "${addresses[@]}")" \
      --timeout-s "$((limit > 30 ? limit - 20 : limit))" && keep "$rate"
  fi
  if [ -x "$peers/mpi_allreduce.openmpi" ]; then
    mpmd=()
    for ((i = 0; i < nodes; i++)); do
      [ "$i" = 0 ] || mpmd+=(:)
      mpmd+=(-np 1 ip netns exec "${namespaces[$i]}" "$peers/mpi_allreduce.openmpi"
        --impl openmpi-tcp --sizes "$sizes")
    done
    # mpirun and its PMIx server stay in the root namespace: the ranks reach them over the
    # job's bridge (kb<pid>, the namespaces' gateway), and each other over eth0.
    PMIX_MCA_ptl_tcp_remote_connections=1 PMIX_MCA_ptl_tcp_if_include="kb$holder" \
      run "openmpi-tcp@$rate" mpirun.openmpi --allow-run-as-root --oversubscribe \
      --bind-to none --mca btl self,tcp --mca btl_tcp_if_include eth0 \
      --mca oob_tcp_if_include "kb$holder" "${mpmd[@]}" && keep "$rate"
  fi
  stop_holder
done
mem_overhead_run

# ---- the table, from the JSON lines (our own fixed format: awk is enough)
echo "# allreduce across $nodes netns nodes, f32 sum, $(date -u '+%Y-%m-%d %H:%M UTC'), load $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-8s %-14s %10s %12s %12s %10s\n' rate impl bytes median_us busbw_gbps "of link"
awk '
  function value(line, key,   at, rest) {
    at = index(line, "\"" key "\":")
    if (at == 0) return ""
    rest = substr(line, at + length(key) + 3)
    gsub(/^"/, "", rest)
    sub(/[",}].*/, "", rest)
    return rest
  }
  value($0, "impl") != "memcpy" {
    rate = value($0, "rate"); impl = value($0, "impl"); bytes = value($0, "bytes")
    gbit = rate; sub(/gbit$/, "", gbit); link_gbps = gbit / 8
    busbw = value($0, "busbw_gbps")
    printf "%-8s %-14s %10s %12.1f %12.3f %10.2f\n", rate, impl, bytes, value($0, "time_us"), \
      busbw, busbw / link_gbps
  }' "$results"

if [ -s "$work/mem_overhead.txt" ]; then
  echo
  echo "# in-memory checkpoints every step across $nodes netns nodes: $mem_overhead"
  cat "$work/mem_overhead.txt"
fi
