/* Parameter servers (ECRec) in this process, on an embedded store: two synchronous workers
 * train random rows and a dense block; a server is lost part way; every row, its optimizer
 * state and the dense block must end bit for bit as a reference computed here applies the
 * same steps, and degraded reads must return exactly the lost rows. */
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include <cmocka.h>

#include "ec/server_internal.h"
#include "ec/service.h"
#include "keel/ec.h"
#include "test_support.h"

#define WORKERS 2
#define STEPS 24
#define ROWS_PER_STEP 40
#define DENSE 37
#define SEED 99

typedef struct ec_job {
  keel_ec_config config;
  keel_auth auth;
  keel_store_server *store_server;
  keel_store *stores[8];
  keel_ec_server *servers[8];
  pid_t processes[8]; /* servers as `keel server` processes, when the test wants them */
  pthread_barrier_t barrier;
  int lose_at; /* the step before which server `lose` is stopped; -1: never */
  int lose;
  int replace_at;     /* the step before which its replacement starts; -1 (or 0): never */
  int second_lose_at; /* the step before which server second_lose is stopped, while
                       * the replacement is rebuilt; 0: never */
  int second_lose;
  bool second_stop_replace; /* second_lose is stopped, replaced and then killed instead */
  int stopped;              /* the server that stops itself, when not `lose` (0: `lose`) */
  int replaced_while_stopped; /* a server killed and replaced while it is stopped (0: none) */
  int stopped_replace_at; /* the step inside which server `lose` stops itself (a fault rule) and
                           * is replaced before it is killed; 0: never */
  char folder[512], fault[256]; /* processes' output folder and KEEL_FAULT */
  keel_status worker_status[WORKERS];
  /* reference */
  size_t block_bytes, dense_block_bytes;
  uint8_t *blocks;
  uint8_t *dense;
} ec_job;

/* Worker w's rows of step s: distinct, increasing, drawn from the seed. */
static size_t step_rows(const ec_job *job, int worker, int step, uint64_t *rows, float *gradients) {
  keel_random random;
  keel_random_seed(&random, keel_random_seed_for(SEED, (uint64_t)step, (uint64_t)worker));
  size_t count = 0;
  uint64_t row = keel_random_below(&random, 4);
  while (count < ROWS_PER_STEP && row < job->config.total_rows) {
    rows[count++] = row;
    row += 1 + keel_random_below(&random, 2 * job->config.total_rows / ROWS_PER_STEP);
  }
  for (size_t i = 0; i < count * (size_t)job->config.dim; i++)
    gradients[i] = (float)(keel_random_unit(&random) - 0.5);
  return count;
}

static void step_dense(int worker, int step, float *gradients) {
  keel_random random;
  keel_random_seed(&random, keel_random_seed_for(SEED + 1, (uint64_t)step, (uint64_t)worker));
  for (int i = 0; i < DENSE; i++) gradients[i] = (float)(keel_random_unit(&random) - 0.5);
}

static void dense_initial(float *values) {
  for (int i = 0; i < DENSE; i++) values[i] = (float)i / 64.0f - 0.25f;
}

/* ---- the reference: every step applied here, gradients summed in worker order */

static void reference_make(ec_job *job) {
  int dim = job->config.dim;
  assert_int_equal(keel_ec_row_block_bytes(&job->config.optimizer, dim, &job->block_bytes),
                   KEEL_OK);
  assert_int_equal(keel_ec_row_block_bytes(&job->config.optimizer, DENSE, &job->dense_block_bytes),
                   KEEL_OK);
  job->blocks = calloc(job->config.total_rows, job->block_bytes);
  job->dense = calloc(1, job->dense_block_bytes);
  float values[64];
  for (uint64_t row = 0; row < job->config.total_rows; row++) {
    assert_int_equal(keel_ec_row_initial(SEED, row, dim, 0.1f, values), KEEL_OK);
    keel_ec_row_init(&job->config.optimizer, dim, values, job->blocks + row * job->block_bytes);
  }
  float dense[DENSE];
  dense_initial(dense);
  keel_ec_row_init(&job->config.optimizer, DENSE, dense, job->dense);
}

static void reference_step(ec_job *job, int step) {
  int dim = job->config.dim;
  uint64_t total = job->config.total_rows;
  float *sums = calloc(total * (size_t)dim, sizeof *sums);
  bool *touched = calloc(total, sizeof *touched);
  uint64_t rows[ROWS_PER_STEP];
  float gradients[ROWS_PER_STEP * 64], dense[DENSE], dense_sum[DENSE];
  for (int w = 0; w < WORKERS; w++) {
    size_t count = step_rows(job, w, step, rows, gradients);
    for (size_t i = 0; i < count; i++) {
      float *sum = sums + rows[i] * (size_t)dim;
      for (int j = 0; j < dim; j++)
        sum[j] = touched[rows[i]] ? sum[j] + gradients[i * (size_t)dim + j]
                                  : gradients[i * (size_t)dim + j];
      touched[rows[i]] = true;
    }
    step_dense(w, step, dense);
    for (int j = 0; j < DENSE; j++) dense_sum[j] = w == 0 ? dense[j] : dense_sum[j] + dense[j];
  }
  for (uint64_t row = 0; row < total; row++)
    if (touched[row])
      keel_ec_row_apply(&job->config.optimizer, dim, job->blocks + row * job->block_bytes,
                        sums + row * (size_t)dim, NULL);
  keel_ec_row_apply(&job->config.optimizer, DENSE, job->dense, dense_sum, NULL);
  free(touched);
  free(sums);
}

static uint32_t reference_checksum(const ec_job *job) {
  uint32_t crc = keel_crc32c(0, job->blocks, job->config.total_rows * job->block_bytes);
  return keel_crc32c(crc, job->dense, job->dense_block_bytes);
}

/* ---- the servers and the workers */

typedef struct worker_context {
  ec_job *job;
  int worker;
} worker_context;

static keel_status worker_steps(ec_job *job, int worker, keel_ec_client *client) {
  uint64_t rows[ROWS_PER_STEP];
  float gradients[ROWS_PER_STEP * 64], pulled[ROWS_PER_STEP * 64], dense[DENSE];
  keel_status status = KEEL_OK;
  for (int step = 0; step < STEPS; step++) {
    /* The main thread may lose a server between two steps. A worker that failed still meets
     * it at every step, so that the test fails on its status instead of hanging. */
    pthread_barrier_wait(&job->barrier);
    pthread_barrier_wait(&job->barrier);
    if (status != KEEL_OK) continue;
    size_t count = step_rows(job, worker, step, rows, gradients);
    status = keel_ec_client_pull_rows(client, rows, count, pulled);
    if (status == KEEL_OK) status = keel_ec_client_pull_dense(client, dense);
    if (status == KEEL_OK)
      status = keel_ec_client_push_rows(client, (uint64_t)step, rows, count, gradients);
    step_dense(worker, step, dense);
    if (status == KEEL_OK) status = keel_ec_client_push_dense(client, (uint64_t)step, dense);
  }
  return status;
}

static void *worker_main(void *argument) {
  worker_context *context = argument;
  ec_job *job = context->job;
  keel_ec_client *client = NULL;
  keel_status status = keel_ec_client_open(job->stores[job->config.servers + context->worker],
                                           &job->auth, context->worker, NULL, &client);
  if (status == KEEL_OK && context->worker == 0) {
    float dense[DENSE];
    dense_initial(dense);
    status = keel_ec_client_init_dense(client, dense);
  }
  keel_status steps = worker_steps(job, context->worker, client);
  job->worker_status[context->worker] = status != KEEL_OK ? status : steps;
  keel_ec_client_close(client);
  return NULL;
}

static void job_start(ec_job *job, int servers, int k, int r, keel_ec_optimizer_kind kind) {
  memset(job, 0, sizeof *job);
  assert_int_equal(keel_auth_generate(&job->auth), KEEL_OK);
  keel_ec_optimizer optimizer;
  assert_int_equal(keel_ec_optimizer_init(kind, 0.05f, &optimizer), KEEL_OK);
  job->config = (keel_ec_config){.servers = servers,
                                 .data_blocks = k,
                                 .parity_blocks = r,
                                 .dim = 8,
                                 .optimizer = optimizer,
                                 .total_rows = 301,
                                 .dense_count = DENSE,
                                 .seed = SEED,
                                 .init_scale = 0.1f,
                                 .workers = WORKERS,
                                 .replicate_dense = true};
  assert_int_equal(keel_store_server_start("127.0.0.1:0", &job->auth, &job->store_server), KEEL_OK);
  for (int i = 0; i < servers + WORKERS; i++)
    assert_int_equal(keel_store_connect(keel_store_server_address(job->store_server), &job->auth,
                                        keel_deadline_after_ns(10000000000), &job->stores[i]),
                     KEEL_OK);
  reference_make(job);
}

