/* The bits of reductions, for test_placement_bits to compare between transports: runs
 * allreduce and reduce-scatter of every dtype and operation over counts from 1 element to a
 * few MiB (odd ones, and ones on either side of the transports' size thresholds) on inputs
 * whose float sums depend on the order of evaluation (magnitudes from 2^-24 to 2^24, signed
 * zeros for max), and prints at rank 0, under `keel run`:
 *   placement-bits transport=T ranks=N
 *   placement-bits case=NAME crc=XXXXXXXX naive=XXXXXXXX|-
 *   placement-bits done cases=K
 * crc is the crc32c of the result (of every rank's block, in rank order, for reduce-scatter);
 * naive, for float sums and maxima of allreduce, is the crc of the result folded in plain rank
 * order 0..n-1, so the test can see that the order it checks is not that one everywhere.
 * Exits 1 when ranks disagree or a collective fails. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "keel/keel.h"

/* Element i of rank r's float input, drawn from the case's stream (store_value narrows it;
 * integer dtypes take a random word instead). Every fifth element is a zero whose sign varies
 * by rank, so that max(+0, -0) and max(-0, +0) tell two orders apart. */
static double input_value(keel_random *random, int rank, size_t i) {
  double unit = keel_random_unit(random), sign = keel_random_unit(random) < 0.5 ? -1 : 1;
  int exponent = (int)keel_random_below(random, 49) - 24;
  if (i % 5 == 0) return ((size_t)rank + i / 5) % 2 ? -0.0 : 0.0;
  return sign * ldexp(1 + unit, exponent);
}

static void store_value(keel_dtype dtype, void *buffer, size_t i, double value, int64_t whole) {
  switch (dtype) {
    case KEEL_F32:
      ((float *)buffer)[i] = (float)value;
      break;
    case KEEL_F64:
      ((double *)buffer)[i] = value;
      break;
    case KEEL_I32:
      ((int32_t *)buffer)[i] = (int32_t)whole;
      break;
    case KEEL_I64:
      ((int64_t *)buffer)[i] = whole;
      break;
    case KEEL_BF16: {
      float narrow = (float)value;
      uint32_t bits;
      memcpy(&bits, &narrow, sizeof bits);
      ((uint16_t *)buffer)[i] = (uint16_t)(bits >> 16);
      break;
    }
  }
}

/* Rank r's whole input of a case: a stream of its own, so rank 0 can remake any rank's. */
static void fill(keel_dtype dtype, void *buffer, size_t count, uint64_t seed, int rank) {
  keel_random random;
  keel_random_seed(&random, keel_random_seed_for(seed, 0, (uint64_t)rank));
  for (size_t i = 0; i < count; i++) {
    double value = input_value(&random, rank, i);
    store_value(dtype, buffer, i, value, (int64_t)keel_random_next(&random));
  }
}

/* The plain rank-order fold ((x0 op x1) op x2) ... of a float sum or max, as the kernels
 * evaluate each step (left: the partial, right: the next rank's). */
#define DEFINE_NAIVE_STEP(suffix, type)                                                          \
  static void naive_step_##suffix(type *partial, const type *next, size_t count,                 \
                                  keel_reduce_op op) {                                           \
    for (size_t i = 0; i < count; i++)                                                           \
      partial[i] =                                                                               \
          op == KEEL_MAX ? (partial[i] > next[i] ? partial[i] : next[i]) : partial[i] + next[i]; \
  }
DEFINE_NAIVE_STEP(f32, float)
DEFINE_NAIVE_STEP(f64, double)

static bool has_naive(keel_dtype dtype, keel_reduce_op op) {
  return (dtype == KEEL_F32 || dtype == KEEL_F64) && (op == KEEL_SUM || op == KEEL_MAX);
}

/* The crc of the rank-order fold of every rank's input of the case. */
static uint32_t naive_crc(keel_dtype dtype, keel_reduce_op op, size_t count, uint64_t seed,
                          int size) {
  size_t bytes = count * keel_dtype_size(dtype);
  uint8_t *partial = malloc(bytes), *next = malloc(bytes);
  if (partial == NULL || next == NULL) {
    free(partial);
    free(next);
    return 0;
  }
  fill(dtype, partial, count, seed, 0);
  for (int rank = 1; rank < size; rank++) {
    fill(dtype, next, count, seed, rank);
    if (dtype == KEEL_F32)
      naive_step_f32((float *)partial, (const float *)next, count, op);
    else
      naive_step_f64((double *)partial, (const double *)next, count, op);
  }
  uint32_t crc = keel_crc32c(0, partial, bytes);
  free(partial);
  free(next);
  return crc;
}

typedef enum collective { ALLREDUCE, REDUCE_SCATTER } collective;

typedef struct run_case {
  collective which;
  keel_dtype dtype;
  keel_reduce_op op;
  size_t count; /* elements of the result: the buffer, or each rank's block */
  uint64_t seed;
} run_case;

static const char *dtype_name(keel_dtype dtype) {
  static const char *const names[] = {[KEEL_F32] = "f32",
                                      [KEEL_F64] = "f64",
                                      [KEEL_I32] = "i32",
                                      [KEEL_I64] = "i64",
                                      [KEEL_BF16] = "bf16"};
  return names[dtype];
}

