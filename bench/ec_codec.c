/* Codec benchmark of the ec layer: encode, delta (old XOR new), update (a delta folded into
 * the r parity blocks) and decode (one lost data block rebuilt; for r = 2 also two) for
 * k = 2, 4 with r = 1 (xor, and rs beside it) and r = 2 (rs), at 64 KiB and 4 MiB blocks.
 * Each figure is the median of several timed runs, in GB/s of the user's data the operation
 * covers (encode: the k data blocks; delta and update: the changed block; decode: the
 * rebuilt blocks), printed beside memcpy of the same bytes in the same run: the copy that 2x
 * replication makes instead. Single thread; the result of each operation is checked once,
 * after its timing: a fast wrong answer is no figure.
 * Usage: ec_codec [--json] [--runs N] */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_stats.h"

#include "keel/core.h"
#include "keel/ec.h"

#define MAX_RUNS 101
/* Each timed run repeats the operation for about this long. */
#define RUN_NS ((int64_t)8 * 1000 * 1000)

typedef struct options {
  bool json;
  int64_t runs;
} options;

typedef enum operation {
  OPERATION_ENCODE,
  OPERATION_DELTA,
  OPERATION_UPDATE,
  OPERATION_DECODE_ONE,
  OPERATION_DECODE_TWO,
  OPERATION_MEMCPY,
} operation;

static const char *const operation_names[] = {"encode",  "delta",   "update",
                                              "decode1", "decode2", "memcpy"};

/* One code at one block size: its blocks, and the buffers the operations need. */
typedef struct bench {
  keel_ec_code *code;
  keel_ec_decoder *decoder;
  int k, r;
  size_t block;
  uint8_t *blocks[KEEL_EC_MAX_BLOCKS]; /* k data then r parity */
  uint8_t *work[KEEL_EC_MAX_BLOCKS];   /* decode's copy of them */
  bool present[KEEL_EC_MAX_BLOCKS];
  uint8_t *old_block, *new_block, *delta;
  uint8_t *copy_from, *copy_to; /* memcpy's: k blocks' worth */
  size_t copy_bytes;
} bench;

static uint8_t *block_alloc(size_t bytes) {
  uint8_t *block = aligned_alloc(64, (bytes + 63) / 64 * 64);
  if (block != NULL) memset(block, 0, bytes); /* fault the pages in before any timing */
  return block;
}

static void fill_random(keel_random *random, uint8_t *block, size_t bytes) {
  for (size_t i = 0; i + 8 <= bytes; i += 8) {
    uint64_t value = keel_random_next(random);
    memcpy(block + i, &value, 8);
  }
}

static void bench_free(bench *b) {
  for (int i = 0; i < b->k + b->r; i++) {
    free(b->blocks[i]);
    free(b->work[i]);
  }
  free(b->old_block);
  free(b->new_block);
  free(b->delta);
  free(b->copy_from);
  free(b->copy_to);
  keel_ec_decoder_destroy(b->decoder);
  keel_ec_code_destroy(b->code);
}

static keel_status bench_make(int k, int r, keel_ec_kind kind, size_t block, bench *b) {
  *b = (bench){.k = k, .r = r, .block = block, .copy_bytes = (size_t)k * block};
  keel_status status = keel_ec_code_create(k, r, kind, &b->code);
  if (status == KEEL_OK) status = keel_ec_decoder_create(b->code, 0, &b->decoder);
  if (status != KEEL_OK) return status;
  bool allocated = true;
  for (int i = 0; i < k + r; i++) {
    b->blocks[i] = block_alloc(block);
    b->work[i] = block_alloc(block);
    allocated = allocated && b->blocks[i] && b->work[i];
  }
  b->old_block = block_alloc(block);
  b->new_block = block_alloc(block);
  b->delta = block_alloc(block);
  b->copy_from = block_alloc(b->copy_bytes);
  b->copy_to = block_alloc(b->copy_bytes);
  allocated = allocated && b->old_block && b->new_block && b->delta && b->copy_from && b->copy_to;
  if (!allocated) return KEEL_ENOMEM;
  keel_random random;
  keel_random_seed(&random, 0xEC0DEC);
  for (int j = 0; j < k; j++) fill_random(&random, b->blocks[j], block);
  fill_random(&random, b->old_block, block);
  fill_random(&random, b->new_block, block);
  fill_random(&random, b->copy_from, b->copy_bytes);
  keel_ec_delta(block, b->old_block, b->new_block, b->delta);
  status = keel_ec_encode(b->code, block, (const uint8_t *const *)b->blocks, b->blocks + k);
  for (int i = 0; i < k + r; i++) memcpy(b->work[i], b->blocks[i], block);
  return status;
}

