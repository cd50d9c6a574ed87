/* The process's session with the job: its store handles, the lease that is its heartbeat,
 * and one background thread that keeps the lease alive, watches the launcher's liveness
 * (its status socket hangs up, or the parent changes), follows the job's keys (job/stop,
 * job/done, join/) and writes the failure detector's observations. The thread never ends or
 * signals the process: it sets flags, which every wait of the endpoint reads, and wakes the
 * endpoint so that a wait in progress sees them at once. A store that does not answer is
 * reported and retried (the client reconnects), never taken for the process's own death. */
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "runtime/runtime_internal.h"

#define MODULE "session"
#define SECOND_NS ((int64_t)1000000000)
/* How long the thread sleeps between looks at the job's keys (a hang-up or a stop request
 * wakes it sooner). */
#define LOOK_INTERVAL_NS (100 * (int64_t)1000000)
#define STORE_BREAK_LOOK_MS 100

struct keel__session {
  const keel__config *config;
  keel__detector *detector;
  keel__events *events;
  keel_store *store;      /* the training thread's */
  keel_store *background; /* the thread's own: keepalive and watching */
  int64_t lease;
  int rank;                      /* as last published: left/ says it, so that an agent can
                                    tell a job whose ranks finished from one that lost them */
  int launcher_pid;              /* KEEL_LAUNCHER_PID; 0: not started by a launcher */
  pthread_mutex_t endpoint_lock; /* the thread wakes the endpoint; close detaches it */
  keel_endpoint *endpoint;
  pthread_t thread;
  bool thread_started;
  int stop_fd;
  atomic_bool stopping;
  /* What the thread found; read by anyone. */
  atomic_int interruption; /* a keel_status: KEEL_OK or why every wait must end */
  atomic_int joiners;
  atomic_bool spares_wanted;      /* keel__session_want_spares */
  atomic_int spares;              /* idle spares at the last look, while wanted */
  atomic_bool spares_stale;       /* wanted since the last look: count them, change or none */
  _Atomic int64_t sections_until; /* keel__sections_until at the last look */
  _Atomic(keel_fault_plan *) faults;
  /* The thread's own bookkeeping. */
  uint64_t watched_revision;
  int64_t send_delay_ns; /* inject/delay/<node>, as last applied */
  bool unreachable;
  int64_t unreachable_since_ns;
};

static int64_t keepalive_period(const keel__config *config) {
  int64_t period = config->heartbeat_ns / 3;
  return period < 50 * (int64_t)1000000 ? 50 * (int64_t)1000000 : period;
}

keel_status keel__session_open(const keel__config *config, keel__detector *detector,
                               keel__session **session_p) {
  keel__session *session = calloc(1, sizeof *session);
  if (session == NULL) return KEEL_ENOMEM;
  session->config = config;
  session->detector = detector;
  session->stop_fd = -1;
  session->rank = -1;
  atomic_init(&session->stopping, false);
  atomic_init(&session->interruption, KEEL_OK);
  atomic_init(&session->joiners, 0);
  atomic_init(&session->spares_wanted, false);
  atomic_init(&session->spares, 0);
  atomic_init(&session->spares_stale, false);
  pthread_mutex_init(&session->endpoint_lock, NULL);
  int64_t pid = 0;
  keel_env_int("KEEL_LAUNCHER_PID", 0, INT32_MAX, &pid);
  session->launcher_pid = (int)pid;
  int64_t deadline = keel_deadline_after_ns(60 * SECOND_NS);
  keel_status status =
      keel_store_connect(config->store_endpoint, &config->auth, deadline, &session->store);
  if (status == KEEL_OK)
    status =
        keel_store_connect(config->store_endpoint, &config->auth, deadline, &session->background);
  /* The thread's requests must not outlast a keepalive period: a store that stalls is
   * retried on the next beat, not waited for. */
  if (status == KEEL_OK)
    status = keel_store_set_timeout(session->background, keepalive_period(config));
  if (status == KEEL_OK)
    status = keel_store_lease_grant(session->store, config->heartbeat_ns, &session->lease);
  if (status != KEEL_OK) {
    KEEL_LOG_E(MODULE, "cannot open a session with the store at %s: %s", config->store_endpoint,
               keel_strerror(status));
    keel__session_close(session, false);
    return status;
  }
  *session_p = session;
  return KEEL_OK;
}

