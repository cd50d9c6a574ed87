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

/* A decision is about one life of a node, named by the lease of its node/ key:
 * "<decision> life=<lease>". */
typedef struct node_decision {
  char word[8];
  int64_t life;
} node_decision;

keel_status keel__root_init(keel__launcher *launcher) {
  keel__agent_state *agent = &launcher->agent;
  agent->uid_limit = keel__agent_uid_limit(launcher);
  agent->node_count = launcher->options.nnodes + launcher->options.spare_nodes;
  agent->uid_node = malloc(agent->uid_limit * sizeof *agent->uid_node);
  agent->uid_state = calloc(agent->uid_limit, sizeof *agent->uid_state);
  agent->node_state = calloc((size_t)agent->node_count, sizeof *agent->node_state);
  agent->node_life = calloc((size_t)agent->node_count, sizeof *agent->node_life);
  if (agent->uid_node == NULL || agent->uid_state == NULL || agent->node_state == NULL ||
      agent->node_life == NULL) {
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
  free(agent->node_life);
  agent->node_life = NULL;
  agent->uid_node = NULL;
  agent->uid_state = agent->node_state = NULL;
}

static void decision_put(keel__launcher *launcher, int64_t node, const char *what, int64_t life) {
  char key[64], value[64];
  snprintf(key, sizeof key, DECISION_PREFIX "%lld", (long long)node);
  int length = snprintf(value, sizeof value, "%s life=%lld", what, (long long)life);
  keel_status status = keel_store_put(launcher->store, key, value, (size_t)length, 0, NULL);
  if (status != KEEL_OK)
    KEEL_LOG_E("root", "cannot write %s = %s: %s", key, value, keel_strerror(status));
}

/* Reads a decision's value; false when it is not one. */
static bool decision_parse(const char *text, node_decision *decision) {
  long long life = 0;
  char word[sizeof decision->word];
  if (sscanf(text, "%7s life=%lld", word, &life) != 2) return false;
  snprintf(decision->word, sizeof decision->word, "%s", word);
  decision->life = life;
  return true;
}

/* The decision about a node covers the processes it had when it was lost, not those of a
 * later life (a spare node started again): once they are all settled, the node is as any
 * other, and a second loss of it is a new decision. */
static void root_node_settled(keel__agent_state *agent, int64_t node) {
  agent->node_state[node] &= (uint8_t)~KEEL__NODE_LOST;
  for (uint32_t uid = 0; uid < agent->uid_limit; uid++)
    if (agent->uid_node[uid] == node) agent->uid_state[uid] &= (uint8_t)~KEEL__UID_LOST;
}

/* dead/<uid> for every process a lost node had when it was lost whose proc/ key is gone; the
 * node's decision is done once none is left. */
static void root_settle(keel__launcher *launcher) {
  keel__agent_state *agent = &launcher->agent;
  if (!agent->is_root) return;
  for (int64_t node = 0; node < agent->node_count; node++) {
    if (!(agent->node_state[node] & KEEL__NODE_LOST)) continue;
    size_t open = 0, marked = 0, settled = 0;
    for (uint32_t uid = 0; uid < agent->uid_limit; uid++) {
      if (agent->uid_node[uid] != node || !(agent->uid_state[uid] & KEEL__UID_LOST) ||
          (agent->uid_state[uid] & KEEL__UID_MARKED))
        continue;
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
    if (open > 0) continue;
    decision_put(launcher, node, DECISION_DONE, agent->node_life[node]);
    root_node_settled(agent, node);
  }
}

/* What decision/node/<node> holds: true when the key is there and reads as a decision. */
static bool decision_get(keel__launcher *launcher, int64_t node, node_decision *decision) {
  char key[64];
  snprintf(key, sizeof key, DECISION_PREFIX "%lld", (long long)node);
  keel_store_entry *entry = NULL;
  if (keel_store_get(launcher->store, key, &entry) != KEEL_OK) return false;
  bool parsed = decision_parse((const char *)entry->value, decision);
  keel_store_entry_free(entry);
  return parsed;
}

/* The processes the root knows of on node now are those the decision about it covers. */
static void root_node_lost(keel__agent_state *agent, int64_t node) {
  agent->node_state[node] |= KEEL__NODE_LOST;
  for (uint32_t uid = 0; uid < agent->uid_limit; uid++)
    if (agent->uid_node[uid] == node) agent->uid_state[uid] |= KEEL__UID_LOST;
}

static void root_decide_lost(keel__launcher *launcher, int64_t node) {
  keel__agent_state *agent = &launcher->agent;
  if (node < 0 || node >= agent->node_count || (agent->node_state[node] & KEEL__NODE_LOST)) return;
  if (node == agent->node) return;
  node_decision earlier;
  if (decision_get(launcher, node, &earlier) && strcmp(earlier.word, DECISION_LEFT) == 0 &&
      earlier.life == agent->node_life[node])
    return;
  decision_put(launcher, node, DECISION_LOST, agent->node_life[node]);
  root_node_lost(agent, node);
  /* This life of the node is decided: the report of its key gone, which may come after a
   * take-over decided on it, decides nothing more. Its next life's key sets SEEN again. */
  agent->node_state[node] &= (uint8_t)~KEEL__NODE_SEEN;
  keel__metrics_node_lost(launcher->metrics);
  keel__event_emit(launcher, "root_decision", "\"node\":%lld,\"decision\":\"lost\",\"root\":%lld",
                   (long long)node, (long long)agent->node);
}

/* A new root finishes what its predecessor decided and did not finish, and decides on each
 * life of a node it saw whose key is gone and that no decision covers. A decision is about
 * the life it names: "done" and "left" need nothing more; "lost" is redone, unless the node's
 * key is back, which it is only once the earlier life's processes are dead (killed with their
 * group, or fenced). A decision about this agent's own node is of an earlier life. */
static void root_take_over(keel__launcher *launcher) {
  keel__agent_state *agent = &launcher->agent;
  for (int64_t node = 0; node < agent->node_count; node++) {
    if (node == agent->node) continue;
    node_decision decision;
    bool decided = decision_get(launcher, node, &decision);
    bool open = decided && strcmp(decision.word, DECISION_LOST) == 0;
    char key[32];
    snprintf(key, sizeof key, "node/%lld", (long long)node);
    keel_store_entry *entry = NULL;
    keel_status status = keel_store_get(launcher->store, key, &entry);
    keel_store_entry_free(entry);
    if (status == KEEL_OK && open) decision_put(launcher, node, DECISION_DONE, decision.life);
    if (status != KEEL_ENOTFOUND) continue;
    bool seen = (agent->node_state[node] & KEEL__NODE_SEEN) != 0;
    if (decided && (decision.life == agent->node_life[node] || !seen)) {
      if (open) root_node_lost(agent, node);
      agent->node_state[node] &= (uint8_t)~KEEL__NODE_SEEN;
      continue;
    }
    if (seen) root_decide_lost(launcher, node);
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
      agent->node_life[report->uid] = report->lease;
      return;
    case KEEL__REPORT_NODE_GONE:
      /* The root's own node may be the one gone: its "root" key went with its lease. */
      keel__root_try(launcher);
      if (agent->is_root && (int64_t)report->uid < agent->node_count &&
          (agent->node_state[report->uid] & KEEL__NODE_SEEN))
        root_decide_lost(launcher, (int64_t)report->uid);
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
  decision_put(launcher, agent->node, DECISION_LEFT, agent->lease);
}
