#!/usr/bin/env bash
# Installs the Debian packages keel needs (DESIGN.md, Dependencies). Idempotent: a package
# already present is not touched, and nothing runs apt-get when all are there.
# Usage: scripts/deps.sh [--bench | --fuzz]   (--bench adds the peers the benchmarks compare
# with; --fuzz adds clang, whose libFuzzer `make fuzz` uses)
set -euo pipefail

packages=(
  build-essential cmake pkg-config
  libcmocka-dev libisal-dev libsodium-dev
  libcurl4-openssl-dev libjansson-dev
  etcd-server etcd-client
  libopenblas-dev zlib1g-dev dataset-fashion-mnist
  iproute2 procps
  python3-torch python3-numpy
)
if [ "${1:-}" = "--bench" ]; then
  # The allreduce peers (bench/peers/): Gloo's C++ library, Open MPI and MPICH with their
  # compiler wrappers and launchers.
  packages+=(libgloo-dev openmpi-bin libopenmpi-dev mpich libmpich-dev g++)
fi
if [ "${1:-}" = "--fuzz" ]; then
  packages+=(clang)
fi

missing=()
for package in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q 'install ok installed' ||
    missing+=("$package")
done
[ "${#missing[@]}" -eq 0 ] && exit 0

echo "deps: installing ${missing[*]}" >&2
sudo_cmd=()
[ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