/* Blocks a decode loses: data block 0, and for two also data block 1. */
static void lose(bench *b, int lost) {
  for (int i = 0; i < b->k + b->r; i++) b->present[i] = i >= lost;
}

static keel_status run_once(bench *b, operation op) {
  switch (op) {
    case OPERATION_ENCODE:
      return keel_ec_encode(b->code, b->block, (const uint8_t *const *)b->blocks, b->blocks + b->k);
    case OPERATION_DELTA:
      keel_ec_delta(b->block, b->old_block, b->new_block, b->delta);
      return KEEL_OK;
    case OPERATION_UPDATE:
      return keel_ec_update(b->code, 0, b->block, b->delta, b->blocks + b->k);
    case OPERATION_DECODE_ONE:
    case OPERATION_DECODE_TWO:
      return keel_ec_decode(b->decoder, b->block, b->work, b->present);
    case OPERATION_MEMCPY:
      break;
  }
  memcpy(b->copy_to, b->copy_from, b->copy_bytes);
  return KEEL_OK;
}

/* Runs op `iterations` times; the time per operation in ns. */
static keel_status time_batch(bench *b, operation op, int64_t iterations, double *per_op_ns) {
  int64_t start = keel_now_ns();
  for (int64_t i = 0; i < iterations; i++) {
    keel_status status = run_once(b, op);
    if (status != KEEL_OK) return status;
  }
  *per_op_ns = (double)(keel_now_ns() - start) / (double)iterations;
  return KEEL_OK;
}

/* The median time of one operation over opts->runs runs of about RUN_NS each. */
static keel_status measure(bench *b, operation op, const options *opts, double *median_ns_p,
                           int64_t *iterations_p) {
  /* Warm-up and calibration: double until a batch takes a millisecond. */
  int64_t iterations = 1;
  double per_op_ns = 0;
  for (;;) {
    keel_status status = time_batch(b, op, iterations, &per_op_ns);
    if (status != KEEL_OK) return status;
    if (per_op_ns * (double)iterations >= 1e6) break;
    iterations *= 2;
  }
  iterations = (int64_t)((double)RUN_NS / per_op_ns) + 1;
  double times[MAX_RUNS];
  for (int64_t run = 0; run < opts->runs; run++) {
    keel_status status = time_batch(b, op, iterations, &times[run]);
    if (status != KEEL_OK) return status;
  }
  double median_us, mean_us;
  bench_summarize(times, opts->runs, &median_us, &mean_us);
  *median_ns_p = median_us * 1e3;
  *iterations_p = iterations;
  return KEEL_OK;
}

/* After the timing: each operation's last result is right. Update ran an unknown number of
 * times, each folding the same delta: the parity is that of data block 0 XOR delta an odd or
 * even number of times, so one of the two encodings must match. */
