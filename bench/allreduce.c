/* Allreduce benchmark, a worker run under `keel run -n N`: times f32-sum allreduces (out of
 * place) of several sizes, reports per-op time and bus bandwidth, and, at rank 0, memcpy of
 * the largest size in the same run as a yardstick. --collective times another collective
 * instead, sizes then being the whole result (allgather), the whole input (reduce-scatter)
 * or the buffer (broadcast from rank 0).
 * Usage: keel run -n 4 -- allreduce [--json] [--sizes 4KiB,1MiB,64MiB] [--iterations K]
 *          [--resilient] [--collective allreduce|allgather|broadcast|reduce-scatter] */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_stats.h"

#include "keel/keel.h"

#define MAX_SIZES 16
/* Without --iterations, each measurement runs for about this long (across all ranks). */
#define TARGET_NS ((int64_t)1000 * 1000 * 1000)
#define MIN_ITERATIONS 10
#define MAX_ITERATIONS 20000

typedef enum collective {
  COLLECTIVE_ALLREDUCE,
  COLLECTIVE_ALLGATHER,
  COLLECTIVE_BROADCAST,
  COLLECTIVE_REDUCE_SCATTER,
} collective;

static const char *const collective_names[] = {"allreduce", "allgather", "broadcast",
                                               "reduce-scatter"};

typedef struct options {
  bool json;
  bool resilient;
  collective operation;
  int64_t iterations; /* 0: adaptive */
  uint64_t sizes[MAX_SIZES];
  int size_count;
} options;

/* One measurement, in the form both outputs print. */
typedef struct result {
  const char *impl;
  int ranks;
  uint64_t bytes;
  int64_t iterations;
  double median_us, mean_us, busbw_gbps;
} result;

static bool parse_sizes(const char *text, options *opts) {
  char copy[512];
  if (snprintf(copy, sizeof copy, "%s", text) >= (int)sizeof copy) return false;
  opts->size_count = 0;
  char *saved = NULL;
  for (char *item = strtok_r(copy, ",", &saved); item; item = strtok_r(NULL, ",", &saved)) {
    uint64_t bytes;
    if (opts->size_count == MAX_SIZES || keel_parse_size(item, &bytes) != KEEL_OK) return false;
    /* f32 elements: a size that is not a multiple of 4 is rounded down. */
    if (bytes < sizeof(float)) return false;
    opts->sizes[opts->size_count++] = bytes - bytes % sizeof(float);
  }
  return opts->size_count > 0;
}

static int parse_options(int argc, char **argv, options *opts) {
  *opts = (options){.size_count = 3, .sizes = {4 << 10, 1 << 20, 64 << 20}};
  static const struct option long_options[] = {{"json", no_argument, 0, 'j'},
                                               {"resilient", no_argument, 0, 'r'},
                                               {"iterations", required_argument, 0, 'i'},
                                               {"sizes", required_argument, 0, 's'},
                                               {"collective", required_argument, 0, 'c'},
                                               {0, 0, 0, 0}};
  int option;
  while ((option = getopt_long(argc, argv, "", long_options, NULL)) != -1) {
    bool ok = option == 'j' || option == 'r';
    if (option == 'j') opts->json = true;
    if (option == 'r') opts->resilient = true;
    if (option == 'i') ok = keel_parse_int(optarg, 1, MAX_ITERATIONS, &opts->iterations) == KEEL_OK;
    if (option == 's') ok = parse_sizes(optarg, opts);
    for (int c = 0; option == 'c' && c < 4; c++) {
      if (strcmp(optarg, collective_names[c]) == 0) opts->operation = (collective)c;
      ok = ok || strcmp(optarg, collective_names[c]) == 0;
    }
    /* Only the allreduce has a resilient twin. */
    ok = ok && !(opts->resilient && opts->operation != COLLECTIVE_ALLREDUCE);
    if (!ok) {
      fprintf(stderr, "allreduce: bad flag (see the file's header)\n");
      return -1;
    }
  }
  return 0;
}


