# The README's commands. CMake does the building; this file only names the steps.
BUILD ?= build
ASAN_BUILD ?= build-asan
JOBS ?= 2

.PHONY: all deps build test test-sanitize demo bench bench-netns fuzz soak load-run clean

all: build

deps:
	@scripts/deps.sh

build: deps
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
	@cmake --build $(BUILD) -j$(JOBS)

test: build
	@cd $(BUILD) && ctest --output-on-failure -j$(JOBS) --timeout 900

# The same tests under AddressSanitizer and UndefinedBehaviorSanitizer (CI runs both).
test-sanitize: deps
	@cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DKEEL_SANITIZE=ON -DKEEL_BENCH=OFF >/dev/null
	@cmake --build $(ASAN_BUILD) -j$(JOBS)
	@cd $(ASAN_BUILD) && ctest --output-on-failure -j$(JOBS) --timeout 900

demo: build
	@scripts/demo.sh $(BUILD)

bench: build
	@scripts/bench.sh $(BUILD)

bench-netns: build
	@scripts/bench_netns.sh $(BUILD)

# libFuzzer on every parser, FUZZ_SECONDS each (default 600); grows tests/fuzz/corpus/.
fuzz:
	@scripts/deps.sh --fuzz
	@scripts/fuzz.sh

# keel chaos through SOAK_FAILURES failures (default 2000) of every kind it supports, on one
# host, on nodes, on etcd, on parameter servers and on a PyTorch DDP job (SOAK_PARTS picks
# some); reports in soak/ (RELIABILITY.md). Not part of `make test`.
soak: build
	@scripts/soak.sh $(BUILD)

# No false deaths: a failure-free job beside two busy loops for LOAD_MINUTES (default 30), one
# rank computing 5 s longer once a minute; passes when no death was declared.
load-run: build
	@scripts/load_run.sh $(BUILD) $(or $(LOAD_MINUTES),30)

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) build-fuzz