static const char *op_name(keel_reduce_op op) {
  return op == KEEL_SUM ? "sum" : op == KEEL_AVG ? "avg" : "max";
}

/* Runs one case at every rank; rank 0 prints its line. Returns false on a failure. */
static bool run_one(keel_comm *comm, const run_case *c) {
  int rank = keel_comm_rank(comm), size = keel_comm_size(comm);
  size_t element_size = keel_dtype_size(c->dtype);
  size_t result_bytes = c->count * element_size;
  size_t input_count = c->which == ALLREDUCE ? c->count : c->count * (size_t)size;
  uint8_t *send = malloc(input_count * element_size + 1), *recv = malloc(result_bytes + 1);
  uint32_t *crcs = calloc((size_t)size, sizeof *crcs);
  bool ok = send != NULL && recv != NULL && crcs != NULL;
  if (ok) {
    fill(c->dtype, send, input_count, c->seed, rank);
    keel_status status =
        c->which == ALLREDUCE
            ? keel_comm_allreduce(comm, send, recv, c->count, c->dtype, c->op)
            : keel_comm_reduce_scatter(comm, send, recv, c->count, c->dtype, c->op);
    uint32_t crc = keel_crc32c(0, recv, result_bytes);
    if (status == KEEL_OK) status = keel_comm_allgather(comm, &crc, crcs, sizeof crc);
    if (status != KEEL_OK) fprintf(stderr, "placement-bits: %s\n", keel_strerror(status));
    ok = status == KEEL_OK;
  }
  char name[96];
  snprintf(name, sizeof name, "%s/%s/%s/%zu",
           c->which == ALLREDUCE ? "allreduce" : "reduce-scatter", dtype_name(c->dtype),
           op_name(c->op), c->count);
  for (int r = 1; ok && c->which == ALLREDUCE && r < size; r++) {
    if (crcs[r] == crcs[0]) continue;
    fprintf(stderr, "placement-bits: %s: rank %d holds other bits than rank 0\n", name, r);
    ok = false;
  }
  if (ok && rank == 0) {
    uint32_t crc =
        c->which == ALLREDUCE ? crcs[0] : keel_crc32c(0, crcs, (size_t)size * sizeof *crcs);
    char naive[16] = "-";
    if (c->which == ALLREDUCE && has_naive(c->dtype, c->op))
      snprintf(naive, sizeof naive, "%08x", naive_crc(c->dtype, c->op, c->count, c->seed, size));
    printf("placement-bits case=%s crc=%08x naive=%s\n", name, crc, naive);
  }
  free(send);
  free(recv);
  free(crcs);
  return ok;
}

int main(void) {
  /* Each line in one write, whole, among the other processes' output. */
  setvbuf(stdout, NULL, _IOLBF, 0);
  keel_ctx *ctx = NULL;
  if (keel_init(&ctx) != KEEL_OK) return 2;
  keel_comm *comm = keel_world(ctx);
  /* Allreduce counts straddle tcp's direct limits (32 KiB: 8192 f32; 256 KiB sent: 65536 f32
   * with 2 ranks, 21845 with 4), shm's whole-buffer limit (256 KiB), its chunk (1 MiB) and
   * tcp's frame segment (4 MiB). */
  static const size_t allreduce_counts[] = {1,     7,     1000,  8191,   8192,  8193,
                                            21845, 21846, 65537, 262147, 786433};
  static const size_t reduce_scatter_counts[] = {1, 7, 1000, 65537, 262147};
  static const keel_dtype dtypes[] = {KEEL_F32, KEEL_F64, KEEL_BF16, KEEL_I32, KEEL_I64};
  static const keel_reduce_op ops[] = {KEEL_SUM, KEEL_AVG, KEEL_MAX};
  if (keel_comm_barrier(comm) != KEEL_OK) return 1;
  if (keel_comm_rank(comm) == 0)
    printf("placement-bits transport=%s ranks=%d\n", keel_comm_transport(comm),
           keel_comm_size(comm));
  int cases = 0, failures = 0;
  for (int which = ALLREDUCE; which <= REDUCE_SCATTER; which++) {
    const size_t *counts = which == ALLREDUCE ? allreduce_counts : reduce_scatter_counts;
    size_t count_total = which == ALLREDUCE
                             ? sizeof allreduce_counts / sizeof allreduce_counts[0]
                             : sizeof reduce_scatter_counts / sizeof reduce_scatter_counts[0];
    for (size_t k = 0; k < count_total; k++)
      for (size_t d = 0; d < sizeof dtypes / sizeof dtypes[0]; d++)
        for (size_t o = 0; o < sizeof ops / sizeof ops[0]; o++) {
          run_case c = {(collective)which, dtypes[d], ops[o], counts[k], (uint64_t)++cases};
          failures += !run_one(comm, &c);
        }
  }
  if (keel_comm_rank(comm) == 0) printf("placement-bits done cases=%d\n", cases);
  keel_finalize(ctx);
  return failures == 0 ? 0 : 1;
}
