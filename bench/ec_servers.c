/* What ECRec's parameter servers cost and how they recover, in this process: every
 * configuration (no fault tolerance, ECRec k = 2 and 4 with and without two-phase commit,
 * checkpoints to disk) trains the same synthetic embedding workload on its own servers, in
 * interleaved windows so that each is compared with the baseline measured beside it; then one
 * server of each ECRec configuration is stopped (the first step after it, degraded-mode
 * throughput), and memory per server and a checkpoint's write and reload times are reported.
 * Usage: ec_servers [--rows N] [--dim D] [--workers W] [--batch B] [--servers S] [--seed X]
 *        [--seconds T | --steps N] [--rounds R] [--checkpoint-every T] [--lose I]
 *        [--mode sync|async|both] [--rebuild-pause-ms MS] [--json FILE] */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench_stats.h"

#include "keel/core.h"
#include "keel/ec.h"
#include "keel/net.h"
#include "keel/store.h"

#define MAX_SERVERS 16
#define MAX_WORKERS 16
#define MAX_ROUNDS 50
#define MAX_JOBS 16
/* Batches drawn before any timing, per worker, used in turn: the steps time the servers, not
 * the sampler. */
#define POOL_BATCHES 32
#define DENSE_COUNT 1024
#define LEARNING_RATE 0.01f
/* Single steps timed one by one before and after a loss. */
#define SINGLE_STEPS 5
/* A warm-up window doubles its steps until it lasts this long; it also sizes the windows. */
#define WARMUP_NS ((int64_t)250 * 1000 * 1000)
#define SECOND_NS 1e9

typedef enum run_mode { MODE_SYNC = 1, MODE_ASYNC = 2, MODE_BOTH = 3 } run_mode;

typedef struct options {
  uint64_t rows;
  int64_t dim, workers, batch, servers, rounds, lose, steps;
  int64_t rebuild_pause_ms; /* keel_ec_config's: the replacement's pause between rounds */
  uint64_t seed;
  double seconds;          /* measured training time per configuration (when steps is 0) */
  double checkpoint_every; /* seconds of training time; 0: a quarter of `seconds` */
  run_mode mode;
  const char *json_path;
} options;

/* ---- the workload: Zipf-like rows (rank probability about 1 / (rank + 1), the exponent 1 of
 * continuous Zipf), ranks scattered over the rows by a fixed bijection, so that hot rows land
 * on every server */

typedef struct batch_pool {
  int batch;
  uint64_t *rows; /* [worker][POOL_BATCHES][batch], each batch strictly increasing */
} batch_pool;

static uint64_t greatest_common_divisor(uint64_t a, uint64_t b) {
  while (b != 0) {
    uint64_t rest = a % b;
    a = b;
    b = rest;
  }
  return a;
}

/* rank -> row: rank * multiplier + 1 mod rows, a bijection since the multiplier is coprime. */
static uint64_t scatter_multiplier(uint64_t rows) {
  uint64_t multiplier = (uint64_t)((double)rows * 0.6180339887) | 1;
  while (multiplier > 1 && greatest_common_divisor(multiplier, rows) != 1) multiplier--;
  return multiplier > 0 ? multiplier : 1;
}

static uint64_t zipf_row(keel_random *random, uint64_t rows, uint64_t multiplier) {
  double rank = floor(exp(keel_random_unit(random) * log((double)rows + 1.0))) - 1.0;
  uint64_t index = rank < 0 ? 0 : (uint64_t)rank;
  if (index >= rows) index = rows - 1;
  return (index * multiplier + 1) % rows;
}

static int compare_rows(const void *left, const void *right) {
  uint64_t a = *(const uint64_t *)left, b = *(const uint64_t *)right;
  return (a > b) - (a < b);
}

/* Sorts rows and drops repeats; returns how many are left. */
static size_t sort_unique(uint64_t *rows, size_t count) {
  qsort(rows, count, sizeof *rows, compare_rows);
  size_t kept = 0;
  for (size_t i = 0; i < count; i++)
    if (kept == 0 || rows[i] != rows[kept - 1]) rows[kept++] = rows[i];
  return kept;
}

/* One batch of `batch` distinct rows, strictly increasing: draws until that many differ. */
static void batch_draw(keel_random *random, uint64_t rows, uint64_t multiplier, int batch,
                       uint64_t *out) {
  size_t have = 0;
  while (have < (size_t)batch) {
    for (size_t i = have; i < (size_t)batch; i++) out[i] = zipf_row(random, rows, multiplier);
    have = sort_unique(out, (size_t)batch);
  }
}

static keel_status pool_make(const options *opts, batch_pool *pool) {
  size_t count = (size_t)opts->workers * POOL_BATCHES * (size_t)opts->batch;
  pool->batch = (int)opts->batch;
  pool->rows = malloc(sizeof *pool->rows * count);
  if (pool->rows == NULL) return KEEL_ENOMEM;
  uint64_t multiplier = scatter_multiplier(opts->rows);
  for (int w = 0; w < opts->workers; w++) {
    for (int b = 0; b < POOL_BATCHES; b++) {
      keel_random random;
      keel_random_seed(&random, keel_random_seed_for(opts->seed, (uint64_t)b, (uint64_t)w));
      batch_draw(&random, opts->rows, multiplier, pool->batch,
                 pool->rows + ((size_t)w * POOL_BATCHES + (size_t)b) * (size_t)pool->batch);
    }
  }
  return KEEL_OK;
}

static const uint64_t *pool_batch(const batch_pool *pool, int worker, uint64_t step) {
  size_t index = (size_t)worker * POOL_BATCHES + (size_t)(step % POOL_BATCHES);
  return pool->rows + index * (size_t)pool->batch;
}

/* ---- what is measured: the configurations */

typedef struct variant {
  const char *name;
  int data_blocks; /* k (r = 1); without parity it only shapes the placement */
  bool parity;     /* false: without_parity, no fault tolerance */
  bool two_phase_commit;
  bool checkpoints; /* a thread checkpoints every server every T seconds of training */
} variant;

/* The first is the baseline every other is compared with. */
static const variant variants[] = {
    {"no-ft", 4, false, false, false},      {"ecrec-k2", 2, true, false, false},
    {"ecrec-k2-2pc", 2, true, true, false}, {"ecrec-k4", 4, true, false, false},
    {"ecrec-k4-2pc", 4, true, true, false}, {"checkpoint", 4, false, false, true},
};
#define VARIANTS (sizeof variants / sizeof variants[0])

/* ---- the checkpoint thread of the checkpoint configuration: every `every_ns` of training
 * time (the time its windows run), all servers one after another to a temporary folder. A
 * window ends only once a checkpoint under way is written, so its whole cost is counted. */

