/* A launcher that is one node's agent (docs/NODES.md): it starts its node's workers and
 * spares in uids no other agent gives, keeps node/<i> alive under a lease, fences its own
 * node when the store stops confirming that lease, and ends the job with the other agents
 * once no process of any node holds a rank. */
#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "launcher.h"

#define SECOND_NS INT64_C(1000000000)
#define CONNECT_DEADLINE_NS (5 * SECOND_NS)
#define TOKEN_KEY "auth/token"
/* How long a fence waits to see its SIGKILLs take effect (a process in uninterruptible sleep
 * may take longer; the event then says how many were dead). */
#define FENCE_WAIT_NS (SECOND_NS / 2)

/* The fencing timing (docs/NODES.md): keepalives every ttl/8, each request bounded by ttl/8,
 * and the node fences itself once no keepalive sent in the last 5/8 ttl was answered. A
 * fence thus starts by 3/4 ttl after the last confirmed keepalive was sent, and the store
 * cannot expire the lease before ttl after it: the workers are dead before anyone else may
 * take their place. */
static int64_t request_timeout_ns(const keel__agent_state *agent) { return agent->ttl_ns / 8; }
static int64_t fence_after_ns(const keel__agent_state *agent) { return agent->ttl_ns * 5 / 8; }

/* A spare node's part, in a later life of a node: spares only, which take the node's own
 * uids that its earlier lives left unused. */
static void agent_become_spare_node(keel__launcher *launcher, int64_t used) {
  keel__agent_state *agent = &launcher->agent;
  int64_t wanted = launcher->options.nproc_per_node + launcher->options.spares;
  int64_t room = (int64_t)agent->uid_stride - used;
  agent->rejoined = true;
  agent->extras_started = used;
  agent->workers = agent->joiners = 0;
  agent->spares = wanted < room ? wanted : room;
}

/* An agent started again by its own launcher (KEEL_AGENT_REJOIN, set by
 * keel__agent_rejoin_exec after a fence, or by the supervisor of a killed node on one host). */
static void agent_rejoin_init(keel__launcher *launcher) {
  keel__agent_state *agent = &launcher->agent;
  const char *text = getenv(KEEL__AGENT_REJOIN_VARIABLE);
  int64_t used;
  if (text == NULL || keel_parse_int(text, 0, agent->uid_stride, &used) != KEEL_OK) return;
  unsetenv(KEEL__AGENT_REJOIN_VARIABLE); /* not for its children */
  agent_become_spare_node(launcher, used);
}

void keel__agent_init(keel__launcher *launcher) {
  const keel__run_options *options = &launcher->options;
  keel__agent_state *agent = &launcher->agent;
  if (options->node_rank < 0) return;
  agent->active = true;
  agent->supervised = getenv("KEEL_AGENT_OF") != NULL;
  agent->node = options->node_rank;
  bool spare_node = options->node_rank >= options->nnodes;
  bool late_node = !spare_node && options->node_rank >= options->nnodes_min;
  agent->workers = spare_node || late_node ? 0 : options->nproc_per_node;
  agent->joiners = late_node ? options->nproc_per_node : 0;
  agent->spares = spare_node ? options->nproc_per_node + options->spares : options->spares;
  agent->uid_stride = keel__agent_uid_stride(options);
  launcher->child_capacity = (size_t)agent->uid_stride;
  agent_rejoin_init(launcher);
  agent->ttl_ns = options->heartbeat_ns;
  agent->lease_confirmed_ns = keel_now_ns();
  /* Agents on one host share its terminal with their supervisor, which draws the line. */
  if (agent->supervised) launcher->options.quiet = true;
}

/* Every agent computes the same stride from the same flags. */
uint32_t keel__agent_uid_stride(const keel__run_options *options) {
  return (uint32_t)(options->nproc_per_node + options->spares + options->max_restarts);
}

/* The first of node's own uids. */
static uint32_t first_extra_uid(const keel__run_options *options, int64_t node) {
  return (uint32_t)(options->max_world + node * keel__agent_uid_stride(options));
}

