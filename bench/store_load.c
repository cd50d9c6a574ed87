/* Store load benchmark (issue 10): N simulated node agents on one store, each with a lease kept
 * alive every TTL/8 on a handle and thread of its own (as an agent's loop does) and a second
 * handle and thread doing its control-plane "steps"; ops/s and each request's latency p50/p99
 * for 4, 16 and 64 agents, on a one-member etcd (--unsafe-no-fsync) against the embedded store
 * (started in this process, as the launcher does), paced (a step every 100 ms, the session's
 * look interval: latency at that load), closed (steps back to back: what the store takes) and
 * bare (closed without the look, which on etcd bounds a step at its watch catch-up).
 * One step (mirroring src/runtime/session.c's look and tools/keel/run_agent.c, run_watch.c):
 *   look  keel_store_wait("", revision of the last step's listing, now): "did anything change?"
 *   job   list job/ (2 keys): job/stop, job/done, as after a change and in keel__session_check
 *   dead  list dead/ (12 keys): the same look, the peers to fail at once
 *   put   put node/<i> under the lease (its registration; stands for a step's one write)
 *   proc  list proc/ (2 keys per agent), every 10th step: the agent's proc/ watcher after a
 *         change, and its end check
 * and, on the other handle, keepalive of the lease (TTL 1 s, etcd's least) every TTL/8.
 * Usage: store_load [--json] [--agents 4,16,64] [--seconds S] [--mode paced,closed,bare|all]
 *                   [--etcd PATH] [--keep] */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench_etcd.h"
#include "bench_jobs.h"
#include "bench_stats.h"
#include "keel/keel.h"

#define MS_NS (1000 * 1000)
#define TTL_NS BENCH_SECOND_NS
#define KEEPALIVE_PERIOD_NS (TTL_NS / 8)
/* The agent's request bound on its lease's handle (run_agent.c: TTL/8); the step handle keeps
 * the client's default, as the watchers' handles do. */
#define KEEPALIVE_TIMEOUT_NS (TTL_NS / 8)
#define STEP_INTERVAL_NS (100 * MS_NS) /* paced: session.c's LOOK_INTERVAL_NS */
#define PROC_EVERY 10
#define DEAD_KEYS 12
#define MAX_AGENTS 256
#define MAX_COUNTS 8
#define CONNECT_LIMIT_NS (10 * BENCH_SECOND_NS)

/* ======================================================================== what is measured */

typedef enum op { OP_LOOK, OP_JOB, OP_DEAD, OP_PUT, OP_PROC, OP_KEEPALIVE, OP_COUNT } op;
static const char *const op_names[OP_COUNT] = {"look", "job", "dead", "put", "proc", "keepalive"};

typedef enum store_kind { STORE_EMBEDDED, STORE_ETCD, STORE_COUNT } store_kind;
static const char *const store_names[STORE_COUNT] = {"embedded", "etcd"};

/* paced: a step every 100 ms; closed: steps back to back; bare: back to back without the look,
 * whose latency on etcd would otherwise bound the rate (what the other requests can take). */
typedef enum mode { MODE_PACED, MODE_CLOSED, MODE_BARE, MODE_COUNT } mode;
static const char *const mode_names[MODE_COUNT] = {"paced", "closed", "bare"};

/* Latencies of one request type of one thread, in ms (grown as needed). */
typedef struct samples {
  float *ms;
  size_t count, capacity;
  uint64_t errors;
} samples;

static void samples_add(samples *s, int64_t elapsed_ns, keel_status status) {
  if (status != KEEL_OK) s->errors++;
  if (s->count == s->capacity) {
    size_t capacity = s->capacity ? 2 * s->capacity : 1024;
    float *grown = realloc(s->ms, capacity * sizeof *grown);
    if (grown == NULL) return;
    s->ms = grown;
    s->capacity = capacity;
  }
  s->ms[s->count++] = (float)((double)elapsed_ns / 1e6);
}

/* ======================================================================== one run */

typedef struct run_config {
  const char *endpoint;
  keel_auth auth; /* its job id names the run's namespace in etcd */
  int agents;
  int started; /* agents whose threads run */
  mode pace;
  atomic_int ready;             /* agents connected, with their keys put */
  atomic_int_fast64_t start_ns; /* 0 until every agent is ready */
  int64_t end_ns;
} run_config;