keel_store *keel__session_store(keel__session *session) { return session->store; }
int64_t keel__session_lease(const keel__session *session) { return session->lease; }
int keel__session_launcher_pid(const keel__session *session) { return session->launcher_pid; }

keel_status keel__session_interrupted(const keel__session *session) {
  return session == NULL ? KEEL_OK : (keel_status)atomic_load(&session->interruption);
}

int keel__session_joiners_waiting(const keel__session *session) {
  return session == NULL ? 0 : atomic_load(&session->joiners);
}

void keel__session_want_spares(keel__session *session, bool wanted) {
  if (session != NULL && atomic_exchange(&session->spares_wanted, wanted) != wanted && wanted)
    atomic_store(&session->spares_stale, true);
}

int keel__session_spares_waiting(const keel__session *session) {
  return session == NULL || !atomic_load(&session->spares_wanted) ? 0
                                                                  : atomic_load(&session->spares);
}

int64_t keel__session_sections_until(const keel__session *session) {
  return session == NULL ? 0 : atomic_load(&session->sections_until);
}

void keel__session_set_faults(keel__session *session, keel_fault_plan *faults) {
  if (session != NULL) atomic_store(&session->faults, faults);
}

/* Sets the first interruption (the earliest cause stays) and wakes whoever waits. */
static void interrupt(keel__session *session, keel_status status) {
  int expected = KEEL_OK;
  if (!atomic_compare_exchange_strong(&session->interruption, &expected, status)) return;
  pthread_mutex_lock(&session->endpoint_lock);
  keel_endpoint_wake(session->endpoint);
  pthread_mutex_unlock(&session->endpoint_lock);
}

void keel__session_detach(keel__session *session) {
  if (session == NULL) return;
  pthread_mutex_lock(&session->endpoint_lock);
  session->endpoint = NULL;
  pthread_mutex_unlock(&session->endpoint_lock);
}

/* ---- the thread */

static void report(keel__session *session, const char *event, const char *fields) {
  keel__events_line(session->events, session->config->uid, -1, 0, event, fields);
}

static void keepalive(keel__session *session) {
  keel_status status = keel_store_lease_keepalive(session->background, session->lease);
  if (status == KEEL_ENOTFOUND) {
    /* The lease lapsed (this process was stopped or starved): the job has declared it
     * dead and fences it; going on would split the job's view of its members. */
    KEEL_LOG_E(MODULE, "the lease expired: the job declared this process dead");
    interrupt(session, KEEL_EEXCLUDED);
    return;
  }
  char fields[160];
  if (status != KEEL_OK && !session->unreachable) {
    session->unreachable = true;
    session->unreachable_since_ns = keel_now_ns();
    KEEL_LOG_W(MODULE, "the store does not answer (%s): retrying", keel_strerror(status));
    snprintf(fields, sizeof fields, "\"status\":\"%s\"", keel_status_name(status));
    report(session, "store_unreachable", fields);
  } else if (status == KEEL_OK && session->unreachable) {
    session->unreachable = false;
    double outage_ms = (double)(keel_now_ns() - session->unreachable_since_ns) / 1e6;
    KEEL_LOG_I(MODULE, "the store answers again after %.0f ms", outage_ms);
    snprintf(fields, sizeof fields, "\"outage_ms\":%.1f,\"reconnects\":%" PRIu64, outage_ms,
             keel_store_reconnects(session->background));
    report(session, "store_reachable", fields);
  }
}

