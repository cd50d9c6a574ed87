#!/usr/bin/env bash
# `make bench`: keel's allreduce against its peers on this machine, and keel's recovery and
# just-in-time checkpoint benchmarks, in one run. Usage: scripts/bench.sh BUILD_DIR
#
# 1. Installs the peers (scripts/deps.sh --bench: Gloo, Open MPI, MPICH) and builds their
#    harnesses (bench/peers/build.sh). A peer that cannot be installed or built is reported
#    as missing, with the reason, and its columns read "missing".
# 2. Times an f32-sum allreduce at each size (BENCH_SIZES, default 4KiB,256KiB,1MiB,16MiB,
#    64MiB) with 2 and 4 ranks, all with the method of bench/allreduce.c:
#      keel-shm            keel run -n N -- bench/allreduce (keel's shared-memory allreduce,
#                          its default for ranks on one host)
#      keel-tcp            the same with KEEL_TRANSPORT=tcp (keel's links on loopback)
#      openmpi-shm         mpirun.openmpi --mca btl self,vader
#      openmpi-tcp         mpirun.openmpi --mca btl self,tcp --mca btl_tcp_if_include lo
#      mpich               mpirun.mpich (Debian's ch4:ucx: shared memory between ranks on
#                          one host; it spins while it waits)
#      gloo-ring           gloo::AllreduceRing over gloo's TCP transport on loopback
#      gloo-default        gloo::allreduce with default options, same transport
#      keel-*-resilient    keel_allreduce_resilient, both transports (no failure: the
#                          bookkeeping's cost)
#      memcpy              one thread, the largest size, by rank 0 of each keel run
# 3. Runs bench/recovery --policy both (kill -9 of a worker, shrink and replace), then
#    bench/jit (Fashion-MNIST on 4 ranks: JIT's steady-state cost, recovery breakdown of
#    user-level and in-process JIT, wasted minibatches, bit-exact parameters; about 1.5 min),
#    then bench/ec_codec (encode, update, decode of the erasure codes against memcpy; 10 s),
#    then bench/mem_snapshot (the in-memory checkpoint tier: save to and restore from a
#    /dev/shm slot of BENCH_MEM_BYTES, default 256MiB, against memcpy, crc32c alone and
#    torch.save of the same bytes to /dev/shm; 10-20 s),
#    then bench/torch_ddp.py (examples/python/fashion_mnist_ddp.py: step time of the keel
#    backend against gloo under torchrun with 2 and 4 ranks, and recovery from kill -9 of a
#    rank, keel shrink and replace against a torchrun restart from a checkpoint; 4-8
#    min; reported missing where /usr/bin/python3 has no torch or torchrun is absent).
# 4. Prints the tables: time per operation with each peer's time / keel's on the same kind
#    of transport (>1: keel is faster): openmpi-shm and mpich (shared memory) against
#    keel-shm, openmpi-tcp and gloo-* against keel-tcp; bus bandwidth with keel's fraction
#    of memcpy; the resilient path; recovery.
#
# BENCH_JSON=1: JSON lines only on stdout (one object per measurement, recovery's too);
# notes and tables go nowhere, progress to stderr. BENCH_NO_INSTALL=1 skips scripts/deps.sh
# (the peers that are not installed are then reported missing). Every command runs under
# a time limit (BENCH_TIMEOUT_S, default 300 s; bench/torch_ddp.py bounds each of its jobs
# by it); the whole run takes 10-11 minutes here.
set -euo pipefail

build=${1:-build}
keel="$build/bin/keel"
allreduce="$build/bench/allreduce"
recovery="$build/bench/recovery"
jit="$build/bench/jit"
ec_codec="$build/bench/ec_codec"
mem_snapshot="$build/bench/mem_snapshot"
peers="$build/bench/peers"
json=${BENCH_JSON:-0}
sizes=${BENCH_SIZES:-4KiB,256KiB,1MiB,16MiB,64MiB}
mem_bytes=${BENCH_MEM_BYTES:-256MiB}
limit=${BENCH_TIMEOUT_S:-300}
root=$(cd "$(dirname "$0")/.." && pwd)
cores=$(nproc)