typedef struct checkpointer {
  pthread_t thread;
  pthread_mutex_t lock;
  pthread_cond_t changed; /* on CLOCK_MONOTONIC */
  bool running, active, busy, quit;
  int64_t every_ns;
  int64_t trained_ns;      /* training time of the windows ended */
  int64_t window_start_ns; /* while active */
  int64_t last_ns;         /* training time at the last checkpoint's start */
  keel_ec_server **servers;
  int server_count;
  char folder[PATH_MAX];
  keel_status status;
  int count;
  double seconds[256]; /* each checkpoint of all servers */
  uint64_t bytes;
} checkpointer;

static void checkpoint_path(const checkpointer *c, int server, char *path, size_t size) {
  snprintf(path, size, "%s/server-%d.ckpt", c->folder, server);
}

/* Every server's checkpoint, one after another; the bytes written in all. */
static keel_status checkpoint_all(checkpointer *c, uint64_t *bytes_p) {
  uint64_t total = 0;
  for (int i = 0; i < c->server_count; i++) {
    char path[PATH_MAX + 32];
    checkpoint_path(c, i, path, sizeof path);
    uint64_t bytes = 0;
    keel_status status = keel_ec_server_checkpoint(c->servers[i], path, &bytes);
    if (status != KEEL_OK) return status;
    total += bytes;
  }
  *bytes_p = total;
  return KEEL_OK;
}

static int64_t checkpointer_trained_ns(const checkpointer *c) {
  return c->trained_ns + (c->active ? keel_now_ns() - c->window_start_ns : 0);
}

static void wait_until(checkpointer *c, int64_t deadline_ns) {
  struct timespec until = {.tv_sec = deadline_ns / 1000000000, .tv_nsec = deadline_ns % 1000000000};
  pthread_cond_timedwait(&c->changed, &c->lock, &until);
}

/* Called with the lock held; returns with it held. */
static void checkpointer_write(checkpointer *c, int64_t trained_ns) {
  c->busy = true;
  c->last_ns = trained_ns;
  pthread_mutex_unlock(&c->lock);
  int64_t start = keel_now_ns();
  uint64_t bytes = 0;
  keel_status status = checkpoint_all(c, &bytes);
  double seconds = (double)(keel_now_ns() - start) / SECOND_NS;
  pthread_mutex_lock(&c->lock);
  if (status != KEEL_OK) c->status = status;
  if (c->count < (int)(sizeof c->seconds / sizeof c->seconds[0])) c->seconds[c->count++] = seconds;
  c->bytes = bytes;
  c->busy = false;
  pthread_cond_broadcast(&c->changed);
}

static void *checkpointer_main(void *argument) {
  checkpointer *c = argument;
  pthread_mutex_lock(&c->lock);
  while (!c->quit) {
    if (!c->active) {
      pthread_cond_wait(&c->changed, &c->lock);
      continue;
    }
    int64_t trained = checkpointer_trained_ns(c);
    if (trained - c->last_ns >= c->every_ns && c->status == KEEL_OK) {
      checkpointer_write(c, trained);
      continue;
    }
    wait_until(c, keel_now_ns() + (c->every_ns - (trained - c->last_ns)));
  }
  pthread_mutex_unlock(&c->lock);
  return NULL;
}

static keel_status checkpointer_start(checkpointer *c, keel_ec_server **servers, int count,
                                      int64_t every_ns, const char *folder) {
  memset(c, 0, sizeof *c);
  c->servers = servers;
  c->server_count = count;
  c->every_ns = every_ns;
  snprintf(c->folder, sizeof c->folder, "%s", folder);
  pthread_condattr_t attributes;
  pthread_condattr_init(&attributes);
  pthread_condattr_setclock(&attributes, CLOCK_MONOTONIC);
  pthread_cond_init(&c->changed, &attributes);
  pthread_condattr_destroy(&attributes);
  pthread_mutex_init(&c->lock, NULL);
  if (pthread_create(&c->thread, NULL, checkpointer_main, c) != 0) return KEEL_ENOMEM;
  c->running = true;
  return KEEL_OK;
}

static void checkpointer_resume(checkpointer *c) {
  if (!c->running) return;
  pthread_mutex_lock(&c->lock);
  c->active = true;
  c->window_start_ns = keel_now_ns();
  pthread_cond_broadcast(&c->changed);
  pthread_mutex_unlock(&c->lock);
}

/* Ends a window's training time, once a checkpoint under way is written. */
static void checkpointer_pause(checkpointer *c) {
  if (!c->running) return;
  pthread_mutex_lock(&c->lock);
  while (c->busy) pthread_cond_wait(&c->changed, &c->lock);
  if (c->active) c->trained_ns += keel_now_ns() - c->window_start_ns;
  c->active = false;
  pthread_mutex_unlock(&c->lock);
}

static void checkpointer_stop(checkpointer *c) {
  if (!c->running) return;
  pthread_mutex_lock(&c->lock);
  c->quit = true;
  pthread_cond_broadcast(&c->changed);
  pthread_mutex_unlock(&c->lock);
  pthread_join(c->thread, NULL);
  pthread_cond_destroy(&c->changed);
  pthread_mutex_destroy(&c->lock);
  c->running = false;
}

/* ---- one configuration's job: an embedded store, S servers, W worker threads that run the
 * steps of the windows the driver gives them */

struct job;

typedef struct worker {
  struct job *job;
  int index;
  pthread_t thread;
  keel_ec_client *client;
  uint64_t next_step;
  float *values; /* batch * dim: pulled, then pushed back as the gradient */
  float *dense;
  keel_status status;
} worker;

/* Windows of one job, in order: the figures of each phase. */
typedef struct window_log {
  int count;
  double seconds[MAX_ROUNDS];
  int64_t steps[MAX_ROUNDS];
} window_log;

typedef struct loss_figures {
  double stop_s;        /* keel_ec_server_stop of the lost server */
  double first_step_s;  /* the first step after it */
  double before_step_s; /* median single step before the loss */
  double after_step_s;  /* median of the next single steps after the first */
  double degraded_rate; /* steps/s, median of the degraded windows */
  /* then a replacement (keel_ec_server_replace) rebuilt while training goes on */
  double rebuild_s;       /* from its start to its standing "rebuilt" */
  double rebuild_rate;    /* steps/s while it was rebuilt */
  int64_t rebuild_steps;  /* steps trained meanwhile */
  uint64_t rebuilt_bytes; /* its row blocks and parity blocks */
} loss_figures;

typedef struct job {
  const variant *variant;
  const options *opts;
  const batch_pool *pool;
  bool synchronous;
  char name[64];
  keel_ec_config config;
  keel_auth auth;
  keel_store_server *store_server;
  keel_store *stores[MAX_SERVERS + MAX_WORKERS];
  keel_ec_server *servers[MAX_SERVERS];
  worker workers[MAX_WORKERS];
  int workers_started;
  checkpointer checkpoints;
  /* the window the workers run: generation counts windows, done the workers through it */
  pthread_mutex_t lock;
  pthread_cond_t changed;
  uint64_t generation;
  int64_t window_steps;
  int done;
  bool quit;
  /* figures */
  double start_s;
  int64_t rss_bytes;
  int64_t steps_per_window;
  window_log normal, degraded;
  bool lost;
  loss_figures loss;
} job;

