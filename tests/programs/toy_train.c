/* A small deterministic data-parallel "training" run for the recovery tests: fast (no data
 * set), with real registered state (parameters, momentum, step) whose update depends on
 * that state, so a replacement that got the wrong state, or a redo with the wrong
 * contributions, changes the final checksum. Every process that finishes prints
 *   toy-final rank=R uid=U step=N world=W crc=XXXXXXXX
 * Flags: --steps N --params P --global-batch B --compute-ms M --seed S */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "keel/comm.h"

typedef struct options {
  int64_t steps, params, global_batch, compute_ms;
  uint64_t seed;
} options;

static int parse_options(int argc, char **argv, options *opts) {
  *opts = (options){.steps = 40, .params = 4096, .global_batch = 64, .compute_ms = 2, .seed = 7};
  static const struct option long_options[] = {{"steps", required_argument, 0, 's'},
                                               {"params", required_argument, 0, 'p'},
                                               {"global-batch", required_argument, 0, 'b'},
                                               {"compute-ms", required_argument, 0, 'c'},
                                               {"seed", required_argument, 0, 'e'},
                                               {0, 0, 0, 0}};
  int option;
  while ((option = getopt_long(argc, argv, "", long_options, NULL)) != -1) {
    int64_t value;
    if (option == '?' || keel_parse_int(optarg, 0, 1 << 30, &value) != KEEL_OK) {
      fprintf(stderr, "toy_train: bad flag (see the file's header)\n");
      return -1;
    }
    if (option == 's') opts->steps = value;
    if (option == 'p') opts->params = value;
    if (option == 'b') opts->global_batch = value;
    if (option == 'c') opts->compute_ms = value;
    if (option == 'e') opts->seed = (uint64_t)value;
  }
  return 0;
}

/* This rank's share [first, first+count) of the step's global batch. */
static void my_share(int64_t batch, int rank, int size, int64_t *first, int64_t *count) {
  int64_t base = batch / size, extra = batch % size;
  *first = rank * base + (rank < extra ? rank : extra);
  *count = base + (rank < extra ? 1 : 0);
}

static void compute_gradient(const options *opts, const float *params, uint64_t step, int rank,
                             int size, float *send) {
  int64_t first, count;
  my_share(opts->global_batch, rank, size, &first, &count);
  memset(send, 0, sizeof(float) * (size_t)(opts->params + 1));
  for (int64_t sample = first; sample < first + count; sample++) {
    keel_random random;
    keel_random_seed(&random, keel_random_seed_for(opts->seed, step, (uint64_t)sample));
    float scale = (float)keel_random_unit(&random);
    for (int64_t i = 0; i < opts->params; i++) {
      float target = (float)(keel_random_unit(&random) - 0.5);
      send[i] += scale * (params[i] - target);
    }
  }
  send[opts->params] = (float)count;
  if (opts->compute_ms > 0) {
    struct timespec pause = {0, (long)opts->compute_ms * 1000000};
    nanosleep(&pause, NULL);
  }
}

int main(int argc, char **argv) {
  options opts;
  if (parse_options(argc, argv, &opts) != 0) return 2;
  keel_ctx *ctx = NULL;
  if (keel_init(&ctx) != KEEL_OK) return 1;
  size_t n = (size_t)opts.params;
  float *params = calloc(n, sizeof(float)), *momentum = calloc(n, sizeof(float));
  float *send = calloc(n + 1, sizeof(float)), *recv = calloc(n + 1, sizeof(float));
  uint64_t step = 0;
  for (size_t i = 0; i < n; i++) params[i] = (float)sin((double)i);
  keel_state_register(ctx, "params", params, n * sizeof(float));
  keel_state_register(ctx, "momentum", momentum, n * sizeof(float));
  keel_state_register(ctx, "step", &step, sizeof step);
  keel_status status = keel_start(ctx);
  int exit_code = 0;
  if (status == KEEL_EJOBDONE) goto done; /* a spare that was never needed */
  if (status != KEEL_OK) {
    exit_code = 1;
    goto done;
  }
  while (step < (uint64_t)opts.steps) {
    keel_step(ctx, step);
    keel_comm *world = keel_world(ctx);
    keel_fault_point(ctx, "forward");
    compute_gradient(&opts, params, step, keel_comm_rank(world), keel_comm_size(world), send);
    keel_recovery recovery;
    status = keel_allreduce_resilient(ctx, send, recv, n + 1, KEEL_F32, KEEL_SUM, &recovery);
    if (status == KEEL_EEXCLUDED) goto done; /* the job went on without us */
    if (status != KEEL_OK) {
      fprintf(stderr, "toy_train: allreduce failed: %s\n", keel_strerror(status));
      exit_code = 1;
      goto done;
    }
    if (recovery.restart_step) continue;
    keel_fault_point(ctx, "optimizer");
    for (size_t i = 0; i < n; i++) {
      momentum[i] = 0.9f * momentum[i] + recv[i] / recv[n];
      params[i] -= 0.05f * momentum[i];
    }
    step++;
    keel_report(ctx, step, (double)recv[0], 0);
  }
  keel_comm *world = keel_world(ctx);
  printf("toy-final rank=%d uid=%u step=%llu world=%d crc=%08x\n", keel_comm_rank(world),
         keel_comm_uid(world, keel_comm_rank(world)), (unsigned long long)step,
         keel_comm_size(world), keel_crc32c(0, params, n * sizeof(float)));
  fflush(stdout);
done:
  keel_finalize(ctx);
  free(params);
  free(momentum);
  free(send);
  free(recv);
  return exit_code;
}