static bool check(bench *b, operation op) {
  int k = b->k, r = b->r;
  switch (op) {
    case OPERATION_DELTA:
      for (size_t i = 0; i < b->block; i++) {
        if (b->delta[i] != (b->old_block[i] ^ b->new_block[i])) return false;
      }
      return true;
    case OPERATION_DECODE_ONE:
    case OPERATION_DECODE_TWO:
      /* The timed runs decoded over blocks already right: poison the lost ones, once more. */
      for (int i = 0; i < k + r; i++) {
        if (!b->present[i]) memset(b->work[i], 0xA5, b->block);
      }
      if (keel_ec_decode(b->decoder, b->block, b->work, b->present) != KEEL_OK) return false;
      for (int i = 0; i < k + r; i++) {
        if (memcmp(b->work[i], b->blocks[i], b->block) != 0) return false;
      }
      return true;
    case OPERATION_MEMCPY:
      return memcmp(b->copy_to, b->copy_from, b->copy_bytes) == 0;
    case OPERATION_ENCODE:
    case OPERATION_UPDATE:
      break;
  }
  /* Encode into work's parity from blocks' data (and from data block 0 ^ delta). */
  bool matches[2];
  for (int flip = 0; flip < 2; flip++) {
    memcpy(b->work[0], b->blocks[0], b->block);
    if (flip) keel_ec_delta(b->block, b->work[0], b->delta, b->work[0]);
    const uint8_t *data[KEEL_EC_MAX_BLOCKS];
    data[0] = b->work[0];
    for (int j = 1; j < k; j++) data[j] = b->blocks[j];
    if (keel_ec_encode(b->code, b->block, data, b->work + k) != KEEL_OK) return false;
    matches[flip] = true;
    for (int p = 0; p < r; p++) {
      if (memcmp(b->work[k + p], b->blocks[k + p], b->block) != 0) matches[flip] = false;
    }
  }
  for (int i = 0; i < k + r; i++) memcpy(b->work[i], b->blocks[i], b->block);
  return op == OPERATION_ENCODE ? matches[0] : matches[0] || matches[1];
}

static int parse_options(int argc, char **argv, options *opts) {
  *opts = (options){.runs = 7};
  static const struct option long_options[] = {
      {"json", no_argument, 0, 'j'}, {"runs", required_argument, 0, 'n'}, {0, 0, 0, 0}};
  int option;
  while ((option = getopt_long(argc, argv, "", long_options, NULL)) != -1) {
    bool ok = option == 'j';
    if (option == 'j') opts->json = true;
    if (option == 'n') ok = keel_parse_int(optarg, 1, MAX_RUNS, &opts->runs) == KEEL_OK;
    if (!ok) {
      fprintf(stderr, "ec_codec: bad flag (see the file's header)\n");
      return -1;
    }
  }
  return 0;
}

typedef struct result {
  const char *code;
  int k, r;
  size_t block;
  operation op;
  size_t bytes; /* the user's bytes one operation covers */
  int64_t iterations;
  double median_us, gbps, memcpy_gbps;
} result;

static void header_print(const options *opts) {
  if (opts->json) return;
  printf("%-4s %2s %2s %9s %-8s %10s %10s %8s %11s %6s\n", "code", "k", "r", "block", "op", "bytes",
         "median_us", "GB/s", "memcpy_GB/s", "ratio");
}

static void result_print(const options *opts, const result *x) {
  if (opts->json) {
    printf(
        "{\"bench\":\"ec_codec\",\"code\":\"%s\",\"k\":%d,\"r\":%d,\"block_bytes\":%zu,"
        "\"op\":\"%s\",\"bytes\":%zu,\"time_us\":%.3f,\"gbps\":%.3f,\"memcpy_gbps\":%.3f,"
        "\"runs\":%lld,\"iterations\":%lld}\n",
        x->code, x->k, x->r, x->block, operation_names[x->op], x->bytes, x->median_us, x->gbps,
        x->memcpy_gbps, (long long)opts->runs, (long long)x->iterations);
  } else {
    printf("%-4s %2d %2d %9zu %-8s %10zu %10.2f %8.2f %11.2f %6.2f\n", x->code, x->k, x->r,
           x->block, operation_names[x->op], x->bytes, x->median_us, x->gbps, x->memcpy_gbps,
           x->gbps / x->memcpy_gbps);
  }
  fflush(stdout);
}

