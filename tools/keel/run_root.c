/* The root agent (docs/NODES.md): one agent, elected by creating the key "root" under its
 * node's lease, decides what becomes of a node whose lease ended. It writes the decision
 * (decision/node/<i> = lost) before it acts, then marks each of the node's processes dead
 * once its own lease has ended too: a partitioned node's agent has fenced them by then, and
 * the workers of a merely stopped agent, which still renew their leases, are left alone.
 * Every agent keeps the view the root needs, so that when the root's lease ends another
 * takes over at once and finishes or redoes what is still open. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "launcher.h"

#define DECISION_PREFIX "decision/node/"
#define DECISION_LOST "lost"
#define DECISION_DONE "done"
#define DECISION_LEFT "left" /* its agent ended in order (keel__root_leave) */

keel_status keel__root_init(keel__launcher *launcher) {
  keel__agent_state *agent = &launcher->agent;
  agent->uid_limit = keel__agent_uid_limit(launcher);
  agent->node_count = launcher->options.nnodes + launcher->options.spare_nodes;
  agent->uid_node = malloc(agent->uid_limit * sizeof *agent->uid_node);
  agent->uid_state = calloc(agent->uid_limit, sizeof *agent->uid_state);
  agent->node_state = calloc((size_t)agent->node_count, sizeof *agent->node_state);
  if (agent->uid_node == NULL || agent->uid_state == NULL || agent->node_state == NULL) {
    keel__root_free(launcher);
    return KEEL_ENOMEM;
  }
  for (uint32_t uid = 0; uid < agent->uid_limit; uid++) agent->uid_node[uid] = -1;
  return KEEL_OK;
}

void keel__root_free(keel__launcher *launcher) {
  keel__agent_state *agent = &launcher->agent;
  free(agent->uid_node);
  free(agent->uid_state);
  free(agent->node_state);
  agent->uid_node = NULL;
  agent->uid_state = agent->node_state = NULL;
}

static void decision_put(keel__launcher *launcher, int64_t node, const char *what) {
  char key[64];
  snprintf(key, sizeof key, DECISION_PREFIX "%lld", (long long)node);
  keel_status status = keel_store_put(launcher->store, key, what, strlen(what), 0, NULL);
  if (status != KEEL_OK)
    KEEL_LOG_E("root", "cannot write %s = %s: %s", key, what, keel_strerror(status));
}

/* dead/<uid> for every process of a lost node whose proc/ key is gone; the node's decision
 * is done once none is left. */
static void root_settle(keel__launcher *launcher) {
  keel__agent_state *agent = &launcher->agent;
  if (!agent->is_root) return;
  for (int64_t node = 0; node < agent->node_count; node++) {
    if (!(agent->node_state[node] & KEEL__NODE_LOST)) continue;
    size_t open = 0, marked = 0, settled = 0;
    for (uint32_t uid = 0; uid < agent->uid_limit; uid++) {
      if (agent->uid_node[uid] != node || (agent->uid_state[uid] & KEEL__UID_MARKED)) continue;
      if (agent->uid_state[uid] & KEEL__UID_ALIVE) {
        open++;
        continue;
      }
      char key[32];
      snprintf(key, sizeof key, "dead/%u", (unsigned)uid);
      static const char text[] = "status=node-lost";
      /* A dead/ its own agent wrote (with the exit status) stays as it is. */
      keel_status status = keel_store_cas(launcher->store, key, 0, text, sizeof text - 1, 0, NULL);
      if (status != KEEL_OK && status != KEEL_ECONFLICT) {
        open++;
        continue;
      }
      agent->uid_state[uid] |= KEEL__UID_MARKED;
      marked += status == KEEL_OK;
      settled++;
    }
    if (marked > 0)
      keel__event_emit(launcher, "node_lost",
                       "\"node\":%lld,\"by_root\":%lld,\"processes\":%zu,\"still_alive\":%zu",
                       (long long)node, (long long)agent->node, marked, open);
    if (open == 0 && settled > 0) {
      decision_put(launcher, node, DECISION_DONE);
      if (agent->node_state[node] & KEEL__NODE_BACK)
        agent->node_state[node] &= (uint8_t) ~(KEEL__NODE_LOST | KEEL__NODE_BACK);
    }
  }
}

/* What decision/node/<node> holds: true when the key is there, its value in text. */
static bool decision_get(keel__launcher *launcher, int64_t node, char *text, size_t capacity) {
  char key[64];
  snprintf(key, sizeof key, DECISION_PREFIX "%lld", (long long)node);
  keel_store_entry *entry = NULL;
  if (keel_store_get(launcher->store, key, &entry) != KEEL_OK) return false;
  snprintf(text, capacity, "%s", (const char *)entry->value);
  keel_store_entry_free(entry);
  return true;
}

/* A lost node's key is there again: a new life of it (an agent that rejoined, a node started
 * again). Once the old life's decision is done, the new one is lost only by a decision of
 * its own, and its processes, which its agent reports, are not the root's to mark. Until
 * then the mark stays: a report of the old key's end may come twice (a listing and a watch),
 * and the second must not decide again. */