uint32_t keel__agent_next_uid(keel__launcher *launcher, keel__role role) {
  keel__agent_state *agent = &launcher->agent;
  const keel__run_options *options = &launcher->options;
  /* A node's workers, or a late node's joiners, take the uids of the ranks it brings. */
  if (role == KEEL__ROLE_WORKER && agent->workers_started < agent->workers)
    return (uint32_t)(agent->node * options->nproc_per_node + agent->workers_started++);
  if (role == KEEL__ROLE_JOINER && agent->joiners_started < agent->joiners)
    return (uint32_t)(agent->node * options->nproc_per_node + agent->joiners_started++);
  uint32_t uid = first_extra_uid(options, agent->node) + (uint32_t)agent->extras_started++;
  keel__agent_uids_note(launcher->store, agent->node, agent->extras_started);
  return uid;
}

/* uids/node/<i>: how many of the node's own uids its lives used, kept without a lease so
 * that a node started again after its agent was killed never gives a uid twice (the dead/
 * keys of old processes are collected; a uid the survivors saw fail stays failed to them,
 * and a spare that had it would never be admitted). */
void keel__agent_uids_note(keel_store *store, int64_t node, int64_t used) {
  char key[48], value[24];
  snprintf(key, sizeof key, "uids/node/%lld", (long long)node);
  int length = snprintf(value, sizeof value, "%lld", (long long)used);
  keel_status status = keel_store_put(store, key, value, (size_t)length, 0, NULL);
  if (status != KEEL_OK)
    KEEL_LOG_W("agent", "node %lld: cannot record its uids in use: %s", (long long)node,
               keel_strerror(status));
}

/* How many of node's own uids its lives used; KEEL_ENOTFOUND when it has had none. */
static keel_status node_uids_read(keel_store *store, int64_t node, int64_t *used_p) {
  char key[48];
  snprintf(key, sizeof key, "uids/node/%lld", (long long)node);
  keel_store_entry *entry = NULL;
  keel_status status = keel_store_get(store, key, &entry);
  if (status == KEEL_OK &&
      keel_parse_int((const char *)entry->value, 0, INT64_MAX, used_p) != KEEL_OK)
    *used_p = 0;
  keel_store_entry_free(entry);
  return status;
}

int64_t keel__agent_uids_used(keel_store *store, int64_t node) {
  int64_t used = 0;
  if (node_uids_read(store, node, &used) != KEEL_OK) used = 0;
  return used;
}

uint32_t keel__agent_uid_limit(const keel__launcher *launcher) {
  const keel__run_options *options = &launcher->options;
  int64_t nodes = options->nnodes + options->spare_nodes;
  return (uint32_t)(options->max_world + nodes * launcher->agent.uid_stride);
}

/* FNV-1a of the --rdzv-id: the same name gives every node the same job id (never 0, which
 * means "any job"). */
static uint64_t job_id_from_name(const char *name) {
  uint64_t hash = UINT64_C(14695981039346656037);
  for (const unsigned char *c = (const unsigned char *)name; *c != '\0'; c++)
    hash = (hash ^ *c) * UINT64_C(1099511628211);
  return hash == 0 ? 1 : hash;
}

/* The first agent to come puts a fresh token; the others read it. The workers' links
 * authenticate with it, and the store (etcd, with TLS where it matters) is what every node
 * already trusts. */
static keel_status token_agree(keel__launcher *launcher) {
  keel_auth fresh;
  keel_status status = keel_auth_generate(&fresh);
  if (status != KEEL_OK) return status;
  char hex[2 * KEEL_TOKEN_BYTES + 1];
  keel_hex_encode(fresh.token, KEEL_TOKEN_BYTES, hex);
  status = keel_store_cas(launcher->store, TOKEN_KEY, 0, hex, strlen(hex), 0, NULL);
  if (status != KEEL_OK && status != KEEL_ECONFLICT) return status;
  keel_store_entry *entry = NULL;
  status = keel_store_get(launcher->store, TOKEN_KEY, &entry);
  if (status != KEEL_OK) return status;
  status = keel_hex_decode((const char *)entry->value, launcher->auth.token, KEEL_TOKEN_BYTES);
  keel_store_entry_free(entry);
  return status;
}

