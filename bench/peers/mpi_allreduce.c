/* MPI_Allreduce peer for bench/allreduce.c: the same method (warm-up, adaptive iteration
 * count, barrier, per-iteration times averaged over ranks, median, result checked after the
 * timing) and the same JSON lines, for MPI_FLOAT MPI_SUM out of place. Built twice by
 * bench/peers/build.sh, with mpicc.openmpi and with mpicc.mpich; the impl name only labels
 * the output (the transport is chosen by the launcher's flags, see scripts/bench.sh).
 * Usage: mpirun -np N mpi_allreduce --impl NAME [--sizes 4KiB,1MiB] [--target-ms T]
 *                                   [--max-iterations K]
 * --target-ms (default 1000) is how long each measurement runs; --max-iterations (default
 * 20000) caps it: MPICH spins, and with more ranks than cores a small allreduce takes ms. */
#define _POSIX_C_SOURCE 200809L
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../bench_stats.h"

#define MAX_SIZES 16
#define MIN_ITERATIONS 10
#define MAX_ITERATIONS 20000

typedef struct options {
  const char *impl;
  double target_ns;
  int64_t max_iterations;
  uint64_t sizes[MAX_SIZES];
  int size_count;
} options;

static double now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

/* "4KiB", "1MiB", "64M", "4096": binary units, as keel_parse_size reads them. */
static int parse_size(const char *text, uint64_t *bytes) {
  char *end;
  unsigned long long value = strtoull(text, &end, 10);
  if (end == text) return -1;
  uint64_t unit = 1;
  if (*end == 'K' || *end == 'k') unit = 1ull << 10;
  if (*end == 'M' || *end == 'm') unit = 1ull << 20;
  if (*end == 'G' || *end == 'g') unit = 1ull << 30;
  if (unit != 1) end++;
  if (strcmp(end, "") != 0 && strcmp(end, "iB") != 0 && strcmp(end, "B") != 0) return -1;
  *bytes = (uint64_t)value * unit;
  return *bytes >= sizeof(float) ? 0 : -1;
}

static int parse_sizes(const char *text, options *opts) {
  char copy[512];
  if (snprintf(copy, sizeof copy, "%s", text) >= (int)sizeof copy) return -1;
  opts->size_count = 0;
  char *saved = NULL;
  for (char *item = strtok_r(copy, ",", &saved); item; item = strtok_r(NULL, ",", &saved)) {
    uint64_t bytes;
    if (opts->size_count == MAX_SIZES || parse_size(item, &bytes) != 0) return -1;
    opts->sizes[opts->size_count++] = bytes - bytes % sizeof(float);
  }
  return opts->size_count > 0 ? 0 : -1;
}

static int parse_options(int argc, char **argv, options *opts) {
  *opts = (options){.impl = NULL,
                    .target_ns = 1e9,
                    .max_iterations = MAX_ITERATIONS,
                    .size_count = 3,
                    .sizes = {4 << 10, 1 << 20, 64 << 20}};
  for (int i = 1; i < argc; i++) {
    const char *value = i + 1 < argc ? argv[i + 1] : NULL;
    int ok = value != NULL;
    if (ok && strcmp(argv[i], "--impl") == 0) {
      opts->impl = value;
    } else if (ok && strcmp(argv[i], "--sizes") == 0) {
      ok = parse_sizes(value, opts) == 0;
    } else if (ok && strcmp(argv[i], "--target-ms") == 0) {
      opts->target_ns = atof(value) * 1e6;
      ok = opts->target_ns > 0;
    } else if (ok && strcmp(argv[i], "--max-iterations") == 0) {
      opts->max_iterations = atoll(value);
      ok = opts->max_iterations >= MIN_ITERATIONS && opts->max_iterations <= MAX_ITERATIONS;
    } else {
      ok = 0;
    }
    if (!ok) return -1;
    i++;
  }
  return opts->impl ? 0 : -1;
}