static void root_note_back(keel__launcher *launcher, int64_t node) {
  keel__agent_state *agent = &launcher->agent;
  if (!(agent->node_state[node] & KEEL__NODE_LOST)) return;
  char decision[16];
  if (decision_get(launcher, node, decision, sizeof decision) &&
      strcmp(decision, DECISION_DONE) == 0)
    agent->node_state[node] &= (uint8_t) ~(KEEL__NODE_LOST | KEEL__NODE_BACK);
  else
    agent->node_state[node] |= KEEL__NODE_BACK;
}

static void root_decide_lost(keel__launcher *launcher, int64_t node) {
  keel__agent_state *agent = &launcher->agent;
  if (node < 0 || node >= agent->node_count || (agent->node_state[node] & KEEL__NODE_LOST)) return;
  if (node == agent->node) return;
  char earlier[16];
  if (decision_get(launcher, node, earlier, sizeof earlier) && strcmp(earlier, DECISION_LEFT) == 0)
    return;
  decision_put(launcher, node, DECISION_LOST);
  agent->node_state[node] |= KEEL__NODE_LOST;
  keel__metrics_node_lost(launcher->metrics);
  keel__event_emit(launcher, "root_decision", "\"node\":%lld,\"decision\":\"lost\",\"root\":%lld",
                   (long long)node, (long long)agent->node);
}

/* A new root redoes the decisions its predecessor wrote and did not finish, and decides on
 * the nodes it knew of whose key is gone. */
static void root_take_over(keel__launcher *launcher) {
  keel__agent_state *agent = &launcher->agent;
  keel_store_entry *entries = NULL;
  size_t count = 0;
  if (keel_store_list(launcher->store, DECISION_PREFIX, &entries, &count, NULL) == KEEL_OK) {
    for (size_t i = 0; i < count; i++) {
      uint32_t node;
      if (keel__uid_from_key(entries[i].key, DECISION_PREFIX, &node) != KEEL_OK) continue;
      if ((int64_t)node >= agent->node_count) continue;
      if (strcmp((const char *)entries[i].value, DECISION_LEFT) == 0) continue;
      agent->node_state[node] |= KEEL__NODE_LOST;
    }
    keel_store_entries_free(entries, count);
  }
  for (int64_t node = 0; node < agent->node_count; node++) {
    char key[32];
    snprintf(key, sizeof key, "node/%lld", (long long)node);
    keel_store_entry *entry = NULL;
    keel_status status = keel_store_get(launcher->store, key, &entry);
    keel_store_entry_free(entry);
    if (status == KEEL_OK) root_note_back(launcher, node);
    if (status == KEEL_ENOTFOUND && (agent->node_state[node] & KEEL__NODE_SEEN))
      root_decide_lost(launcher, node);
  }
}

void keel__root_try(keel__launcher *launcher) {
  keel__agent_state *agent = &launcher->agent;
  if (!agent->active || agent->is_root || agent->fenced || agent->lease == 0) return;
  char value[64];
  int length =
      snprintf(value, sizeof value, "node=%lld pid=%ld", (long long)agent->node, (long)getpid());
  keel_status status =
      keel_store_cas(launcher->store, "root", 0, value, (size_t)length, agent->lease, NULL);
  if (status != KEEL_OK) return;
  agent->is_root = true;
  keel__event_emit(launcher, "root", "\"node\":%lld,\"pid\":%ld", (long long)agent->node,
                   (long)getpid());
  keel__launcher_metrics_start(launcher);
  root_take_over(launcher);
  root_settle(launcher);
}

void keel__root_note_report(keel__launcher *launcher, const keel__report *report) {
  keel__agent_state *agent = &launcher->agent;
  if (!agent->active || agent->uid_node == NULL) return;
  switch ((keel__report_kind)report->kind) {
    case KEEL__REPORT_PROC:
      if (report->uid >= agent->uid_limit) return;
      agent->uid_node[report->uid] = (int32_t)report->node;
      agent->uid_state[report->uid] |= KEEL__UID_ALIVE;
      return;
    case KEEL__REPORT_PROC_GONE:
      if (report->uid >= agent->uid_limit) return;
      agent->uid_state[report->uid] &= (uint8_t)~KEEL__UID_ALIVE;
      root_settle(launcher);
      return;
    case KEEL__REPORT_NODE:
      if ((int64_t)report->uid >= agent->node_count) return;
      agent->node_state[report->uid] |= KEEL__NODE_SEEN;
      if (agent->is_root) root_note_back(launcher, (int64_t)report->uid);
      return;
    case KEEL__REPORT_NODE_GONE:
      /* The root's own node may be the one gone: its "root" key went with its lease. */
      keel__root_try(launcher);
      if (agent->is_root) root_decide_lost(launcher, (int64_t)report->uid);
      root_settle(launcher);
      return;
    case KEEL__REPORT_SUSPECT:
    case KEEL__REPORT_REQUEST:
      return;
  }
}

void keel__root_leave(keel__launcher *launcher) {
  keel__agent_state *agent = &launcher->agent;
  if (!agent->active || agent->fenced || agent->lease == 0) return;
  decision_put(launcher, agent->node, DECISION_LEFT);
}