/* A SIGINT or SIGTERM that came while waiting: the supervisor or the user stops the node. */
static bool stop_signal_pending(const keel__launcher *launcher) {
  struct signalfd_siginfo info;
  bool stop = false;
  while (read(launcher->signal_fd, &info, sizeof info) == (ssize_t)sizeof info)
    stop |= info.ssi_signo == SIGINT || info.ssi_signo == SIGTERM;
  return stop;
}

/* One pause of an agent's wait on the store: pause_ns, or until deadline_ns if sooner, cut
 * short by a signal; true if it was a stop. */
static bool pause_until_stopped(const keel__launcher *launcher, int64_t pause_ns,
                                int64_t deadline_ns) {
  struct pollfd poller = {.fd = launcher->signal_fd, .events = POLLIN};
  int64_t next = keel_now_ns() + pause_ns;
  poll(&poller, 1, keel_poll_timeout_ms(next < deadline_ns ? next : deadline_ns));
  return stop_signal_pending(launcher);
}

/* A node that lived before in this job (uids/node/<i>, which every life of it writes when it
 * registers) and whose agent starts again without its launcher saying so: a host rebooted or
 * replaced, whose scheduler runs the same `keel run --node-rank I` again. Its ranks were
 * given to spares or shrunk away meanwhile, so it comes back as a spare node, as a killed
 * node on one host does (run_nodes.c). It waits first until the store shows nothing of its
 * earlier life (the node's key and its processes' proc/ keys end with their leases, within
 * --heartbeat of the host's death), so that the root decides on the lost node before the
 * new life's key appears, and a second agent for a node that is alive is refused. */
static bool uid_of_node(const keel__launcher *launcher, uint32_t uid) {
  const keel__run_options *options = &launcher->options;
  int64_t node = launcher->agent.node;
  int64_t first_rank_uid = node * options->nproc_per_node;
  if (node < options->nnodes && uid >= first_rank_uid &&
      uid < first_rank_uid + options->nproc_per_node)
    return true;
  uint32_t first = first_extra_uid(options, node);
  return uid >= first && uid < first + launcher->agent.uid_stride;
}

/* Whether the store still holds the node's key or a proc/ key of one of its uids; a store
 * that does not answer counts as holding them. */
static bool earlier_life_present(keel__launcher *launcher) {
  char key[32];
  snprintf(key, sizeof key, "node/%lld", (long long)launcher->agent.node);
  keel_store_entry *entry = NULL;
  keel_status status = keel_store_get(launcher->store, key, &entry);
  keel_store_entry_free(entry);
  if (status != KEEL_ENOTFOUND) return true;
  keel_store_entry *entries = NULL;
  size_t count = 0;
  if (keel_store_list(launcher->store, "proc/", &entries, &count, NULL) != KEEL_OK) return true;
  bool present = false;
  for (size_t i = 0; i < count && !present; i++) {
    uint32_t uid;
    present =
        keel__uid_from_key(entries[i].key, "proc/", &uid) == KEEL_OK && uid_of_node(launcher, uid);
  }
  keel_store_entries_free(entries, count);
  return present;
}

static keel_status earlier_life_wait(keel__launcher *launcher) {
  const keel__agent_state *agent = &launcher->agent;
  int64_t wait_ns = 2 * agent->ttl_ns + SECOND_NS;
  int64_t deadline = keel_deadline_after_ns(wait_ns);
  KEEL_LOG_I("agent", "node %lld lived before in this job: it comes back as a spare node",
             (long long)agent->node);
  while (earlier_life_present(launcher)) {
    if (keel_now_ns() >= deadline) {
      KEEL_LOG_E("agent",
                 "node %lld: the store still holds its earlier life (its agent's key or a "
                 "process of it), or does not answer, after %.1f s: an agent of this node "
                 "is alive; start no second one",
                 (long long)agent->node, (double)wait_ns / 1e9);
      return KEEL_EEXIST;
    }
    if (pause_until_stopped(launcher, agent->ttl_ns / 8, deadline)) return KEEL_ESTOPPED;
  }
  return KEEL_OK;
}