typedef struct agent {
  const run_config *config;
  int index;
  pthread_t step_thread, lease_thread;
  keel_store *steps_store, *lease_store;
  int64_t lease;
  atomic_bool lease_ok; /* the lease thread's keys are put (or it failed: see failed) */
  bool failed;
  uint64_t revision;
  uint64_t steps;
  samples step_ms;
  samples ops[OP_COUNT];
  int64_t max_keepalive_gap_ns; /* between keepalives the store confirmed */
  uint64_t leases_lost;         /* keepalives answered KEEL_ENOTFOUND (then granted anew) */
} agent;

static keel_status timed(samples *s, int64_t started_ns, keel_status status) {
  samples_add(s, keel_now_ns() - started_ns, status);
  return status;
}

/* The agent's registration under its lease: node/<i>, and its two workers' proc/ keys. */
static keel_status keys_put(agent *a) {
  char key[32], value[128];
  int length = snprintf(value, sizeof value, "pid=%d pgid=%d role=worker group=0 addr=127.0.0.1",
                        1000 + a->index, 1000 + a->index);
  snprintf(key, sizeof key, "node/%d", a->index);
  keel_status status = keel_store_put(a->lease_store, key, value, (size_t)length, a->lease, NULL);
  for (int worker = 0; worker < 2 && status == KEEL_OK; worker++) {
    int uid = 2 * a->index + worker;
    length = snprintf(value, sizeof value,
                      "pid=%d node=%d role=worker rank=%d epoch=0 addr=127.0.0.1:%d", 2000 + uid,
                      a->index, uid, 30000 + uid);
    snprintf(key, sizeof key, "proc/%d", uid);
    status = keel_store_put(a->lease_store, key, value, (size_t)length, a->lease, NULL);
  }
  return status;
}

static keel_status lease_take(agent *a) {
  keel_status status = keel_store_lease_grant(a->lease_store, TTL_NS, &a->lease);
  return status == KEEL_OK ? keys_put(a) : status;
}

static void wait_for_start(const run_config *config) {
  while (atomic_load(&config->start_ns) == 0) bench_sleep_ns(MS_NS);
}

static void keepalive_once(agent *a, int64_t *confirmed_ns) {
  int64_t started = keel_now_ns();
  keel_status status =
      timed(&a->ops[OP_KEEPALIVE], started, keel_store_lease_keepalive(a->lease_store, a->lease));
  if (status == KEEL_ENOTFOUND) {
    a->leases_lost++; /* an agent fences here; the simulation takes a lease anew */
    lease_take(a);
  }
  if (status != KEEL_OK) return;
  if (started - *confirmed_ns > a->max_keepalive_gap_ns)
    a->max_keepalive_gap_ns = started - *confirmed_ns;
  *confirmed_ns = started;
}

/* The agent's loop: a keepalive every TTL/8 until the run ends. */
static void *lease_main(void *argument) {
  agent *a = argument;
  a->failed = keel_store_set_timeout(a->lease_store, KEEPALIVE_TIMEOUT_NS) != KEEL_OK ||
              lease_take(a) != KEEL_OK;
  atomic_store(&a->lease_ok, true);
  wait_for_start(a->config);
  int64_t confirmed_ns = atomic_load(&a->config->start_ns);
  for (int64_t next = confirmed_ns; keel_now_ns() < a->config->end_ns;) {
    bench_sleep_ns(next - keel_now_ns() > 0 ? next - keel_now_ns() : 0);
    keepalive_once(a, &confirmed_ns);
    next = keel_now_ns() + KEEPALIVE_PERIOD_NS;
  }
  return NULL;
}

static void list_timed(agent *a, op which, const char *prefix, uint64_t *revision_p) {
  keel_store_entry *entries = NULL;
  size_t count = 0;
  int64_t started = keel_now_ns();
  timed(&a->ops[which], started,
        keel_store_list(a->steps_store, prefix, &entries, &count, revision_p));
  keel_store_entries_free(entries, count);
}

