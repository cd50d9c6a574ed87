#!/usr/bin/env bash
# Builds the allreduce peers that scripts/bench.sh compares keel with, into
# BUILD_DIR/bench/peers/, with the system compilers (not CMake: the peers are optional):
#   mpi_allreduce.openmpi  mpi_allreduce.c with mpicc.openmpi  (openmpi-shm, openmpi-tcp)
#   mpi_allreduce.mpich    mpi_allreduce.c with mpicc.mpich    (mpich)
#   gloo_allreduce         gloo_allreduce.cc with g++ -lgloo   (gloo-ring, gloo-default)
# Every peer gets one line, on stdout and in BUILD_DIR/bench/peers/status:
#   "ok NAME" or "missing NAME: reason" (a package not installed, a build that failed:
#   its compiler output is in BUILD_DIR/bench/peers/NAME.log). Never fails for a peer.
# Usage: bench/peers/build.sh BUILD_DIR     (scripts/deps.sh --bench installs the packages)
set -uo pipefail

build=${1:?usage: bench/peers/build.sh BUILD_DIR}
source_dir=$(cd "$(dirname "$0")" && pwd)
out="$build/bench/peers"
mkdir -p "$out" || exit 1
status_file="$out/status"
: >"$status_file"

report() {
  echo "$*"
  echo "$*" >>"$status_file"
}

# missing_tools PACKAGE TOOL...: the first tool that is not there, with its package.
missing_tools() {
  local package=$1
  shift
  for tool in "$@"; do
    if ! command -v "$tool" >/dev/null 2>&1 && [ ! -e "$tool" ]; then
      echo "$tool not found (Debian package $package not installed)"
      return
    fi
  done
}

# build_one NAME OUTPUT SOURCE COMMAND...: runs COMMAND unless OUTPUT is newer than SOURCE
# and this script.
build_one() {
  local name=$1 output=$2 source=$3
  shift 3
  if [ -x "$output" ] && [ "$output" -nt "$source" ] && [ "$output" -nt "$0" ]; then
    report "ok $name"
    return
  fi
  if "$@" >"$out/$name.log" 2>&1; then
    report "ok $name"
  else
    local first_error
    first_error=$(grep -m1 -E 'error|undefined' "$out/$name.log" || tail -n1 "$out/$name.log")
    report "missing $name: does not build ($first_error; see $out/$name.log)"
  fi
}

cflags=(-std=c11 -O2 -Wall -Wextra)

reason=$(missing_tools libopenmpi-dev mpicc.openmpi)
[ -z "$reason" ] && reason=$(missing_tools openmpi-bin mpirun.openmpi)
if [ -n "$reason" ]; then
  report "missing openmpi: $reason"
else
  build_one openmpi "$out/mpi_allreduce.openmpi" "$source_dir/mpi_allreduce.c" \
    mpicc.openmpi "${cflags[@]}" -o "$out/mpi_allreduce.openmpi" "$source_dir/mpi_allreduce.c"
fi

reason=$(missing_tools libmpich-dev mpicc.mpich)
[ -z "$reason" ] && reason=$(missing_tools mpich mpirun.mpich)
if [ -n "$reason" ]; then
  report "missing mpich: $reason"
else
  build_one mpich "$out/mpi_allreduce.mpich" "$source_dir/mpi_allreduce.c" \
    mpicc.mpich "${cflags[@]}" -o "$out/mpi_allreduce.mpich" "$source_dir/mpi_allreduce.c"
fi

# Debian's libgloo-dev ships headers, /usr/lib/libgloo.so and a CMake package, but no
# pkg-config file: plain -lgloo (its own dependencies come with the shared library).
reason=$(missing_tools g++ g++)
[ -z "$reason" ] && reason=$(missing_tools libgloo-dev /usr/include/gloo/allreduce.h)
if [ -n "$reason" ]; then
  report "missing gloo: $reason"
else
  build_one gloo "$out/gloo_allreduce" "$source_dir/gloo_allreduce.cc" \
    g++ -std=c++17 -O2 -Wall -Wextra -o "$out/gloo_allreduce" "$source_dir/gloo_allreduce.cc" \
    -lgloo -pthread
fi
exit 0