static void servers_start(ec_job *job) {
  for (int i = 0; i < job->config.servers; i++)
    assert_int_equal(keel_ec_server_start(&job->config, i, "127.0.0.1:0", job->stores[i],
                                          &job->auth, &job->servers[i]),
                     KEEL_OK);
}

/* Server `index` as a `keel server` process (a replacement with --replace), with the job's
 * token and fault rules in its environment. */
static void process_spawn(ec_job *job, int index, bool replace) {
  char id_env[48], token_env[96], fault_env[288];
  snprintf(id_env, sizeof id_env, "KEEL_JOB_ID=%llu", (unsigned long long)job->auth.job_id);
  int at = snprintf(token_env, sizeof token_env, "KEEL_JOB_TOKEN=");
  for (int i = 0; i < KEEL_TOKEN_BYTES; i++)
    at += snprintf(token_env + at, sizeof token_env - (size_t)at, "%02x", job->auth.token[i]);
  snprintf(fault_env, sizeof fault_env, "KEEL_FAULT=%s", job->fault);
  /* At info, a server says what it decided (test_killed_between_its_answers reads it). */
  char *const environment[] = {id_env, token_env, fault_env, "KEEL_LOG=info", NULL};
  char number[16], output[640], chunk[16], pause[16];
  snprintf(number, sizeof number, "%d", index);
  snprintf(output, sizeof output, "%s/server-%d%s.txt", job->folder, index,
           replace ? "-replacement" : "");
  /* A replacement rebuilds at the test's pace (a server's own, not in the configuration). */
  snprintf(chunk, sizeof chunk, "%u", job->config.rebuild_chunk_groups);
  snprintf(pause, sizeof pause, "%u", job->config.rebuild_pause_ms);
  char *argv[12];
  int count = 0;
  argv[count++] = (char *)keel_test_bin("keel");
  argv[count++] = "server";
  argv[count++] = "--index";
  argv[count++] = number;
  argv[count++] = "--store";
  argv[count++] = (char *)keel_store_server_address(job->store_server);
  if (job->config.rebuild_chunk_groups > 0) {
    argv[count++] = "--rebuild-chunk";
    argv[count++] = chunk;
  }
  if (job->config.rebuild_pause_ms > 0) {
    argv[count++] = "--rebuild-pause-ms";
    argv[count++] = pause;
  }
  if (replace) argv[count++] = "--replace";
  argv[count] = NULL;
  job->processes[index] = keel_test_spawn(argv, environment, output);
  assert_true(job->processes[index] > 0);
}

/* The servers as `keel server` processes; they wait for the configuration, which this test
 * then publishes as a job's first worker would. */
static void processes_start(ec_job *job, const char *folder, const char *fault) {
  snprintf(job->folder, sizeof job->folder, "%s", folder);
  snprintf(job->fault, sizeof job->fault, "%s", fault != NULL ? fault : "");
  for (int i = 0; i < job->config.servers; i++) process_spawn(job, i, false);
  assert_int_equal(keel_ec_config_publish(job->stores[0], &job->config), KEEL_OK);
  /* Once there, the configuration stays: the same again is fine, another is refused. */
  assert_int_equal(keel_ec_config_publish(job->stores[1], &job->config), KEEL_OK);
  keel_ec_config other = job->config;
  other.dim++;
  assert_int_equal(keel_ec_config_publish(job->stores[1], &other), KEEL_ECONFLICT);
  keel_ec_config seen;
  assert_int_equal(keel_ec_config_wait(job->stores[1], keel_deadline_after_ns(1000000000), &seen),
                   KEEL_OK);
  assert_int_equal(seen.dim, job->config.dim);
  assert_int_equal(seen.total_rows, job->config.total_rows);
}

/* Loses server `lose`: a clean stop in this process, or SIGKILL to its process (which must
 * have been alive and must die of it). */