static void look_once(agent *a) {
  int64_t started = keel_now_ns();
  uint64_t changed_at = 0;
  keel_status looked = keel_store_wait(a->steps_store, "", a->revision, keel_now_ns(), &changed_at);
  /* KEEL_ETIMEDOUT: nothing changed, an answer like any other. */
  timed(&a->ops[OP_LOOK], started, looked == KEEL_ETIMEDOUT ? KEEL_OK : looked);
}

static void step_once(agent *a) {
  int64_t started = keel_now_ns();
  if (a->config->pace != MODE_BARE) look_once(a);
  list_timed(a, OP_JOB, "job/", NULL);
  list_timed(a, OP_DEAD, "dead/", &a->revision);
  char key[32], value[96];
  snprintf(key, sizeof key, "node/%d", a->index);
  int length = snprintf(value, sizeof value, "pid=%d pgid=%d role=worker group=0 step=%llu",
                        1000 + a->index, 1000 + a->index, (unsigned long long)a->steps);
  int64_t put_started = keel_now_ns();
  timed(&a->ops[OP_PUT], put_started,
        keel_store_put(a->steps_store, key, value, (size_t)length, a->lease, NULL));
  if (a->steps % PROC_EVERY == 0) list_timed(a, OP_PROC, "proc/", NULL);
  samples_add(&a->step_ms, keel_now_ns() - started, KEEL_OK);
  a->steps++;
}

/* Paced agents start spread over one interval, as processes started apart would look. */
static void *step_main(void *argument) {
  agent *a = argument;
  const run_config *config = a->config;
  wait_for_start(config);
  int64_t interval = config->pace == MODE_PACED ? STEP_INTERVAL_NS : 0;
  int64_t next = atomic_load(&config->start_ns) + interval * a->index / config->agents;
  while (keel_now_ns() < config->end_ns) {
    if (next > keel_now_ns()) bench_sleep_ns(next - keel_now_ns());
    if (keel_now_ns() >= config->end_ns) break;
    step_once(a);
    next += interval;
  }
  return NULL;
}

/* ======================================================================== setting a run up */

static keel_status agent_connect(agent *a) {
  keel_auth auth = a->config->auth;
  auth.local_id = (uint32_t)a->index;
  int64_t deadline = keel_now_ns() + CONNECT_LIMIT_NS;
  keel_status status = keel_store_connect(a->config->endpoint, &auth, deadline, &a->steps_store);
  if (status == KEEL_OK)
    status = keel_store_connect(a->config->endpoint, &auth, deadline, &a->lease_store);
  return status;
}

/* The keys every agent reads: job/ (2) and dead/ (DEAD_KEYS), as a job that lost some. */
static keel_status job_keys_put(const run_config *config) {
  keel_store *store = NULL;
  keel_status status =
      keel_store_connect(config->endpoint, &config->auth, keel_now_ns() + CONNECT_LIMIT_NS, &store);
  if (status == KEEL_OK) status = keel_store_put(store, "job/info", "world=6", 7, 0, NULL);
  if (status == KEEL_OK)
    status = keel_store_put(store, "job/token", "0123456789abcdef", 16, 0, NULL);
  for (int uid = 0; uid < DEAD_KEYS && status == KEEL_OK; uid++) {
    char key[32];
    snprintf(key, sizeof key, "dead/%d", 100000 + uid);
    status = keel_store_put(store, key, "status=SIGKILL", 14, 0, NULL);
  }
  keel_store_close(store);
  return status;
}

static bool agents_start(run_config *config, agent *agents) {
  for (int i = 0; i < config->agents; i++) {
    agents[i] = (agent){.config = config, .index = i};
    atomic_init(&agents[i].lease_ok, false);
    if (agent_connect(&agents[i]) != KEEL_OK) return false;
    if (pthread_create(&agents[i].lease_thread, NULL, lease_main, &agents[i]) != 0) return false;
    if (pthread_create(&agents[i].step_thread, NULL, step_main, &agents[i]) != 0) {
      agents[i].failed = true;
      config->end_ns = keel_now_ns();
      atomic_store(&config->start_ns, config->end_ns);
      pthread_join(agents[i].lease_thread, NULL);
      return false;
    }
    config->started = i + 1;
  }
  return true;
}