static keel_status earlier_life_check(keel__launcher *launcher) {
  keel__agent_state *agent = &launcher->agent;
  int64_t used = 0;
  if (agent->rejoined) return KEEL_OK;
  keel_status status = node_uids_read(launcher->store, agent->node, &used);
  if (status == KEEL_ENOTFOUND) return KEEL_OK;
  if (status == KEEL_OK) status = earlier_life_wait(launcher);
  /* Read again: the earlier life may have given more of its uids while it ended. */
  if (status == KEEL_OK) status = node_uids_read(launcher->store, agent->node, &used);
  if (status != KEEL_OK) {
    if (status != KEEL_EEXIST && status != KEEL_ESTOPPED)
      KEEL_LOG_E("agent", "node %lld: cannot read its earlier lives from the store: %s",
                 (long long)agent->node, keel_strerror(status));
    return status;
  }
  if (used >= (int64_t)agent->uid_stride) {
    KEEL_LOG_E("agent",
               "node %lld: its earlier lives used every uid it has (--max-restarts "
               "sizes them): it cannot come back",
               (long long)agent->node);
    return KEEL_ERANGE;
  }
  agent_become_spare_node(launcher, used);
  agent->rejoin_by_store = true;
  return KEEL_OK;
}

keel_status keel__agent_store_open(keel__launcher *launcher) {
  const keel__run_options *options = &launcher->options;
  keel_status status;
  if (launcher->agent.supervised) {
    status = keel_auth_from_env(&launcher->auth);
    const char *store = getenv("KEEL_STORE");
    if (status == KEEL_OK && store == NULL) status = KEEL_EINVAL;
    if (status != KEEL_OK) {
      KEEL_LOG_E("agent", "started without the job's identity (KEEL_JOB_ID, KEEL_STORE)");
      return status;
    }
    snprintf(launcher->endpoint, sizeof launcher->endpoint, "%s", store);
  } else {
    memset(&launcher->auth, 0, sizeof launcher->auth);
    launcher->auth.job_id = job_id_from_name(options->rdzv_id);
    snprintf(launcher->endpoint, sizeof launcher->endpoint, "%s", options->rdzv_endpoint);
  }
  launcher->auth.local_id = KEEL__LAUNCHER_ID;
  status = keel_store_connect(launcher->endpoint, &launcher->auth,
                              keel_deadline_after_ns(CONNECT_DEADLINE_NS), &launcher->store);
  if (status != KEEL_OK) {
    KEEL_LOG_E("agent", "cannot connect to the store %s: %s", launcher->endpoint,
               keel_strerror(status));
    return status;
  }
  if (!launcher->agent.supervised) status = token_agree(launcher);
  if (status == KEEL_OK)
    status = keel_store_set_timeout(launcher->store, request_timeout_ns(&launcher->agent));
  if (status != KEEL_OK)
    KEEL_LOG_E("agent", "cannot agree on the job's token: %s", keel_strerror(status));
  if (status == KEEL_OK) status = earlier_life_check(launcher);
  if (status == KEEL_OK) return KEEL_OK;
  keel_store_close(launcher->store);
  launcher->store = NULL;
  return status;
}

/* What the node brings: workers, joiners (a late node of --nnodes MIN:MAX) or spares. */
static const char *agent_role(const keel__agent_state *agent) {
  if (agent->workers > 0) return "worker";
  return agent->joiners > 0 ? "joiner" : "spare";
}

/* The node's key under a fresh lease; *sent_ns_p when the grant was asked for. */
static keel_status register_once(keel__launcher *launcher, int64_t *sent_ns_p) {
  keel__agent_state *agent = &launcher->agent;
  *sent_ns_p = keel_now_ns();
  keel_status status = keel_store_lease_grant(launcher->store, agent->ttl_ns, &agent->lease);
  char key[32], value[256];
  snprintf(key, sizeof key, "node/%lld", (long long)agent->node);
  const char *host = getenv("KEEL_HOST");
  int length = snprintf(value, sizeof value, "pid=%ld pgid=%ld role=%s group=%d addr=%s%s%s",
                        (long)getpid(), (long)getpgid(0), agent_role(agent), agent->supervised,
                        host != NULL ? host : "127.0.0.1", launcher->mem_agent ? " ckpt=" : "",
                        launcher->mem_agent ? keel_ckpt_agent_address(launcher->mem_agent) : "");
  if (status == KEEL_OK)
    status = keel_store_put(launcher->store, key, value, (size_t)length, agent->lease, NULL);
  return status;
}

