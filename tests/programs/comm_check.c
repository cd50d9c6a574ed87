/* Checks every collective under `keel run` (or alone): results against values computed
 * here from every rank's deterministic inputs, for each dtype and operation, counts
 * including 0, 1, odd and ring-sized, in place and out of place, every broadcast root.
 * Integer-valued floats make sums exact whatever the order; a crc of results made from
 * random floats is then allgathered to check every rank holds the same bits; a point-to-point
 * request moves in the background of collectives. Prints
 * "comm-check ok ranks=N checks=K" and exits 0, or names the first mismatch and exits 1. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "keel/keel.h"

static int failures;
static int checks;

#define EXPECT(condition, ...)              \
  do {                                      \
    checks++;                               \
    if (!(condition)) {                     \
      failures++;                           \
      fprintf(stderr, "comm-check: " __VA_ARGS__); \
      fprintf(stderr, "\n");                \
    }                                       \
  } while (0)

/* Input element i of rank r: small integers, so every sum is exact. */
static double input_value(int rank, size_t i) { return (double)((rank * 7 + (int)(i % 13)) % 17) - 5; }

static void fill(keel_dtype dtype, void *buffer, size_t count, int rank) {
  for (size_t i = 0; i < count; i++) {
    double value = input_value(rank, i);
    switch (dtype) {
      case KEEL_F32: ((float *)buffer)[i] = (float)value; break;
      case KEEL_F64: ((double *)buffer)[i] = value; break;
      case KEEL_I32: ((int32_t *)buffer)[i] = (int32_t)value; break;
      case KEEL_I64: ((int64_t *)buffer)[i] = (int64_t)value; break;
      case KEEL_BF16: {
        float narrow = (float)value; /* small integers: exact in bf16 */
        uint32_t bits;
        memcpy(&bits, &narrow, sizeof bits);
        ((uint16_t *)buffer)[i] = (uint16_t)(bits >> 16);
        break;
      }
    }
  }
}

static double element(keel_dtype dtype, const void *buffer, size_t i) {
  switch (dtype) {
    case KEEL_F32: return ((const float *)buffer)[i];
    case KEEL_F64: return ((const double *)buffer)[i];
    case KEEL_I32: return ((const int32_t *)buffer)[i];
    case KEEL_I64: return (double)((const int64_t *)buffer)[i];
    case KEEL_BF16: {
      uint32_t bits = (uint32_t)((const uint16_t *)buffer)[i] << 16;
      float value;
      memcpy(&value, &bits, sizeof value);
      return value;
    }
  }
  return 0;
}

static double expected(keel_dtype dtype, keel_reduce_op op, int size, size_t i) {
  double sum = 0, maximum = -1e300;
  for (int rank = 0; rank < size; rank++) {
    double value = input_value(rank, i);
    sum += value;
    if (value > maximum) maximum = value;
  }
  if (op == KEEL_MAX) return maximum;
  if (op == KEEL_SUM) return sum;
  if (dtype == KEEL_I32 || dtype == KEEL_I64) return (double)((long long)sum / size);
  if (dtype == KEEL_BF16) {
    /* The sum is exact; the division is done in f32 and rounded to bf16 like the kernel. */
    float quotient = (float)sum / (float)size;
    uint32_t bits;
    memcpy(&bits, &quotient, sizeof bits);
    bits = (bits + 0x7fffu + ((bits >> 16) & 1u)) & 0xffff0000u;
    memcpy(&quotient, &bits, sizeof quotient);
    return quotient;
  }
  return dtype == KEEL_F32 ? (double)((float)sum / (float)size) : sum / size;
}

static void check_allreduce(keel_comm *comm, keel_dtype dtype, keel_reduce_op op, size_t count,
                            bool in_place) {
  int rank = keel_comm_rank(comm), size = keel_comm_size(comm);
  size_t bytes = count * keel_dtype_size(dtype);
  void *send = malloc(bytes + 8), *recv = malloc(bytes + 8);
  fill(dtype, send, count, rank);
  if (in_place) memcpy(recv, send, bytes);
  keel_status status = keel_comm_allreduce(comm, in_place ? recv : send, recv, count, dtype, op);
  EXPECT(status == KEEL_OK, "allreduce dtype %d op %d count %zu: %s", dtype, op, count,
         keel_strerror(status));
  for (size_t i = 0; i < count && status == KEEL_OK; i++) {
    double want = expected(dtype, op, size, i), got = element(dtype, recv, i);
    if (got != want) {
      EXPECT(false, "allreduce dtype %d op %d count %zu in_place %d: [%zu] = %g, want %g", dtype,
             op, count, in_place, i, got, want);
      break;
    }
  }
  if (!in_place) {
    void *again = malloc(bytes + 8);
    fill(dtype, again, count, rank);
    EXPECT(memcmp(again, send, bytes) == 0, "allreduce wrote into its send buffer");
    free(again);
  }
  free(send);
  free(recv);
}