/* job/stop and job/done in entries: the interruption they mean. */
static void job_keys_note(keel__session *session, const keel_store_entry *entries, size_t count) {
  for (size_t i = 0; i < count; i++) {
    if (strcmp(entries[i].key, "job/stop") == 0) interrupt(session, KEEL_ESTOPPED);
    if (strcmp(entries[i].key, "job/done") == 0) interrupt(session, KEEL_EJOBDONE);
  }
}

/* The launcher is gone when its end of the status socket hangs up: the kernel closes it
 * when the launcher dies, however it dies, and no other process holds it. Without a status
 * socket, when its pid is no more. (Not the parent's pid: a wrapper such as a shell may sit
 * between the launcher and this process.) */
static bool launcher_gone(const keel__session *session, short status_events) {
  if (status_events & (POLLHUP | POLLERR)) return true;
  if (session->config->status_fd >= 0 || session->launcher_pid <= 1) return false;
  return kill(session->launcher_pid, 0) != 0 && errno == ESRCH;
}

/* The same look, now, from the caller's thread: the session thread may be blocked in a
 * store call to the launcher that just died, and a caller whose own store call failed must
 * learn why before it reports the failure. */
static bool launcher_gone_now(const keel__session *session, int wait_ms) {
  if (session->config->status_fd < 0) return launcher_gone(session, 0);
  struct pollfd poller = {.fd = session->config->status_fd, .events = 0};
  if (poll(&poller, 1, wait_ms) < 0) return false;
  return launcher_gone(session, poller.revents);
}

keel_status keel__session_check(keel__session *session, keel_status failure) {
  /* A dying launcher closes the store's links and the status socket one after the other:
   * after a broken store link, give the hang-up a moment to arrive. */
  bool store_broke = failure == KEEL_ECLOSED || failure == KEEL_ETIMEDOUT;
  if (launcher_gone_now(session, store_broke ? STORE_BREAK_LOOK_MS : 0))
    interrupt(session, KEEL_EORPHANED);
  if (keel__session_interrupted(session) == KEEL_EORPHANED) return KEEL_EORPHANED;
  keel_store_entry *entries = NULL;
  size_t count = 0;
  if (keel_store_list(session->store, "job/", &entries, &count, NULL) == KEEL_OK) {
    job_keys_note(session, entries, count);
    keel_store_entries_free(entries, count);
  }
  return keel__session_interrupted(session);
}

/* dead/<uid> whose status is not a clean exit: the endpoint fails such a peer at once. A
 * partitioned node's processes break no link, so without this an operation that waits on
 * them would wait out its deadline; the verdict itself (who is dead) stays the detector's. */
static void dead_keys_note(keel__session *session, const keel_store_entry *entries, size_t count) {
  pthread_mutex_lock(&session->endpoint_lock);
  for (size_t i = 0; i < count && session->endpoint != NULL; i++) {
    if (strcmp((const char *)entries[i].value, "status=0") == 0) continue;
    int64_t uid;
    if (keel_parse_int(entries[i].key + strlen("dead/"), 0, UINT32_MAX, &uid) != KEEL_OK) continue;
    if ((uint32_t)uid == session->config->uid) continue;
    keel_endpoint_declare_dead(session->endpoint, (uint32_t)uid);
  }
  pthread_mutex_unlock(&session->endpoint_lock);
}

/* inject/delay/<node> (`keel inject delay NODE 20ms`): this node's frames go out that much
 * later, emulating a slow link (no netem on this kernel); a missing key is no delay. */
static void delay_key_note(keel__session *session, const keel_store_entry *entries, size_t count) {
  char key[48];
  snprintf(key, sizeof key, "inject/delay/%d", session->config->node);
  int64_t delay_ns = 0;
  for (size_t i = 0; i < count; i++) {
    if (strcmp(entries[i].key, key) != 0) continue;
    if (keel_parse_int((const char *)entries[i].value, 0, INT64_MAX, &delay_ns) != KEEL_OK)
      delay_ns = 0;
  }
  if (delay_ns == session->send_delay_ns) return;
  session->send_delay_ns = delay_ns;
  pthread_mutex_lock(&session->endpoint_lock);
  keel_endpoint_delay_sends(session->endpoint, delay_ns);
  pthread_mutex_unlock(&session->endpoint_lock);
  char fields[96];
  snprintf(fields, sizeof fields, "\"node\":%d,\"delay_ms\":%.3f", session->config->node,
           (double)delay_ns / 1e6);
  report(session, "send_delay", fields);
}