static void result_print(const options *opts, const result *r) {
  if (opts->json) {
    printf(
        "{\"bench\":\"allreduce\",\"impl\":\"%s\",\"ranks\":%d,\"bytes\":%llu,"
        "\"time_us\":%.3f,\"mean_us\":%.3f,\"busbw_gbps\":%.4f,\"iterations\":%lld}\n",
        r->impl, r->ranks, (unsigned long long)r->bytes, r->median_us, r->mean_us, r->busbw_gbps,
        (long long)r->iterations);
  } else {
    printf("%-20s %5d %12llu %10lld %12.1f %12.1f %10.3f\n", r->impl, r->ranks,
           (unsigned long long)r->bytes, (long long)r->iterations, r->median_us, r->mean_us,
           r->busbw_gbps);
  }
  fflush(stdout);
}

static void header_print(const options *opts) {
  if (opts->json) return;
  printf("%-20s %5s %12s %10s %12s %12s %10s\n", "impl", "ranks", "bytes", "iterations",
         "median_us", "mean_us", "busbw_GB/s");
  fflush(stdout);
}

/* ---- the allreduce measurement */

typedef struct bench {
  keel_ctx *ctx;
  const options *opts;
  float *send, *recv;
  char impl[32]; /* "keel-shm", "keel-tcp-resilient", ... */
  uint64_t step;  /* the resilient path's step transactions */
} bench;

/* One operation over count f32 elements (the whole result or input: a rank's block is
 * count / size of them). */
static keel_status one_allreduce(bench *b, size_t count) {
  keel_comm *world = keel_world(b->ctx);
  size_t block = count / (size_t)keel_comm_size(world);
  switch (b->opts->operation) {
    case COLLECTIVE_ALLGATHER:
      return keel_comm_allgather(world, b->send, b->recv, block * sizeof(float));
    case COLLECTIVE_BROADCAST:
      return keel_comm_broadcast(world, b->recv, count * sizeof(float), 0);
    case COLLECTIVE_REDUCE_SCATTER:
      return keel_comm_reduce_scatter(world, b->send, b->recv, block, KEEL_F32, KEEL_SUM);
    case COLLECTIVE_ALLREDUCE:
      break;
  }
  if (!b->opts->resilient) return keel_comm_allreduce(world, b->send, b->recv, count, KEEL_F32, KEEL_SUM);
  /* The resilient path is a whole step transaction around the one allreduce. */
  keel_status status = keel_step_begin(b->ctx, b->step);
  if (status == KEEL_OK) status = keel_step_allreduce(b->ctx, b->send, b->recv, count, KEEL_F32, KEEL_SUM);
  if (status == KEEL_OK) status = keel_step_commit(b->ctx);
  b->step++;
  return status;
}

/* Runs iterations allreduces back to back; times[i] gets iteration i's duration here. */
static keel_status run_timed(bench *b, size_t count, int64_t iterations, double *times) {
  for (int64_t i = 0; i < iterations; i++) {
    int64_t start = keel_now_ns();
    keel_status status = one_allreduce(b, count);
    if (status != KEEL_OK) return status;
    if (times) times[i] = (double)(keel_now_ns() - start);
  }
  return KEEL_OK;
}

/* Warm-up count by size: enough to set up links, scratch and page tables, few enough
 * that 64 MiB does not eat the time budget. */
static int64_t warmup_iterations(uint64_t bytes) {
  if (bytes >= (8u << 20)) return 2;
  if (bytes >= (256u << 10)) return 10;
  return 50;
}

/* Iterations that fill target_ns at per_op_ns each, within the limits. */
static int64_t iterations_for(double target_ns, double per_op_ns) {
  double wanted = per_op_ns > 0 ? target_ns / per_op_ns : MAX_ITERATIONS;
  if (wanted < MIN_ITERATIONS) return MIN_ITERATIONS;
  return wanted > MAX_ITERATIONS ? MAX_ITERATIONS : (int64_t)wanted;
}

/* Every rank must run the same number of iterations, so the count comes from the slowest
 * rank's warm-up (an allreduce of MAX), and the same arithmetic everywhere. */
static keel_status choose_iterations(bench *b, double warmup_per_op_ns, int64_t *iterations_p) {
  if (b->opts->iterations > 0) {
    *iterations_p = b->opts->iterations;
    return KEEL_OK;
  }
  double slowest = 0;
  keel_status status =
      keel_comm_allreduce(keel_world(b->ctx), &warmup_per_op_ns, &slowest, 1, KEEL_F64, KEEL_MAX);
  if (status != KEEL_OK) return status;
  *iterations_p = iterations_for((double)TARGET_NS, slowest);
  return KEEL_OK;
}