static double job_rate(const window_log *log, int round) {
  return (double)log->steps[round] / log->seconds[round];
}

/* One step: pull the batch's rows and the dense block, push them back as the gradients. */
static keel_status worker_step(worker *w) {
  job *j = w->job;
  const uint64_t *rows = pool_batch(j->pool, w->index, w->next_step);
  size_t count = (size_t)j->pool->batch;
  keel_status status = keel_ec_client_pull_rows(w->client, rows, count, w->values);
  if (status == KEEL_OK) status = keel_ec_client_pull_dense(w->client, w->dense);
  if (status == KEEL_OK)
    status = keel_ec_client_push_rows(w->client, w->next_step, rows, count, w->values);
  if (status == KEEL_OK) status = keel_ec_client_push_dense(w->client, w->next_step, w->dense);
  w->next_step++;
  return status;
}

/* Waits for a window after `seen`; false when the job quits. */
static bool worker_wait_window(worker *w, uint64_t *seen, int64_t *steps) {
  job *j = w->job;
  pthread_mutex_lock(&j->lock);
  while (!j->quit && j->generation == *seen) pthread_cond_wait(&j->changed, &j->lock);
  bool go = !j->quit;
  *seen = j->generation;
  *steps = j->window_steps;
  pthread_mutex_unlock(&j->lock);
  return go;
}

static void worker_report(worker *w, keel_status status) {
  job *j = w->job;
  pthread_mutex_lock(&j->lock);
  if (w->status == KEEL_OK) w->status = status;
  j->done++;
  pthread_cond_broadcast(&j->changed);
  pthread_mutex_unlock(&j->lock);
}

static keel_status worker_open(worker *w) {
  job *j = w->job;
  w->values = malloc(sizeof *w->values * (size_t)j->pool->batch * (size_t)j->config.dim);
  w->dense = malloc(sizeof *w->dense * DENSE_COUNT);
  if (w->values == NULL || w->dense == NULL) return KEEL_ENOMEM;
  keel_status status = keel_ec_client_open(j->stores[j->config.servers + w->index], &j->auth,
                                           w->index, NULL, &w->client);
  for (int i = 0; i < DENSE_COUNT; i++) w->dense[i] = (float)(i % 64) / 256.0f;
  /* Every worker may: the first one's values win. */
  if (status == KEEL_OK) status = keel_ec_client_init_dense(w->client, w->dense);
  return status;
}

static void *worker_main(void *argument) {
  worker *w = argument;
  keel_status status = worker_open(w);
  worker_report(w, status); /* window 0: ready */
  uint64_t seen = 0;
  int64_t steps = 0;
  while (status == KEEL_OK && worker_wait_window(w, &seen, &steps)) {
    for (int64_t i = 0; i < steps && status == KEEL_OK; i++) status = worker_step(w);
    worker_report(w, status);
  }
  keel_ec_client_close(w->client);
  free(w->values);
  free(w->dense);
  return NULL;
}

/* Waits until every worker is through the window; the first failure among them. */
static keel_status job_wait_done(job *j) {
  pthread_mutex_lock(&j->lock);
  while (j->done < j->workers_started) pthread_cond_wait(&j->changed, &j->lock);
  keel_status status = KEEL_OK;
  for (int i = 0; i < j->workers_started && status == KEEL_OK; i++) status = j->workers[i].status;
  pthread_mutex_unlock(&j->lock);
  return status;
}

/* Runs `steps` steps on every worker; *seconds_p: from the start to the last worker's end
 * (and the end of a checkpoint under way). */
static keel_status job_window(job *j, int64_t steps, bool checkpoints, double *seconds_p) {
  int64_t start = keel_now_ns();
  if (checkpoints) checkpointer_resume(&j->checkpoints);
  pthread_mutex_lock(&j->lock);
  j->done = 0;
  j->window_steps = steps;
  j->generation++;
  pthread_cond_broadcast(&j->changed);
  pthread_mutex_unlock(&j->lock);
  keel_status status = job_wait_done(j);
  if (checkpoints) checkpointer_pause(&j->checkpoints);
  *seconds_p = (double)(keel_now_ns() - start) / SECOND_NS;
  if (status == KEEL_OK && checkpoints) status = j->checkpoints.status;
  if (status != KEEL_OK)
    fprintf(stderr, "ec_servers: %s: a window failed: %s\n", j->name, keel_strerror(status));
  return status;
}

/* VmRSS of this process, in bytes (0 when /proc cannot be read). */
static int64_t resident_bytes(void) {
  FILE *file = fopen("/proc/self/status", "r");
  if (file == NULL) return 0;
  char line[256];
  long long kib = 0;
  while (fgets(line, sizeof line, file) != NULL)
    if (sscanf(line, "VmRSS: %lld kB", &kib) == 1) break;
  fclose(file);
  return (int64_t)kib * 1024;
}

static keel_status job_config(job *j) {
  const options *opts = j->opts;
  keel_ec_optimizer optimizer;
  keel_status status = keel_ec_optimizer_init(KEEL_EC_ADAGRAD, LEARNING_RATE, &optimizer);
  j->config = (keel_ec_config){.servers = (int)opts->servers,
                               .data_blocks = j->variant->data_blocks,
                               .parity_blocks = 1,
                               .dim = (int)opts->dim,
                               .optimizer = optimizer,
                               .total_rows = opts->rows,
                               .dense_count = DENSE_COUNT,
                               .seed = opts->seed,
                               .init_scale = 0.1f,
                               .workers = j->synchronous ? (int)opts->workers : 0,
                               .two_phase_commit = j->variant->two_phase_commit,
                               .rebuild_pause_ms = (uint32_t)opts->rebuild_pause_ms,
                               /* ECRec replicates the dense block; the others keep one. */
                               .replicate_dense = j->variant->parity,
                               .without_parity = !j->variant->parity};
  snprintf(j->name, sizeof j->name, "%s%s", j->variant->name, j->synchronous ? "" : " async");
  return status;
}

/* The store, its connections (one per server and per worker) and the servers. */
static keel_status job_start_servers(job *j) {
  keel_status status = keel_auth_generate(&j->auth);
  if (status == KEEL_OK)
    status = keel_store_server_start("127.0.0.1:0", &j->auth, &j->store_server);
  int connections = j->config.servers + (int)j->opts->workers;
  for (int i = 0; i < connections && status == KEEL_OK; i++)
    status =
        keel_store_connect(keel_store_server_address(j->store_server), &j->auth,
                           keel_deadline_after_ns((int64_t)10 * 1000 * 1000 * 1000), &j->stores[i]);
  for (int i = 0; i < j->config.servers && status == KEEL_OK; i++)
    status =
        keel_ec_server_start(&j->config, i, "127.0.0.1:0", j->stores[i], &j->auth, &j->servers[i]);
  return status;
}