/* A later life of a node (a spare node after a fence) may come while the store cannot answer
 * in time (an etcd member stopped, a leader being elected): it tries again until --rejoin-wait
 * has passed or it is told to stop, as its earlier life waited for the store to answer at all.
 * A test_chaos_netns_etcd run under ASan had one such life give up at once and end with an
 * error, and the job, though it finished, exit 1 (RELIABILITY.md). */
keel_status keel__agent_register(keel__launcher *launcher) {
  keel__agent_state *agent = &launcher->agent;
  int64_t deadline = keel_deadline_after_ns(agent->rejoined ? launcher->options.rejoin_wait_ns : 0);
  int64_t sent_ns = 0;
  keel_status status = register_once(launcher, &sent_ns);
  while (status != KEEL_OK && agent->rejoined && keel_now_ns() < deadline) {
    KEEL_LOG_W("agent", "node %lld cannot register yet (%s): trying again", (long long)agent->node,
               keel_strerror(status));
    if (pause_until_stopped(launcher, agent->ttl_ns / 4, deadline)) break;
    status = register_once(launcher, &sent_ns);
  }
  if (status != KEEL_OK) {
    KEEL_LOG_E("agent", "cannot register node %lld: %s", (long long)agent->node,
               keel_strerror(status));
    return status;
  }
  agent->lease_confirmed_ns = sent_ns;
  agent->next_keepalive_ns = sent_ns + request_timeout_ns(agent);
  /* The node's mark that it has lived, for a later life (earlier_life_check). */
  keel__agent_uids_note(launcher->store, agent->node, agent->extras_started);
  keel__event_emit(launcher, "agent_start", "\"node\":%lld,\"pid\":%ld,\"role\":\"%s\"",
                   (long long)agent->node, (long)getpid(), agent_role(agent));
  if (agent->rejoined)
    keel__event_emit(launcher, "agent_rejoin", "\"node\":%lld,\"spares\":%lld,\"by\":\"%s\"",
                     (long long)agent->node, (long long)agent->spares,
                     agent->rejoin_by_store ? "store" : "launcher");
  return KEEL_OK;
}

/* The node lost its lease, or may have: its workers die now, before the store could let the
 * rest of the job replace them. */
/* Waits (without reaping: the loop does that, with its bookkeeping) until every child the
 * fence killed is dead, FENCE_WAIT_NS at most; how many are. */
static size_t fenced_children_wait(const keel__launcher *launcher) {
  int64_t deadline = keel_deadline_after_ns(FENCE_WAIT_NS);
  size_t dead = 0;
  for (size_t i = 0; i < launcher->child_count; i++) {
    const keel__child *child = &launcher->children[i];
    if (!child->alive) continue;
    for (;;) {
      siginfo_t info = {0};
      int result = waitid(P_PID, (id_t)child->pid, &info, WEXITED | WNOWAIT | WNOHANG);
      if (result != 0 || info.si_pid == child->pid) {
        dead++;
        break;
      }
      if (keel_now_ns() >= deadline) break;
      struct timespec pause = {0, 200000};
      nanosleep(&pause, NULL);
    }
  }
  return dead;
}

static void agent_fence(keel__launcher *launcher, int64_t now_ns) {
  keel__agent_state *agent = &launcher->agent;
  agent->fenced = true;
  double silent_ms = (double)(now_ns - agent->lease_confirmed_ns) / 1e6;
  KEEL_LOG_E("agent", "node %lld: the store has not confirmed its lease for %.0f ms: fencing",
             (long long)agent->node, silent_ms);
  size_t alive = keel__children_alive(launcher, false);
  keel__launcher_terminate(launcher, KEEL__EXIT_FENCED, SIGKILL);
  size_t dead = fenced_children_wait(launcher);
  /* Written once the node's processes are dead: its time is when the fence held. */
  keel__event_emit(launcher, "node_fence",
                   "\"node\":%lld,\"silent_ms\":%.1f,\"ttl_ms\":%.1f,\"killed\":%zu,"
                   "\"dead\":%zu,\"fenced_ms\":%.1f",
                   (long long)agent->node, silent_ms, (double)agent->ttl_ns / 1e6, alive, dead,
                   (double)(keel_now_ns() - agent->lease_confirmed_ns) / 1e6);
}