/* Fills send with small integers so that every partial sum is exact in f32, and checks the
 * result once, after the timing: a fast wrong answer is no figure. */
static void fill_send(float *send, size_t count, int rank) {
  for (size_t i = 0; i < count; i++) send[i] = (float)(i % 7) + (float)rank;
}

/* What element i of the result must be, given fill_send's inputs. */
static float expected_at(collective operation, size_t i, size_t block, int rank, int size) {
  switch (operation) {
    case COLLECTIVE_ALLGATHER: /* rank i / block's element i % block */
      return (float)((i % block) % 7) + (float)(i / block);
    case COLLECTIVE_BROADCAST: /* rank 0's */
      return (float)(i % 7);
    case COLLECTIVE_REDUCE_SCATTER: /* this rank's block, summed */
      return (float)size * (float)(((size_t)rank * block + i) % 7) + (float)(size * (size - 1) / 2);
    case COLLECTIVE_ALLREDUCE:
      break;
  }
  return (float)size * (float)(i % 7) + (float)(size * (size - 1) / 2);
}

static bool result_correct(collective operation, const float *recv, size_t count, int rank,
                           int size) {
  size_t block = count / (size_t)size;
  size_t checked = operation == COLLECTIVE_REDUCE_SCATTER ? block : count;
  if (operation == COLLECTIVE_ALLGATHER) checked = block * (size_t)size;
  for (size_t i = 0; i < checked; i++) {
    float expected = expected_at(operation, i, block, rank, size);
    if (recv[i] != expected) {
      fprintf(stderr, "allreduce: wrong result at element %zu: %g, expected %g\n", i,
              (double)recv[i], (double)expected);
      return false;
    }
  }
  return true;
}

static keel_status measure_size(bench *b, uint64_t bytes, double *times, result *r) {
  keel_comm *world = keel_world(b->ctx);
  int size = keel_comm_size(world);
  size_t count = bytes / sizeof(float);
  if (count < (size_t)size) return KEEL_EINVAL; /* a block of at least one element */
  fill_send(b->send, count, keel_comm_rank(world));
  /* Broadcast works in place: every rank's buffer starts as its own, rank 0's wins. */
  if (b->opts->operation == COLLECTIVE_BROADCAST) fill_send(b->recv, count, keel_comm_rank(world));
  int64_t warmup = warmup_iterations(bytes), iterations;
  int64_t start = keel_now_ns();
  keel_status status = run_timed(b, count, warmup, NULL);
  double per_op = (double)(keel_now_ns() - start) / (double)warmup;
  if (status == KEEL_OK) status = choose_iterations(b, per_op, &iterations);
  if (status == KEEL_OK) status = keel_comm_barrier(world);
  if (status == KEEL_OK) status = run_timed(b, count, iterations, times);
  if (status != KEEL_OK) return status;
  if (!result_correct(b->opts->operation, b->recv, count, keel_comm_rank(world), size))
    return KEEL_ECORRUPT;
  /* An iteration's time is the average over ranks of the time each spent in it (the OSU
   * benchmarks' convention). The slowest rank's time would overstate back-to-back
   * operations: a rank that starts early counts its wait for the others, so the sum of the
   * per-iteration maxima exceeds the elapsed time. */
  status =
      keel_comm_allreduce(world, times, times + iterations, (size_t)iterations, KEEL_F64, KEEL_AVG);
  if (status != KEEL_OK) return status;
  /* The impl names the transport the allreduce really used ("keel-shm", "keel-tcp"). */
  const char *detection = getenv("KEEL_FAILURE_DETECTION");
  bool detecting = detection == NULL || strcmp(detection, "off") != 0;
  bool allreduce = b->opts->operation == COLLECTIVE_ALLREDUCE;
  snprintf(b->impl, sizeof b->impl, "keel-%s%s%s%s%s", keel_comm_transport(world),
           b->opts->resilient ? "-resilient" : "", detecting ? "" : "-nodetect",
           allreduce ? "" : "-", allreduce ? "" : collective_names[b->opts->operation]);
  *r = (result){.impl = b->impl,
                .ranks = size,
                .bytes = bytes,
                .iterations = iterations};
  bench_summarize(times + iterations, iterations, &r->median_us, &r->mean_us);
  /* NCCL's bus factors: 2(n-1)/n for allreduce, (n-1)/n for allgather and reduce-scatter,
   * 1 for broadcast; at one rank, where the operation is a copy, its rate is given. */
  double factor = size > 1 ? (double)(size - 1) / size : 1.0;
  if (allreduce && size > 1) factor *= 2.0;
  if (b->opts->operation == COLLECTIVE_BROADCAST) factor = 1.0;
  r->busbw_gbps = factor * (double)bytes / (r->median_us * 1e3);
  return KEEL_OK;
}