/* inject/hang/<uid> and inject/bitflip/<uid> (`keel inject hang|bitflip RANK`): the training
 * thread hangs, or flips a bit of its registered state, at its next step; for a hang this
 * thread keeps the lease alive meanwhile: the failure only a deadline can catch. Each key is
 * passed on once and deleted. */
static void request_keys_note(keel__session *session, const keel_store_entry *entries,
                              size_t count) {
  static const char *const actions[] = {"hang", "bitflip"};
  for (size_t a = 0; a < sizeof actions / sizeof actions[0]; a++) {
    char key[48];
    snprintf(key, sizeof key, "inject/%s/%" PRIu32, actions[a], session->config->uid);
    for (size_t i = 0; i < count; i++) {
      if (strcmp(entries[i].key, key) != 0) continue;
      keel_fault_plan_request(atomic_load(&session->faults), actions[a]);
      keel_store_delete(session->background, key);
    }
  }
}

/* Idle spares (their offers, spare/), counted only while the runtime wants them (a replace
 * world below its size): every rank listing them at every change would load the store for
 * nothing. A dead spare's offer goes with its lease, which its launcher revokes. */
static void spares_count(keel__session *session, bool changed) {
  bool stale = atomic_exchange(&session->spares_stale, false);
  if (!atomic_load(&session->spares_wanted) || !(changed || stale)) return;
  keel_store_entry *entries = NULL;
  size_t count = 0;
  if (keel_store_list(session->background, "spare/", &entries, &count, NULL) != KEEL_OK) {
    atomic_store(&session->spares_stale, true);
    return;
  }
  atomic_store(&session->spares, (int)count);
  keel_store_entries_free(entries, count);
}

/* The job's own keys: job/stop (an orderly stop), job/done (the job ended), and how many
 * joiners wait, the dead, the others' sections, and injected delays, hangs and bit flips. Read only
 * when the store changed since the last look. */
static void watch(keel__session *session) {
  uint64_t revision = 0;
  keel_status status =
      keel_store_wait(session->background, "", session->watched_revision, keel_now_ns(), &revision);
  spares_count(session, status == KEEL_OK);
  if (status != KEEL_OK) return; /* KEEL_ETIMEDOUT: nothing changed */
  keel_store_entry *entries = NULL;
  size_t count = 0;
  if (keel_store_list(session->background, "job/", &entries, &count, NULL) != KEEL_OK) return;
  job_keys_note(session, entries, count);
  keel_store_entries_free(entries, count);
  if (keel_store_list(session->background, "join/", &entries, &count, NULL) != KEEL_OK) return;
  atomic_store(&session->joiners, (int)count);
  keel_store_entries_free(entries, count);
  if (keel_store_list(session->background, "dead/", &entries, &count, NULL) != KEEL_OK) return;
  dead_keys_note(session, entries, count);
  keel_store_entries_free(entries, count);
  if (keel_store_list(session->background, "section/", &entries, &count, NULL) != KEEL_OK) return;
  atomic_store(&session->sections_until,
               keel__sections_until(entries, count, session->config->uid));
  keel_store_entries_free(entries, count);
  if (keel_store_list(session->background, "inject/", &entries, &count, NULL) != KEEL_OK) return;
  delay_key_note(session, entries, count);
  request_keys_note(session, entries, count);
  keel_store_entries_free(entries, count);
  session->watched_revision = revision;
}