void keel__agent_event_note(keel__launcher *launcher, const char *event) {
  keel__agent_state *agent = &launcher->agent;
  if (!agent->active || strcmp(event, "progress") == 0) return;
  snprintf(agent->last_event, sizeof agent->last_event, "%s", event);
  agent->last_event_wall_ns = keel_wall_ns();
  agent->last_event_unsent = true;
}

/* Puts the last event where keel status reads it; tried again at the next keepalive if the
 * store did not take it. */
static void last_event_send(keel__launcher *launcher) {
  keel__agent_state *agent = &launcher->agent;
  char key[48], value[80];
  snprintf(key, sizeof key, "event/node/%lld", (long long)agent->node);
  int length = snprintf(value, sizeof value, "%s %lld", agent->last_event,
                        (long long)agent->last_event_wall_ns);
  if (keel_store_put(launcher->store, key, value, (size_t)length, agent->lease, NULL) == KEEL_OK)
    agent->last_event_unsent = false;
}

/* Finding 37: an etcd cluster without a leader for longer than the fence's 5/8 of the
 * heartbeat read, to every agent, like its own cut from the store, and every node fenced at
 * once. A store without a leader expires no lease, and its next leader gives every lease its
 * full time again; but an agent cut off from a store that still has one must fence. Only
 * the members tell these apart: a reading of a majority electing at terms above every term
 * an earlier reading saw (keel_store_quorum_moved_on) confirms the lease as of that earlier
 * reading. A minority's view (a partition's side, a majority stopped) proves nothing: the
 * fence goes on as before. */
static void quorum_reading_keep(keel__agent_state *agent, const keel_store_quorum *reading) {
  if (agent->quorum_reading_count == KEEL__AGENT_QUORUM_READINGS) {
    memmove(agent->quorum_readings, agent->quorum_readings + 1,
            (KEEL__AGENT_QUORUM_READINGS - 1) * sizeof agent->quorum_readings[0]);
    agent->quorum_reading_count--;
  }
  agent->quorum_readings[agent->quorum_reading_count++] = *reading;
}

static void agent_quorum_read(keel__launcher *launcher) {
  keel__agent_state *agent = &launcher->agent;
  if (agent->quorum_unsupported) return;
  keel_store_quorum reading;
  keel_status status = keel_store_quorum_read(
      launcher->store, keel_deadline_after_ns(request_timeout_ns(agent)), &reading);
  if (status == KEEL_ENOTSUP) agent->quorum_unsupported = true;
  if (status != KEEL_OK) return;
  /* The newest earlier reading it moved on from: older ones confirm less. */
  for (size_t i = agent->quorum_reading_count; i-- > 0;) {
    const keel_store_quorum *earlier = &agent->quorum_readings[i];
    if (earlier->asked_ns <= agent->lease_confirmed_ns) break;
    if (!keel_store_quorum_moved_on(earlier, &reading)) continue;
    agent->lease_confirmed_ns = earlier->asked_ns;
    if (!agent->leaderless_said) {
      agent->leaderless_said = true;
      KEEL_LOG_W("agent",
                 "node %lld: the store has no leader: a majority of its members elect one at "
                 "terms above %llu; no lease can expire before the next leader renews them all, "
                 "so the node waits instead of fencing",
                 (long long)agent->node, (unsigned long long)keel_store_quorum_term(earlier));
      keel__event_emit(launcher, "store_leaderless",
                       "\"node\":%lld,\"term\":%llu,\"voters\":%zu,\"answered\":%zu",
                       (long long)agent->node, (unsigned long long)keel_store_quorum_term(&reading),
                       reading.voters, reading.answered);
    }
    break;
  }
  quorum_reading_keep(agent, &reading);
}