/* ---- memcpy, the yardstick: one rank, one thread, the same buffers. */
static void measure_memcpy(bench *b, uint64_t bytes, double *times, result *r) {
  memcpy(b->recv, b->send, bytes); /* first touch is not what is measured */
  int64_t start = keel_now_ns();
  memcpy(b->recv, b->send, bytes);
  double once = (double)(keel_now_ns() - start);
  int64_t iterations = b->opts->iterations;
  if (iterations == 0) iterations = iterations_for((double)TARGET_NS / 2, once);
  for (int64_t i = 0; i < iterations; i++) {
    /* Alternate the direction so no pass finds its destination already in cache. */
    float *from = i % 2 ? b->recv : b->send, *to = i % 2 ? b->send : b->recv;
    start = keel_now_ns();
    memcpy(to, from, bytes);
    times[i] = (double)(keel_now_ns() - start);
  }
  *r = (result){.impl = "memcpy", .ranks = 1, .bytes = bytes, .iterations = iterations};
  bench_summarize(times, iterations, &r->median_us, &r->mean_us);
  r->busbw_gbps = (double)bytes / (r->median_us * 1e3);
}

static uint64_t largest_size(const options *opts) {
  uint64_t largest = 0;
  for (int i = 0; i < opts->size_count; i++)
    if (opts->sizes[i] > largest) largest = opts->sizes[i];
  return largest;
}

static int run_all(bench *b, double *times) {
  int rank = keel_comm_rank(keel_world(b->ctx));
  if (rank == 0) header_print(b->opts);
  for (int i = 0; i < b->opts->size_count; i++) {
    result r;
    keel_status status = measure_size(b, b->opts->sizes[i], times, &r);
    if (status != KEEL_OK) {
      fprintf(stderr, "allreduce: rank %d, %llu bytes: %s\n", rank,
              (unsigned long long)b->opts->sizes[i], keel_strerror(status));
      return 1;
    }
    if (rank == 0) result_print(b->opts, &r);
  }
  if (rank == 0) {
    result r;
    measure_memcpy(b, largest_size(b->opts), times, &r);
    result_print(b->opts, &r);
  }
  /* The others wait (in poll, not spinning) while rank 0 copies. */
  keel_status status = keel_comm_barrier(keel_world(b->ctx));
  if (status != KEEL_OK) fprintf(stderr, "allreduce: final barrier: %s\n", keel_strerror(status));
  return status == KEEL_OK ? 0 : 1;
}

int main(int argc, char **argv) {
  options opts;
  if (parse_options(argc, argv, &opts) != 0) return 2;
  keel_ctx *ctx = NULL;
  keel_status status = keel_init(&ctx);
  if (status == KEEL_OK) status = keel_start(ctx);
  if (status != KEEL_OK) {
    fprintf(stderr, "allreduce: cannot join the job: %s\n", keel_strerror(status));
    keel_finalize(ctx);
    return 1;
  }
  uint64_t largest = largest_size(&opts);
  /* Buffers are set up once and reused by every size, as a training loop would. Twice
   * MAX_ITERATIONS times: per-iteration times here and their average over ranks. */
  bench b = {.ctx = ctx, .opts = &opts, .send = malloc(largest), .recv = malloc(largest)};
  double *times = malloc(2 * MAX_ITERATIONS * sizeof *times);
  int code = 1;
  if (b.send && b.recv && times) {
    code = run_all(&b, times);
  } else {
    fprintf(stderr, "allreduce: out of memory for %llu-byte buffers\n",
            (unsigned long long)largest);
  }
  free(times);
  free(b.send);
  free(b.recv);
  keel_finalize(ctx);
  return code;
}
