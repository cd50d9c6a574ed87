/* The one statistic every allreduce benchmark reports, keel's and the peers' harnesses
 * alike (bench/allreduce.c, bench/peers/mpi_allreduce.c), so their figures compare: the
 * median and the mean of per-iteration times (the other benchmarks use its sort and median).
 * Header-only: the peers are built outside CMake. */
#ifndef KEEL_BENCH_STATS_H
#define KEEL_BENCH_STATS_H

#include <stdint.h>
#include <stdlib.h>

static inline int bench_compare_doubles(const void *left, const void *right) {
  double a = *(const double *)left, b = *(const double *)right;
  return (a > b) - (a < b);
}

/* The median of sorted values; count > 0. */
static inline double bench_median_sorted(const double *sorted, int64_t count) {
  return count % 2 ? sorted[count / 2] : (sorted[count / 2 - 1] + sorted[count / 2]) / 2;
}

/* Median and mean of times (ns), in microseconds; sorts times. count > 0. */
static inline void bench_summarize(double *times, int64_t count, double *median_us,
                                   double *mean_us) {
  qsort(times, (size_t)count, sizeof *times, bench_compare_doubles);
  double sum = 0;
  for (int64_t i = 0; i < count; i++) sum += times[i];
  *median_us = bench_median_sorted(times, count) / 1e3;
  *mean_us = sum / (double)count / 1e3;
}

#endif