/* Every lease is granted and its keys put before the clock starts. */
static bool agents_ready(run_config *config, agent *agents, int64_t seconds) {
  bool failed = false;
  for (int i = 0; i < config->agents; i++) {
    while (!atomic_load(&agents[i].lease_ok)) bench_sleep_ns(MS_NS);
    failed |= agents[i].failed;
  }
  int64_t start = keel_now_ns() + 10 * MS_NS;
  config->end_ns = start + seconds * BENCH_SECOND_NS;
  atomic_store(&config->start_ns, start);
  return !failed;
}

static void agents_join(const run_config *config, agent *agents) {
  for (int i = 0; i < config->agents; i++) {
    if (i < config->started) {
      pthread_join(agents[i].step_thread, NULL);
      pthread_join(agents[i].lease_thread, NULL);
    }
    /* Once the steps are done too: their last put is under the lease. */
    if (agents[i].lease != 0) keel_store_lease_revoke(agents[i].lease_store, agents[i].lease);
    keel_store_close(agents[i].steps_store);
    keel_store_close(agents[i].lease_store);
  }
}

static void agents_free(const run_config *config, agent *agents) {
  for (int i = 0; i < config->agents; i++) {
    free(agents[i].step_ms.ms);
    for (int o = 0; o < OP_COUNT; o++) free(agents[i].ops[o].ms);
  }
}

/* ======================================================================== figures */

/* Nearest-rank percentile of sorted values (as bench/recovery.c). */
static double percentile(const float *sorted, size_t count, double p) {
  size_t rank = (size_t)ceil(p / 100.0 * (double)count);
  return sorted[rank < 1 ? 0 : rank - 1];
}

static int compare_floats(const void *left, const void *right) {
  float a = *(const float *)left, b = *(const float *)right;
  return (a > b) - (a < b);
}

typedef struct latency {
  uint64_t count, errors;
  double p50, p99;
} latency;

/* All agents' samples of one kind, pooled; offset picks it out of struct agent. */
static latency latency_of(const agent *agents, int count, size_t offset) {
  latency l = {0, 0, NAN, NAN};
  for (int i = 0; i < count; i++) {
    const samples *s = (const samples *)((const char *)&agents[i] + offset);
    l.count += s->count;
    l.errors += s->errors;
  }
  float *pooled = l.count ? malloc(l.count * sizeof *pooled) : NULL;
  if (pooled == NULL) return l;
  size_t used = 0;
  for (int i = 0; i < count; i++) {
    const samples *s = (const samples *)((const char *)&agents[i] + offset);
    memcpy(pooled + used, s->ms, s->count * sizeof *pooled);
    used += s->count;
  }
  qsort(pooled, used, sizeof *pooled, compare_floats);
  l.p50 = percentile(pooled, used, 50);
  l.p99 = percentile(pooled, used, 99);
  free(pooled);
  return l;
}

typedef struct result {
  bool done;
  double seconds;
  double steps_per_s, ops_per_s;
  latency step;
  latency ops[OP_COUNT];
  double max_keepalive_gap_ms;
  uint64_t leases_lost;
  uint64_t keepalive_failures; /* past TTL/8 (the agent's bound) or refused */
  uint64_t errors;             /* failed requests of the steps */
} result;

static void result_fill(result *r, const agent *agents, int count, double seconds) {
  *r = (result){.done = true, .seconds = seconds};
  uint64_t steps = 0, ops = 0;
  for (int i = 0; i < count; i++) {
    steps += agents[i].steps;
    r->leases_lost += agents[i].leases_lost;
    double gap_ms = (double)agents[i].max_keepalive_gap_ns / 1e6;
    if (gap_ms > r->max_keepalive_gap_ms) r->max_keepalive_gap_ms = gap_ms;
  }
  r->step = latency_of(agents, count, offsetof(agent, step_ms));
  for (int o = 0; o < OP_COUNT; o++) {
    r->ops[o] = latency_of(agents, count, offsetof(agent, ops) + (size_t)o * sizeof(samples));
    ops += r->ops[o].count;
    if (o == OP_KEEPALIVE)
      r->keepalive_failures = r->ops[o].errors;
    else
      r->errors += r->ops[o].errors;
  }
  r->steps_per_s = (double)steps / seconds;
  r->ops_per_s = (double)ops / seconds;
}