/* memcpy of `bytes` in GB/s, measured now (the peer beside each figure). */
static keel_status memcpy_gbps(bench *b, size_t bytes, const options *opts, double *gbps_p) {
  size_t saved = b->copy_bytes;
  b->copy_bytes = bytes;
  double median_ns;
  int64_t iterations;
  keel_status status = measure(b, OPERATION_MEMCPY, opts, &median_ns, &iterations);
  if (status == KEEL_OK && !check(b, OPERATION_MEMCPY)) status = KEEL_ECORRUPT;
  b->copy_bytes = saved;
  if (status == KEEL_OK) *gbps_p = (double)bytes / median_ns;
  return status;
}

static keel_status bench_code(int k, int r, keel_ec_kind kind, size_t block, const options *opts) {
  bench b;
  keel_status status = bench_make(k, r, kind, block, &b);
  static const operation ops[] = {OPERATION_ENCODE, OPERATION_DELTA, OPERATION_UPDATE,
                                  OPERATION_DECODE_ONE, OPERATION_DECODE_TWO};
  for (size_t i = 0; status == KEEL_OK && i < sizeof ops / sizeof ops[0]; i++) {
    operation op = ops[i];
    if (op == OPERATION_DECODE_TWO && r < 2) continue;
    if (op == OPERATION_DECODE_ONE || op == OPERATION_DECODE_TWO) {
      lose(&b, op == OPERATION_DECODE_ONE ? 1 : 2);
    }
    result x = {.code = keel_ec_code_name(b.code), .k = k, .r = r, .block = block, .op = op};
    x.bytes = op == OPERATION_ENCODE       ? (size_t)k * block
              : op == OPERATION_DECODE_TWO ? 2 * block
                                           : block;
    double median_ns;
    status = measure(&b, op, opts, &median_ns, &x.iterations);
    if (status != KEEL_OK) break;
    if (!check(&b, op)) {
      fprintf(stderr, "ec_codec: %s k=%d r=%d %zu: wrong result after %s\n", x.code, k, r, block,
              operation_names[op]);
      status = KEEL_ECORRUPT;
      break;
    }
    /* Update left the parity of other data: make it that of the blocks again. */
    if (op == OPERATION_UPDATE) {
      status = keel_ec_encode(b.code, block, (const uint8_t *const *)b.blocks, b.blocks + k);
      for (int p = 0; status == KEEL_OK && p < r; p++)
        memcpy(b.work[k + p], b.blocks[k + p], block);
    }
    if (status == KEEL_OK) status = memcpy_gbps(&b, x.bytes, opts, &x.memcpy_gbps);
    if (status != KEEL_OK) break;
    x.median_us = median_ns / 1e3;
    x.gbps = (double)x.bytes / median_ns;
    result_print(opts, &x);
  }
  bench_free(&b);
  return status;
}

int main(int argc, char **argv) {
  options opts;
  if (parse_options(argc, argv, &opts) != 0) return 2;
  static const size_t blocks[] = {64 << 10, 4 << 20};
  static const int data_blocks[] = {2, 4};
  static const struct {
    int r;
    keel_ec_kind kind;
  } codes[] = {{1, KEEL_EC_XOR}, {1, KEEL_EC_RS}, {2, KEEL_EC_RS}};
  header_print(&opts);
  for (size_t s = 0; s < sizeof blocks / sizeof blocks[0]; s++) {
    for (size_t d = 0; d < sizeof data_blocks / sizeof data_blocks[0]; d++) {
      for (size_t c = 0; c < sizeof codes / sizeof codes[0]; c++) {
        keel_status status =
            bench_code(data_blocks[d], codes[c].r, codes[c].kind, blocks[s], &opts);
        if (status != KEEL_OK) {
          fprintf(stderr, "ec_codec: %s\n", keel_strerror(status));
          return 1;
        }
      }
    }
  }
  return 0;
}