static int64_t warmup_iterations(uint64_t bytes) {
  if (bytes >= (8u << 20)) return 2;
  if (bytes >= (256u << 10)) return 10;
  return 50;
}

static int64_t iterations_for(const options *opts, double per_op_ns) {
  double wanted = per_op_ns > 0 ? opts->target_ns / per_op_ns : (double)opts->max_iterations;
  if (wanted < MIN_ITERATIONS) return MIN_ITERATIONS;
  return wanted > (double)opts->max_iterations ? opts->max_iterations : (int64_t)wanted;
}

static void fill_send(float *send, size_t count, int rank) {
  for (size_t i = 0; i < count; i++) send[i] = (float)(i % 7) + (float)rank;
}

static int result_correct(const float *recv, size_t count, int size) {
  for (size_t i = 0; i < count; i++) {
    float expected = (float)size * (float)(i % 7) + (float)(size * (size - 1) / 2);
    if (recv[i] != expected) {
      fprintf(stderr, "mpi_allreduce: wrong result at element %zu: %g, expected %g\n", i,
              (double)recv[i], (double)expected);
      return 0;
    }
  }
  return 1;
}

static void measure(const options *opts, uint64_t bytes, float *send, float *recv,
                    double *times) {
  int rank, size;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  int count = (int)(bytes / sizeof(float));
  fill_send(send, (size_t)count, rank);
  int64_t warmup = warmup_iterations(bytes);
  double start = now_ns();
  for (int64_t i = 0; i < warmup; i++)
    MPI_Allreduce(send, recv, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  double per_op = (now_ns() - start) / (double)warmup, slowest = 0;
  MPI_Allreduce(&per_op, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  int64_t iterations = iterations_for(opts, slowest);
  MPI_Barrier(MPI_COMM_WORLD);
  for (int64_t i = 0; i < iterations; i++) {
    start = now_ns();
    MPI_Allreduce(send, recv, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    times[i] = now_ns() - start;
  }
  if (!result_correct(recv, (size_t)count, size)) MPI_Abort(MPI_COMM_WORLD, 3);
  /* Average over ranks of each iteration's time (the OSU convention, as bench/allreduce.c). */
  MPI_Allreduce(times, times + iterations, (int)iterations, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  if (rank != 0) return;
  for (int64_t i = 0; i < iterations; i++) times[iterations + i] /= size;
  double median_us, mean_us;
  bench_summarize(times + iterations, iterations, &median_us, &mean_us);
  double factor = size > 1 ? 2.0 * (size - 1) / size : 1.0;
  printf(
      "{\"bench\":\"allreduce\",\"impl\":\"%s\",\"ranks\":%d,\"bytes\":%llu,"
      "\"time_us\":%.3f,\"mean_us\":%.3f,\"busbw_gbps\":%.4f,\"iterations\":%lld}\n",
      opts->impl, size, (unsigned long long)bytes, median_us, mean_us,
      factor * (double)bytes / (median_us * 1e3), (long long)iterations);
  fflush(stdout);
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  options opts;
  if (parse_options(argc, argv, &opts) != 0) {
    fprintf(stderr, "mpi_allreduce: bad flags (see the file's header)\n");
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  uint64_t largest = 0;
  for (int i = 0; i < opts.size_count; i++)
    if (opts.sizes[i] > largest) largest = opts.sizes[i];
  if (largest / sizeof(float) > (uint64_t)INT32_MAX) MPI_Abort(MPI_COMM_WORLD, 2);
  float *send = malloc(largest), *recv = malloc(largest);
  double *times = malloc(2 * MAX_ITERATIONS * sizeof *times);
  if (!send || !recv || !times) {
    fprintf(stderr, "mpi_allreduce: out of memory\n");
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  for (int i = 0; i < opts.size_count; i++) measure(&opts, opts.sizes[i], send, recv, times);
  free(times);
  free(send);
  free(recv);
  MPI_Finalize();
  return 0;
}