/* One run: agents on the store at endpoint, as members of the job auth names, for seconds;
 * false if it could not be set up. */
static bool run_once(const char *endpoint, const keel_auth *auth, int agent_count, mode pace,
                     int64_t seconds, result *r) {
  static agent agents[MAX_AGENTS];
  static run_config config;
  config = (run_config){.endpoint = endpoint, .auth = *auth, .agents = agent_count, .pace = pace};
  if (job_keys_put(&config) != KEEL_OK) return false;
  bool started = agents_start(&config, agents);
  /* Threads that started must end: a failed start still sets the clock, to a run of 0 s. */
  bool ready = started && agents_ready(&config, agents, seconds);
  if (!started) {
    config.end_ns = keel_now_ns();
    atomic_store(&config.start_ns, config.end_ns);
  }
  agents_join(&config, agents);
  if (ready) result_fill(r, agents, agent_count, (double)seconds);
  agents_free(&config, agents);
  return ready;
}

/* ======================================================================== output */

typedef struct options {
  bool json, keep;
  int counts[MAX_COUNTS];
  int count_total;
  int64_t seconds;
  bool modes[MODE_COUNT];
  const char *etcd_path;
} options;

static double ratio(double etcd, double embedded) {
  return embedded > 0 && !isnan(etcd) ? etcd / embedded : NAN;
}

static void cell(double value, int width, int decimals) {
  if (isnan(value))
    printf(" %*s", width, "-");
  else
    printf(" %*.*f", width, decimals, value);
}

static void throughput_header(void) {
  printf(
      "store load: N simulated agents, each a lease (TTL 1 s, keepalive every 125 ms on its own "
      "handle) and steps of: look (wait \"\" since the last listing, deadline now), list job/, "
      "list dead/ (12 keys), put node/<i> (leased), list proc/ (2N keys) every 10th step; "
      "paced: a step every 100 ms per agent; closed: back to back; bare: back to back without the "
      "look. ka gap: the longest between confirmed keepalives (an agent fences at 625 ms); ka "
      "fail: keepalives past 125 ms; x emb: etcd / embedded, same N and mode\n");
  printf("%-9s %-7s %6s %10s %10s %9s %9s %8s %7s %7s %6s %9s %9s\n", "store", "mode", "agents",
         "steps/s", "ops/s", "step p50", "step p99", "ka gap", "ka fail", "lost", "errors",
         "ops x emb", "step x emb");
}

static void throughput_row(store_kind store, mode pace, int agents, const result *r,
                           const result *embedded) {
  printf("%-9s %-7s %6d", store_names[store], mode_names[pace], agents);
  cell(r->steps_per_s, 10, 1);
  cell(r->ops_per_s, 10, 1);
  cell(r->step.p50, 9, 2);
  cell(r->step.p99, 9, 2);
  cell(r->max_keepalive_gap_ms, 8, 1);
  printf(" %7llu %7llu %6llu", (unsigned long long)r->keepalive_failures,
         (unsigned long long)r->leases_lost, (unsigned long long)r->errors);
  bool peer = store == STORE_ETCD && embedded->done;
  cell(peer ? ratio(r->ops_per_s, embedded->ops_per_s) : NAN, 9, 2);
  cell(peer ? ratio(r->step.p50, embedded->step.p50) : NAN, 9, 2);
  printf("\n");
}

static void latency_header(void) {
  printf("\nlatency of each request, ms, p50 / p99 (all agents pooled)\n");
  printf("%-9s %-7s %6s", "store", "mode", "agents");
  for (int o = 0; o < OP_COUNT; o++) printf(" %17s", op_names[o]);
  printf("\n");
}

static void latency_row(store_kind store, mode pace, int agents, const result *r) {
  printf("%-9s %-7s %6d", store_names[store], mode_names[pace], agents);
  for (int o = 0; o < OP_COUNT; o++) {
    char text[32];
    snprintf(text, sizeof text, "%.2f / %.2f", r->ops[o].p50, r->ops[o].p99);
    printf(" %17s", r->ops[o].count ? text : "-");
  }
  printf("\n");
}