void keel__agent_tick(keel__launcher *launcher, int64_t now_ns) {
  keel__agent_state *agent = &launcher->agent;
  if (!agent->active || agent->lease == 0 || agent->fenced) return;
  if (now_ns - agent->lease_confirmed_ns >= fence_after_ns(agent)) {
    agent_fence(launcher, now_ns);
    return;
  }
  if (now_ns < agent->next_keepalive_ns) return;
  keel_status status = keel_store_lease_keepalive(launcher->store, agent->lease);
  int64_t answered_ns = keel_now_ns();
  agent->next_keepalive_ns = answered_ns + request_timeout_ns(agent);
  if (status == KEEL_OK) keel__metrics_store_request(launcher->metrics, answered_ns - now_ns);
  if (status == KEEL_OK) {
    agent->lease_confirmed_ns = now_ns;
    agent->quorum_reading_count = 0;
    agent->leaderless_said = false;
    if (agent->last_event_unsent) last_event_send(launcher);
    return;
  }
  KEEL_LOG_W("agent", "node %lld: keepalive failed: %s", (long long)agent->node,
             keel_strerror(status));
  /* A lease the store no longer has cannot come back: the rest of the job may be replacing
   * this node already. */
  if (status == KEEL_ENOTFOUND) {
    agent_fence(launcher, keel_now_ns());
    return;
  }
  agent_quorum_read(launcher);
}

int64_t keel__agent_deadline(const keel__launcher *launcher) {
  const keel__agent_state *agent = &launcher->agent;
  if (!agent->active || agent->lease == 0 || agent->fenced) return KEEL_NO_DEADLINE;
  int64_t fence_at = agent->lease_confirmed_ns + fence_after_ns(agent);
  return agent->next_keepalive_ns < fence_at ? agent->next_keepalive_ns : fence_at;
}

/* job/began (docs/RUNTIME.md): some process of the job held a rank. An agent's own sighting
 * dies with it, and an agent started again after its fence or its node's loss has seen
 * none: the key tells it that the job has begun (finding 37: with every node fenced at once,
 * the agents started again never saw a rank, and never ended a job that had none left). */
#define JOB_BEGAN_KEY "job/began"

void keel__agent_note_ranks(keel__launcher *launcher) {
  keel__agent_state *agent = &launcher->agent;
  if (agent->ranks_seen) return;
  agent->ranks_seen = true;
  if (!agent->active || launcher->store == NULL) return;
  keel_status status = keel_store_put(launcher->store, JOB_BEGAN_KEY, "", 0, 0, NULL);
  if (status != KEEL_OK)
    KEEL_LOG_W("agent", "node %lld: cannot put " JOB_BEGAN_KEY ": %s", (long long)agent->node,
               keel_strerror(status));
}

static bool job_began(keel__launcher *launcher) {
  return launcher->agent.ranks_seen || keel__store_has(launcher->store, JOB_BEGAN_KEY);
}

/* Whether a process of any node still holds a rank: its proc/ value shows one. */
static bool ranks_held_anywhere(keel__launcher *launcher, bool *known_p) {
  keel_store_entry *entries = NULL;
  size_t count = 0;
  *known_p = keel_store_list(launcher->store, "proc/", &entries, &count, NULL) == KEEL_OK;
  bool held = false;
  for (size_t i = 0; *known_p && i < count && !held; i++) {
    keel__proc_value value;
    held = keel__proc_value_parse((const char *)entries[i].value, &value) == KEEL_OK &&
           value.rank >= 0;
  }
  keel_store_entries_free(entries, count);
  return held;
}

/* Whether some process left in order (keel_finalize's left/<uid>) while it held a rank: the
 * ranks finished, rather than all died before anyone could take their place. */
static bool ranks_finished(keel__launcher *launcher) {
  keel_store_entry *entries = NULL;
  size_t count = 0;
  if (keel_store_list(launcher->store, "left/", &entries, &count, NULL) != KEEL_OK) return true;
  bool finished = false;
  for (size_t i = 0; i < count && !finished; i++) {
    const char *rank = strstr((const char *)entries[i].value, "rank=");
    finished = rank != NULL && rank[5] >= '0' && rank[5] <= '9';
  }
  keel_store_entries_free(entries, count);
  return finished;
}

/* A node whose processes hold no rank ends with the job: when no process of any node holds
 * one any more (once some did: a spare node's agent may look before the workers are up), or
 * when another agent has said so. No rank held and none finished: every holder of some rank
 * died before a spare could take its state (failures faster than recoveries), and the job
 * failed, whatever this node's spares say. */