static keel_status job_start_workers(job *j) {
  for (int i = 0; i < j->opts->workers; i++) {
    j->workers[i] = (worker){.job = j, .index = i};
    if (pthread_create(&j->workers[i].thread, NULL, worker_main, &j->workers[i]) != 0)
      return KEEL_ENOMEM;
    j->workers_started++;
  }
  return job_wait_done(j);
}

static keel_status job_start(job *j, const char *folder) {
  pthread_mutex_init(&j->lock, NULL);
  pthread_cond_init(&j->changed, NULL);
  keel_status status = job_config(j);
  int64_t rss_before = resident_bytes(), start = keel_now_ns();
  if (status == KEEL_OK) status = job_start_servers(j);
  j->start_s = (double)(keel_now_ns() - start) / SECOND_NS;
  j->rss_bytes = resident_bytes() - rss_before;
  if (status == KEEL_OK) status = job_start_workers(j);
  if (status == KEEL_OK && j->variant->checkpoints)
    status = checkpointer_start(&j->checkpoints, j->servers, j->config.servers,
                                (int64_t)(j->opts->checkpoint_every * SECOND_NS), folder);
  if (status != KEEL_OK)
    fprintf(stderr, "ec_servers: %s: cannot start: %s\n", j->name, keel_strerror(status));
  return status;
}

static void job_stop(job *j) {
  checkpointer_stop(&j->checkpoints);
  pthread_mutex_lock(&j->lock);
  j->quit = true;
  pthread_cond_broadcast(&j->changed);
  pthread_mutex_unlock(&j->lock);
  for (int i = 0; i < j->workers_started; i++) pthread_join(j->workers[i].thread, NULL);
  for (int i = 0; i < j->config.servers; i++) keel_ec_server_stop(j->servers[i]);
  for (int i = 0; i < j->config.servers + j->opts->workers; i++) keel_store_close(j->stores[i]);
  keel_store_server_stop(j->store_server);
  pthread_cond_destroy(&j->changed);
  pthread_mutex_destroy(&j->lock);
}

/* ---- the phases */

/* Warm-up (connections, first touches) with doubling windows until one lasts WARMUP_NS; sizes
 * the measured windows from its rate (or from --steps). */
static keel_status job_warm_up(job *j, int rounds) {
  const options *opts = j->opts;
  double seconds = 0;
  int64_t steps = 2;
  keel_status status = KEEL_OK;
  for (; status == KEEL_OK; steps *= 2) {
    status = job_window(j, steps, false, &seconds);
    if (seconds * SECOND_NS >= WARMUP_NS || opts->steps > 0) break;
  }
  double rate = (double)steps / (seconds > 0 ? seconds : 1e-9);
  j->steps_per_window =
      opts->steps > 0 ? opts->steps / rounds : (int64_t)(rate * opts->seconds / rounds + 0.5);
  if (j->steps_per_window < 1) j->steps_per_window = 1;
  return status;
}

/* Rounds of one window per job, the first job of each round rotating; into each job's log. */
static keel_status run_rounds(job **jobs, int count, int rounds, bool degraded) {
  for (int round = 0; round < rounds; round++) {
    for (int at = 0; at < count; at++) {
      job *j = jobs[(round + at) % count];
      window_log *log = degraded ? &j->degraded : &j->normal;
      double seconds = 0;
      keel_status status = job_window(j, j->steps_per_window, !degraded, &seconds);
      if (status != KEEL_OK) return status;
      log->seconds[log->count] = seconds;
      log->steps[log->count++] = j->steps_per_window;
    }
  }
  return KEEL_OK;
}

/* The median time of `count` single steps. */
static keel_status single_steps(job *j, int count, double *median_s) {
  double times[SINGLE_STEPS];
  for (int i = 0; i < count; i++) {
    keel_status status = job_window(j, 1, false, &times[i]);
    if (status != KEEL_OK) return status;
  }
  qsort(times, (size_t)count, sizeof *times, bench_compare_doubles);
  *median_s = bench_median_sorted(times, count);
  return KEEL_OK;
}

/* Stops server opts->lose between two steps (a clean stop of an in-process server: its links
 * close, so the first call to it fails at once) and times the steps around it. */
static keel_status job_lose_server(job *j) {
  int lose = (int)j->opts->lose;
  keel_status status = single_steps(j, SINGLE_STEPS, &j->loss.before_step_s);
  if (status != KEEL_OK) return status;
  int64_t start = keel_now_ns();
  keel_ec_server_stop(j->servers[lose]);
  j->servers[lose] = NULL;
  j->lost = true;
  j->loss.stop_s = (double)(keel_now_ns() - start) / SECOND_NS;
  status = job_window(j, 1, false, &j->loss.first_step_s);
  if (status == KEEL_OK) status = single_steps(j, SINGLE_STEPS, &j->loss.after_step_s);
  return status;
}

/* Server index's standing in the directory ("" when live). */
static void standing_read(job *j, int index, char *text, size_t size) {
  char key[32];
  snprintf(key, sizeof key, "ec/lost/%d", index);
  keel_store_entry *entry = NULL;
  text[0] = '\0';
  if (keel_store_get(j->stores[0], key, &entry) != KEEL_OK) return;
  snprintf(text, size, "%s", (const char *)entry->value);
  keel_store_entry_free(entry);
}

/* The lost server's replacement, rebuilt in the background while the workers train in windows
 * of a few steps; timed until its standing is no longer "rebuilding" (60 s at most). */