static void server_lose(ec_job *job, int lose) {
  if (job->processes[lose] <= 0) {
    keel_ec_server_stop(job->servers[lose]);
    job->servers[lose] = NULL;
    return;
  }
  assert_true(keel_test_pid_exists(job->processes[lose]));
  assert_int_equal(kill(job->processes[lose], SIGKILL), 0);
  int status = 0;
  assert_true(keel_test_wait(job->processes[lose], 10000, &status));
  assert_true(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
  job->processes[lose] = 0;
}

/* The lost server's replacement: rebuilt in the background while the workers go on. */
static void server_replace(ec_job *job, int index) {
  if (job->folder[0] != '\0') {
    process_spawn(job, index, true);
    return;
  }
  assert_int_equal(keel_ec_server_replace(&job->config, index, "127.0.0.1:0", job->stores[index],
                                          &job->auth, &job->servers[index]),
                   KEEL_OK);
}

static void job_stop(ec_job *job) {
  for (int i = 0; i < job->config.servers; i++) keel_ec_server_stop(job->servers[i]);
  for (int i = 0; i < job->config.servers; i++) {
    if (job->processes[i] <= 0) continue;
    int status = 0;
    kill(job->processes[i], SIGTERM);
    assert_true(keel_test_wait(job->processes[i], 10000, &status));
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  for (int i = 0; i < job->config.servers + WORKERS; i++) keel_store_close(job->stores[i]);
  keel_store_server_stop(job->store_server);
  free(job->blocks);
  free(job->dense);
}

/* Every row, read back through a client: exactly the reference's parameters. */
static void assert_rows_match(ec_job *job, keel_ec_client *client) {
  int dim = job->config.dim;
  uint64_t total = job->config.total_rows;
  uint64_t *rows = malloc(sizeof *rows * total);
  float *values = malloc(sizeof *values * total * (size_t)dim);
  float *expected = malloc(sizeof *expected * (size_t)dim);
  for (uint64_t row = 0; row < total; row++) rows[row] = row;
  assert_int_equal(keel_ec_client_pull_rows(client, rows, total, values), KEEL_OK);
  for (uint64_t row = 0; row < total; row++) {
    keel_ec_row_read(dim, job->blocks + row * job->block_bytes, expected);
    assert_memory_equal(values + row * (size_t)dim, expected, sizeof(float) * (size_t)dim);
  }
  free(expected);
  free(values);
  free(rows);
}

/* Server index's standing in the directory ("rebuilding", "rebuilt", "lost", "back N"), or
 * "live" when it has none. */
static const char *standing_read(ec_job *job, int index) {
  static char text[64];
  char key[32];
  snprintf(key, sizeof key, "ec/lost/%d", index);
  keel_store_entry *entry = NULL;
  keel_status status = keel_store_get(job->stores[0], key, &entry);
  if (status == KEEL_ENOTFOUND) return "live";
  assert_int_equal(status, KEEL_OK);
  snprintf(text, sizeof text, "%s", (const char *)entry->value);
  keel_store_entry_free(entry);
  return text;
}

/* Waits (10 s at most) until server index's standing is no longer `left`. */
static void standing_wait_past(ec_job *job, int index, const char *left) {
  int64_t deadline = keel_deadline_after_ns(10000000000);
  while (strcmp(standing_read(job, index), left) == 0) {
    if (keel_now_ns() > deadline) fail_msg("server %d is still %s", index, left);
    poll(NULL, 0, 5);
  }
}

/* Server index stopped itself inside a step (a `stop` fault rule). Its replacement starts
 * and marks itself rebuilding before the stopped one is killed, so that a worker whose push
 * it never answered finds the link broken and the new address published: the push goes
 * again, to the replacement. */
/* A replacement process has marked itself: rebuilding, or rebuilt already (a few ms), either
 * way not serving until moved back. A worker whose push a stopped server never answered may
 * mark it lost first (seen under the sanitizers): the replacement's mark comes after. */
static void replacement_marked_wait(ec_job *job, int index) {
  int64_t marked_by = keel_deadline_after_ns(10000000000);
  const char *standing = standing_read(job, index);
  while (strcmp(standing, "rebuilding") != 0 && strcmp(standing, "rebuilt") != 0) {
    if (keel_now_ns() > marked_by) fail_msg("server %d is still %s", index, standing);
    poll(NULL, 0, 5);
    standing = standing_read(job, index);
  }
}

/* Server index's process has stopped itself (a fault rule). */
static void server_stopped_wait(ec_job *job, int index) {
  int64_t deadline = keel_deadline_after_ns(10000000000);
  char state = 0;
  int parent = 0;
  while (keel_process_stat(job->processes[index], &state, &parent) == KEEL_OK && state != 'T') {
    if (keel_now_ns() > deadline) fail_msg("server %d never stopped", index);
    poll(NULL, 0, 2);
  }
  assert_int_equal(state, 'T');
}

static void server_replace_stopped(ec_job *job, int index) {
  pid_t stopped = job->processes[index];
  server_stopped_wait(job, index);
  job->fault[0] = '\0'; /* the replacement has the same uid: the rule is not for it */
  process_spawn(job, index, true);
  replacement_marked_wait(job, index);
  assert_int_equal(kill(stopped, SIGKILL), 0);
  int status = 0;
  assert_true(keel_test_wait(stopped, 10000, &status));
  assert_true(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
}

/* Stops server index's process, lets the rebuild under way call on it (five of its rounds at
 * the tests' 40 ms pace: a call then waits on the stopped server), replaces it, and kills it
 * once the replacement has marked itself: the calls waiting on it go to the replacement. */
static void server_stop_replace(ec_job *job, int index) {
  assert_true(keel_test_pid_exists(job->processes[index]));
  assert_int_equal(kill(job->processes[index], SIGSTOP), 0);
  poll(NULL, 0, 200);
  server_replace_stopped(job, index);
}

static void run_job(ec_job *job) {
  pthread_barrier_init(&job->barrier, NULL, WORKERS + 1);
  pthread_t threads[WORKERS];
  worker_context contexts[WORKERS];
  for (int w = 0; w < WORKERS; w++) {
    contexts[w] = (worker_context){.job = job, .worker = w};
    assert_int_equal(pthread_create(&threads[w], NULL, worker_main, &contexts[w]), 0);
  }
  for (int step = 0; step < STEPS; step++) {
    pthread_barrier_wait(&job->barrier);
    if (step == job->lose_at) server_lose(job, job->lose);
    if (step == job->replace_at && job->replace_at > 0) {
      server_replace(job, job->lose);
      if (job->folder[0] != '\0') replacement_marked_wait(job, job->lose);
    }
    if (step == job->second_lose_at && job->second_lose_at > 0) {
      /* The loss must fall inside the rebuild, or the case tests nothing. */
      assert_string_equal(standing_read(job, job->lose), "rebuilding");
      if (job->second_stop_replace)
        server_stop_replace(job, job->second_lose);
      else
        server_lose(job, job->second_lose);
    }
    pthread_barrier_wait(&job->barrier);
    if (step == job->stopped_replace_at && job->stopped_replace_at > 0) {
      int stopped = job->stopped > 0 ? job->stopped : job->lose;
      if (job->replaced_while_stopped > 0) {
        server_stopped_wait(job, stopped);
        server_lose(job, job->replaced_while_stopped);
        server_replace(job, job->replaced_while_stopped);
        replacement_marked_wait(job, job->replaced_while_stopped);
      }
      server_replace_stopped(job, stopped);
    }
    reference_step(job, step);
  }
  for (int w = 0; w < WORKERS; w++) pthread_join(threads[w], NULL);
  pthread_barrier_destroy(&job->barrier);
  for (int w = 0; w < WORKERS; w++) assert_int_equal(job->worker_status[w], KEEL_OK);
}

static void check_job(ec_job *job, uint64_t lost_expected) {
  keel_ec_client *client = NULL;
  assert_int_equal(
      keel_ec_client_open(job->stores[job->config.servers], &job->auth, 0, NULL, &client), KEEL_OK);
  assert_int_equal(keel_ec_client_lost(client), lost_expected);
  assert_rows_match(job, client);
  uint32_t crc = 0;
  assert_int_equal(keel_ec_client_checksum(client, &crc), KEEL_OK);
  assert_int_equal(crc, reference_checksum(job));
  /* Every parity block that survives is the code of the rows: the next loss would decode
   * exact rows too. */
  uint64_t inconsistent = UINT64_MAX;
  assert_int_equal(keel_ec_client_verify(client, &inconsistent), KEEL_OK);
  /* Without parity the parity blocks stay as they started: the scrub must see it. */
  if (job->config.without_parity)
    assert_true(inconsistent > 0);
  else
    assert_int_equal(inconsistent, 0);
  keel_ec_client_close(client);
}

/* In-process server index's checkpoint, as written (*bytes_p long), its dense block (when it
 * holds one) at the end checked against the reference's (parameters and optimizer state). */
static char *checkpoint_checked(ec_job *job, int index, uint64_t *bytes_p) {
  char path[512];
  snprintf(path, sizeof path, "%s/server-%d.ckpt", keel_test_tempdir("keel-ec-ckpt"), index);
  uint64_t bytes = 0;
  assert_int_equal(keel_ec_server_checkpoint(job->servers[index], path, &bytes), KEEL_OK);
  size_t length = 0;
  char *written = keel_test_read_file(path, &length);
  assert_non_null(written);
  assert_true(length == bytes && bytes >= job->dense_block_bytes);
  if (index <= 1)
    assert_memory_equal(written + bytes - job->dense_block_bytes, job->dense,
                        job->dense_block_bytes);
  *bytes_p = bytes;
  return written;
}

/* Server 0's checkpoint: its rows in slot order (slot 0 is row 0), then the dense block. */
static void check_checkpoint(ec_job *job) {
  uint64_t bytes = 0;
  char *written = checkpoint_checked(job, 0, &bytes);
  uint64_t groups = (job->config.total_rows + 2) / 3, data_rows = 0, parity_rows = 0;
  keel_ec_layout layout;
  keel_ec_layout_init(job->config.servers, 3, 1, &layout);
  keel_ec_layout_count(&layout, 0, groups, &data_rows, &parity_rows);
  assert_int_equal(bytes, data_rows * job->block_bytes + job->dense_block_bytes);
  assert_memory_equal(written, job->blocks, job->block_bytes);
  free(written);
  /* A folder that does not exist: an error, and nothing left behind. */
  assert_int_not_equal(
      keel_ec_server_checkpoint(job->servers[0], "/nonexistent-keel/server.ckpt", NULL), KEEL_OK);
}

static void test_no_failure(void **state) {
  (void)state;
  ec_job job;
  job_start(&job, 4, 3, 1, KEEL_EC_ADAGRAD);
  servers_start(&job);
  job.lose_at = -1;
  run_job(&job);
  check_job(&job, 0);
  check_checkpoint(&job);
  job_stop(&job);
}

/* A server lost between steps: its rows are read and updated through the parity, exactly. */
static void check_lose_each_server(int servers, int k, int r, keel_ec_optimizer_kind kind,
                                   bool two_phase_commit) {
  for (int lose = 0; lose < servers; lose++) {
    ec_job job;
    job_start(&job, servers, k, r, kind);
    job.config.two_phase_commit = two_phase_commit;
    servers_start(&job);
    job.lose_at = STEPS / 2;
    job.lose = lose;
    run_job(&job);
    check_job(&job, (uint64_t)1 << lose);
    job_stop(&job);
  }
}

static void test_lose_any_server_xor(void **state) {
  (void)state;
  check_lose_each_server(4, 3, 1, KEEL_EC_ADAGRAD, false);
}

static void test_lose_any_server_reed_solomon(void **state) {
  (void)state;
  check_lose_each_server(5, 3, 2, KEEL_EC_ADAM, false);
}

/* Bad input: a connector with the wrong token is refused; a malformed request, a request of
 * a server's rows sent to another, and a frame of another type get an error reply; the
 * server goes on serving. */
static void test_bad_requests_refused(void **state) {
  (void)state;
  ec_job job;
  job_start(&job, 4, 3, 1, KEEL_EC_SGD);
  servers_start(&job);
  const char *address = keel_ec_server_address(job.servers[1]);
  keel_auth impostor = job.auth;
  impostor.token[0] ^= 1;
  keel_link *link = NULL;
  assert_int_equal(keel_link_connect(address, &impostor, keel_deadline_after_ns(5000000000), &link),
                   KEEL_EAUTH);
  assert_int_equal(keel_link_connect(address, &job.auth, keel_deadline_after_ns(5000000000), &link),
                   KEEL_OK);
  /* PULL_ROWS of row 0 (server 0's) at step 0, then garbage, then a bare header of an
   * unknown op. */
  uint64_t request[4] = {2 | ((uint64_t)1 << 32), 0, 0, 0};
  uint8_t garbage[40];
  memset(garbage, 0xA5, sizeof garbage);
  uint64_t unknown[2] = {77, 0};
  const struct {
    const void *payload;
    size_t length;
    keel_status expected;
  } cases[] = {
      {request, sizeof request, KEEL_EAGAIN},
      {garbage, sizeof garbage, KEEL_EPROTO},
      {unknown, sizeof unknown, KEEL_EPROTO},
      {request, sizeof request - 3, KEEL_EPROTO},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    keel_frame frame = {.type = KEEL_FRAME_EC_REQUEST, .tag = 100 + i};
    assert_int_equal(keel_link_send(link, &frame, cases[i].payload, cases[i].length,
                                    keel_deadline_after_ns(5000000000)),
                     KEEL_OK);
    keel_frame reply;
    void *payload = NULL;
    assert_int_equal(keel_link_recv(link, &reply, &payload, keel_deadline_after_ns(5000000000)),
                     KEEL_OK);
    assert_int_equal(reply.type, KEEL_FRAME_EC_REPLY);
    assert_int_equal(reply.tag, 100 + i);
    assert_true(reply.length >= 16);
    int32_t status;
    memcpy(&status, (const uint8_t *)payload + 4, sizeof status);
    assert_int_equal(status, cases[i].expected);
    free(payload);
  }
  keel_link_close(link);
  /* Still serving: a worker runs a whole job through it. */
  job.lose_at = -1;
  run_job(&job);
  check_job(&job, 0);
  job_stop(&job);
}

/* Real processes: `keel server` killed with SIGKILL between steps, RS with r = 2. */
static void test_kill_server_process(void **state) {
  (void)state;
  ec_job job;
  job_start(&job, 5, 3, 2, KEEL_EC_ADAM);
  processes_start(&job, keel_test_tempdir("keel-ec-servers"), NULL);
  job.lose_at = STEPS / 2;
  job.lose = 2;
  run_job(&job);
  check_job(&job, (uint64_t)1 << 2);
  job_stop(&job);
}

/* More servers lost than the parity covers: a pull of every row fails with KEEL_EDATALOST,
 * and the servers still up, which answered it so, stay live in the directory. Before, their
 * answer (KEEL_EIO) was taken for their own loss: a CI rehearsal's launcher then counted 4
 * servers dead of the 2 killed. */
static void test_data_lost_beyond_parity(void **state) {
  (void)state;
  ec_job job;
  job_start(&job, 4, 3, 1, KEEL_EC_ADAGRAD);
  servers_start(&job);
  keel_ec_client *client = NULL;
  assert_int_equal(
      keel_ec_client_open(job.stores[job.config.servers], &job.auth, 0, NULL, &client), KEEL_OK);
  server_lose(&job, 1);
  server_lose(&job, 2);
  uint64_t total = job.config.total_rows;
  uint64_t *rows = malloc(sizeof *rows * total);
  float *values = malloc(sizeof *values * total * (size_t)job.config.dim);
  assert_non_null(rows);
  assert_non_null(values);
  for (uint64_t row = 0; row < total; row++) rows[row] = row;
  assert_int_equal(keel_ec_client_pull_rows(client, rows, total, values), KEEL_EDATALOST);
  assert_int_equal(keel_ec_client_lost(client), (uint64_t)0x6);
  assert_string_equal(standing_read(&job, 0), "live");
  assert_string_equal(standing_read(&job, 3), "live");
  free(values);
  free(rows);
  keel_ec_client_close(client);
  job_stop(&job);
}

/* The benchmarks' baseline: the same training, no parity kept. */
static void test_without_parity(void **state) {
  (void)state;
  ec_job job;
  job_start(&job, 4, 3, 1, KEEL_EC_ADAGRAD);
  job.config.without_parity = true;
  servers_start(&job);
  job.lose_at = -1;
  run_job(&job);
  check_job(&job, 0);
  job_stop(&job);
}

static void test_lose_any_server_two_phase_commit(void **state) {
  (void)state;
  check_lose_each_server(5, 3, 2, KEEL_EC_MOMENTUM, true);
}

/* Whether some server's output has text. */
static bool servers_said(const ec_job *job, const char *text) {
  bool said = false;
  for (int i = 0; i < 2 * job->config.servers && !said; i++) {
    char path[640];
    snprintf(path, sizeof path, "%s/server-%d%s.txt", job->folder, i / 2,
             i % 2 ? "-replacement" : "");
    char *output = keel_test_read_file(path, NULL);
    said = output != NULL && strstr(output, text) != NULL;
    free(output);
  }
  return said;
}

/* Server 2 kills itself at a fault point in step 12 (KEEL_FAULT, `rule` names the point), and
 * every row still ends exact and every parity consistent. */
static void check_killed_at(const char *rule, bool two_phase_commit, const char *decided) {
  ec_job job;
  job_start(&job, 5, 3, 2, KEEL_EC_ADAM);
  job.config.two_phase_commit = two_phase_commit;
  char fault[128];
  snprintf(fault, sizeof fault, "kill@uid=2,step=%d,%s", STEPS / 2, rule);
  processes_start(&job, keel_test_tempdir("keel-ec-killed"), fault);
  job.lose_at = -1;
  run_job(&job);
  /* The server died of its own rule, not of anything this test sent. */
  int status = 0;
  assert_true(keel_test_wait(job.processes[2], 10000, &status));
  assert_true(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
  job.processes[2] = 0;
  check_job(&job, (uint64_t)1 << 2);
  if (decided != NULL) assert_true(servers_said(&job, decided));
  job_stop(&job);
}

/* Two-phase commit: the server dies inside an update, and its parity holders decide the
 * update together. */
static void test_killed_between_the_phases(void **state) {
  (void)state;
  check_killed_at("point=ec_prepared", true, NULL);
}

static void test_killed_during_the_commits(void **state) {
  (void)state;
  check_killed_at("point=ec_committing", true, NULL);
}

/* Finding 19: the server answers one worker's push of the step and dies before its answer to
 * the other goes out. That worker sends the server's rows again in a second phase, which the
 * first never sends; the holders see that the server had applied the step (its marks) and
 * answer at once instead of waiting for the first worker until the deadline. The servers'
 * logs show that this happened. */
#define VOID_SECOND_PHASE "is void: every server applied the step"

static void test_killed_between_its_answers(void **state) {
  (void)state;
  check_killed_at("point=ec_answered,after=1", true, VOID_SECOND_PHASE);
}

static void test_killed_between_its_answers_without_two_phase_commit(void **state) {
  (void)state;
  check_killed_at("point=ec_answered,after=1", false, VOID_SECOND_PHASE);
}

/* Waits for the server process that was to kill itself by its rule. */
static void server_killed_itself(ec_job *job, int server) {
  int status = 0;
  assert_true(keel_test_wait(job->processes[server], 10000, &status));
  assert_true(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
  job->processes[server] = 0;
}

/* With r = 2 (RS), server `lose` lost between steps 8 and 9, then the servers of `killed` kill
 * themselves at the points of their rules: the job ends with every row exact, and the
 * servers' logs show `said`. */
static void check_losses(const char *folder, int servers, int k, const char *rule, int lose,
                         uint64_t killed, const char *said) {
  ec_job job;
  job_start(&job, servers, k, 2, KEEL_EC_ADAM);
  job.config.two_phase_commit = true;
  processes_start(&job, keel_test_tempdir(folder), rule);
  job.lose_at = 8;
  job.lose = lose;
  run_job(&job);
  for (int i = 0; i < servers; i++)
    if (killed & (uint64_t)1 << i) server_killed_itself(&job, i);
  check_job(&job, killed | (uint64_t)1 << lose);
  assert_true(servers_said(&job, said));
  job_stop(&job);
}

/* Five servers, k = 3: server 3 lost between steps 8 and 9, then server 4 by its rule. */
static void check_second_loss(const char *folder, const char *rule, const char *said) {
  check_losses(folder, 5, 3, rule, 3, (uint64_t)1 << 4, said);
}

/* Finding 44: server 4 dies while another server reads its blocks to decode the rows of
 * server 3 for a worker. The reader reads again without it. It used to answer the worker
 * with the broken link's status, which the worker took for the reader's own loss: a healthy
 * server declared lost, three lost of r = 2, the job's data gone. Server 4 kills itself in
 * the first read it serves from step 14 on; the servers' logs show that a read went again. */
static void test_source_lost_while_read(void **state) {
  (void)state;
  check_second_loss("keel-ec-read", "kill@uid=4,step=14,point=ec_read", "reading again without it");
}

/* Finding 47: server 4 applies its second phase of step 12 (the rows it acts for), answers
 * one worker and dies before its answer to the other goes out. Only that worker pushes the
 * second phase again; the others' second rounds used to wait for the first worker, which had
 * gone on, until the deadline, and the job failed. Now every server has server 4's mark of
 * its second phase and answers the round at once (the servers' logs say so). */
#define VOID_SECOND_ROUND "applied its second phase"

static void test_killed_between_its_second_phase_answers(void **state) {
  (void)state;
  check_second_loss("keel-ec-second", "kill@uid=4,step=12,point=ec_answered_acting,after=1",
                    VOID_SECOND_ROUND);
}

/* Finding 48 (a soak at r = 2): six servers, k = 2, r = 2 (no group has three of servers 1, 3
 * and 5). Server 3 lost between steps 8 and 9, so every step has a second phase; in step 12
 * server 1 dies after it applied its own rows and marked them at every other server, before
 * any worker had its answer; then server 5 applies its second phase, answers one worker and
 * dies. Server 1 never had a second phase to mark, and the void rule of finding 47 counted
 * it as a server that might have answered nobody: the other worker's second round waited
 * until the deadline. The second round now names the servers its first one lost (server 5),
 * and only those count. */
static void test_lost_after_its_first_phase_then_another_in_the_second(void **state) {
  (void)state;
  check_losses("keel-ec-first-second", 6, 2,
               "kill@uid=1,step=12,point=ec_applied;"
               "kill@uid=5,step=12,point=ec_answered_acting,after=1",
               3, (uint64_t)1 << 1 | (uint64_t)1 << 5, VOID_SECOND_ROUND);
}

/* Finding 53 (the seventh soak, r = 2): server 3 lost between steps 8 and 9, so every step
 * has a second phase; in step 12 server 4 applies its own rows, answers one worker and dies
 * before its answer to the other goes out. The worker it answered pushed it the second phase,
 * lost it there and pushed that phase again; the other, which had lost it in the first phase,
 * had routed the second without it at once and went on, and every server waited for its
 * second round until the deadline (the job failed, as the soak did). Now the other counts the
 * server lost in the second phase too, and both push the second round: every row ends exact. */
static void test_answered_one_in_the_first_phase_with_another_lost(void **state) {
  (void)state;
  check_second_loss("keel-ec-first-answer", "kill@uid=4,step=12,point=ec_answered,after=1",
                    "routed step 12's second phase around different lost servers");
}

/* Finding 21: the server answers one worker's push of step 12 and stops; its replacement is
 * rebuilding when it is killed. The other worker's link breaks and its push goes again, to
 * the replacement, which used to keep it until the deadline while the first worker waited
 * for the second on the dense block. Now the replacement refuses it at once, and the worker
 * pushes the rows again in a second phase, which the marks make void. */
static void test_push_sent_again_to_a_replacement(void **state) {
  (void)state;
  ec_job job;
  job_start(&job, 5, 3, 2, KEEL_EC_ADAM);
  job.config.two_phase_commit = true;
  char fault[128];
  snprintf(fault, sizeof fault, "stop@uid=2,point=ec_answered,step=%d,after=1", STEPS / 2);
  processes_start(&job, keel_test_tempdir("keel-ec-resent"), fault);
  job.lose_at = -1;
  job.lose = 2;
  job.stopped_replace_at = STEPS / 2;
  run_job(&job);
  assert_true(servers_said(&job, VOID_SECOND_PHASE));
  standing_wait_past(&job, 2, "rebuilding");
  bool live = strcmp(standing_read(&job, 2), "live") == 0;
  check_job(&job, live ? 0u : 1u << 2);
  job_stop(&job);
}

/* Finding 54 (test_chaos_servers' seed 7 ended with another model once in a few dozen
 * runs; traced, the runs parted where a worker pulled server 3's rows as the seed made them):
 * a replacement serves none of its own rows before its rebuild is complete. Its view of the
 * directory said it was live until its rebuild read it back, and a worker whose pull to the
 * server it replaces broke sends the pull again to the new address. Here the directory says
 * server 2 is live again while its replacement rebuilds slowly, as that view did: a pull of
 * one of its rows is refused; the rebuild then ends, and every row is exact. */
static void test_replacement_serves_no_rows_before_its_rebuild(void **state) {
  (void)state;
  ec_job job;
  job_start(&job, 5, 3, 2, KEEL_EC_ADAM);
  job.config.two_phase_commit = true;
  job.config.rebuild_chunk_groups = 1;
  job.config.rebuild_pause_ms = 40; /* a group every 40 ms: seconds */
  servers_start(&job);
  job.lose_at = -1;
  run_job(&job); /* trained: no row is the seed's any more */
  server_lose(&job, 2);
  server_replace(&job, 2);
  assert_string_equal(standing_read(&job, 2), "rebuilding");
  assert_int_equal(keel_store_delete(job.stores[0], "ec/lost/2"), KEEL_OK);
  keel_ec_client *client = NULL;
  assert_int_equal(keel_ec_client_open(job.stores[job.config.servers], &job.auth, 0, NULL, &client),
                   KEEL_OK);
  uint64_t row = 6; /* group 2's first member: on server 2 */
  float values[8];
  keel_status pulled = keel_ec_client_pull_rows(client, &row, 1, values);
  keel_ec_client_close(client);
  /* Still rebuilding (or the case tested nothing), and marked so again. */
  assert_string_equal(standing_read(&job, 2), "live");
  assert_int_equal(keel_store_put(job.stores[0], "ec/lost/2", "rebuilding", 10, 0, NULL), KEEL_OK);
  assert_int_equal(pulled, KEEL_EAGAIN);
  standing_wait_past(&job, 2, "rebuilding");
  check_job(&job, strcmp(standing_read(&job, 2), "live") != 0 ? 1u << 2 : 0);
  job_stop(&job);
}

/* RS (5 servers, r = 2) with two-phase commit, `keel server` processes whose replacements
 * rebuild slowly (a group every 40 ms: seconds, so that a loss falls inside a rebuild). */
static void slow_rebuild_job_start(ec_job *job, const char *folder, const char *fault) {
  job_start(job, 5, 3, 2, KEEL_EC_ADAM);
  job->config.two_phase_commit = true;
  job->config.rebuild_chunk_groups = 1;
  job->config.rebuild_pause_ms = 40;
  processes_start(job, folder, fault);
}

/* A chaos run at r = 2: a replacement rebuilding read from a server just replaced in turn,
 * whose replacement took the call at its address and refused it, not serving yet; the
 * rebuild failed on that and its server stayed lost for good. Here server 4 is lost at step 4
 * and rebuilt slowly from step 6; at step 8 server 2 is stopped while the rebuild calls on
 * it, replaced, and killed. The rebuild reads that round again without server 2 (its log
 * says so); both replacements end their rebuilds, and every row ends exact. */
static void test_rebuild_read_refused_by_a_replacement(void **state) {
  (void)state;
  ec_job job;
  slow_rebuild_job_start(&job, keel_test_tempdir("keel-ec-refused-read"), NULL);
  job.lose_at = 4;
  job.lose = 4;
  job.replace_at = 6;
  job.second_lose_at = 8;
  job.second_lose = 2;
  job.second_stop_replace = true;
  run_job(&job);
  standing_wait_past(&job, 4, "rebuilding");
  standing_wait_past(&job, 2, "rebuilding");
  assert_true(servers_said(&job, "does not serve its blocks yet"));
  uint64_t lost = 0;
  for (int i = 2; i <= 4; i += 2)
    if (strcmp(standing_read(&job, i), "live") != 0) lost |= (uint64_t)1 << i;
  check_job(&job, lost);
  job_stop(&job);
}

/* Finding 50 (chaos at r = 2 ended with other rows): server 4 lost at step 8; in step 12
 * server 2 stops after its first parity holder committed its update and before the second
 * did, a replacement takes its place (marked rebuilding: server 2 is never declared lost)
 * and it is killed. Decoding server 2's rows needs both parities, and the update used to
 * stay prepared at the second for good, since only the updates of a lost server were
 * decided, each by a holder of it before it decoded. Now the updates of a server that no
 * longer serves are decided, by any server before it serves a read of its blocks too. */
static void test_committed_at_one_holder_then_replaced(void **state) {
  (void)state;
  ec_job job;
  slow_rebuild_job_start(&job, keel_test_tempdir("keel-ec-committed-replaced"),
                         "stop@uid=2,point=ec_committing,step=12");
  job.lose_at = 8;
  job.lose = 4;
  job.stopped = 2;
  job.stopped_replace_at = 12;
  run_job(&job);
  uint64_t lost = (uint64_t)1 << 4;
  if (strcmp(standing_read(&job, 2), "live") != 0) lost |= (uint64_t)1 << 2;
  check_job(&job, lost);
  job_stop(&job);
}

/* Finding 52 (chaos at r = 2 ended with other rows): server 4 stops in step 12 with its update
 * prepared at every parity holder and none committed; meanwhile server 3 is killed and
 * replaced (its replacement never saw the update), then server 4 is replaced and killed.
 * The holders decide the update: one that asked server 3's replacement found it "not
 * prepared" and aborted, others that had no group with parity on server 3 found every holder
 * prepared and committed, and the parities disagreed. Now an update is committed only when
 * some server committed it, whoever decides. */
static void test_prepared_everywhere_then_a_holder_replaced(void **state) {
  (void)state;
  ec_job job;
  slow_rebuild_job_start(&job, keel_test_tempdir("keel-ec-prepared-replaced"),
                         "stop@uid=4,point=ec_prepared,step=12");
  job.lose_at = -1;
  job.lose = 4;
  job.stopped_replace_at = 12;
  job.replaced_while_stopped = 3;
  run_job(&job);
  uint64_t lost = 0;
  for (int i = 3; i <= 4; i++)
    if (strcmp(standing_read(&job, i), "live") != 0) lost |= (uint64_t)1 << i;
  check_job(&job, lost);
  job_stop(&job);
}

/* The limits of the servers' configuration (asked of server 0), and *directory to reach them,
 * for a test that sends them requests itself. */
static void requests_prepare(ec_job *job, keel__ec_directory *directory, keel__ec_limits *limits) {
  keel__ec_directory_init(directory, job->stores[job->config.servers]);
  keel__ec_peer peer;
  keel__ec_peer_init(&peer, 0);
  keel__ec_config wire;
  assert_int_equal(
      keel__ec_peer_info(&peer, directory, &job->auth, &wire, keel_deadline_after_ns(10000000000)),
      KEEL_OK);
  assert_int_equal(keel__ec_config_limits(&wire, KEEL__EC_MAX_COUNT, limits), KEEL_OK);
  keel__ec_peer_destroy(&peer);
}

/* Five servers in process (k = 3, r = 2, two-phase commit) for a test that sends them requests
 * itself (requests_prepare). */
static void requests_job_start(ec_job *job, keel__ec_directory *directory,
                               keel__ec_limits *limits) {
  job_start(job, 5, 3, 2, KEEL_EC_SGD);
  job->config.two_phase_commit = true;
  servers_start(job);
  requests_prepare(job, directory, limits);
}

/* The id of origin's update of step in a synchronous job: origin << 48 | (step + 1) << 1,
 * and 1 for its second phase (acting). */
static uint64_t update_id(uint64_t origin, uint64_t step, bool acting) {
  return origin << 48 | (step + 1) << 1 | (acting ? 1u : 0u);
}

/* Server 4's update of step 5 prepared at the holder of group 2's parity member
 * parity_member (3: server 0, 4: server 1), changing the group's member 2 (server 4's row) by
 * delta. Group 2's member m is on server (2 + m) mod 5. */
static void prepare_of_server_4(ec_job *job, keel__ec_directory *directory, keel__ec_peer *peer,
                                const keel__ec_limits *limits, uint32_t parity_member,
                                const uint8_t *delta) {
  keel__ec_ref ref = {.group = 2, .member = 2, .other = parity_member};
  keel__ec_request prepare = {.op = KEEL__EC_OP_PARITY_PREPARE,
                              .count = 1,
                              .id = update_id(4, 5, false),
                              .refs = &ref,
                              .blocks = delta};
  assert_int_equal(keel__ec_peer_call(peer, directory, &job->auth, &prepare, limits, NULL,
                                      keel_deadline_after_ns(10000000000), NULL),
                   KEEL_OK);
}

/* Finding 58 (a chaos run at r = 2 ended with other rows): a server's first commit of its
 * update was still in a holder's socket when the server died; a decider asked that holder,
 * found the update prepared everywhere, and aborted it; then the holder read the late commit
 * and folded the update, and the parities disagreed. Here the test plays the dead origin
 * (server 4: an update of its row in group 2, prepared at both parity holders, servers 0 and
 * 1) and the decider (it asks server 0, then the origin's commit reaches server 0, then the
 * verdict goes to both). A holder that a decider asked takes the verdict only: both end
 * aborted and every parity block is the code of its rows. */
static void test_commit_late_after_a_decider_asked(void **state) {
  (void)state;
  ec_job job;
  keel__ec_directory directory;
  keel__ec_limits limits;
  requests_job_start(&job, &directory, &limits);
  keel__ec_peer peers[2];
  for (int i = 0; i < 2; i++) keel__ec_peer_init(&peers[i], i);
  int64_t deadline = keel_deadline_after_ns(10000000000);
  uint64_t id = update_id(4, 5, false);
  uint8_t *delta = malloc(limits.block_bytes);
  assert_non_null(delta);
  memset(delta, 0x5A, limits.block_bytes);
  for (int holder = 0; holder < 2; holder++)
    prepare_of_server_4(&job, &directory, &peers[holder], &limits, (uint32_t)(3 + holder), delta);
  keel__ec_request query = {
      .op = KEEL__EC_OP_PARITY_COMMIT, .flags = KEEL__EC_FLAG_QUERY, .id = id};
  assert_int_equal(
      keel__ec_peer_call(&peers[0], &directory, &job.auth, &query, &limits, NULL, deadline, NULL),
      KEEL_EAGAIN);
  keel__ec_request late_commit = {.op = KEEL__EC_OP_PARITY_COMMIT, .id = id};
  keel_status late = keel__ec_peer_call(&peers[0], &directory, &job.auth, &late_commit, &limits,
                                        NULL, deadline, NULL);
  keel__ec_request abort_verdict = {.op = KEEL__EC_OP_PARITY_COMMIT,
                                    .flags = KEEL__EC_FLAG_VERDICT | KEEL__EC_FLAG_ABORT,
                                    .id = id};
  keel_status verdicts[2], states[2];
  for (int holder = 0; holder < 2; holder++) {
    verdicts[holder] = keel__ec_peer_call(&peers[holder], &directory, &job.auth, &abort_verdict,
                                          &limits, NULL, deadline, NULL);
    states[holder] = keel__ec_peer_call(&peers[holder], &directory, &job.auth, &query, &limits,
                                        NULL, deadline, NULL);
  }
  /* Aborted at both: nothing of it left, and not remembered as committed (before the fix the
   * late commit was taken, server 0 answered "committed" and server 1 "nothing"). */
  if (states[0] != KEEL_ENOTFOUND || states[1] != KEEL_ENOTFOUND)
    fail_msg("the holders disagree on the update: server 0 %s, server 1 %s (the late commit: %s)",
             keel_status_name(states[0]), keel_status_name(states[1]), keel_status_name(late));
  assert_int_equal(late, KEEL_ECANCELED);
  assert_int_equal(verdicts[0], KEEL_OK);
  assert_int_equal(verdicts[1], KEEL_OK);
  free(delta);
  for (int i = 0; i < 2; i++) keel__ec_peer_destroy(&peers[i]);
  keel__ec_directory_destroy(&directory);
  /* No step ran: the rows are the seed's, and so must every parity block be. */
  keel_ec_client *client = NULL;
  assert_int_equal(keel_ec_client_open(job.stores[job.config.servers], &job.auth, 0, NULL, &client),
                   KEEL_OK);
  uint64_t inconsistent = UINT64_MAX;
  assert_int_equal(keel_ec_client_verify(client, &inconsistent), KEEL_OK);
  assert_int_equal(inconsistent, 0);
  keel_ec_client_close(client);
  job_stop(&job);
}

/* Whether in-process server holds worker's phase-2 push of step in a slot that waits for
 * the other workers' (white-box: the test reads the server's slots under its lock). */
static bool push_waiting(keel_ec_server *server, uint64_t step, uint32_t worker) {
  bool waiting = false;
  pthread_mutex_lock(&server->step_lock);
  for (step_slot *slot = server->steps; slot != NULL; slot = slot->next)
    waiting |= slot->acting && slot->step == step && !slot->applied &&
               slot->pushes[worker].payload != NULL;
  pthread_mutex_unlock(&server->step_lock);
  return waiting;
}

/* A phase-2 push of `step` by `worker` to server 0 over peer, started (round 0, or the second
 * round naming server 4), finished by the caller. */
static void acting_push_start(ec_job *job, keel__ec_directory *directory, keel__ec_peer *peer,
                              const keel__ec_limits *limits, uint64_t step, uint32_t worker,
                              bool again, keel__ec_pending *pending) {
  static const uint32_t lost_in_round_0[2] = {4, KEEL__EC_NO_SERVER};
  keel__ec_request push = {
      .op = KEEL__EC_OP_PUSH_ROWS,
      .flags = again ? KEEL__EC_FLAG_ACTING | KEEL__EC_FLAG_AGAIN : KEEL__EC_FLAG_ACTING,
      .id = step + 1,
      .step = step,
      .worker = worker,
      .workers = WORKERS,
      .again_lost = lost_in_round_0};
  assert_int_equal(keel__ec_peer_start(peer, directory, &job->auth, &push, limits,
                                       keel_deadline_after_ns(3000000000), pending),
                   KEEL_OK);
}

/* Finding 59 (a chaos run at r = 2; the job failed): server 4, acting in step 5's second
 * phase, died while it marked the other servers, its mark to server 0 still in flight. Both
 * workers pushed a second round naming it; worker 0's reached server 0 before the mark and
 * waited there for worker 1's, which came after the mark and was answered at once as void:
 * worker 0 waited until the deadline. The test plays the workers and server 4's mark; server
 * 0 answers worker 0's waiting round once the mark comes. */
static void test_second_round_before_the_mark(void **state) {
  (void)state;
  ec_job job;
  keel__ec_directory directory;
  keel__ec_limits limits;
  requests_job_start(&job, &directory, &limits);
  keel__ec_peer peers[WORKERS]; /* each worker's link to server 0 */
  keel__ec_pending pending[WORKERS];
  for (int w = 0; w < WORKERS; w++) keel__ec_peer_init(&peers[w], 0);
  int64_t deadline = keel_deadline_after_ns(10000000000);
  uint64_t step = 5;
  /* Round 0 of the second phase: both workers' pushes applied (no rows: only the round). */
  for (uint32_t w = 0; w < WORKERS; w++)
    acting_push_start(&job, &directory, &peers[w], &limits, step, w, false, &pending[w]);
  for (int w = 0; w < WORKERS; w++)
    assert_int_equal(keel__ec_peer_finish(&pending[w], &directory, &job.auth, NULL,
                                          keel_deadline_after_ns(3000000000)),
                     KEEL_OK);
  /* Worker 0's second round, held at server 0 until the mark comes. */
  acting_push_start(&job, &directory, &peers[0], &limits, step, 0, true, &pending[0]);
  int64_t give_up = keel_deadline_after_ns(2000000000);
  while (!push_waiting(job.servers[0], step, 0) && keel_now_ns() < give_up) usleep(1000);
  assert_true(push_waiting(job.servers[0], step, 0));
  /* Server 4's mark of its second phase of the step. */
  keel__ec_peer from_server_4;
  keel__ec_peer_init(&from_server_4, 0);
  keel__ec_request mark = {.op = KEEL__EC_OP_PARITY_PREPARE,
                           .flags = KEEL__EC_FLAG_APPLY_NOW,
                           .id = update_id(4, step, true)};
  assert_int_equal(keel__ec_peer_call(&from_server_4, &directory, &job.auth, &mark, &limits, NULL,
                                      deadline, NULL),
                   KEEL_OK);
  /* Worker 1's second round: void at once. */
  acting_push_start(&job, &directory, &peers[1], &limits, step, 1, true, &pending[1]);
  assert_int_equal(keel__ec_peer_finish(&pending[1], &directory, &job.auth, NULL,
                                        keel_deadline_after_ns(3000000000)),
                   KEEL_OK);
  /* Worker 0's too, by its 3 s deadline (before the fix: KEEL_ETIMEDOUT, the server's wait
   * lasting 60 s). */
  assert_int_equal(keel__ec_peer_finish(&pending[0], &directory, &job.auth, NULL,
                                        keel_deadline_after_ns(3000000000)),
                   KEEL_OK);
  keel__ec_peer_destroy(&from_server_4);
  for (int w = 0; w < WORKERS; w++) keel__ec_peer_destroy(&peers[w]);
  keel__ec_directory_destroy(&directory);
  job_stop(&job);
}

/* Finding 61 (the twelfth soak; the job failed): a holder decided an update whose origin, a
 * replacement back and serving, was committing it. The holder decoded a lost server's row by
 * a view of the servers older than the directory (the origin rebuilt, not yet back), took the
 * origin for lost and asked about its update, and the next holder then refused the origin's
 * commit (finding 58's rule): the step failed with KEEL_ECANCELED. Here server 0's view says
 * server 4 is rebuilt while the directory says it is live; server 4 (the test plays it) has an
 * update prepared at server 0 (a change of nothing, so that the parity stays the code of its
 * rows); a worker reads row 7 of server 3, lost, which server 0 decodes. Server 0 reads the
 * directory before it decides anything, leaves the update to its origin, and takes the
 * origin's commit. */
static void test_a_stale_view_decides_no_live_origin(void **state) {
  (void)state;
  ec_job job;
  keel__ec_directory directory;
  keel__ec_limits limits;
  requests_job_start(&job, &directory, &limits);
  keel_ec_server *holder = job.servers[0];
  keel_ec_location at;
  keel_ec_layout_locate_row(&holder->shard.layout, 7, &at);
  assert_int_equal(at.server, 3); /* group 2's member 1; the group's parity on servers 0 and 1 */
  assert_int_equal(keel__ec_directory_set_standing(&directory, 3, KEEL__EC_LOST), KEEL_OK);
  pthread_mutex_lock(&holder->lost_lock);
  holder->standing[3] = KEEL__EC_LOST;
  holder->standing[4] = KEEL__EC_REBUILT;
  pthread_mutex_unlock(&holder->lost_lock);

  keel__ec_peer peer;
  keel__ec_peer_init(&peer, 0);
  int64_t deadline = keel_deadline_after_ns(10000000000);
  /* Server 4's update of step 5, its parity member 3 on server 0. */
  uint64_t id = update_id(4, 5, false);
  uint8_t *delta = calloc(1, limits.block_bytes);
  assert_non_null(delta);
  prepare_of_server_4(&job, &directory, &peer, &limits, 3, delta);

  keel_ec_client *client = NULL;
  assert_int_equal(keel_ec_client_open(job.stores[job.config.servers], &job.auth, 0, NULL, &client),
                   KEEL_OK);
  uint64_t row = 7;
  float *values = malloc(sizeof *values * job.config.dim);
  assert_non_null(values);
  assert_int_equal(keel_ec_client_pull_rows(client, &row, 1, values), KEEL_OK);

  /* The origin's commit is taken (before the fix: KEEL_ENOTFOUND, decided away). */
  keel__ec_request commit = {.op = KEEL__EC_OP_PARITY_COMMIT, .id = id};
  assert_int_equal(
      keel__ec_peer_call(&peer, &directory, &job.auth, &commit, &limits, NULL, deadline, NULL),
      KEEL_OK);
  uint64_t inconsistent = UINT64_MAX;
  assert_int_equal(keel_ec_client_verify(client, &inconsistent), KEEL_OK);
  assert_int_equal(inconsistent, 0);
  keel_ec_client_close(client);
  free(values);
  free(delta);
  keel__ec_peer_destroy(&peer);
  keel__ec_directory_destroy(&directory);
  job_stop(&job);
}

/* A worker of test_dense_replica_replaced_between_its_calls: worker 0 opens its client and
 * initialises the dense block (links to both replicas open) before server 1 is replaced,
 * worker 1 after; then each pushes step 0 and pulls. */
typedef struct dense_worker {
  ec_job *job;
  int worker;
  pthread_barrier_t *ready, *go;
  keel_status status;
  float values[DENSE];
} dense_worker;

static void *dense_worker_main(void *argument) {
  dense_worker *self = argument;
  ec_job *job = self->job;
  keel_ec_client *client = NULL;
  float dense[DENSE];
  dense_initial(dense);
  for (int phase = 0; phase < 2; phase++) {
    if (phase == 1) {
      pthread_barrier_wait(self->ready);
      pthread_barrier_wait(self->go);
    }
    if (phase != self->worker) continue;
    self->status = keel_ec_client_open(job->stores[job->config.servers + self->worker], &job->auth,
                                       self->worker, NULL, &client);
    if (self->status == KEEL_OK) self->status = keel_ec_client_init_dense(client, dense);
  }
  step_dense(self->worker, 0, dense);
  if (self->status == KEEL_OK) self->status = keel_ec_client_push_dense(client, 0, dense);
  if (self->status == KEEL_OK) self->status = keel_ec_client_pull_dense(client, self->values);
  keel_ec_client_close(client);
  return NULL;
}

/* Finding 62 (a chaos run at r = 2; the job failed): a dense push reached server 0, and its
 * copy to server 1, the other replica, found the link broken; sent again to server 1's
 * replacement, not serving yet, it was refused (KEEL_EAGAIN), and the worker sent the whole
 * push again, to server 0, which took it for a new push of the step: it waited there for the
 * other worker, which had found server 1 lost and gone on. Here worker 0's link to server 1
 * leads to a server stopped since, whose replacement is rebuilt slowly; worker 1 opens its
 * client after the replacement marked itself rebuilding, so it sends server 1 nothing. Both
 * push step 0: before the fix worker 0's push waited at server 0 until its deadline; now both
 * end at once, the block updated once, as the reference's. */
static void test_dense_replica_replaced_between_its_calls(void **state) {
  (void)state;
  ec_job job;
  job_start(&job, 5, 3, 2, KEEL_EC_SGD);
  job.config.rebuild_chunk_groups = 1;
  job.config.two_phase_commit = true;
  job.config.rebuild_pause_ms = 1000; /* the replacement stays rebuilding through the step */
  servers_start(&job);
  pthread_barrier_t ready, go;
  pthread_barrier_init(&ready, NULL, WORKERS + 1);
  pthread_barrier_init(&go, NULL, WORKERS + 1);
  dense_worker workers[WORKERS];
  pthread_t threads[WORKERS];
  for (int w = 0; w < WORKERS; w++) {
    workers[w] = (dense_worker){.job = &job, .worker = w, .ready = &ready, .go = &go};
    assert_int_equal(pthread_create(&threads[w], NULL, dense_worker_main, &workers[w]), 0);
  }
  pthread_barrier_wait(&ready);
  server_lose(&job, 1);
  server_replace(&job, 1);
  standing_wait_past(&job, 1, "lost");
  assert_string_equal(standing_read(&job, 1), "rebuilding");
  pthread_barrier_wait(&go);
  for (int w = 0; w < WORKERS; w++) pthread_join(threads[w], NULL);
  pthread_barrier_destroy(&ready);
  pthread_barrier_destroy(&go);
  reference_step(&job, 0);
  for (int w = 0; w < WORKERS; w++) {
    assert_int_equal(workers[w].status, KEEL_OK);
    assert_memory_equal(workers[w].values, job.dense, sizeof workers[w].values);
  }
  job_stop(&job);
}

/* Server `lose` lost, then replaced while training goes on: the replacement rebuilds its rows,
 * parity blocks and replica of the dense block (servers 0 and 1), comes back at a step
 * boundary and serves them; every row ends exact and every parity block consistent, the
 * replaced server live again. In process, the replacement's dense block is checked itself,
 * whether or not the job ended before it served. */
static void check_replacement(int servers, int k, int r, bool processes, int lose) {
  ec_job job;
  job_start(&job, servers, k, r, KEEL_EC_ADAGRAD);
  job.config.two_phase_commit = true;
  job.lose_at = 4;
  job.lose = lose;
  job.replace_at = 6;
  if (processes)
    processes_start(&job, keel_test_tempdir("keel-ec-replace"), NULL);
  else
    servers_start(&job);
  run_job(&job);
  /* A loaded machine may end the job before the replacement is rebuilt and back (seen in a CI
   * rehearsal: lost mask 0x10): the rebuild must end; the client counts the server lost until
   * it is live again. */
  standing_wait_past(&job, job.lose, "lost");
  standing_wait_past(&job, job.lose, "rebuilding");
  bool live = strcmp(standing_read(&job, job.lose), "live") == 0;
  check_job(&job, live ? 0u : 1u << job.lose);
  if (!processes) {
    uint64_t bytes = 0;
    free(checkpoint_checked(&job, lose, &bytes));
  }
  job_stop(&job);
}

/* RS (r = 2): a server lost while the replacement of another is rebuilt, slowly (a group a
 * round, 40 ms between rounds: seconds, so that the rebuild spans many steps even of a loaded
 * sanitizer build; 4 groups at 20 ms were over within the two steps before the second loss
 * once rebuilds got fast). The rebuild reads around
 * the new loss and completes; rows, checksum and parity end exact, both servers still served
 * through the parity when the job ends before the replacement is moved back. */
static void test_server_lost_during_a_rebuild(void **state) {
  (void)state;
  ec_job job;
  job_start(&job, 5, 3, 2, KEEL_EC_ADAM);
  job.config.two_phase_commit = true;
  job.config.rebuild_chunk_groups = 1;
  job.config.rebuild_pause_ms = 40;
  job.lose_at = 4;
  job.lose = 4;
  job.replace_at = 6;
  job.second_lose_at = 8;
  job.second_lose = 2;
  servers_start(&job);
  run_job(&job);
  /* The job may end before the replacement is rebuilt, or after it is back (a slow machine,
   * a sanitizer): the client's view counts it lost until it is live again. */
  standing_wait_past(&job, 4, "rebuilding");
  bool live = strcmp(standing_read(&job, 4), "live") == 0;
  check_job(&job, (live ? 0u : 1u << 4) | (1u << 2));
  job_stop(&job);
}

static void test_replacement_rebuilt_in_process(void **state) {
  (void)state;
  check_replacement(4, 3, 1, false, 3);
}

static void test_replacement_process_after_kill(void **state) {
  (void)state;
  check_replacement(5, 3, 2, true, 4);
}

/* The holders of the dense block: server 0, whose loss sends the workers' dense pushes to
 * server 1 alone, which then sends its block after each step to the replacement; and server
 * 1, which server 0 sends it to. A `keel server --replace` of server 0 after SIGKILL too. */
static void test_dense_holder_replaced_in_process(void **state) {
  (void)state;
  check_replacement(4, 3, 1, false, 0);
  check_replacement(4, 3, 1, false, 1);
}

static void test_dense_holder_replaced_after_kill(void **state) {
  (void)state;
  check_replacement(5, 3, 2, true, 0);
}

/* Finding 63 (a hunt at r = 2 ended with other rows, parity consistent): servers 1 and 2 were
 * killed within a step; the holder that decoded a worker's pull of their rows read from server
 * 2, the link broke, and the read went again to the address server 2's replacement had just
 * published, before its rebuild started: it served its blocks as the seed made them, and the
 * worker trained on the rows decoded from them. Here server 2's replacement waits (a fault
 * rule) between marking itself rebuilding and starting its rebuild; a read of its blocks then
 * is refused, the rebuild ends, and every row is exact. */
static void test_replacement_serves_no_blocks_before_its_rebuild(void **state) {
  (void)state;
  /* Long enough for a `keel server` to start and mark itself under the sanitizers too. */
  const int wait_ms = 4000 * keel_test_slowdown();
  ec_job job;
  job_start(&job, 5, 3, 2, KEEL_EC_ADAM);
  job.config.two_phase_commit = true;
  processes_start(&job, keel_test_tempdir("keel-ec-early-read"), NULL);
  job.lose_at = -1;
  run_job(&job); /* trained: no block is the seed's any more */
  server_lose(&job, 2);
  snprintf(job.fault, sizeof job.fault, "delay@uid=2,point=ec_rebuild_begin,ms=%d", wait_ms);
  int64_t spawned = keel_now_ns();
  process_spawn(&job, 2, true);
  replacement_marked_wait(&job, 2);
  keel__ec_directory directory;
  keel__ec_limits limits;
  requests_prepare(&job, &directory, &limits);
  keel__ec_peer peer;
  keel__ec_peer_init(&peer, 2);
  keel__ec_ref ref = {.group = 2, .member = 0}; /* group 2's first row: server 2's */
  keel__ec_request read = {.op = KEEL__EC_OP_READ_BLOCKS, .count = 1, .refs = &ref};
  uint8_t *block = malloc(limits.block_bytes);
  assert_non_null(block);
  keel_status status = keel__ec_peer_call(&peer, &directory, &job.auth, &read, &limits, block,
                                          keel_deadline_after_ns(10000000000), NULL);
  /* Inside the wait, or the case tested nothing. */
  assert_true(keel_now_ns() - spawned < (int64_t)wait_ms * 1000000);
  assert_string_equal(standing_read(&job, 2), "rebuilding");
  assert_int_equal(status, KEEL_EAGAIN);
  free(block);
  keel__ec_peer_destroy(&peer);
  keel__ec_directory_destroy(&directory);
  /* The wait ends, then the rebuild. */
  int64_t waited_ms = (keel_now_ns() - spawned) / 1000000;
  if (waited_ms < wait_ms) poll(NULL, 0, (int)(wait_ms - waited_ms));
  standing_wait_past(&job, 2, "rebuilding");
  assert_true(servers_said(&job, "injected fault: delay at ec_rebuild_begin"));
  check_job(&job, strcmp(standing_read(&job, 2), "live") != 0 ? 1u << 2 : 0);
  job_stop(&job);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_no_failure),
      cmocka_unit_test(test_without_parity),
      cmocka_unit_test(test_data_lost_beyond_parity),
      cmocka_unit_test(test_lose_any_server_xor),
      cmocka_unit_test(test_lose_any_server_reed_solomon),
      cmocka_unit_test(test_bad_requests_refused),
      cmocka_unit_test(test_kill_server_process),
      cmocka_unit_test(test_lose_any_server_two_phase_commit),
      cmocka_unit_test(test_killed_between_the_phases),
      cmocka_unit_test(test_killed_during_the_commits),
      cmocka_unit_test(test_killed_between_its_answers),
      cmocka_unit_test(test_killed_between_its_answers_without_two_phase_commit),
      cmocka_unit_test(test_source_lost_while_read),
      cmocka_unit_test(test_killed_between_its_second_phase_answers),
      cmocka_unit_test(test_answered_one_in_the_first_phase_with_another_lost),
      cmocka_unit_test(test_lost_after_its_first_phase_then_another_in_the_second),
      cmocka_unit_test(test_push_sent_again_to_a_replacement),
      cmocka_unit_test(test_replacement_serves_no_rows_before_its_rebuild),
      cmocka_unit_test(test_replacement_rebuilt_in_process),
      cmocka_unit_test(test_replacement_process_after_kill),
      cmocka_unit_test(test_dense_holder_replaced_in_process),
      cmocka_unit_test(test_dense_holder_replaced_after_kill),
      cmocka_unit_test(test_server_lost_during_a_rebuild),
      cmocka_unit_test(test_rebuild_read_refused_by_a_replacement),
      cmocka_unit_test(test_committed_at_one_holder_then_replaced),
      cmocka_unit_test(test_prepared_everywhere_then_a_holder_replaced),
      cmocka_unit_test(test_commit_late_after_a_decider_asked),
      cmocka_unit_test(test_second_round_before_the_mark),
      cmocka_unit_test(test_a_stale_view_decides_no_live_origin),
      cmocka_unit_test(test_dense_replica_replaced_between_its_calls),
      cmocka_unit_test(test_replacement_serves_no_blocks_before_its_rebuild),
  };
  /* KEEL_TEST_FILTER=test_replacement* runs only the cases it names. */
  if (getenv("KEEL_TEST_FILTER") != NULL) cmocka_set_test_filter(getenv("KEEL_TEST_FILTER"));
  return keel_test_finish(cmocka_run_group_tests(tests, NULL, NULL));
}