static void *session_main(void *argument) {
  keel__session *session = argument;
  int64_t next_keepalive = keel_now_ns();
  while (!atomic_load(&session->stopping)) {
    int64_t now = keel_now_ns();
    int64_t wake =
        now + LOOK_INTERVAL_NS < next_keepalive ? now + LOOK_INTERVAL_NS : next_keepalive;
    struct pollfd pollers[2] = {{.fd = session->stop_fd, .events = POLLIN},
                                {.fd = session->config->status_fd, .events = 0}};
    nfds_t count = session->config->status_fd >= 0 ? 2 : 1;
    poll(pollers, count, keel_poll_timeout_ms(wake));
    if (atomic_load(&session->stopping)) break;
    if (launcher_gone(session, count == 2 ? pollers[1].revents : 0)) {
      interrupt(session, KEEL_EORPHANED);
      /* Nothing more to keep: the job's store went with its launcher, or will not hear us. */
      break;
    }
    if (keel_now_ns() >= next_keepalive) {
      keepalive(session);
      next_keepalive = keel_now_ns() + keepalive_period(session->config);
    }
    keel__detector_flush(session->detector, session->background);
    watch(session);
  }
  return NULL;
}

keel_status keel__session_start(keel__session *session, keel__events *events,
                                keel_endpoint *endpoint) {
  session->events = events;
  pthread_mutex_lock(&session->endpoint_lock);
  session->endpoint = endpoint;
  pthread_mutex_unlock(&session->endpoint_lock);
  session->stop_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (session->stop_fd < 0) return keel_status_from_errno(errno);
  if (pthread_create(&session->thread, NULL, session_main, session) != 0) return KEEL_ENOMEM;
  session->thread_started = true;
  return KEEL_OK;
}

keel_status keel__session_publish(keel__session *session, keel__role role, int rank, uint64_t epoch,
                                  const char *address) {
  const keel__config *config = session->config;
  char key[64], value[320];
  session->rank = rank;
  snprintf(key, sizeof key, "proc/%" PRIu32, config->uid);
  int length =
      snprintf(value, sizeof value, "pid=%d node=%d role=%s rank=%d epoch=%" PRIu64 " addr=%s",
               (int)getpid(), config->node, keel__role_name(role), rank, epoch, address);
  return keel_store_put(session->store, key, value, (size_t)length, session->lease, NULL);
}

keel_status keel__session_address(keel__session *session, uint32_t uid, char *address,
                                  size_t capacity) {
  char key[64];
  snprintf(key, sizeof key, "proc/%" PRIu32, uid);
  keel_store_entry *entry = NULL;
  keel_status status = keel_store_get(session->store, key, &entry);
  if (status != KEEL_OK) return status;
  const char *found = strstr((const char *)entry->value, "addr=");
  status = KEEL_ECORRUPT;
  if (found != NULL) {
    size_t length = strcspn(found + 5, " ");
    if (length > 0 && length < capacity) {
      memcpy(address, found + 5, length);
      address[length] = '\0';
      status = KEEL_OK;
    }
  }
  keel_store_entry_free(entry);
  return status;
}

void keel__session_close(keel__session *session, bool orderly) {
  if (session == NULL) return;
  atomic_store(&session->stopping, true);
  if (session->stop_fd >= 0) {
    uint64_t one = 1;
    ssize_t ignored = write(session->stop_fd, &one, sizeof one);
    (void)ignored;
  }
  if (session->thread_started) pthread_join(session->thread, NULL);
  if (orderly && session->lease != 0 && session->store != NULL) {
    /* Say we left before the lease goes, so that the launcher does not take the vanished
     * proc/ key of a process that is still finishing for a hung one. */
    char key[64], value[48];
    snprintf(key, sizeof key, "left/%" PRIu32, session->config->uid);
    int length = snprintf(value, sizeof value, "pid=%d rank=%d", (int)getpid(), session->rank);
    keel_store_put(session->store, key, value, (size_t)length, 0, NULL);
    keel_store_lease_revoke(session->store, session->lease);
  }
  if (session->stop_fd >= 0) close(session->stop_fd);
  keel_store_close(session->background);
  keel_store_close(session->store);
  pthread_mutex_destroy(&session->endpoint_lock);
  free(session);
}