static keel_status job_replace_server(job *j) {
  enum { STEPS_PER_LOOK = 4 };
  const int64_t limit_ns = (int64_t)60 * 1000 * 1000 * 1000;
  int lose = (int)j->opts->lose;
  int64_t start = keel_now_ns();
  keel_status status = keel_ec_server_replace(&j->config, lose, "127.0.0.1:0", j->stores[lose],
                                              &j->auth, &j->servers[lose]);
  /* Rebuilding until "rebuilt", which the first worker soon turns into "back N". */
  char standing[64] = "rebuilding";
  while (status == KEEL_OK && strcmp(standing, "rebuilding") == 0) {
    if (keel_now_ns() - start > limit_ns) status = KEEL_ETIMEDOUT;
    double seconds = 0;
    if (status == KEEL_OK) status = job_window(j, STEPS_PER_LOOK, false, &seconds);
    j->loss.rebuild_steps += STEPS_PER_LOOK;
    standing_read(j, lose, standing, sizeof standing);
  }
  j->loss.rebuild_s = (double)(keel_now_ns() - start) / SECOND_NS;
  j->loss.rebuild_rate = (double)j->loss.rebuild_steps / j->loss.rebuild_s;
  /* What it rebuilt: its row blocks and parity blocks, as the layout places them. */
  keel_ec_layout layout;
  size_t block = 0;
  uint64_t k = (uint64_t)j->config.data_blocks, data_rows = 0, parity_rows = 0;
  if (status == KEEL_OK)
    status = keel_ec_layout_init(j->config.servers, j->config.data_blocks, j->config.parity_blocks,
                                 &layout);
  if (status == KEEL_OK)
    status = keel_ec_layout_count(&layout, lose, (j->config.total_rows + k - 1) / k, &data_rows,
                                  &parity_rows);
  if (status == KEEL_OK)
    status = keel_ec_row_block_bytes(&j->config.optimizer, j->config.dim, &block);
  j->loss.rebuilt_bytes = (data_rows + parity_rows) * block;
  return status;
}

static double median_rate(const window_log *log) {
  double rates[MAX_ROUNDS];
  for (int i = 0; i < log->count; i++) rates[i] = job_rate(log, i);
  qsort(rates, (size_t)log->count, sizeof *rates, bench_compare_doubles);
  return log->count > 0 ? bench_median_sorted(rates, log->count) : 0;
}

/* Overhead against the baseline: per round, 1 - rate / baseline's rate in the same round;
 * the median over rounds, in percent. */
static double overhead_percent(const window_log *log, const window_log *baseline) {
  double overheads[MAX_ROUNDS];
  int count = log->count < baseline->count ? log->count : baseline->count;
  for (int i = 0; i < count; i++)
    overheads[i] = 100.0 * (1.0 - job_rate(log, i) / job_rate(baseline, i));
  qsort(overheads, (size_t)count, sizeof *overheads, bench_compare_doubles);
  return count > 0 ? bench_median_sorted(overheads, count) : 0;
}

/* ---- the checkpoint baseline: one checkpoint of all servers with nothing else running, and
 * its reload (the files read back), from the page cache and, after POSIX_FADV_DONTNEED on
 * each file, from the disk */

typedef struct checkpoint_figures {
  bool measured;
  uint64_t bytes;
  double write_s, reload_cold_s, reload_warm_s;
  double during_training_s; /* median of the checkpoints taken while training */
  int during_training;
} checkpoint_figures;

/* Drops every file's pages from the page cache (clean pages: the checkpoint synced them). */
static void evict_all(const checkpointer *c) {
  for (int i = 0; i < c->server_count; i++) {
    char path[PATH_MAX + 32];
    checkpoint_path(c, i, path, sizeof path);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    close(fd);
  }
}

/* Reads every server's file back, whole: what a restore reads before it can go on. */
static keel_status reload_all(const checkpointer *c, uint8_t *buffer, size_t size,
                              double *seconds_p) {
  int64_t start = keel_now_ns();
  for (int i = 0; i < c->server_count; i++) {
    char path[PATH_MAX + 32];
    checkpoint_path(c, i, path, sizeof path);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return keel_status_from_errno(errno);
    ssize_t got;
    while ((got = read(fd, buffer, size)) > 0) {
    }
    keel_status status = got < 0 ? keel_status_from_errno(errno) : KEEL_OK;
    close(fd);
    if (status != KEEL_OK) return status;
  }
  *seconds_p = (double)(keel_now_ns() - start) / SECOND_NS;
  return KEEL_OK;
}

static keel_status checkpoint_baseline(job *j, checkpoint_figures *figures) {
  checkpointer *c = &j->checkpoints;
  int64_t start = keel_now_ns();
  keel_status status = checkpoint_all(c, &figures->bytes);
  figures->write_s = (double)(keel_now_ns() - start) / SECOND_NS;
  size_t size = (size_t)4 << 20;
  uint8_t *buffer = malloc(size);
  if (status == KEEL_OK && buffer == NULL) status = KEEL_ENOMEM;
  if (status == KEEL_OK) evict_all(c);
  if (status == KEEL_OK) status = reload_all(c, buffer, size, &figures->reload_cold_s);
  if (status == KEEL_OK) status = reload_all(c, buffer, size, &figures->reload_warm_s);
  free(buffer);
  pthread_mutex_lock(&c->lock);
  figures->during_training = c->count;
  if (c->count > 0) {
    qsort(c->seconds, (size_t)c->count, sizeof c->seconds[0], bench_compare_doubles);
    figures->during_training_s = bench_median_sorted(c->seconds, c->count);
  }
  pthread_mutex_unlock(&c->lock);
  figures->measured = status == KEEL_OK;
  return status;
}

static void checkpoint_files_remove(const checkpointer *c) {
  for (int i = 0; i < c->server_count; i++) {
    char path[PATH_MAX + 32];
    checkpoint_path(c, i, path, sizeof path);
    unlink(path);
  }
}

/* ---- memory: bytes held, from the layout (data and parity row blocks, the dense block, and
 * the parity stamps keel keeps beside each parity block: k u64s) */

typedef struct memory_scheme {
  const char *name;
  int data_blocks; /* k; it places the rows */
  bool parity;     /* r = 1 parity blocks and their stamps */
  int row_copies, dense_copies;
} memory_scheme;

static const memory_scheme memory_schemes[] = {
    {"no-ft", 4, false, 1, 1},
    {"ecrec k=2", 2, true, 1, 2},
    {"ecrec k=4", 4, true, 1, 2},
    {"2x replication", 4, false, 2, 2},
};
#define MEMORY_SCHEMES (sizeof memory_schemes / sizeof memory_schemes[0])

typedef struct memory_figures {
  const char *scheme;
  uint64_t per_server_max, per_server_min, total, stamps;
} memory_figures;

static void memory_add_server(memory_figures *m, uint64_t bytes, bool first) {
  m->total += bytes;
  if (first || bytes > m->per_server_max) m->per_server_max = bytes;
  if (first || bytes < m->per_server_min) m->per_server_min = bytes;
}

/* Each server's bytes under the scheme, by keel_ec_layout_count; the dense block on servers 0
 * (and 1 when it has two copies). */