# Notes are for people: on stdout with the tables, on stderr when stdout is JSON.
note() {
  if [ "$json" = 1 ]; then echo "$*" >&2; else echo "$*"; fi
}

for program in "$keel" "$allreduce" "$recovery" "$jit" "$ec_codec" "$mem_snapshot"; do
  if [ ! -x "$program" ]; then
    echo "bench: $program is missing (build first: make build, or cmake --build $build)" >&2
    exit 1
  fi
done

work=$(mktemp -d "${TMPDIR:-/tmp}/keel-bench.XXXXXX")
trap 'rm -rf -- "$work"' EXIT
results="$work/results.jsonl"
: >"$results"
started=$(date +%s)

note "# keel benchmarks, $(date -u '+%Y-%m-%d %H:%M UTC'), $cores cores, load $(cut -d' ' -f1-3 /proc/loadavg)"

# ---- the peers: install, build, and note which are there.
if [ "${BENCH_NO_INSTALL:-0}" != 1 ]; then
  if ! "$root/scripts/deps.sh" --bench >&2; then
    note "# peers: scripts/deps.sh --bench failed: the peers not installed are missing below"
  fi
fi
declare -A missing=() # peer (openmpi, mpich, gloo) -> reason
if "$root/bench/peers/build.sh" "$build" >/dev/null && [ -f "$peers/status" ]; then
  while read -r state rest; do
    [ "$state" = missing ] && missing[${rest%%:*}]=${rest#*: }
  done <"$peers/status"
else
  for peer in openmpi mpich gloo; do missing[$peer]="bench/peers/build.sh $build failed"; done
fi
for peer in openmpi mpich gloo; do
  if [ -n "${missing[$peer]:-}" ]; then
    note "# peer $peer: MISSING: ${missing[$peer]}"
  else
    note "# peer $peer: built"
  fi
done

# run NAME COMMAND...: runs one benchmark command under the time limit and keeps its JSON
# lines (echoed on stdout with BENCH_JSON=1); a failure is noted with its stderr's tail.
declare -A failed=() # impl@ranks -> why
run() {
  local name=$1
  shift
  echo "bench: $name" >&2
  local code=0
  timeout -k 10 "$limit" "$@" >"$work/out" 2>"$work/err" || code=$?
  grep '^{' "$work/out" >>"$results" || true
  if [ "$json" = 1 ]; then grep '^{' "$work/out" || true; fi
  if [ "$code" != 0 ]; then
    local why="exit $code"
    [ "$code" = 124 ] && why="timed out after $limit s"
    failed[$name]=$why
    note "# $name: FAILED ($why): $(tail -n 3 "$work/err" | tr '\n' ' ')"
  fi
}

mpirun_openmpi=(mpirun.openmpi --allow-run-as-root --oversubscribe --bind-to none)
for ranks in 2 4; do
  run "keel-shm@$ranks" env -u KEEL_TRANSPORT "$keel" run -n "$ranks" --quiet -- "$allreduce" --sizes "$sizes" --json
  run "keel-tcp@$ranks" env KEEL_TRANSPORT=tcp "$keel" run -n "$ranks" --quiet -- \
    "$allreduce" --sizes "$sizes" --json
  if [ -z "${missing[openmpi]:-}" ]; then
    run "openmpi-shm@$ranks" "${mpirun_openmpi[@]}" -np "$ranks" --mca btl self,vader \
      "$peers/mpi_allreduce.openmpi" --impl openmpi-shm --sizes "$sizes"
    run "openmpi-tcp@$ranks" "${mpirun_openmpi[@]}" -np "$ranks" --mca btl self,tcp \
      --mca btl_tcp_if_include lo "$peers/mpi_allreduce.openmpi" --impl openmpi-tcp \
      --sizes "$sizes"
  fi
  if [ -z "${missing[mpich]:-}" ]; then
    # MPICH spins while it waits: with more ranks than cores, each operation waits for the
    # scheduler (ms for 4 KiB), so it gets half the time per size there.
    mpich_flags=()
    [ "$ranks" -gt "$cores" ] && mpich_flags=(--target-ms 500)
    run "mpich@$ranks" mpirun.mpich -np "$ranks" "$peers/mpi_allreduce.mpich" --impl mpich \
      --sizes "$sizes" "${mpich_flags[@]}"
  fi
  if [ -z "${missing[gloo]:-}" ]; then
    run "gloo@$ranks" "$peers/gloo_allreduce" --ranks "$ranks" --sizes "$sizes" \
      --timeout-s "$((limit > 30 ? limit - 20 : limit))"
  fi
done
for ranks in 2 4; do
  run "keel-shm-resilient@$ranks" env -u KEEL_TRANSPORT "$keel" run -n "$ranks" --quiet -- "$allreduce" \
    --sizes "$sizes" --resilient --json
  run "keel-tcp-resilient@$ranks" env KEEL_TRANSPORT=tcp "$keel" run -n "$ranks" --quiet -- \
    "$allreduce" --sizes "$sizes" --resilient --json
done
echo "bench: recovery" >&2
if [ "$json" = 1 ]; then
  "$recovery" --policy both --json
else
  "$recovery" --policy both >"$work/recovery.txt"
fi
echo "bench: jit" >&2
if [ "$json" = 1 ]; then
  "$jit" --json || failed[jit]="exit $?"
else
  "$jit" >"$work/jit.txt" || failed[jit]="exit $?"
fi
echo "bench: ec codec" >&2
if [ "$json" = 1 ]; then
  "$ec_codec" --json || failed[ec_codec]="exit $?"
else
  "$ec_codec" >"$work/ec_codec.txt" || failed[ec_codec]="exit $?"
fi
echo "bench: mem snapshot" >&2
if [ "$json" = 1 ]; then
  timeout -k 10 "$limit" "$mem_snapshot" --bytes "$mem_bytes" --json || failed[mem_snapshot]="exit $?"
else
  timeout -k 10 "$limit" "$mem_snapshot" --bytes "$mem_bytes" >"$work/mem_snapshot.txt" ||
    failed[mem_snapshot]="exit $?"
fi
echo "bench: torch" >&2
torch_missing=""
if ! /usr/bin/python3 -c 'import torch' 2>/dev/null || [ ! -x /usr/bin/torchrun ]; then
  torch_missing="/usr/bin/python3 without torch, or no /usr/bin/torchrun"
elif [ "$json" = 1 ]; then
  "$root/bench/torch_ddp.py" --build "$build" --timeout "$limit" --json ||
    failed[torch_ddp]="exit $?"
else
  "$root/bench/torch_ddp.py" --build "$build" --timeout "$limit" >"$work/torch_ddp.txt" ||
    failed[torch_ddp]="exit $?"
fi
elapsed=$(($(date +%s) - started))
echo "bench: done in ${elapsed} s" >&2
# A missing peer is reported (above, and in the tables) but is no failure of the benchmark;
# a command that failed or timed out is.
if [ "$json" = 1 ]; then
  [ "${#failed[@]}" -eq 0 ] || echo "bench: failed: ${!failed[*]}" >&2
  [ "${#failed[@]}" -eq 0 ]
  exit
fi

# ---- the tables, from the JSON lines (our own fixed format: awk is enough).
missing_list=""
for peer in "${!missing[@]}"; do missing_list+="$peer "; done
failed_list=""
for name in "${!failed[@]}"; do failed_list+="$name "; done

awk -v sizes="$sizes" -v missing="$missing_list" -v failed="$failed_list" '
function field(line, name,   rest) {
  if (!match(line, "\"" name "\":\"?[^,\"}]*")) return ""
  rest = substr(line, RSTART + length(name) + 3, RLENGTH - length(name) - 3)
  sub(/^"/, "", rest)
  return rest
}
function size_label(bytes) {
  if (bytes >= 1048576 && bytes % 1048576 == 0) return bytes / 1048576 " MiB"
  if (bytes >= 1024 && bytes % 1024 == 0) return bytes / 1024 " KiB"
  return bytes " B"
}
function time_label(us) {
  if (us < 1000) return sprintf("%.1f µs", us)
  if (us < 1000000) return sprintf("%.2f ms", us / 1000)
  return sprintf("%.2f s", us / 1000000)
}
function peer_of(impl) {
  if (impl ~ /^openmpi/) return "openmpi"
  if (impl ~ /^gloo/) return "gloo"
  return impl
}
# What a cell says when there is no figure.
function absent(impl, ranks) {
  if (index(" " missing, " " peer_of(impl) " ")) return "missing"
  if (index(" " failed, " " impl "@" ranks " ") || index(" " failed, " " peer_of(impl) "@" ranks " "))
    return "failed"
  return "-"
}
{
  impl = field($0, "impl"); ranks = field($0, "ranks"); bytes = field($0, "bytes")
  if (impl == "memcpy") { copies[++ncopies] = field($0, "busbw_gbps") + 0; copied = bytes; next }
  key = impl SUBSEP ranks SUBSEP bytes
  time_us[key] = field($0, "time_us") + 0
  busbw[key] = field($0, "busbw_gbps") + 0
}
# The keel figure a peer is compared with: the same kind of transport.
function keel_for(impl) { return impl ~ /-shm$|^mpich$/ ? "keel-shm" : "keel-tcp" }
function cell(key) { return (key in time_us) ? time_label(time_us[key]) : "" }
END {
  npeers = split("openmpi-shm mpich openmpi-tcp gloo-ring gloo-default", peers, " ")
  nkeels = split("keel-shm keel-tcp", keels, " ")
  nsizes = 0
  for (i = 1; i <= ncopies; i++) for (j = i; j > 1 && copies[j - 1] > copies[j]; j--) {
    t = copies[j]; copies[j] = copies[j - 1]; copies[j - 1] = t
  }
  memcpy = ncopies ? copies[int((ncopies + 1) / 2)] : 0
  # The sizes, in bytes, in the order given (bench/allreduce rounds to whole floats).
  n = split(sizes, names, ",")
  for (i = 1; i <= n; i++) {
    s = names[i]; unit = 1
    if (s ~ /[Kk]/) unit = 1024; else if (s ~ /[Mm]/) unit = 1048576; else if (s ~ /[Gg]/) unit = 1073741824
    b = (s + 0) * unit; b -= b % 4; list[++nsizes] = b
  }

  print "## Allreduce, f32 sum: median time per operation"
  print ""
  print "÷ is the peer time / keel time on the same kind of transport (>1: keel is faster):"
  print "openmpi-shm and mpich against keel-shm; openmpi-tcp, gloo-ring, gloo-default against keel-tcp."
  print ""
  line = "| size | ranks |"; rule = "|---|---|"
  for (q = 1; q <= nkeels; q++) { line = line " " keels[q] " |"; rule = rule "---|" }
  for (p = 1; p <= npeers; p++) { line = line " " peers[p] " | ÷ |"; rule = rule "---|---|" }
  print line; print rule
  for (r = 2; r <= 4; r += 2) for (i = 1; i <= nsizes; i++) {
    line = "| " size_label(list[i]) " | " r " |"
    for (q = 1; q <= nkeels; q++) {
      k = keels[q] SUBSEP r SUBSEP list[i]
      line = line " " ((k in time_us) ? time_label(time_us[k]) : absent(keels[q], r)) " |"
    }
    for (p = 1; p <= npeers; p++) {
      k = keel_for(peers[p]) SUBSEP r SUBSEP list[i]
      q = peers[p] SUBSEP r SUBSEP list[i]
      if (!(q in time_us)) { line = line " " absent(peers[p], r) " | |"; continue }
      ratio = (k in time_us) && time_us[k] > 0 ? sprintf("%.2f", time_us[q] / time_us[k]) : ""
      line = line " " time_label(time_us[q]) " | " ratio " |"
    }
    print line
  }
  print ""
  printf "## Bus bandwidth, GB/s (2(n-1)/n · bytes / time); memcpy %.2f GB/s", memcpy
  printf " (one thread, %s, median of %d runs", size_label(copied), ncopies
  if (ncopies > 1) printf ": %.2f-%.2f", copies[1], copies[ncopies]
  print ")"
  print ""
  line = "| size | ranks |"; rule = "|---|---|"
  for (q = 1; q <= nkeels; q++) { line = line " " keels[q] " |"; rule = rule "---|" }
  for (p = 1; p <= npeers; p++) { line = line " " peers[p] " |"; rule = rule "---|" }
  for (q = 1; q <= nkeels; q++) { line = line " " keels[q] " / memcpy |"; rule = rule "---|" }
  print line; print rule
  for (r = 2; r <= 4; r += 2) for (i = 1; i <= nsizes; i++) {
    line = "| " size_label(list[i]) " | " r " |"
    for (q = 1; q <= nkeels; q++) {
      k = keels[q] SUBSEP r SUBSEP list[i]
      line = line " " ((k in busbw) ? sprintf("%.3f", busbw[k]) : absent(keels[q], r)) " |"
    }
    for (p = 1; p <= npeers; p++) {
      q = peers[p] SUBSEP r SUBSEP list[i]
      line = line " " ((q in busbw) ? sprintf("%.3f", busbw[q]) : absent(peers[p], r)) " |"
    }
    for (q = 1; q <= nkeels; q++) {
      k = keels[q] SUBSEP r SUBSEP list[i]
      line = line " " ((k in busbw) && memcpy > 0 ? sprintf("%.1f%%", 100 * busbw[k] / memcpy) : "-") " |"
    }
    print line
  }
  print ""
  print "## keel_allreduce_resilient (no failure) against keel_comm_allreduce: median per op"
  print ""
  print "| size | ranks | keel-shm | keel-shm-resilient | ÷ | keel-tcp | keel-tcp-resilient | ÷ |"
  print "|---|---|---|---|---|---|---|---|"
  for (r = 2; r <= 4; r += 2) for (i = 1; i <= nsizes; i++) {
    line = "| " size_label(list[i]) " | " r " |"
    for (q = 1; q <= nkeels; q++) {
      k = keels[q] SUBSEP r SUBSEP list[i]; m = keels[q] "-resilient" SUBSEP r SUBSEP list[i]
      ratio = (k in time_us) && (m in time_us) ? sprintf("%.2f", time_us[m] / time_us[k]) : ""
      line = line " " cell(k) " | " cell(m) " | " ratio " |"
    }
    print line
  }
}' "$results"

note ""
note "## Recovery: $recovery --policy both"
note ""
cat "$work/recovery.txt"
note ""
note "## Just-in-time checkpoints: $jit"
note ""
cat "$work/jit.txt"
note ""
note "## Erasure codes (ECRec's codec): $ec_codec"
note ""
cat "$work/ec_codec.txt"
note ""
note "## In-memory checkpoint tier (Gemini's snapshot): $mem_snapshot --bytes $mem_bytes"
note ""
cat "$work/mem_snapshot.txt"
note ""
note "## PyTorch: bench/torch_ddp.py --build $build (keel.torch against gloo and torchrun)"
note ""
if [ -n "$torch_missing" ]; then
  note "MISSING: $torch_missing"
else
  cat "$work/torch_ddp.txt"
fi
note ""
note "# notes: mpich with more ranks than cores gets half the time per size (it spins);"
note "# Open MPI runs with --bind-to none, as keel does not pin its ranks."
note "# Whole run: ${elapsed} s; load now $(cut -d' ' -f1-3 /proc/loadavg)."
[ -n "$missing_list" ] && note "# missing peers: ${missing_list}(see the top)"
[ -z "$failed_list" ] || { note "# failed: ${failed_list}(see above)"; exit 1; }