/* Ring-sized allreduces back to back while rank 0 lags before every other one: the others'
 * first segments of the next operation reach it before it posts its receives, and are
 * reduced from where they arrived (progress.c's adopted buffers) rather than copied. */
static void check_allreduce_behind_a_lagging_rank(keel_comm *comm) {
  int rank = keel_comm_rank(comm), size = keel_comm_size(comm);
  size_t count = (size_t)1 << 20;
  float *send = malloc(count * sizeof *send), *recv = malloc(count * sizeof *recv);
  fill(KEEL_F32, send, count, rank);
  for (int round = 0; round < 6; round++) {
    if (rank == 0 && round % 2 == 1) nanosleep(&(struct timespec){0, 5000000}, NULL);
    keel_status status = keel_comm_allreduce(comm, send, recv, count, KEEL_F32, KEEL_SUM);
    EXPECT(status == KEEL_OK, "lagging allreduce %d: %s", round, keel_strerror(status));
    for (size_t i = 0; i < count && status == KEEL_OK; i++) {
      double want = expected(KEEL_F32, KEEL_SUM, size, i);
      if ((double)recv[i] != want) {
        EXPECT(false, "lagging allreduce %d: [%zu] = %g, want %g", round, i, recv[i], want);
        break;
      }
    }
  }
  free(send);
  free(recv);
}

static void check_same_bits_everywhere(keel_comm *comm, size_t count) {
  int rank = keel_comm_rank(comm), size = keel_comm_size(comm);
  float *send = malloc(count * sizeof(float) + 4), *recv = malloc(count * sizeof(float) + 4);
  keel_random random;
  keel_random_seed(&random, 1000 + (uint64_t)rank);
  for (size_t i = 0; i < count; i++) send[i] = (float)(keel_random_unit(&random) * 2 - 1);
  EXPECT(keel_comm_allreduce(comm, send, recv, count, KEEL_F32, KEEL_SUM) == KEEL_OK,
         "random allreduce");
  uint32_t crc = keel_crc32c(0, recv, count * sizeof(float));
  uint32_t *all = calloc((size_t)size, sizeof(uint32_t));
  EXPECT(keel_comm_allgather(comm, &crc, all, sizeof crc) == KEEL_OK, "allgather of crcs");
  for (int r = 0; r < size; r++)
    EXPECT(all[r] == crc, "rank %d holds other bits than rank %d for count %zu", r, rank, count);
  free(all);
  free(send);
  free(recv);
}

static void check_broadcast(keel_comm *comm, size_t bytes) {
  int rank = keel_comm_rank(comm), size = keel_comm_size(comm);
  uint8_t *buffer = malloc(bytes + 1);
  for (int root = 0; root < size; root++) {
    for (size_t i = 0; i < bytes; i++) buffer[i] = rank == root ? (uint8_t)(i * 31 + (size_t)root) : 0;
    EXPECT(keel_comm_broadcast(comm, buffer, bytes, root) == KEEL_OK, "broadcast");
    for (size_t i = 0; i < bytes; i++) {
      if (buffer[i] != (uint8_t)(i * 31 + (size_t)root)) {
        EXPECT(false, "broadcast from %d of %zu bytes: byte %zu wrong", root, bytes, i);
        break;
      }
    }
  }
  free(buffer);
}

static void check_allgather_and_reduce_scatter(keel_comm *comm, size_t per_rank) {
  int rank = keel_comm_rank(comm), size = keel_comm_size(comm);
  int32_t *mine = malloc(per_rank * sizeof(int32_t) + 4);
  int32_t *all = malloc(per_rank * sizeof(int32_t) * (size_t)size + 4);
  for (size_t i = 0; i < per_rank; i++) mine[i] = rank * 1000 + (int32_t)i;
  EXPECT(keel_comm_allgather(comm, mine, all, per_rank * sizeof(int32_t)) == KEEL_OK, "allgather");
  for (int r = 0; r < size; r++) {
    for (size_t i = 0; i < per_rank; i++) {
      if (all[(size_t)r * per_rank + i] != r * 1000 + (int32_t)i) {
        EXPECT(false, "allgather block %d element %zu wrong", r, i);
        r = size;
        break;
      }
    }
  }
  /* reduce_scatter: rank r's input block b is b*100 + r + i; block b sums over ranks. */
  for (int b = 0; b < size; b++)
    for (size_t i = 0; i < per_rank; i++) all[(size_t)b * per_rank + i] = b * 100 + rank + (int32_t)i;
  EXPECT(keel_comm_reduce_scatter(comm, all, mine, per_rank, KEEL_I32, KEEL_SUM) == KEEL_OK,
         "reduce_scatter");
  for (size_t i = 0; i < per_rank; i++) {
    int32_t want = size * (rank * 100 + (int32_t)i) + size * (size - 1) / 2;
    if (mine[i] != want) {
      EXPECT(false, "reduce_scatter element %zu = %d, want %d", i, mine[i], want);
      break;
    }
  }
  free(mine);
  free(all);
}