static keel_status memory_of(const options *opts, const memory_scheme *scheme, memory_figures *m) {
  keel_ec_optimizer optimizer;
  size_t block = 0, dense = 0;
  keel_ec_layout layout;
  int k = scheme->data_blocks;
  keel_status status = keel_ec_optimizer_init(KEEL_EC_ADAGRAD, LEARNING_RATE, &optimizer);
  if (status == KEEL_OK) status = keel_ec_row_block_bytes(&optimizer, (int)opts->dim, &block);
  if (status == KEEL_OK) status = keel_ec_row_block_bytes(&optimizer, DENSE_COUNT, &dense);
  if (status == KEEL_OK) status = keel_ec_layout_init((int)opts->servers, k, 1, &layout);
  *m = (memory_figures){.scheme = scheme->name};
  uint64_t groups = (opts->rows + (uint64_t)k - 1) / (uint64_t)k;
  for (int s = 0; s < opts->servers && status == KEEL_OK; s++) {
    uint64_t data_rows = 0, parity_rows = 0;
    status = keel_ec_layout_count(&layout, s, groups, &data_rows, &parity_rows);
    uint64_t bytes = data_rows * block * (uint64_t)scheme->row_copies;
    if (s < scheme->dense_copies) bytes += dense;
    if (scheme->parity) {
      uint64_t stamps = parity_rows * (uint64_t)k * sizeof(uint64_t);
      bytes += parity_rows * block + stamps;
      m->stamps += stamps;
    }
    memory_add_server(m, bytes, s == 0);
  }
  return status;
}

/* ---- output */

static double mib(uint64_t bytes) { return (double)bytes / (1024.0 * 1024.0); }

static const job *baseline_of(job *const *jobs, int count, const job *j) {
  for (int i = 0; i < count; i++)
    if (jobs[i]->variant == &variants[0] && jobs[i]->synchronous == j->synchronous) return jobs[i];
  return j;
}

static void print_throughput(job *const *jobs, int count, const options *opts) {
  printf(
      "\n## Training throughput (median of %d windows; overhead: median over rounds of "
      "1 - rate / no-ft's rate in the same round)\n\n",
      jobs[0]->normal.count);
  printf("%-20s %9s %11s %9s %9s %9s %8s\n", "configuration", "steps/s", "rows/s", "overhead",
         "step_ms", "rss_MiB", "start_s");
  for (int i = 0; i < count; i++) {
    const job *j = jobs[i];
    double rate = median_rate(&j->normal);
    double overhead = overhead_percent(&j->normal, &baseline_of(jobs, count, j)->normal);
    printf("%-20s %9.1f %11.0f %8.1f%% %9.2f %9.1f %8.2f\n", j->name, rate,
           rate * (double)opts->workers * (double)opts->batch, overhead, 1e3 / rate,
           mib((uint64_t)j->rss_bytes), j->start_s);
  }
}

static void print_losses(job *const *jobs, int count) {
  printf(
      "\n## Server lost (clean stop of an in-process server between steps), then degraded "
      "mode\n\n");
  printf("%-20s %8s %14s %13s %14s %11s %11s %10s\n", "configuration", "stop_ms", "first_step_ms",
         "step_ms_before", "step_ms_after", "deg_steps/s", "% of normal", "% of no-ft");
  for (int i = 0; i < count; i++) {
    const job *j = jobs[i];
    if (!j->lost) continue;
    const job *baseline = baseline_of(jobs, count, j);
    double normal = median_rate(&j->normal), degraded = median_rate(&j->degraded);
    double of_baseline = 100 - overhead_percent(&j->degraded, &baseline->degraded);
    printf("%-20s %8.1f %14.2f %13.2f %14.2f %11.1f %10.1f%% %9.1f%%\n", j->name,
           j->loss.stop_s * 1e3, j->loss.first_step_s * 1e3, j->loss.before_step_s * 1e3,
           j->loss.after_step_s * 1e3, degraded, 100 * degraded / normal, of_baseline);
  }
  printf("\n## Then a replacement of the lost server, rebuilt while training goes on\n\n");
  printf("%-20s %12s %10s %13s %13s %12s\n", "configuration", "rebuilt_MiB", "rebuild_s",
         "steps_during", "steps/s", "% of normal");
  for (int i = 0; i < count; i++) {
    const job *j = jobs[i];
    if (!j->lost) continue;
    double normal = median_rate(&j->normal);
    printf("%-20s %12.1f %10.3f %13lld %13.1f %11.1f%%\n", j->name, mib(j->loss.rebuilt_bytes),
           j->loss.rebuild_s, (long long)j->loss.rebuild_steps, j->loss.rebuild_rate,
           100 * j->loss.rebuild_rate / normal);
  }
}

static void print_memory(const memory_figures *m, int count, job *const *jobs, int jobs_n) {
  printf("\n## Memory held by the servers (row blocks + dense block + parity stamps)\n\n");
  printf("%-16s %15s %15s %12s %12s\n", "scheme", "per_server_MiB", "total_MiB", "stamps_MiB",
         "x no-ft");
  for (int i = 0; i < count; i++)
    printf("%-16s %7.1f-%-7.1f %15.1f %12.1f %12.2f\n", m[i].scheme, mib(m[i].per_server_min),
           mib(m[i].per_server_max), mib(m[i].total), mib(m[i].stamps),
           (double)m[i].total / (double)m[0].total);
  printf("\nVmRSS growth when each configuration's servers started (cross-check):");
  for (int i = 0; i < jobs_n; i++)
    printf(" %s %.1f MiB%s", jobs[i]->name, mib((uint64_t)jobs[i]->rss_bytes),
           i + 1 < jobs_n ? ";" : "\n");
}

static void print_checkpoints(const checkpoint_figures *c, const options *opts, job *const *jobs,
                              int count) {
  if (!c->measured) return;
  printf("\n## Checkpoint baseline (every server, one after another, to a temporary folder)\n\n");
  printf(
      "checkpoint of all servers: %.1f MiB, %.3f s idle, %.3f s while training (median of "
      "%d)\n",
      mib(c->bytes), c->write_s, c->during_training_s, c->during_training);
  printf(
      "reload (read the files back): %.3f s from disk (after POSIX_FADV_DONTNEED), %.3f s "
      "from the page cache\n",
      c->reload_cold_s, c->reload_warm_s);
  printf("checkpoint recovery, average case: reload + T/2 redone = %.3f + %.3f s (T = %.2f s)\n",
         c->reload_cold_s, opts->checkpoint_every / 2, opts->checkpoint_every);
  for (int i = 0; i < count; i++)
    if (jobs[i]->lost)
      printf("  against %s: first step after the loss %.3f s\n", jobs[i]->name,
             jobs[i]->loss.first_step_s);
}

/* ---- JSON (--json FILE): the same figures */

