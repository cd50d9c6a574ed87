/* A small deterministic data-parallel "training" run for the recovery tests: fast (no data
 * set), with real registered state (parameters, momentum, step) whose update depends on
 * that state, so a replacement that got the wrong state, or a redo with the wrong
 * contributions, changes the final checksum. Every process that finishes prints
 *   toy-final rank=R uid=U step=N world=W crc=XXXXXXXX
 * Flags: --steps N --params P --global-batch B --compute-ms M --seed S|job --shards K
 *        --persist-every N --persist-dir DIR --second-allreduce --undo
 *        --long-step N --long-ms M [--section] [--long-every-ms E] [--long-spin]
 *        --skip-step N --leak-per-redo
 * With --shards K (hybrid sharding, JIT §3.1, keel_state_shard) rank r holds shard r % K of
 * the parameters and momentum, replicated by every group of K ranks: each step allgathers
 * the shards, reduces the whole gradient and updates its own shard. The arithmetic is the
 * unsharded run's, so its crc is the same. Each step is a step transaction: a failure in
 * either collective is recovered by the runtime, and a replacement receives its shard from
 * a survivor that holds it. Under `keel run --ckpt jit` the state is saved just in time;
 * with --persist-every N the state is saved to DIR every N commits and that tier serves a
 * replacement whose shard no survivor holds. With --second-allreduce each step ends with a
 * second allreduce after the optimizer (the registered state changes between two collectives
 * of one step, and a fault point "updated" sits between them); --undo turns the runtime's
 * undo copy on, which a recovery needs to redo such a step exactly. With --long-step N
 * --long-ms M, uid 1 works M ms longer once, at step N (an evaluation the others wait for),
 * inside a keel_section_begin/end with --section. With --long-every-ms E it does so again at
 * the first step after each E ms of its life (an uneven step, not a hang); with --long-spin it
 * computes (a busy loop, competing for the cores) instead of sleeping. --skip-step N makes the
 * program jump from step N-1 to N+1, as a data position that skips a minibatch would: step N
 * is never committed, which `keel chaos` must see. --leak-per-redo opens /dev/null and never
 * closes it each time a step is redone after a recovery, a leak `keel chaos` must see. */
#include <fcntl.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "keel/keel.h"

typedef struct options {
  int64_t steps, params, global_batch, compute_ms, shards, persist_every, long_step, long_ms,
      long_every_ms, skip_step;
  uint64_t seed;
  const char *persist_directory;
  bool second_allreduce, undo, section, long_spin, leak_per_redo;
} options;