static void json_row(store_kind store, mode pace, int agents, const result *r) {
  printf(
      "{\"bench\":\"store_load\",\"impl\":\"%s\",\"mode\":\"%s\",\"agents\":%d,"
      "\"seconds\":%.0f,\"steps_per_s\":%.1f,\"ops_per_s\":%.1f,\"step_p50_ms\":%.3f,"
      "\"step_p99_ms\":%.3f,\"max_keepalive_gap_ms\":%.1f,\"keepalive_failures\":%llu,"
      "\"leases_lost\":%llu,\"errors\":%llu",
      store_names[store], mode_names[pace], agents, r->seconds, r->steps_per_s, r->ops_per_s,
      r->step.p50, r->step.p99, r->max_keepalive_gap_ms, (unsigned long long)r->keepalive_failures,
      (unsigned long long)r->leases_lost, (unsigned long long)r->errors);
  for (int o = 0; o < OP_COUNT; o++) {
    if (r->ops[o].count == 0) continue;
    printf(",\"%s_p50_ms\":%.3f,\"%s_p99_ms\":%.3f,\"%s_count\":%llu,\"%s_errors\":%llu",
           op_names[o], r->ops[o].p50, op_names[o], r->ops[o].p99, op_names[o],
           (unsigned long long)r->ops[o].count, op_names[o], (unsigned long long)r->ops[o].errors);
  }
  printf("}\n");
}

/* ======================================================================== the driver */