static json_t *job_json(job *const *jobs, int count, const job *j, const options *opts) {
  double rate = median_rate(&j->normal);
  json_t *rates = json_array();
  for (int i = 0; i < j->normal.count; i++)
    json_array_append_new(rates, json_real(job_rate(&j->normal, i)));
  json_t *object = json_pack(
      "{s:s, s:s, s:i, s:i, s:i, s:b, s:b, s:b, s:f, s:f, s:f, s:f, s:o, s:I, s:f}", "name",
      j->name, "mode", j->synchronous ? "sync" : "async", "servers", j->config.servers, "k",
      j->config.data_blocks, "r", j->variant->parity ? 1 : 0, "parity", j->variant->parity,
      "two_phase_commit", j->variant->two_phase_commit, "checkpoints", j->variant->checkpoints,
      "steps_per_s", rate, "rows_per_s", rate * (double)opts->workers * (double)opts->batch,
      "overhead_pct", overhead_percent(&j->normal, &baseline_of(jobs, count, j)->normal), "step_ms",
      1e3 / rate, "window_steps_per_s", rates, "rss_growth_bytes", (json_int_t)j->rss_bytes,
      "start_s", j->start_s);
  if (j->lost) {
    double degraded = median_rate(&j->degraded);
    double of_baseline =
        100 - overhead_percent(&j->degraded, &baseline_of(jobs, count, j)->degraded);
    json_object_set_new(
        object, "loss",
        json_pack("{s:i, s:f, s:f, s:f, s:f, s:f, s:f, s:f}", "server", (int)opts->lose, "stop_ms",
                  j->loss.stop_s * 1e3, "first_step_ms", j->loss.first_step_s * 1e3,
                  "step_ms_before", j->loss.before_step_s * 1e3, "step_ms_after",
                  j->loss.after_step_s * 1e3, "degraded_steps_per_s", degraded,
                  "degraded_pct_of_normal", 100 * degraded / rate, "degraded_pct_of_no_ft",
                  of_baseline));
  }
  return object;
}

static json_t *memory_json(const memory_figures *m, int count) {
  json_t *array = json_array();
  for (int i = 0; i < count; i++)
    json_array_append_new(
        array, json_pack("{s:s, s:I, s:I, s:I, s:I}", "scheme", m[i].scheme, "per_server_max_bytes",
                         (json_int_t)m[i].per_server_max, "per_server_min_bytes",
                         (json_int_t)m[i].per_server_min, "total_bytes", (json_int_t)m[i].total,
                         "stamps_bytes", (json_int_t)m[i].stamps));
  return array;
}

static keel_status write_json(const options *opts, job *const *jobs, int count,
                              const memory_figures *m, int memory_count,
                              const checkpoint_figures *c) {
  json_t *configurations = json_array();
  for (int i = 0; i < count; i++)
    json_array_append_new(configurations, job_json(jobs, count, jobs[i], opts));
  json_t *root =
      json_pack("{s:s, s:I, s:i, s:i, s:i, s:i, s:I, s:f, s:i, s:i, s:o, s:o}", "bench",
                "ec_servers", "rows", (json_int_t)opts->rows, "dim", (int)opts->dim, "workers",
                (int)opts->workers, "batch", (int)opts->batch, "servers", (int)opts->servers,
                "seed", (json_int_t)opts->seed, "checkpoint_every_s", opts->checkpoint_every,
                "rounds", (int)opts->rounds, "cores", (int)sysconf(_SC_NPROCESSORS_ONLN),
                "configurations", configurations, "memory", memory_json(m, memory_count));
  if (c->measured)
    json_object_set_new(
        root, "checkpoint",
        json_pack("{s:I, s:f, s:f, s:f, s:f, s:i}", "bytes", (json_int_t)c->bytes, "write_s",
                  c->write_s, "write_while_training_s", c->during_training_s, "reload_disk_s",
                  c->reload_cold_s, "reload_cache_s", c->reload_warm_s, "taken_while_training",
                  c->during_training));
  int failed = root == NULL ? -1 : json_dump_file(root, opts->json_path, JSON_INDENT(2));
  json_decref(root);
  if (failed != 0) fprintf(stderr, "ec_servers: cannot write %s\n", opts->json_path);
  return failed != 0 ? KEEL_EIO : KEEL_OK;
}

/* ---- options */

static bool parse_seconds(const char *text, double minimum, double *seconds_p) {
  int64_t ns = 0;
  if (keel_parse_duration_ns(text, &ns) != KEEL_OK || (double)ns / SECOND_NS < minimum)
    return false;
  *seconds_p = (double)ns / SECOND_NS;
  return true;
}

static bool parse_mode(const char *text, run_mode *mode_p) {
  if (strcmp(text, "sync") == 0)
    *mode_p = MODE_SYNC;
  else if (strcmp(text, "async") == 0)
    *mode_p = MODE_ASYNC;
  else if (strcmp(text, "both") == 0)
    *mode_p = MODE_BOTH;
  else
    return false;
  return true;
}

static bool parse_one(int option, const char *text, options *opts) {
  int64_t rows = 0, seed = 0;
  switch (option) {
    case 'r':
      if (keel_parse_int(text, 1, INT32_MAX, &rows) != KEEL_OK) return false;
      opts->rows = (uint64_t)rows;
      return true;
    case 'd':
      return keel_parse_int(text, 1, 4096, &opts->dim) == KEEL_OK;
    case 'w':
      return keel_parse_int(text, 1, MAX_WORKERS, &opts->workers) == KEEL_OK;
    case 'b':
      return keel_parse_int(text, 1, 65536, &opts->batch) == KEEL_OK;
    case 'S':
      return keel_parse_int(text, 2, MAX_SERVERS, &opts->servers) == KEEL_OK;
    case 'R':
      return keel_parse_int(text, 1, MAX_ROUNDS, &opts->rounds) == KEEL_OK;
    case 'l':
      return keel_parse_int(text, 0, MAX_SERVERS - 1, &opts->lose) == KEEL_OK;
    case 'n':
      return keel_parse_int(text, 1, INT32_MAX, &opts->steps) == KEEL_OK;
    case 't':
      return parse_seconds(text, 0.01, &opts->seconds);
    case 'c':
      return parse_seconds(text, 0.01, &opts->checkpoint_every);
    case 'm':
      return parse_mode(text, &opts->mode);
    case 'j':
      opts->json_path = text;
      return true;
    case 'P':
      return keel_parse_int(text, 0, 60000, &opts->rebuild_pause_ms) == KEEL_OK;
    case 's':
      if (keel_parse_int(text, 0, INT64_MAX, &seed) != KEEL_OK) return false;
      opts->seed = (uint64_t)seed;
      return true;
    default:
      return false;
  }
}