/* A point-to-point request moves in the background of collectives: rank 0 sends 64 MiB to
 * the last rank, both post the request and then run a few large allreduces without touching
 * it. Afterwards one keel_request_test (one non-blocking pass of the progress engine, which
 * moves at most a socket buffer's worth, a few MiB) must find it complete: the rest moved
 * while the collectives waited. The bytes are checked, and a small blocking send goes the
 * other way. */
#define BACKGROUND_BYTES ((size_t)64 << 20)
#define BACKGROUND_TAG 0x7e57

static void check_background_transfer(keel_comm *comm) {
  int rank = keel_comm_rank(comm), size = keel_comm_size(comm), last = size - 1;
  if (size < 2) return;
  bool sender = rank == 0, receiver = rank == last;
  uint8_t *data = (sender || receiver) ? malloc(BACKGROUND_BYTES) : NULL;
  float *send = malloc(((size_t)4 << 20) * sizeof(float));
  float *recv = malloc(((size_t)4 << 20) * sizeof(float));
  if (((sender || receiver) && data == NULL) || send == NULL || recv == NULL) {
    EXPECT(false, "no memory for the background transfer check");
    goto done;
  }
  for (size_t i = 0; i < BACKGROUND_BYTES && sender; i++) data[i] = (uint8_t)(i * 7 + 3);
  if (receiver) memset(data, 0, BACKGROUND_BYTES);
  for (size_t i = 0; i < ((size_t)4 << 20); i++) send[i] = (float)(i % 5);
  keel_request *request = NULL;
  keel_status status = KEEL_OK;
  if (sender) status = keel_comm_isend(comm, last, BACKGROUND_TAG, data, BACKGROUND_BYTES, &request);
  if (receiver) status = keel_comm_irecv(comm, 0, BACKGROUND_TAG, data, BACKGROUND_BYTES, &request);
  EXPECT(status == KEEL_OK, "posting the background request: %s", keel_strerror(status));
  for (int round = 0; round < 6 && status == KEEL_OK; round++) {
    status = keel_comm_allreduce(comm, send, recv, (size_t)4 << 20, KEEL_F32, KEEL_SUM);
    EXPECT(status == KEEL_OK, "allreduce beside the background request: %s", keel_strerror(status));
  }
  if (request != NULL) {
    bool done = false;
    status = keel_request_test(request, &done);
    EXPECT(status == KEEL_OK && done,
           "the 64 MiB request was not complete after the collectives (%s, done=%d): it did not "
           "move in their background", keel_strerror(status), done);
    if (!done) status = keel_request_wait(request, keel_deadline_after_ns(30000000000));
    keel_request_free(request);
  }
  for (size_t i = 0; i < BACKGROUND_BYTES && receiver && status == KEEL_OK; i++) {
    if (data[i] != (uint8_t)(i * 7 + 3)) {
      EXPECT(false, "background byte %zu = %u, want %u", i, data[i], (uint8_t)(i * 7 + 3));
      break;
    }
  }
  uint64_t word = 0x1234abcd;
  if (receiver) EXPECT(keel_comm_send(comm, 0, 9, &word, sizeof word) == KEEL_OK, "send back");
  if (sender) {
    word = 0;
    EXPECT(keel_comm_recv(comm, last, 9, &word, sizeof word) == KEEL_OK && word == 0x1234abcd,
           "receive back");
  }
done:
  free(data);
  free(send);
  free(recv);
}

int main(void) {
  keel_ctx *ctx = NULL;
  keel_status status = keel_init(&ctx);
  if (status != KEEL_OK) return 2;
  keel_comm *comm = keel_world(ctx);
  static const size_t counts[] = {0, 1, 2, 7, 1000, 8191, 100003, (size_t)1 << 20};
  static const keel_dtype dtypes[] = {KEEL_F32, KEEL_F64, KEEL_I32, KEEL_I64, KEEL_BF16};
  static const keel_reduce_op ops[] = {KEEL_SUM, KEEL_AVG, KEEL_MAX};
  for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++)
    for (size_t d = 0; d < sizeof dtypes / sizeof dtypes[0]; d++)
      for (size_t o = 0; o < 3; o++)
        for (int in_place = 0; in_place < 2; in_place++)
          check_allreduce(comm, dtypes[d], ops[o], counts[c], in_place);
  check_allreduce_behind_a_lagging_rank(comm);
  check_same_bits_everywhere(comm, 1001);
  check_same_bits_everywhere(comm, 3 << 20);
  check_broadcast(comm, 0);
  check_broadcast(comm, 5);
  check_broadcast(comm, (3u << 20) + 17);
  check_allgather_and_reduce_scatter(comm, 0);
  check_allgather_and_reduce_scatter(comm, 3);
  check_allgather_and_reduce_scatter(comm, 300001);
  check_background_transfer(comm);
  EXPECT(keel_comm_barrier(comm) == KEEL_OK, "barrier");
  int rank = keel_comm_rank(comm), size = keel_comm_size(comm);
  if (failures == 0 && rank == 0) printf("comm-check ok ranks=%d checks=%d\n", size, checks);
  keel_finalize(ctx);
  return failures == 0 ? 0 : 1;
}