void keel__agent_check_end(keel__launcher *launcher) {
  if (launcher->phase != KEEL__PHASE_RUNNING) return;
  if (keel__children_alive(launcher, true) > 0) return;
  if (!keel__launcher_refresh_ranks(launcher)) return;
  if (keel__children_alive(launcher, true) > 0) return;
  bool known;
  bool over = job_began(launcher) && !ranks_held_anywhere(launcher, &known) && known;
  bool done = keel__store_has(launcher->store, "job/done");
  bool finished = (over || done) && ranks_finished(launcher);
  if (done)
    over = true;
  else if (over && !finished) {
    KEEL_LOG_E("agent",
               "node %lld: no process of the job holds a rank and none finished: "
               "the ranks' last holders died before spares could take their state",
               (long long)launcher->agent.node);
    keel__event_emit(launcher, "ranks_lost", "\"node\":%lld", (long long)launcher->agent.node);
    keel__launcher_begin_ending(launcher, KEEL__EXIT_FAILURE);
    return;
  }
  /* A node whose rank holders all failed, replaced on other nodes that finished (RELIABILITY.md,
   * finding 12): the job's outcome is theirs. */
  if (over) keel__launcher_begin_ending(launcher, keel__children_verdict(launcher, finished));
}

bool keel__agent_rejoin_wait(keel__launcher *launcher) {
  const keel__agent_state *agent = &launcher->agent;
  int64_t wait_ns = launcher->options.rejoin_wait_ns;
  if (!agent->active || !agent->fenced || wait_ns <= 0 || launcher->store == NULL) return false;
  if ((int64_t)agent->uid_stride - agent->extras_started <= 0) {
    KEEL_LOG_W("agent", "node %lld: no uid left for spares: it does not rejoin",
               (long long)agent->node);
    return false;
  }
  int64_t deadline = keel_deadline_after_ns(wait_ns);
  KEEL_LOG_I("agent", "node %lld: fenced; waiting up to %.1f s for the store to rejoin",
             (long long)agent->node, (double)wait_ns / 1e9);
  while (keel_now_ns() < deadline) {
    /* The store answers again: a job that ended needs no spares, one that goes on may. */
    keel_store_entry *done = NULL;
    keel_status status = keel_store_get(launcher->store, "job/done", &done);
    keel_store_entry_free(done);
    if (status == KEEL_ENOTFOUND) {
      /* The fence's kills could not be recorded while the node was cut off, and the root
       * may never have seen the node's key gone (it can be gone and back between two of its
       * listings): the others learn of the deaths from here, before the new life begins. */
      size_t recorded = keel__children_deaths_record(launcher);
      keel__event_emit(launcher, "deaths_recorded", "\"node\":%lld,\"processes\":%zu",
                       (long long)agent->node, recorded);
      return true;
    }
    if (status == KEEL_OK) return false;
    if (pause_until_stopped(launcher, agent->ttl_ns / 4, deadline)) return false;
  }
  KEEL_LOG_W("agent", "node %lld: the store did not answer within --rejoin-wait",
             (long long)agent->node);
  return false;
}

void keel__agent_rejoin_exec(const keel__run_options *options, int64_t extras_started) {
  char path[PATH_MAX], used[24];
  ssize_t length = readlink("/proc/self/exe", path, sizeof path - 1);
  char **argv = calloc((size_t)options->argc + 2, sizeof *argv);
  if (length <= 0 || argv == NULL) {
    free(argv);
    KEEL_LOG_E("agent", "cannot start again as a spare node: %s", strerror(errno));
    return;
  }
  path[length] = '\0';
  argv[0] = "keel";
  for (int i = 0; i < options->argc; i++) argv[1 + i] = options->argv[i];
  snprintf(used, sizeof used, "%lld", (long long)extras_started);
  setenv(KEEL__AGENT_REJOIN_VARIABLE, used, 1);
  execv(path, argv);
  KEEL_LOG_E("agent", "cannot start again as a spare node: %s: %s", path, strerror(errno));
  free(argv);
}

void keel__agent_close(keel__launcher *launcher) {
  keel__agent_state *agent = &launcher->agent;
  if (!agent->active || agent->lease == 0 || agent->fenced) return;
  keel__root_leave(launcher);
  keel_store_lease_revoke(launcher->store, agent->lease);
  agent->lease = 0;
}
