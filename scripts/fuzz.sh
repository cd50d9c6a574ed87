#!/usr/bin/env bash
# `make fuzz`: builds the fuzz targets with clang's libFuzzer under ASan+UBSan (folder
# build-fuzz) and runs each for FUZZ_SECONDS (default 600), starting from and growing its
# committed corpus tests/fuzz/corpus/<target>/ (new inputs are merged in, minimised; commit
# them: `make test` replays the corpus). A crash leaves its input in tests/fuzz/crashes/ and
# fails the run: add it to the target's corpus once fixed, as its replay case.
# Prints each target's executions per second and coverage (docs/FUZZING.md keeps them).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${FUZZ_SECONDS:-600}"
build="${FUZZ_BUILD:-build-fuzz}"
CC=clang cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKEEL_FUZZ=ON \
  -DKEEL_BENCH=OFF >/dev/null
targets=()
for source in tests/fuzz/fuzz_*.c; do targets+=("$(basename "$source" .c)"); done
[ -n "${FUZZ_TARGETS:-}" ] && read -r -a targets <<<"$FUZZ_TARGETS"
cmake --build "$build" -j"${JOBS:-2}" --target "${targets[@]}"
mkdir -p tests/fuzz/crashes
failed=0
printf '%-20s %10s %8s %8s %8s\n' target exec/s cov ft corpus
for target in "${targets[@]}"; do
  corpus="tests/fuzz/corpus/$target"
  fresh="$(mktemp -d)"
  mkdir -p "$corpus"
  log="$build/$target.log"
  # The committed corpus is read, never written, while fuzzing; new finds go to fresh.
  if ! KEEL_LOG=off "$build/tests/$target" -max_total_time="$seconds" -print_final_stats=1 \
      -artifact_prefix=tests/fuzz/crashes/"$target"- -max_len=8192 "$fresh" "$corpus" \
      >"$log" 2>&1; then
    echo "$target: crashed; the input is in tests/fuzz/crashes/ (log: $log)" >&2
    failed=1
  fi
  KEEL_LOG=off "$build/tests/$target" -merge=1 "$corpus" "$fresh" >"$log.merge" 2>&1 || true
  rm -rf "$fresh"
  # The fuzzing's last status line: "#N DONE cov: C ft: F corp: K/.. exec/s: E rss: ..."
  line="$(grep -E '^#[0-9]+' "$log" | tail -1 || true)"
  exec_s="$(sed -nE 's/.*exec\/s: ([0-9]+).*/\1/p' <<<"$line")"
  cov="$(sed -nE 's/.* cov: ([0-9]+).*/\1/p' <<<"$line")"
  ft="$(sed -nE 's/.* ft: ([0-9]+).*/\1/p' <<<"$line")"
  printf '%-20s %10s %8s %8s %8s\n' "$target" "${exec_s:-?}" "${cov:-?}" "${ft:-?}" \
    "$(find "$corpus" -type f | wc -l)"
done
exit "$failed"