static int parse_options(int argc, char **argv, options *opts) {
  *opts = (options){.rows = 1000000,
                    .dim = 16,
                    .workers = 2,
                    .batch = 512,
                    .servers = 5,
                    .rounds = 5,
                    .lose = 2,
                    .seed = 42,
                    .seconds = 5.0,
                    .mode = MODE_SYNC};
  static const struct option long_options[] = {{"rows", required_argument, 0, 'r'},
                                               {"dim", required_argument, 0, 'd'},
                                               {"workers", required_argument, 0, 'w'},
                                               {"batch", required_argument, 0, 'b'},
                                               {"servers", required_argument, 0, 'S'},
                                               {"rounds", required_argument, 0, 'R'},
                                               {"lose", required_argument, 0, 'l'},
                                               {"steps", required_argument, 0, 'n'},
                                               {"seconds", required_argument, 0, 't'},
                                               {"checkpoint-every", required_argument, 0, 'c'},
                                               {"mode", required_argument, 0, 'm'},
                                               {"json", required_argument, 0, 'j'},
                                               {"seed", required_argument, 0, 's'},
                                               {"rebuild-pause-ms", required_argument, 0, 'P'},
                                               {0, 0, 0, 0}};
  int option;
  while ((option = getopt_long(argc, argv, "", long_options, NULL)) != -1) {
    if (!parse_one(option, optarg, opts)) {
      fprintf(stderr, "ec_servers: bad flag (see the file's header)\n");
      return -1;
    }
  }
  if (opts->checkpoint_every == 0) opts->checkpoint_every = opts->seconds / 4;
  /* k = 4, r = 1 needs 5 servers; a batch needs that many distinct rows. */
  if (opts->servers < 5 || opts->lose >= opts->servers || (uint64_t)opts->batch > opts->rows) {
    fprintf(stderr, "ec_servers: needs --servers >= 5, --lose < servers, --batch <= rows\n");
    return -1;
  }
  return 0;
}

/* ---- main */

typedef struct bench {
  options opts;
  batch_pool pool;
  job jobs[MAX_JOBS];
  job *order[MAX_JOBS];
  int count;
  char folder[PATH_MAX];
  memory_figures memory[MEMORY_SCHEMES];
  checkpoint_figures checkpoint;
} bench;

static keel_status bench_start(bench *b) {
  keel_status status = pool_make(&b->opts, &b->pool);
  for (int mode = MODE_SYNC; mode <= MODE_ASYNC && status == KEEL_OK; mode++) {
    if ((b->opts.mode & mode) == 0) continue;
    for (size_t v = 0; v < VARIANTS && status == KEEL_OK; v++) {
      job *j = &b->jobs[b->count];
      *j = (job){.variant = &variants[v],
                 .opts = &b->opts,
                 .pool = &b->pool,
                 .synchronous = mode == MODE_SYNC};
      b->order[b->count++] = j;
      status = job_start(j, b->folder);
    }
  }
  for (int i = 0; i < b->count && status == KEEL_OK; i++)
    status = job_warm_up(b->order[i], (int)b->opts.rounds);
  return status;
}

/* Loses a server in every ECRec job, then runs degraded rounds of those and the baselines. */
static keel_status bench_losses(bench *b) {
  job *degraded[MAX_JOBS];
  int count = 0;
  keel_status status = KEEL_OK;
  for (int i = 0; i < b->count && status == KEEL_OK; i++) {
    job *j = b->order[i];
    if (j->variant == &variants[0]) degraded[count++] = j;
    if (!j->variant->parity || !j->synchronous) continue;
    status = job_lose_server(j);
    degraded[count++] = j;
  }
  if (status == KEEL_OK) status = run_rounds(degraded, count, (int)b->opts.rounds, true);
  for (int i = 0; i < b->count && status == KEEL_OK; i++)
    if (b->order[i]->lost) status = job_replace_server(b->order[i]);
  return status;
}

static keel_status bench_run(bench *b) {
  keel_status status = run_rounds(b->order, b->count, (int)b->opts.rounds, false);
  if (status == KEEL_OK) status = bench_losses(b);
  for (int i = 0; i < b->count && status == KEEL_OK; i++)
    if (b->order[i]->variant->checkpoints) {
      status = checkpoint_baseline(b->order[i], &b->checkpoint);
      break;
    }
  for (size_t i = 0; i < MEMORY_SCHEMES && status == KEEL_OK; i++)
    status = memory_of(&b->opts, &memory_schemes[i], &b->memory[i]);
  return status;
}

/* The first three fields of /proc/loadavg ("" when it cannot be read). */
static void load_average(char *text, size_t size) {
  text[0] = 0;
  FILE *file = fopen("/proc/loadavg", "r");
  if (file == NULL) return;
  double one, five, fifteen;
  if (fscanf(file, "%lf %lf %lf", &one, &five, &fifteen) == 3)
    snprintf(text, size, "%.2f %.2f %.2f", one, five, fifteen);
  fclose(file);
}

static void bench_print(const bench *b, const char *load_at_start) {
  const options *opts = &b->opts;
  size_t block = 0;
  keel_ec_row_block_bytes(&b->jobs[0].config.optimizer, (int)opts->dim, &block);
  char load[64];
  load_average(load, sizeof load);
  printf(
      "# ec_servers: %llu rows x dim %d (Adagrad, %zu-byte row blocks), %d distinct Zipf-like "
      "rows per worker-step + %d dense values, %d workers, %d servers (r = 1), %.2f s per "
      "configuration in %d rounds, checkpoint every %.2f s of training, lose server %d\n",
      (unsigned long long)opts->rows, (int)opts->dim, block, (int)opts->batch, DENSE_COUNT,
      (int)opts->workers, (int)opts->servers, opts->seconds, (int)opts->rounds,
      opts->checkpoint_every, (int)opts->lose);
  printf("# %ld cores; load %s at the start, %s at the end\n", sysconf(_SC_NPROCESSORS_ONLN),
         load_at_start, load);
  print_throughput(b->order, b->count, opts);
  print_losses(b->order, b->count);
  print_memory(b->memory, MEMORY_SCHEMES, b->order, b->count);
  print_checkpoints(&b->checkpoint, opts, b->order, b->count);
}

int main(int argc, char **argv) {
  static bench b;
  if (parse_options(argc, argv, &b.opts) != 0) return 2;
  const char *tmp = getenv("TMPDIR");
  snprintf(b.folder, sizeof b.folder, "%s/keel-ec-servers.XXXXXX", tmp != NULL ? tmp : "/tmp");
  if (mkdtemp(b.folder) == NULL) {
    perror("ec_servers: mkdtemp");
    return 1;
  }
  char load[64];
  load_average(load, sizeof load);
  keel_status status = bench_start(&b);
  if (status == KEEL_OK) status = bench_run(&b);
  if (status == KEEL_OK) bench_print(&b, load);
  if (status == KEEL_OK && b.opts.json_path != NULL)
    status = write_json(&b.opts, b.order, b.count, b.memory, MEMORY_SCHEMES, &b.checkpoint);
  for (int i = 0; i < b.count; i++) {
    if (b.order[i]->variant->checkpoints) checkpoint_files_remove(&b.order[i]->checkpoints);
    job_stop(b.order[i]);
  }
  rmdir(b.folder);
  free(b.pool.rows);
  if (status != KEEL_OK) fprintf(stderr, "ec_servers: %s\n", keel_strerror(status));
  return status == KEEL_OK ? 0 : 1;
}