static bool counts_parse(const char *text, options *opts) {
  char copy[256];
  snprintf(copy, sizeof copy, "%s", text);
  opts->count_total = 0;
  char *save = NULL;
  for (char *item = strtok_r(copy, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
    int64_t count;
    if (opts->count_total == MAX_COUNTS || keel_parse_int(item, 1, MAX_AGENTS, &count) != KEEL_OK)
      return false;
    opts->counts[opts->count_total++] = (int)count;
  }
  return opts->count_total > 0;
}

/* --mode a,b: those modes ("all": every one); false if a name is unknown. */
static bool modes_parse(const char *text, bool *modes) {
  bool all = strcmp(text, "all") == 0;
  for (int m = 0; m < MODE_COUNT; m++) modes[m] = all;
  if (all) return true;
  char copy[64];
  snprintf(copy, sizeof copy, "%s", text);
  char *save = NULL;
  for (char *name = strtok_r(copy, ",", &save); name; name = strtok_r(NULL, ",", &save)) {
    bool known = false;
    for (int m = 0; m < MODE_COUNT; m++) {
      if (strcmp(name, mode_names[m]) == 0) modes[m] = known = true;
    }
    if (!known) return false;
  }
  return true;
}

static int parse_options(int argc, char **argv, options *opts) {
  *opts =
      (options){.counts = {4, 16, 64}, .count_total = 3, .seconds = 5, .modes = {true, true, true}};
  static const struct option long_options[] = {{"json", no_argument, 0, 'j'},
                                               {"keep", no_argument, 0, 'k'},
                                               {"agents", required_argument, 0, 'a'},
                                               {"seconds", required_argument, 0, 's'},
                                               {"mode", required_argument, 0, 'm'},
                                               {"etcd", required_argument, 0, 'E'},
                                               {0, 0, 0, 0}};
  int option;
  while ((option = getopt_long(argc, argv, "", long_options, NULL)) != -1) {
    bool ok = option != '?';
    if (option == 'j') opts->json = true;
    if (option == 'k') opts->keep = true;
    if (option == 'E') opts->etcd_path = optarg;
    if (option == 'a') ok = counts_parse(optarg, opts);
    if (option == 's') ok = keel_parse_int(optarg, 1, 600, &opts->seconds) == KEEL_OK;
    if (option == 'm') ok = modes_parse(optarg, opts->modes);
    if (!ok) {
      fprintf(stderr, "store_load: bad flag (see the file's header)\n");
      return -1;
    }
  }
  return 0;
}

typedef struct driver {
  const options *opts;
  char directory[PATH_MAX];
  bench_etcd etcd;
  bool etcd_running;
  result results[STORE_COUNT][MODE_COUNT][MAX_COUNTS];
} driver;

/* One embedded store per run, so that no run sees another's keys or leases. */
static bool run_embedded(int count, mode pace, int64_t seconds, result *r) {
  keel_auth auth;
  keel_store_server *server = NULL;
  if (keel_auth_generate(&auth) != KEEL_OK ||
      keel_store_server_start("127.0.0.1:0", &auth, &server) != KEEL_OK)
    return false;
  bool done = run_once(keel_store_server_address(server), &auth, count, pace, seconds, r);
  keel_store_server_stop(server);
  return done;
}

/* etcd: a job id of its own per run, a namespace of its own (the token is not used: etcd's
 * TLS guards a real cluster). */
static bool run_etcd(const driver *d, uint64_t job_id, int count, mode pace, result *r) {
  keel_auth auth = {.job_id = job_id};
  return run_once(d->etcd.endpoint, &auth, count, pace, d->opts->seconds, r);
}

/* The runs in turn: for each mode and count, the embedded store, then etcd. */
static void runs_all(driver *d) {
  uint64_t job_id = (uint64_t)getpid() << 16;
  for (int pace = 0; pace < MODE_COUNT; pace++) {
    if (!d->opts->modes[pace]) continue;
    for (int c = 0; c < d->opts->count_total; c++) {
      int count = d->opts->counts[c];
      if (!run_embedded(count, (mode)pace, d->opts->seconds, &d->results[STORE_EMBEDDED][pace][c]))
        fprintf(stderr, "store_load: the embedded run with %d agents failed\n", count);
      if (d->etcd_running &&
          !run_etcd(d, ++job_id, count, (mode)pace, &d->results[STORE_ETCD][pace][c]))
        fprintf(stderr, "store_load: the etcd run with %d agents failed\n", count);
    }
  }
}

typedef enum table { TABLE_THROUGHPUT, TABLE_LATENCY, TABLE_JSON } table;

static void rows_print(const driver *d, table which) {
  const options *opts = d->opts;
  for (int pace = 0; pace < MODE_COUNT; pace++) {
    for (int c = 0; c < opts->count_total && opts->modes[pace]; c++) {
      for (int store = 0; store < STORE_COUNT; store++) {
        const result *r = &d->results[store][pace][c];
        if (!r->done) continue;
        if (which == TABLE_THROUGHPUT)
          throughput_row((store_kind)store, (mode)pace, opts->counts[c], r,
                         &d->results[STORE_EMBEDDED][pace][c]);
        if (which == TABLE_LATENCY) latency_row((store_kind)store, (mode)pace, opts->counts[c], r);
        if (which == TABLE_JSON) json_row((store_kind)store, (mode)pace, opts->counts[c], r);
      }
    }
  }
}

/* The tables, then their rows as JSON lines (--json: those alone). */
static void results_print(const driver *d) {
  if (!d->opts->json) {
    throughput_header();
    rows_print(d, TABLE_THROUGHPUT);
    latency_header();
    rows_print(d, TABLE_LATENCY);
    printf("\n");
  }
  rows_print(d, TABLE_JSON);
}

static void etcd_start(driver *d) {
  char why[PATH_MAX + 64] = "no etcd program (install etcd-server, or pass --etcd)";
  if (bench_etcd_find(d->opts->etcd_path, d->etcd.program, sizeof d->etcd.program) &&
      bench_make_directory("store-load", d->directory, sizeof d->directory))
    d->etcd_running = bench_etcd_start(&d->etcd, d->directory, why, sizeof why);
  if (!d->etcd_running) fprintf(stderr, "store_load: etcd skipped: %s\n", why);
}

int main(int argc, char **argv) {
  static driver d;
  options opts;
  if (parse_options(argc, argv, &opts) != 0) return 2;
  d.opts = &opts;
  etcd_start(&d);
  runs_all(&d);
  if (d.etcd_running) {
    bench_etcd_stop(&d.etcd);
    if (rmdir(d.directory) != 0) fprintf(stderr, "store_load: files are left in %s\n", d.directory);
  }
  results_print(&d);
  return 0;
}