static int parse_options(int argc, char **argv, options *opts) {
  *opts = (options){.steps = 40,
                    .params = 4096,
                    .global_batch = 64,
                    .compute_ms = 2,
                    .shards = 1,
                    .seed = 7,
                    .long_step = -1,
                    .skip_step = -1};
  static const struct option long_options[] = {{"steps", required_argument, 0, 's'},
                                               {"params", required_argument, 0, 'p'},
                                               {"global-batch", required_argument, 0, 'b'},
                                               {"compute-ms", required_argument, 0, 'c'},
                                               {"seed", required_argument, 0, 'e'},
                                               {"shards", required_argument, 0, 'k'},
                                               {"persist-every", required_argument, 0, 'P'},
                                               {"persist-dir", required_argument, 0, 'D'},
                                               {"second-allreduce", no_argument, 0, 'A'},
                                               {"undo", no_argument, 0, 'U'},
                                               {"long-step", required_argument, 0, 'L'},
                                               {"long-ms", required_argument, 0, 'M'},
                                               {"section", no_argument, 0, 'S'},
                                               {"long-every-ms", required_argument, 0, 'E'},
                                               {"long-spin", no_argument, 0, 'B'},
                                               {"skip-step", required_argument, 0, 'K'},
                                               {"leak-per-redo", no_argument, 0, 'R'},
                                               {0, 0, 0, 0}};
  int option;
  while ((option = getopt_long(argc, argv, "", long_options, NULL)) != -1) {
    int64_t value = 0;
    if (option == 'D' || option == 'A' || option == 'U' || option == 'S' || option == 'B' ||
        option == 'R') {
      if (option == 'D') opts->persist_directory = optarg;
      if (option == 'A') opts->second_allreduce = true;
      if (option == 'U') opts->undo = true;
      if (option == 'S') opts->section = true;
      if (option == 'B') opts->long_spin = true;
      if (option == 'R') opts->leak_per_redo = true;
      continue;
    }
    /* --seed job: a seed of the job's id, the same in every rank and different in every
     * run; a run that keel chaos compares with another must then differ from it. */
    if (option == 'e' && strcmp(optarg, "job") == 0 && getenv("KEEL_JOB_ID") != NULL) {
      opts->seed = strtoull(getenv("KEEL_JOB_ID"), NULL, 10);
      continue;
    }
    if (option == '?' || keel_parse_int(optarg, 0, 1 << 30, &value) != KEEL_OK) {
      fprintf(stderr, "toy_train: bad flag (see the file's header)\n");
      return -1;
    }
    if (option == 's') opts->steps = value;
    if (option == 'p') opts->params = value;
    if (option == 'b') opts->global_batch = value;
    if (option == 'c') opts->compute_ms = value;
    if (option == 'e') opts->seed = (uint64_t)value;
    if (option == 'k') opts->shards = value;
    if (option == 'P') opts->persist_every = value;
    if (option == 'L') opts->long_step = value;
    if (option == 'M') opts->long_ms = value;
    if (option == 'E') opts->long_every_ms = value;
    if (option == 'K') opts->skip_step = value;
  }
  if (opts->persist_every > 0 && opts->persist_directory == NULL) {
    fprintf(stderr, "toy_train: --persist-every needs --persist-dir\n");
    return -1;
  }
  if (opts->shards < 1 || opts->params % opts->shards != 0) {
    fprintf(stderr, "toy_train: --shards must divide --params\n");
    return -1;
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

/* The run's memory: the whole parameter vector (assembled every step when sharded), this
 * rank's shard of parameters and momentum (the registered state), the reduction buffers. */
typedef struct toy_state {
  size_t n, shard_n;
  float *params, *shard_params, *momentum, *send, *recv, *gathered;
  uint64_t step;
  bool long_done;
  int64_t next_long_ns; /* --long-every-ms: when the next long step is due */
  int64_t long_count;
} toy_state;

static bool toy_allocate(toy_state *toy, const options *opts) {
  toy->n = (size_t)opts->params;
  toy->shard_n = toy->n / (size_t)opts->shards;
  toy->params = calloc(toy->n, sizeof(float));
  toy->shard_params = calloc(toy->shard_n, sizeof(float));
  toy->momentum = calloc(toy->shard_n, sizeof(float));
  toy->send = calloc(toy->n + 1, sizeof(float));
  toy->recv = calloc(toy->n + 1, sizeof(float));
  return toy->params && toy->shard_params && toy->momentum && toy->send && toy->recv;
}

static void toy_release(toy_state *toy) {
  free(toy->params);
  free(toy->shard_params);
  free(toy->momentum);
  free(toy->send);
  free(toy->recv);
  free(toy->gathered);
}

static size_t shard_of(const options *opts, keel_comm *world) {
  return (size_t)keel_comm_rank(world) % (size_t)opts->shards;
}

/* The whole parameter vector from the shards: shard k from rank k, the first replica group
 * (every group holds the same shards). Unsharded, the registered vector is the whole one. */
static keel_status params_assemble(toy_state *toy, const options *opts, keel_ctx *ctx) {
  if (opts->shards == 1) return KEEL_OK;
  size_t shard_bytes = toy->shard_n * sizeof(float);
  /* Room for the largest world the job can have: recovery may change the size. */
  size_t size = 1024;
  if (toy->gathered == NULL) toy->gathered = malloc(shard_bytes * size);
  if (toy->gathered == NULL) return KEEL_ENOMEM;
  keel_status status = keel_step_allgather(ctx, toy->shard_params, toy->gathered, shard_bytes);
  if (status != KEEL_OK) return status;
  for (int64_t k = 0; k < opts->shards; k++)
    memcpy(toy->params + (size_t)k * toy->shard_n, toy->gathered + (size_t)k * toy->shard_n,
           shard_bytes);
  return KEEL_OK;
}

static void optimizer_step(toy_state *toy, const options *opts, keel_comm *world) {
  size_t first = opts->shards == 1 ? 0 : shard_of(opts, world) * toy->shard_n;
  float *params = opts->shards == 1 ? toy->params : toy->shard_params;
  for (size_t i = 0; i < toy->shard_n; i++) {
    toy->momentum[i] = 0.9f * toy->momentum[i] + toy->recv[first + i] / toy->recv[toy->n];
    params[i] -= 0.05f * toy->momentum[i];
  }
}

/* The exit code for a status keel ended the run with; a real error is named. */
static int run_end(const toy_state *toy, const char *what, keel_status status) {
  int code = keel_exit_code(status);
  if (code == 1)
    fprintf(stderr, "toy_train: %s at step %llu: %s\n", what, (unsigned long long)toy->step,
            keel_strerror(status));
  return code;
}

/* Whether uid 1 works long at this step: once at --long-step, or each --long-every-ms. */
static bool long_work_due(keel_ctx *ctx, toy_state *toy, const options *opts) {
  keel_comm *world = keel_world(ctx);
  if (keel_comm_uid(world, keel_comm_rank(world)) != 1) return false;
  if (opts->long_every_ms > 0) {
    int64_t now = keel_now_ns(), every_ns = opts->long_every_ms * 1000000;
    if (toy->next_long_ns == 0) toy->next_long_ns = now + every_ns;
    if (now < toy->next_long_ns) return false;
    toy->next_long_ns = now + every_ns;
    return true;
  }
  if (toy->long_done || (int64_t)toy->step != opts->long_step) return false;
  toy->long_done = true;
  return true;
}

/* uid 1's long work, declared as a section with --section (a replacement of uid 1 does not
 * do a --long-step one again). */
static void long_work(keel_ctx *ctx, toy_state *toy, const options *opts) {
  if (!long_work_due(ctx, toy, opts)) return;
  int64_t duration_ns = opts->long_ms * 1000000;
  keel_status status = KEEL_OK;
  if (opts->section)
    status = keel_section_begin(ctx, "evaluation", keel_deadline_after_ns(2 * duration_ns));
  if (status != KEEL_OK)
    fprintf(stderr, "toy_train: keel_section_begin: %s\n", keel_strerror(status));
  if (opts->long_spin) {
    int64_t until = keel_now_ns() + duration_ns;
    volatile uint64_t spins = 0;
    while (keel_now_ns() < until) spins++;
  } else {
    struct timespec pause = {(time_t)(duration_ns / 1000000000), (long)(duration_ns % 1000000000)};
    nanosleep(&pause, NULL);
  }
  if (opts->section && status == KEEL_OK && (status = keel_section_end(ctx)) != KEEL_OK)
    fprintf(stderr, "toy_train: keel_section_end: %s\n", keel_strerror(status));
  fprintf(stderr, "toy_train: long work %lld (%lld ms) at step %llu\n",
          (long long)++toy->long_count, (long long)opts->long_ms, (unsigned long long)toy->step);
}

/* A step is redone after a recovery; with --leak-per-redo, an fd is leaked. */
static void step_redone(const options *opts) {
  if (opts->leak_per_redo && open("/dev/null", O_RDONLY) < 0) perror("toy_train: /dev/null");
}

/* The training steps up to --steps; returns -1 when they are done, else the exit code. */
static int toy_steps(keel_ctx *ctx, toy_state *toy, const options *opts) {
  keel_status status;
  while (toy->step < (uint64_t)opts->steps) {
    if ((status = keel_step_begin(ctx, toy->step)) != KEEL_OK)
      return run_end(toy, "keel_step_begin", status);
    status = params_assemble(toy, opts, ctx);
    if (status == KEEL_OK) {
      keel_fault_point(ctx, "forward");
      long_work(ctx, toy, opts);
      keel_comm *world = keel_world(ctx);
      compute_gradient(opts, toy->params, toy->step, keel_comm_rank(world), keel_comm_size(world),
                       toy->send);
      status = keel_step_allreduce(ctx, toy->send, toy->recv, toy->n + 1, KEEL_F32, KEEL_SUM);
    }
    if (status == KEEL_EREDO) { /* recovered: the step begins again */
      step_redone(opts);
      continue;
    }
    if (status != KEEL_OK) return run_end(toy, "step", status);
    keel_fault_point(ctx, "optimizer");
    optimizer_step(toy, opts, keel_world(ctx));
    if (opts->second_allreduce) {
      /* A statistic of the updated parameters, as a loss-scale or norm check would be: the
       * registered state has already changed when this collective runs. */
      float norm = 0.0f, total = 0.0f;
      for (size_t i = 0; i < toy->shard_n; i++) norm += toy->momentum[i] * toy->momentum[i];
      keel_fault_point(ctx, "updated");
      status = keel_step_allreduce(ctx, &norm, &total, 1, KEEL_F32, KEEL_SUM);
      if (status == KEEL_EREDO) {
        step_redone(opts);
        continue;
      }
      if (status != KEEL_OK) return run_end(toy, "second allreduce", status);
    }
    toy->step++;
    if ((int64_t)toy->step == opts->skip_step) toy->step++;
    if ((status = keel_step_commit(ctx)) != KEEL_OK) return run_end(toy, "commit", status);
    keel_report(ctx, toy->step, (double)toy->recv[0], 0);
  }
  return -1;
}

/* The final assembly is a step of its own (it is a collective, and may fail too); then
 * keel_finish, so that no rank leaves while another may still fail the last step. */
static keel_status toy_final(keel_ctx *ctx, toy_state *toy, const options *opts,
                             const char **what_p) {
  *what_p = "keel_step_begin";
  keel_status status = keel_step_begin(ctx, toy->step);
  if (status != KEEL_OK) return status;
  *what_p = "final assembly";
  if ((status = params_assemble(toy, opts, ctx)) != KEEL_OK) return status;
  *what_p = "keel_finish";
  return keel_finish(ctx);
}

/* Returns the exit code (keel_exit_code of how the run ended). */
static int toy_run(keel_ctx *ctx, toy_state *toy, const options *opts) {
  /* A recovery at the end may bring back an older step (a rollback): train on from it. */
  for (;;) {
    int code = toy_steps(ctx, toy, opts);
    if (code >= 0) return code;
    const char *what = NULL;
    keel_status status = toy_final(ctx, toy, opts, &what);
    if (status == KEEL_EREDO) continue;
    if (status != KEEL_OK) return run_end(toy, what, status);
    break;
  }
  keel_comm *world = keel_world(ctx);
  printf("toy-final rank=%d uid=%u step=%llu world=%d crc=%08x\n", keel_comm_rank(world),
         keel_comm_uid(world, keel_comm_rank(world)), (unsigned long long)toy->step,
         keel_comm_size(world), keel_crc32c(0, toy->params, toy->n * sizeof(float)));
  fflush(stdout);
  return 0;
}

int main(int argc, char **argv) {
  options opts;
  if (parse_options(argc, argv, &opts) != 0) return 2;
  keel_ctx *ctx = NULL;
  if (keel_init(&ctx) != KEEL_OK) return 1;
  toy_state toy = {0};
  keel_ckpt_jit *jit = NULL;
  keel_ckpt_persist *persist = NULL;
  keel_ckpt_mem *mem = NULL;
  int exit_code = 1;
  if (!toy_allocate(&toy, &opts)) goto done;
  for (size_t i = 0; i < toy.n; i++) toy.params[i] = (float)sin((double)i);
  float *held = opts.shards == 1 ? toy.params : toy.shard_params;
  keel_state_register(ctx, "params", held, toy.shard_n * sizeof(float));
  keel_state_register(ctx, "momentum", toy.momentum, toy.shard_n * sizeof(float));
  keel_state_register(ctx, "step", &toy.step, sizeof toy.step);
  keel_state_shard(ctx, (uint32_t)opts.shards);
  if (opts.undo && keel_step_undo(ctx, true) != KEEL_OK) goto done;
  /* The tier before keel_start: a spare admitted there may need it for its shard. */
  if (opts.persist_every > 0 &&
      keel_ckpt_persist_enable(ctx, opts.persist_directory, (uint64_t)opts.persist_every,
                               &persist) != KEEL_OK)
    goto done;
  /* In-memory checkpoints when `keel run --ckpt mem` asks for them (a no-op otherwise). */
  if (keel_ckpt_mem_enable(ctx, &mem) != KEEL_OK) goto done;
  keel_status status = keel_start(ctx);
  if (status != KEEL_OK) {
    exit_code = keel_exit_code(status); /* KEEL_EJOBDONE: a spare that was never needed */
    goto done;
  }
  /* A newcomer's shard arrived from a survivor; the first workers make theirs. */
  keel_comm *world = keel_world(ctx);
  size_t shard = (size_t)keel_comm_rank(world) % (size_t)opts.shards;
  if (opts.shards > 1 && !keel_is_newcomer(ctx)) {
    for (size_t i = 0; i < toy.shard_n; i++)
      toy.shard_params[i] = (float)sin((double)(shard * toy.shard_n + i));
  }
  status = keel_ckpt_jit_enable(ctx, NULL, &jit);
  if (status != KEEL_OK) {
    fprintf(stderr, "toy_train: checkpoints: %s\n", keel_strerror(status));
    goto done;
  }
  exit_code = toy_run(ctx, &toy, &opts);
done:
  keel_finalize(ctx);
  keel_ckpt_persist_destroy(persist);
  keel_ckpt_mem_destroy(mem);
  keel_ckpt_jit_destroy(jit);
  toy_release(&toy);
  return exit_code;
}
