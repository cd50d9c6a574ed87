/* `keel report --svg FILE`: the job's timeline as one standalone SVG (no script, nothing
 * fetched), drawn from the events report.c reads: a lane per process grouped by node, with its
 * steps, death, fences and JIT saves; restarts; each recovery's phases; and a panel per
 * recovery and restart that zooms in on it, so that one sees where its time went. */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "keel/runtime.h"
#include "report_svg.h"

/* ---- limits: each kind of record has a maximum; further ones are counted, not drawn */
#define MAX_LANES 1024
#define MAX_NODES 256
#define MAX_MARKS 8192
#define MAX_SPANS 8192
#define MAX_RECOVERIES 1024
#define MAX_RESTARTS 1024
#define MAX_PROGRESS ((size_t)1 << 21)
#define MAX_FAILED 64
#define MAX_ZOOMS 8       /* recoveries, and restarts, that also get a panel of their own */
#define ZOOM_MAX_LANES 12 /* in a panel; the timeline has them all */
/* Lanes of uids below this are found by index; progress lines are most of a file. */
#define UID_TABLE_SIZE 65536
#define NO_TIME INT64_MIN
/* Monotonic times are ns since boot, durations a few minutes at most: a time outside
 * [0, 2^62) or a duration beyond MS_MAX is garbage, and refusing them keeps every sum and
 * difference of the drawing within int64_t. */
#define TIME_LIMIT ((int64_t)1 << 62)
#define MS_MAX 1e9
#define NS_PER_MS 1e6
#define NS_PER_S 1e9

/* ---- what is drawn */

/* A recovery's phases as the recovery line gives them (docs/RUNTIME.md), drawn in this order.
 * total_ms is their sum less detect, so it is no phase of its own. */
typedef struct phase_kind {
  const char *key, *name, *colour;
} phase_kind;

static const phase_kind phase_kinds[] = {{"detect_ms", "detect", "#e69f00"},
                                         {"revoke_ms", "revoke", "#cc79a7"},
                                         {"agree_ms", "agree", "#0072b2"},
                                         {"rebuild_ms", "rebuild", "#56b4e9"},
                                         {"state_transfer_ms", "state transfer", "#009e73"},
                                         {"redo_ms", "redo", "#7e57c2"}};
#define PHASE_COUNT (sizeof phase_kinds / sizeof phase_kinds[0])
#define PHASE_DETECT 0
#define PHASE_REDO (PHASE_COUNT - 1)
/* Between the phases and the recovery line: the failure hooks and, when the step began
 * again, its work up to its first collective; no phase measures it. */
#define UNACCOUNTED_NAME "between phases (step begun again)"
#define UNACCOUNTED_COLOUR "#d0d0d0"

/* A process's own span of work, from the line that ends it and its duration. */
typedef struct span_kind {
  const char *event, *ms_key, *name, *colour;
} span_kind;

static const span_kind span_kinds[] = {{"jit_save", "save_ms", "JIT save", "#17becf"},
                                       {"jit_restore", "restore_ms", "JIT restore", "#bcbd22"}};
#define SPAN_KIND_COUNT (sizeof span_kinds / sizeof span_kinds[0])

typedef enum lane_end {
  END_NONE,  /* no exit in the file: still running when it ends */
  END_OK,    /* exit 0 */
  END_LEFT,  /* saved and left: for a restart (75), the launcher gone (76), a stop (77) */
  END_IDLE,  /* a spare or joiner that never held a rank: stopped at the end of the job */
  END_DEATH, /* a signal or another exit code */
  END_LOST,  /* no exit: its node was lost with it */
} lane_end;

/* One process (uid): a lane of the drawing. */
typedef struct lane {
  int64_t uid, node; /* node -1: no spawn event said */
  char role[16];
  int64_t spawn_t_ns, held_t_ns, exit_t_ns; /* held: first seen with a rank */
  int64_t first_rank, last_rank;            /* -1: it held none */
  int64_t min_epoch, max_epoch;             /* of its own lines; -1: none */
  lane_end end;
  char outcome[32];  /* "SIGKILL", "exit 3" */
  int64_t last_step; /* -1: no progress line */
} lane;

typedef struct node_info {
  int64_t node, agent_pid, agent_begin_t_ns, agent_end_t_ns;
} node_info;

typedef enum mark_kind {
  MARK_DEATH,      /* on a process: its exit by a signal or a failing code */
  MARK_FENCE,      /* on a process: the launcher or its agent fenced it */
  MARK_FAULT,      /* on a process: a KEEL_FAULT rule fired */
  MARK_RESUMED,    /* on a process: rank 0 completed the minibatch a recovery resumed at */
  MARK_NODE_LOST,  /* on a node */
  MARK_NODE_FENCE, /* on a node: its agent lost its lease and killed its processes */
} mark_kind;

typedef struct mark {
  mark_kind kind;
  int64_t t_ns, subject; /* a uid, or a node for the node marks */
  char text[96];
} mark;

typedef struct span {
  size_t kind; /* in span_kinds */
  int64_t uid, begin_t_ns, end_t_ns;
} span;

typedef struct recovery {
  int64_t t_ns, t_detect_ns; /* t_detect_ns NO_TIME: not in the line */
  int64_t reporter, old_epoch, new_epoch, old_world, new_world;
  char policy[16];
  int64_t failed[MAX_FAILED];
  size_t failed_count;
  double phase_ms[PHASE_COUNT]; /* 0 when missing from the line */
} recovery;

/* restart_begin to restart: the job has no process training. */
typedef struct restart {
  int64_t number, failed_uid, begin_t_ns, end_t_ns;
  char reason[64];
} restart;

typedef struct progress {
  int64_t t_ns;
  uint32_t lane;
} progress;

struct keel__timeline {
  bool started, ended;
  char job_id[32], program[256], policy[16], domain[16];
  int64_t world, spares, code;
  double seconds;
  int64_t start_t_ns, end_t_ns, last_t_ns;
  lane lanes[MAX_LANES];
  uint16_t lane_by_uid[UID_TABLE_SIZE]; /* index + 1; 0: none yet */
  node_info nodes[MAX_NODES];
  mark marks[MAX_MARKS];
  span spans[MAX_SPANS];
  recovery recoveries[MAX_RECOVERIES];
  restart restarts[MAX_RESTARTS];
  size_t lane_count, node_count, mark_count, span_count, recovery_count, restart_count;
  progress *progress;
  size_t progress_count, progress_capacity;
  size_t not_kept; /* records past a limit */
};

keel__timeline *keel__timeline_create(void) { return calloc(1, sizeof(keel__timeline)); }

void keel__timeline_free(keel__timeline *timeline) {
  if (timeline == NULL) return;
  free(timeline->progress);
  free(timeline);
}

/* ---- reading the events */

static bool time_valid(int64_t t_ns) { return t_ns >= 0 && t_ns < TIME_LIMIT; }

/* A duration; 0 when missing, negative or garbage. */
static double member_ms(const json_t *event, const char *key) {
  double ms = 0;
  keel__json_double(event, key, &ms);
  return ms > 0 && ms <= MS_MAX ? ms : 0;
}

static lane *lane_add(keel__timeline *timeline, int64_t uid) {
  if (timeline->lane_count == MAX_LANES) {
    timeline->not_kept++;
    return NULL;
  }
  size_t index = timeline->lane_count++;
  timeline->lanes[index] = (lane){.uid = uid,
                                  .node = -1,
                                  .spawn_t_ns = NO_TIME,
                                  .held_t_ns = NO_TIME,
                                  .exit_t_ns = NO_TIME,
                                  .first_rank = -1,
                                  .last_rank = -1,
                                  .min_epoch = -1,
                                  .max_epoch = -1,
                                  .last_step = -1};
  if (uid < UID_TABLE_SIZE) timeline->lane_by_uid[uid] = (uint16_t)(index + 1);
  return &timeline->lanes[index];
}

/* The lane of uid, made at its first event; NULL for no uid or past MAX_LANES. */
static lane *lane_of(keel__timeline *timeline, int64_t uid) {
  if (uid < 0) return NULL;
  if (uid < UID_TABLE_SIZE) {
    uint16_t index = timeline->lane_by_uid[uid];
    return index > 0 ? &timeline->lanes[index - 1] : lane_add(timeline, uid);
  }
  for (size_t i = 0; i < timeline->lane_count; i++)
    if (timeline->lanes[i].uid == uid) return &timeline->lanes[i];
  return lane_add(timeline, uid);
}

static node_info *node_of(keel__timeline *timeline, int64_t node) {
  if (node < 0) return NULL;
  for (size_t i = 0; i < timeline->node_count; i++)
    if (timeline->nodes[i].node == node) return &timeline->nodes[i];
  if (timeline->node_count == MAX_NODES) {
    timeline->not_kept++;
    return NULL;
  }
  node_info *info = &timeline->nodes[timeline->node_count++];
  *info = (node_info){.node = node, .agent_begin_t_ns = NO_TIME, .agent_end_t_ns = NO_TIME};
  return info;
}

static mark *mark_add(keel__timeline *timeline, mark_kind kind, int64_t t_ns, int64_t subject) {
  if (timeline->mark_count == MAX_MARKS) {
    timeline->not_kept++;
    return NULL;
  }
  mark *added = &timeline->marks[timeline->mark_count++];
  *added = (mark){.kind = kind, .t_ns = t_ns, .subject = subject};
  return added;
}

/* The process held a rank at t_ns. */
static void lane_held(lane *process, int64_t t_ns, int64_t rank) {
  if (process == NULL || rank < 0) return;
  if (process->held_t_ns == NO_TIME || t_ns < process->held_t_ns) process->held_t_ns = t_ns;
  if (process->first_rank < 0) process->first_rank = rank;
  process->last_rank = rank;
}

/* A line a process wrote itself (it has an epoch): which epochs it was a member of says which
 * recoveries it took part in. */
static void worker_line_read(keel__timeline *timeline, const json_t *event, int64_t t_ns) {
  int64_t epoch = keel__json_int_or(event, "epoch", -1),
          rank = keel__json_int_or(event, "rank", -1);
  if (epoch < 0 || rank < 0) return;
  lane *process = lane_of(timeline, keel__json_int_or(event, "uid", -1));
  if (process == NULL) return;
  lane_held(process, t_ns, rank);
  if (process->min_epoch < 0 || epoch < process->min_epoch) process->min_epoch = epoch;
  if (epoch > process->max_epoch) process->max_epoch = epoch;
}

static void job_start_read(keel__timeline *timeline, const json_t *event, int64_t t_ns) {
  timeline->started = true;
  timeline->start_t_ns = t_ns;
  keel__json_string(event, "job_id", timeline->job_id, sizeof timeline->job_id);
  keel__json_string(event, "program", timeline->program, sizeof timeline->program);
  keel__json_string(event, "on_failure", timeline->policy, sizeof timeline->policy);
  keel__json_string(event, "failure_domain", timeline->domain, sizeof timeline->domain);
  timeline->world = keel__json_int_or(event, "world", 0);
  timeline->spares = keel__json_int_or(event, "spares", 0);
}

static void job_end_read(keel__timeline *timeline, const json_t *event, int64_t t_ns) {
  timeline->ended = true;
  timeline->end_t_ns = t_ns;
  timeline->code = keel__json_int_or(event, "code", -1);
  keel__json_double(event, "seconds", &timeline->seconds);
}

static void spawn_read(keel__timeline *timeline, const json_t *event, int64_t t_ns) {
  lane *process = lane_of(timeline, keel__json_int_or(event, "uid", -1));
  if (process == NULL || process->spawn_t_ns != NO_TIME) return;
  process->spawn_t_ns = t_ns;
  process->node = keel__json_int_or(event, "node", -1);
  node_of(timeline, process->node);
  keel__json_string(event, "role", process->role, sizeof process->role);
}

static void ready_read(keel__timeline *timeline, const json_t *event, int64_t t_ns) {
  lane_held(lane_of(timeline, keel__json_int_or(event, "uid", -1)), t_ns,
            keel__json_int_or(event, "rank", -1));
}

static void progress_read(keel__timeline *timeline, const json_t *event, int64_t t_ns) {
  lane *process = lane_of(timeline, keel__json_int_or(event, "uid", -1));
  int64_t step = keel__json_int_or(event, "step", -1);
  if (process == NULL || step < 0) return;
  process->last_step = step;
  if (timeline->progress_count == timeline->progress_capacity) {
    size_t capacity = timeline->progress_capacity ? 2 * timeline->progress_capacity : 4096;
    progress *grown =
        capacity <= MAX_PROGRESS ? realloc(timeline->progress, capacity * sizeof *grown) : NULL;
    if (grown == NULL) {
      timeline->not_kept++;
      return;
    }
    timeline->progress = grown;
    timeline->progress_capacity = capacity;
  }
  timeline->progress[timeline->progress_count++] =
      (progress){.t_ns = t_ns, .lane = (uint32_t)(process - timeline->lanes)};
}

/* How an exit ends a lane, as `keel report` counts failures: saving and leaving is none, nor
 * is a spare that never held a rank being stopped at the end. */
static lane_end exit_kind(const json_t *event, const char *signal, int64_t code) {
  bool fenced = json_is_true(json_object_get(event, "fenced"));
  if (signal[0] == '\0' && code == 0 && !fenced) return END_OK;
  if (signal[0] == '\0' && !fenced &&
      (code == KEEL_EXIT_RESTART || code == KEEL_EXIT_ORPHANED || code == KEEL_EXIT_STOPPED))
    return END_LEFT;
  if (keel__json_int_or(event, "rank", -1) < 0 && !fenced) return END_IDLE;
  return END_DEATH;
}

static void exit_read(keel__timeline *timeline, const json_t *event, int64_t t_ns) {
  lane *process = lane_of(timeline, keel__json_int_or(event, "uid", -1));
  if (process == NULL) return;
  char signal[24] = "";
  keel__json_string(event, "signal", signal, sizeof signal);
  int64_t code = keel__json_int_or(event, "code", 0);
  process->exit_t_ns = t_ns;
  process->end = exit_kind(event, signal, code);
  if (signal[0] != '\0')
    snprintf(process->outcome, sizeof process->outcome, "%s", signal);
  else
    snprintf(process->outcome, sizeof process->outcome, "exit %lld", (long long)code);
  if (process->end != END_DEATH) return;
  mark *death = mark_add(timeline, MARK_DEATH, t_ns, process->uid);
  if (death != NULL) snprintf(death->text, sizeof death->text, "%s", process->outcome);
}

static void fence_read(keel__timeline *timeline, const json_t *event, int64_t t_ns) {
  mark *fence = mark_add(timeline, MARK_FENCE, t_ns, keel__json_int_or(event, "uid", -1));
  if (fence != NULL) keel__json_string(event, "reason", fence->text, sizeof fence->text);
}

static void fault_read(keel__timeline *timeline, const json_t *event, int64_t t_ns) {
  mark *fault = mark_add(timeline, MARK_FAULT, t_ns, keel__json_int_or(event, "uid", -1));
  if (fault == NULL) return;
  char action[16] = "?", point[32] = "?";
  keel__json_string(event, "action", action, sizeof action);
  keel__json_string(event, "point", point, sizeof point);
  snprintf(fault->text, sizeof fault->text, "%s at %s, step %lld", action, point,
           (long long)keel__json_int_or(event, "step", -1));
}

static void resumed_read(keel__timeline *timeline, const json_t *event, int64_t t_ns) {
  mark *resumed = mark_add(timeline, MARK_RESUMED, t_ns, keel__json_int_or(event, "uid", -1));
  if (resumed == NULL) return;
  char kind[16] = "?";
  keel__json_string(event, "kind", kind, sizeof kind);
  snprintf(resumed->text, sizeof resumed->text, "step %lld (%s)",
           (long long)keel__json_int_or(event, "step", -1), kind);
}

static void node_lost_read(keel__timeline *timeline, const json_t *event, int64_t t_ns) {
  int64_t node = keel__json_int_or(event, "node", -1);
  node_of(timeline, node);
  mark *lost = mark_add(timeline, MARK_NODE_LOST, t_ns, node);
  if (lost != NULL)
    snprintf(lost->text, sizeof lost->text, "%lld processes",
             (long long)keel__json_int_or(event, "processes", -1));
}

static void node_fence_read(keel__timeline *timeline, const json_t *event, int64_t t_ns) {
  int64_t node = keel__json_int_or(event, "node", -1);
  node_of(timeline, node);
  mark *fence = mark_add(timeline, MARK_NODE_FENCE, t_ns, node);
  double silent_ms = -1;
  keel__json_double(event, "silent_ms", &silent_ms);
  if (fence != NULL)
    snprintf(fence->text, sizeof fence->text, "the store silent for %.0f ms", silent_ms);
}

static void agent_start_read(keel__timeline *timeline, const json_t *event, int64_t t_ns) {
  node_info *info = node_of(timeline, keel__json_int_or(event, "node", -1));
  if (info == NULL) return;
  if (info->agent_begin_t_ns == NO_TIME) info->agent_begin_t_ns = t_ns;
  info->agent_pid = keel__json_int_or(event, "pid", info->agent_pid);
}

static void agent_end_read(keel__timeline *timeline, const json_t *event, int64_t t_ns) {
  node_info *info = node_of(timeline, keel__json_int_or(event, "node", -1));
  if (info != NULL) info->agent_end_t_ns = t_ns;
}

static void recovery_read(keel__timeline *timeline, const json_t *event, int64_t t_ns) {
  if (timeline->recovery_count == MAX_RECOVERIES) {
    timeline->not_kept++;
    return;
  }
  recovery *line = &timeline->recoveries[timeline->recovery_count++];
  *line = (recovery){.t_ns = t_ns};
  line->t_detect_ns = keel__json_int_or(event, "t_detect_ns", NO_TIME);
  if (!time_valid(line->t_detect_ns)) line->t_detect_ns = NO_TIME;
  line->reporter = keel__json_int_or(event, "uid", -1);
  line->old_epoch = keel__json_int_or(event, "old_epoch", -1);
  line->new_epoch = keel__json_int_or(event, "new_epoch", -1);
  line->old_world = keel__json_int_or(event, "old_world", -1);
  line->new_world = keel__json_int_or(event, "new_world", -1);
  keel__json_string(event, "policy", line->policy, sizeof line->policy);
  line->failed_count = keel__json_int_array(event, "failed", line->failed, MAX_FAILED);
  for (size_t i = 0; i < PHASE_COUNT; i++) line->phase_ms[i] = member_ms(event, phase_kinds[i].key);
}

static void restart_begin_read(keel__timeline *timeline, const json_t *event, int64_t t_ns) {
  if (timeline->restart_count == MAX_RESTARTS) {
    timeline->not_kept++;
    return;
  }
  restart *round = &timeline->restarts[timeline->restart_count++];
  *round = (restart){.number = keel__json_int_or(event, "restart", -1),
                     .failed_uid = keel__json_int_or(event, "failed_uid", -1),
                     .begin_t_ns = t_ns,
                     .end_t_ns = NO_TIME};
  keel__json_string(event, "reason", round->reason, sizeof round->reason);
}

static void restart_read(keel__timeline *timeline, const json_t *event, int64_t t_ns) {
  int64_t number = keel__json_int_or(event, "restart", -1);
  for (size_t i = timeline->restart_count; i > 0; i--) {
    restart *round = &timeline->restarts[i - 1];
    if (round->number != number) continue;
    round->end_t_ns = t_ns;
    return;
  }
}

static void span_add(keel__timeline *timeline, const json_t *event, int64_t t_ns, size_t kind) {
  if (timeline->span_count == MAX_SPANS) {
    timeline->not_kept++;
    return;
  }
  int64_t length_ns = (int64_t)llround(member_ms(event, span_kinds[kind].ms_key) * NS_PER_MS);
  timeline->spans[timeline->span_count++] = (span){.kind = kind,
                                                   .uid = keel__json_int_or(event, "uid", -1),
                                                   .begin_t_ns = t_ns - length_ns,
                                                   .end_t_ns = t_ns};
}

static void jit_save_read(keel__timeline *timeline, const json_t *event, int64_t t_ns) {
  span_add(timeline, event, t_ns, 0);
}

static void jit_restore_read(keel__timeline *timeline, const json_t *event, int64_t t_ns) {
  span_add(timeline, event, t_ns, 1);
}

typedef void event_reader(keel__timeline *timeline, const json_t *event, int64_t t_ns);

static const struct {
  const char *name;
  event_reader *read;
} event_readers[] = {
    {"job_start", job_start_read},
    {"job_end", job_end_read},
    {"spawn", spawn_read},
    {"ready", ready_read},
    {"progress", progress_read},
    {"exit", exit_read},
    {"fence", fence_read},
    {"resumed", resumed_read},
    {"fault", fault_read},
    {"node_lost", node_lost_read},
    {"node_fence", node_fence_read},
    {"agent_spawn", agent_start_read},
    {"agent_start", agent_start_read},
    {"agent_end", agent_end_read},
    {"recovery", recovery_read},
    {"restart_begin", restart_begin_read},
    {"restart", restart_read},
    {"jit_save", jit_save_read},
    {"jit_restore", jit_restore_read},
};

void keel__timeline_event(keel__timeline *timeline, const char *name, const json_t *event,
                          int64_t t_ns) {
  if (!time_valid(t_ns)) {
    timeline->not_kept++;
    return;
  }
  if (t_ns > timeline->last_t_ns) timeline->last_t_ns = t_ns;
  worker_line_read(timeline, event, t_ns);
  for (size_t i = 0; i < sizeof event_readers / sizeof event_readers[0]; i++)
    if (strcmp(name, event_readers[i].name) == 0) event_readers[i].read(timeline, event, t_ns);
}

/* ---- when things happened, as drawn */

/* The first loss of node at or after after_ns; NO_TIME if none. */
static int64_t node_lost_t_ns(const keel__timeline *timeline, int64_t node, int64_t after_ns) {
  int64_t lost = NO_TIME;
  for (size_t i = 0; i < timeline->mark_count && node >= 0; i++) {
    const mark *loss = &timeline->marks[i];
    if (loss->kind == MARK_NODE_LOST && loss->subject == node && loss->t_ns >= after_ns &&
        (lost == NO_TIME || loss->t_ns < lost))
      lost = loss->t_ns;
  }
  return lost;
}

static int64_t timeline_end_t_ns(const keel__timeline *timeline) {
  return timeline->ended ? timeline->end_t_ns : timeline->last_t_ns;
}

/* When a process's lane begins and ends, and how it ended. */
typedef struct lifetime {
  int64_t begin_t_ns, end_t_ns;
  lane_end how;
} lifetime;

/* From its spawn to its exit, else the loss of its node, else the end of the job. */
static lifetime lifetime_of(const keel__timeline *timeline, const lane *process) {
  lifetime life = {
      .begin_t_ns = process->spawn_t_ns != NO_TIME ? process->spawn_t_ns : process->held_t_ns,
      .end_t_ns = process->exit_t_ns,
      .how = process->end};
  if (life.begin_t_ns == NO_TIME) life.begin_t_ns = timeline->start_t_ns;
  if (life.end_t_ns != NO_TIME) return life;
  life.end_t_ns = node_lost_t_ns(timeline, process->node, life.begin_t_ns);
  life.how = life.end_t_ns != NO_TIME ? END_LOST : END_NONE;
  if (life.end_t_ns == NO_TIME) life.end_t_ns = timeline_end_t_ns(timeline);
  return life;
}

static bool uid_listed(const int64_t *uids, size_t count, int64_t uid) {
  for (size_t i = 0; i < count; i++)
    if (uids[i] == uid) return true;
  return false;
}

/* A process took part in a recovery when it was a member of the new epoch (it wrote a line
 * in it, or was there when the line was written) without being one of the failed. */
static bool took_part(const lane *process, const lifetime *life, const recovery *line) {
  if (uid_listed(line->failed, line->failed_count, process->uid) || process->min_epoch < 0 ||
      process->min_epoch > line->new_epoch)
    return false;
  return process->max_epoch >= line->new_epoch || life->end_t_ns >= line->t_ns;
}

static int64_t ms_to_ns(double ms) { return (int64_t)llround(ms * NS_PER_MS); }

/* Where each phase of a recovery lies. With t_detect_ns (the moment the failure was detected,
 * src/runtime/recovery.c), detect ends there and revoke .. state transfer follow it back to
 * back, redo ending at the recovery line (the first collective of the new epoch); what lies
 * between is no phase's (the step begun again). Without it, all back to back up to the line. */
typedef struct recovery_layout {
  int64_t begin[PHASE_COUNT], end[PHASE_COUNT];
  int64_t unaccounted_begin, unaccounted_end;
} recovery_layout;

static void recovery_lay_out(const recovery *line, recovery_layout *layout) {
  int64_t cursor = line->t_detect_ns;
  if (cursor == NO_TIME) {
    cursor = line->t_ns;
    for (size_t i = 0; i < PHASE_COUNT; i++) cursor -= ms_to_ns(line->phase_ms[i]);
  } else {
    cursor -= ms_to_ns(line->phase_ms[PHASE_DETECT]);
  }
  for (size_t i = 0; i < PHASE_REDO; i++) {
    layout->begin[i] = cursor;
    cursor += ms_to_ns(line->phase_ms[i]);
    layout->end[i] = cursor;
  }
  int64_t redo_ns = ms_to_ns(line->phase_ms[PHASE_REDO]);
  int64_t redo_begin = line->t_ns - redo_ns > cursor ? line->t_ns - redo_ns : cursor;
  layout->unaccounted_begin = cursor;
  layout->unaccounted_end = redo_begin;
  layout->begin[PHASE_REDO] = redo_begin;
  layout->end[PHASE_REDO] = redo_begin + redo_ns;
}

/* The first death among uids (their exit, or their node's loss) in the minute before
 * before_ns; NO_TIME if the file has none. */
static int64_t first_death_t_ns(const keel__timeline *timeline, const int64_t *uids, size_t count,
                                int64_t before_ns, const mark **death_p) {
  int64_t first = NO_TIME;
  for (size_t i = 0; i < timeline->mark_count; i++) {
    const mark *death = &timeline->marks[i];
    if (death->t_ns > before_ns || death->t_ns < before_ns - 60 * (int64_t)NS_PER_S ||
        (first != NO_TIME && death->t_ns >= first))
      continue;
    bool failed = death->kind == MARK_DEATH && uid_listed(uids, count, death->subject);
    for (size_t f = 0; death->kind == MARK_NODE_LOST && f < count; f++) {
      uint16_t index =
          uids[f] >= 0 && uids[f] < UID_TABLE_SIZE ? timeline->lane_by_uid[uids[f]] : 0;
      failed = failed || (index > 0 && timeline->lanes[index - 1].node == death->subject);
    }
    if (!failed) continue;
    first = death->t_ns;
    *death_p = death;
  }
  return first;
}

/* The first line that says training resumed, at or after t_ns; NO_TIME if none. */
static int64_t resumed_t_ns(const keel__timeline *timeline, int64_t t_ns) {
  int64_t first = NO_TIME;
  for (size_t i = 0; i < timeline->mark_count; i++) {
    const mark *resumed = &timeline->marks[i];
    if (resumed->kind == MARK_RESUMED && resumed->t_ns >= t_ns &&
        (first == NO_TIME || resumed->t_ns < first))
      first = resumed->t_ns;
  }
  return first;
}

/* ---- SVG output */

/* Layout, in px. */
#define WIDTH 1200.0
#define PLOT_X 210.0 /* lane labels left of it */
#define PLOT_WIDTH (WIDTH - PLOT_X - 50.0)
#define LANE_HEIGHT 18.0
#define ZOOM_LANE_HEIGHT 16.0
#define NODE_HEIGHT 20.0
#define MARKER_HEIGHT 18.0
#define AXIS_HEIGHT 34.0
#define TICK_MIN_GAP_PX 2.0
#define CHAR_WIDTH_PX 6.2 /* of the 11 px font, to guess whether a label fits */

static const char style_sheet[] =
    "text{font-family:'DejaVu Sans',Helvetica,Arial,sans-serif;font-size:11px;fill:#222}"
    ".title{font-size:16px;font-weight:bold}.sub{font-size:12px;fill:#444}"
    ".heading{font-size:13px;font-weight:bold}.small{font-size:9px;fill:#555}"
    ".end{text-anchor:end}.mid{text-anchor:middle}.node{font-weight:bold}"
    ".on-phase{font-size:9px;fill:#fff}.death-text{font-size:9px;fill:#d62728}"
    ".band{fill:#f4f6f8}.life{stroke:#888;stroke-width:1.5}"
    ".idle{stroke:#aaa;stroke-width:1.2;stroke-dasharray:3 3}"
    ".agent{stroke:#bbb;stroke-width:3}.ticks{stroke:#333;stroke-width:0.8}"
    ".grid{stroke:#e2e2e2;stroke-width:1}.axis{stroke:#555;stroke-width:1}"
    ".death{stroke:#d62728;stroke-width:2}.lost{stroke:#d62728;stroke-width:1.5;"
    "stroke-dasharray:5 3}.fence{fill:#8c564b}.node-fence{stroke:#8c564b;stroke-width:1.5;"
    "stroke-dasharray:2 2}.fault{fill:#222}.down{fill:#000;fill-opacity:0.08}"
    ".exit{stroke:#555;stroke-width:1.5;fill:#fff}.marker{fill:#555}"
    ".resumed{fill:#2ca02c;stroke:#fff;stroke-width:0.8}";

typedef struct view {
  int64_t t0_ns, t1_ns; /* the time shown, t1 > t0 */
  double x0, width;     /* where, in px */
} view;

typedef struct drawing {
  const keel__timeline *timeline;
  FILE *out;
  view whole;
  const lane *order[MAX_LANES]; /* by node (unknown last), then uid */
  size_t lane_count;
  lifetime lifetimes[MAX_LANES]; /* of timeline->lanes[i] */
  /* The progress lines by lane, in the file's order: lane i's are from ticks_first[i] to
   * ticks_first[i + 1]. */
  progress *ticks;
  size_t ticks_first[MAX_LANES + 1];
} drawing;

static const lifetime *life_of(const drawing *picture, const lane *process) {
  return &picture->lifetimes[process - picture->timeline->lanes];
}

static double x_at(const view *shown, int64_t t_ns) {
  double fraction = (double)(t_ns - shown->t0_ns) / (double)(shown->t1_ns - shown->t0_ns);
  if (fraction < 0) fraction = 0;
  if (fraction > 1) fraction = 1;
  return shown->x0 + fraction * shown->width;
}

static bool view_shows(const view *shown, int64_t begin_ns, int64_t end_ns) {
  return end_ns >= shown->t0_ns && begin_ns <= shown->t1_ns;
}

/* Bytes of the UTF-8 character at text; 0 when it is not a whole one (a string cut to fit). */
static size_t utf8_length(const unsigned char *text) {
  size_t length = *text < 0x80             ? 1
                  : (*text & 0xe0) == 0xc0 ? 2
                  : (*text & 0xf0) == 0xe0 ? 3
                  : (*text & 0xf8) == 0xf0 ? 4
                                           : 0;
  for (size_t i = 1; i < length; i++)
    if ((text[i] & 0xc0) != 0x80) return 0;
  return length;
}

/* Text as XML character data or attribute value: the five special characters as entities,
 * control characters and broken UTF-8 as '?', which XML would refuse. */
static void xml_escaped_put(FILE *out, const char *text) {
  static const char *const entities[] = {
      ['&'] = "&amp;", ['<'] = "&lt;", ['>'] = "&gt;", ['"'] = "&quot;", ['\''] = "&apos;"};
  const unsigned char *at = (const unsigned char *)text;
  while (*at != '\0') {
    size_t length = utf8_length(at);
    if (length == 1 && *at < sizeof entities / sizeof entities[0] && entities[*at] != NULL)
      fputs(entities[*at], out);
    else if (length == 0 || *at < 0x20)
      fputc('?', out);
    else
      fwrite(at, 1, length, out);
    at += length > 0 ? length : 1;
  }
}

/* Formats into a line, then writes it escaped: every text of the drawing goes through here. */
static void __attribute__((format(printf, 5, 6)))
text_put(FILE *out, double x, double y, const char *classes, const char *format, ...) {
  char text[512];
  va_list arguments;
  va_start(arguments, format);
  vsnprintf(text, sizeof text, format, arguments);
  va_end(arguments);
  fprintf(out, "<text x=\"%.1f\" y=\"%.1f\"", x, y);
  if (classes != NULL) fprintf(out, " class=\"%s\"", classes);
  fputc('>', out);
  xml_escaped_put(out, text);
  fputs("</text>\n", out);
}

/* A tooltip: the element it is put in must be open. */
static void __attribute__((format(printf, 2, 3))) title_put(FILE *out, const char *format, ...) {
  char text[512];
  va_list arguments;
  va_start(arguments, format);
  vsnprintf(text, sizeof text, format, arguments);
  va_end(arguments);
  fputs("<title>", out);
  xml_escaped_put(out, text);
  fputs("</title>", out);
}

static double seconds_in_job(const drawing *picture, int64_t t_ns) {
  return (double)(t_ns - picture->timeline->start_t_ns) / NS_PER_S;
}

/* "8.88 ms": three significant digits, or whole milliseconds from 100 on. */
static void ms_format(double ms, char *text, size_t capacity) {
  snprintf(text, capacity, "%.*f ms", ms >= 100 ? 0 : ms >= 10 ? 1 : 2, ms);
}

/* ---- shapes, shared by the lanes and the legend */
static void cross_put(FILE *out, double x, double y, double r) {
  fprintf(out, "<path class=\"death\" d=\"M%.1f %.1fL%.1f %.1fM%.1f %.1fL%.1f %.1f\"/>", x - r,
          y - r, x + r, y + r, x - r, y + r, x + r, y - r);
}

static void diamond_put(FILE *out, double x, double y, double r) {
  fprintf(out, "<path class=\"fence\" d=\"M%.1f %.1fL%.1f %.1fL%.1f %.1fL%.1f %.1fZ\"/>", x, y - r,
          x + r, y, x, y + r, x - r, y);
}

/* Pointing down at (x, y). */
static void triangle_put(FILE *out, const char *classes, double x, double y, double r) {
  fprintf(out, "<path class=\"%s\" d=\"M%.1f %.1fL%.1f %.1fL%.1f %.1fZ\"/>", classes, x - r,
          y - 1.6 * r, x + r, y - 1.6 * r, x, y);
}

static void resumed_put(FILE *out, double x, double y) {
  fprintf(out, "<circle class=\"resumed\" cx=\"%.1f\" cy=\"%.1f\" r=\"3\"/>", x, y);
}

static void line_put(FILE *out, const char *classes, double x1, double y1, double x2, double y2) {
  fprintf(out, "<line class=\"%s\" x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>", classes, x1,
          y1, x2, y2);
}

static void rect_open(FILE *out, const char *classes, const char *fill, double x, double y,
                      double width, double height) {
  fprintf(out, "<rect class=\"%s\" x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" height=\"%.1f\"", classes,
          x, y, width, height);
  if (fill != NULL) fprintf(out, " fill=\"%s\"", fill);
  fputc('>', out);
}

/* How a lane ends when no death mark says it: the mark at its end. */
static void end_cap_put(FILE *out, lane_end how, double x, double y) {
  if (how == END_OK) fprintf(out, "<path class=\"exit\" d=\"M%.1f %.1fv10\"/>", x, y - 5);
  if (how == END_LEFT)
    fprintf(out, "<circle class=\"exit\" cx=\"%.1f\" cy=\"%.1f\" r=\"3.5\"/>", x, y);
  if (how == END_IDLE)
    fprintf(out, "<rect class=\"exit\" x=\"%.1f\" y=\"%.1f\" width=\"6\" height=\"6\"/>", x - 3,
            y - 3);
  if (how == END_LOST) cross_put(out, x, y, 4);
}

/* ---- a lane */

/* "uid 4 · rank 2 · spare", "uid 3 · rank 3→2", "uid 5 · no rank · spare" */
static void lane_label_format(const lane *process, char *text, size_t capacity) {
  char ranks[64] = "no rank";
  if (process->first_rank >= 0 && process->first_rank == process->last_rank)
    snprintf(ranks, sizeof ranks, "rank %lld", (long long)process->first_rank);
  else if (process->first_rank >= 0)
    snprintf(ranks, sizeof ranks, "rank %lld→%lld", (long long)process->first_rank,
             (long long)process->last_rank);
  bool worker = process->role[0] == '\0' || strcmp(process->role, "worker") == 0;
  snprintf(text, capacity, "uid %lld · %s%s%s", (long long)process->uid, ranks, worker ? "" : " · ",
           worker ? "" : process->role);
}

static void lane_label_put(const drawing *picture, const lane *process, double y,
                           const char *classes) {
  char label[96];
  lane_label_format(process, label, sizeof label);
  fputs("<g>", picture->out);
  title_put(picture->out, "uid %lld (%s) on node %lld; %s%s; last step %lld",
            (long long)process->uid, process->role[0] ? process->role : "?",
            (long long)process->node, process->outcome[0] ? "ended: " : "no exit in the file",
            process->outcome, (long long)process->last_step);
  text_put(picture->out, 24, y + 4, classes, "%s", label);
  fputs("</g>\n", picture->out);
}

/* Solid while the process could hold a rank; dashed while a spare or joiner waited for one. */
static void lifeline_put(const drawing *picture, const view *shown, const lane *process, double y) {
  const lifetime *life = life_of(picture, process);
  int64_t begin = life->begin_t_ns, end = life->end_t_ns;
  lane_end how = life->how;
  if (!view_shows(shown, begin, end)) return;
  bool waits = strcmp(process->role, "spare") == 0 || strcmp(process->role, "joiner") == 0;
  int64_t held =
      process->held_t_ns != NO_TIME && process->held_t_ns < end ? process->held_t_ns : end;
  if (waits) line_put(picture->out, "idle", x_at(shown, begin), y, x_at(shown, held), y);
  if (!waits || held < end)
    line_put(picture->out, "life", x_at(shown, waits ? held : begin), y, x_at(shown, end), y);
  if (how != END_DEATH && how != END_NONE && view_shows(shown, end, end))
    end_cap_put(picture->out, how, x_at(shown, end), y);
  fputc('\n', picture->out);
}

/* One path of thin ticks, a progress line each, at most one per TICK_MIN_GAP_PX: where a lane
 * has more steps than pixels, a tick stands for several. */
static void ticks_put(const drawing *picture, const view *shown, const lane *process, double y,
                      double half) {
  size_t index = (size_t)(process - picture->timeline->lanes);
  double last_x = -1e9;
  bool open = false;
  for (size_t i = picture->ticks_first[index]; i < picture->ticks_first[index + 1]; i++) {
    const progress *line = &picture->ticks[i];
    if (!view_shows(shown, line->t_ns, line->t_ns)) continue;
    double x = x_at(shown, line->t_ns);
    if (fabs(x - last_x) < TICK_MIN_GAP_PX) continue;
    if (!open) fputs("<path class=\"ticks\" d=\"", picture->out);
    open = true;
    fprintf(picture->out, "M%.1f %.1fv%.1f", x, y - half, 2 * half);
    last_x = x;
  }
  if (open) fputs("\"/>\n", picture->out);
}

/* Rectangles between begin and end, never thinner than a line, with a tooltip. */
static void __attribute__((format(printf, 9, 10)))
time_rect_put(FILE *out, const view *shown, const char *classes, const char *fill, int64_t begin,
              int64_t end, double y, double height, const char *format, ...) {
  if (end <= begin || !view_shows(shown, begin, end)) return;
  double x = x_at(shown, begin), width = x_at(shown, end) - x;
  rect_open(out, classes, fill, x, y, width > 0.6 ? width : 0.6, height);
  char text[256];
  va_list arguments;
  va_start(arguments, format);
  vsnprintf(text, sizeof text, format, arguments);
  va_end(arguments);
  title_put(out, "%s", text);
  fputs("</rect>\n", out);
}

/* A recovery's phases between y and y + height, each of classes; R number in tooltips. */
static void phase_rects_put(const drawing *picture, const view *shown, size_t number,
                            const char *classes, double y, double height) {
  const recovery *line = &picture->timeline->recoveries[number];
  recovery_layout layout;
  recovery_lay_out(line, &layout);
  char ms[32];
  for (size_t i = 0; i < PHASE_COUNT; i++) {
    ms_format(line->phase_ms[i], ms, sizeof ms);
    time_rect_put(picture->out, shown, classes, phase_kinds[i].colour, layout.begin[i],
                  layout.end[i], y, height, "R%zu %s: %s", number + 1, phase_kinds[i].name, ms);
  }
  ms_format((double)(layout.unaccounted_end - layout.unaccounted_begin) / NS_PER_MS, ms, sizeof ms);
  time_rect_put(picture->out, shown, "unaccounted", UNACCOUNTED_COLOUR, layout.unaccounted_begin,
                layout.unaccounted_end, y, height, "R%zu %s: %s", number + 1, UNACCOUNTED_NAME, ms);
}

static void process_spans_put(const drawing *picture, const view *shown, const lane *process,
                              double y, double half) {
  const keel__timeline *timeline = picture->timeline;
  for (size_t i = 0; i < timeline->span_count; i++) {
    const span *work = &timeline->spans[i];
    if (work->uid != process->uid) continue;
    time_rect_put(picture->out, shown, "span", span_kinds[work->kind].colour, work->begin_t_ns,
                  work->end_t_ns, y - half, 2 * half, "%s of uid %lld: %.3f ms",
                  span_kinds[work->kind].name, (long long)process->uid,
                  (double)(work->end_t_ns - work->begin_t_ns) / NS_PER_MS);
  }
}

/* Deaths, fences and faults of the process; with labels, a death says how next to it. */
static void lane_marks_put(const drawing *picture, const view *shown, const lane *process, double y,
                           bool labels) {
  const keel__timeline *timeline = picture->timeline;
  static const char *const kinds[] = {[MARK_DEATH] = "death",
                                      [MARK_FENCE] = "fence",
                                      [MARK_FAULT] = "fault injected",
                                      [MARK_RESUMED] = "training resumed"};
  for (size_t i = 0; i < timeline->mark_count; i++) {
    const mark *event = &timeline->marks[i];
    if (event->kind > MARK_RESUMED || event->subject != process->uid ||
        !view_shows(shown, event->t_ns, event->t_ns))
      continue;
    double x = x_at(shown, event->t_ns);
    fputs("<g>", picture->out);
    title_put(picture->out, "uid %lld, %s at %+.3f s: %s", (long long)process->uid,
              kinds[event->kind], seconds_in_job(picture, event->t_ns), event->text);
    if (event->kind == MARK_DEATH) cross_put(picture->out, x, y, 4.5);
    if (event->kind == MARK_FENCE) diamond_put(picture->out, x, y, 5);
    if (event->kind == MARK_FAULT) triangle_put(picture->out, "fault", x, y - 4, 3.5);
    if (event->kind == MARK_RESUMED) resumed_put(picture->out, x, y);
    fputs("</g>\n", picture->out);
    if (labels && event->kind == MARK_DEATH && x + 70 < shown->x0 + shown->width)
      text_put(picture->out, x + 7, y - 3, "death-text", "%s", event->text);
  }
}

static void lane_draw(const drawing *picture, const view *shown, const lane *process, double y,
                      double half, bool labels) {
  lifeline_put(picture, shown, process, y);
  for (size_t i = 0; i < picture->timeline->recovery_count; i++)
    if (took_part(process, life_of(picture, process), &picture->timeline->recoveries[i]))
      phase_rects_put(picture, shown, i, "phase-span", y - half, 2 * half);
  process_spans_put(picture, shown, process, y, half * 0.8);
  ticks_put(picture, shown, process, y, half * 0.55);
  lane_marks_put(picture, shown, process, y, labels);
}

/* ---- nodes: a header row (the node, its agent's lifetime) above the lanes of its processes */
static size_t node_lane_count(const drawing *picture, int64_t node) {
  size_t count = 0;
  for (size_t i = 0; i < picture->lane_count; i++) count += picture->order[i]->node == node;
  return count;
}

static double node_height(const drawing *picture, int64_t node) {
  return NODE_HEIGHT + (double)node_lane_count(picture, node) * LANE_HEIGHT;
}

static const node_info *node_find(const keel__timeline *timeline, int64_t node) {
  for (size_t i = 0; i < timeline->node_count; i++)
    if (timeline->nodes[i].node == node) return &timeline->nodes[i];
  return NULL;
}

static void agent_put(const drawing *picture, const node_info *agent, double y) {
  if (agent == NULL || agent->agent_begin_t_ns == NO_TIME) return;
  int64_t end = agent->agent_end_t_ns;
  if (end == NO_TIME) end = node_lost_t_ns(picture->timeline, agent->node, agent->agent_begin_t_ns);
  if (end == NO_TIME) end = timeline_end_t_ns(picture->timeline);
  fputs("<g>", picture->out);
  title_put(picture->out, "the agent of node %lld (pid %lld)", (long long)agent->node,
            (long long)agent->agent_pid);
  line_put(picture->out, "agent", x_at(&picture->whole, agent->agent_begin_t_ns), y,
           x_at(&picture->whole, end), y);
  fputs("</g>\n", picture->out);
}

static void node_header_put(const drawing *picture, int64_t node, double y) {
  const node_info *agent = node_find(picture->timeline, node);
  if (node < 0)
    text_put(picture->out, 8, y + 14, "node", "node ?");
  else
    text_put(picture->out, 8, y + 14, "node", "node %lld", (long long)node);
  if (agent != NULL && agent->agent_begin_t_ns != NO_TIME)
    text_put(picture->out, 70, y + 14, "small", "agent pid %lld", (long long)agent->agent_pid);
  agent_put(picture, agent, y + NODE_HEIGHT / 2);
}

/* A node's loss or fence: a line across its rows. */
static void node_marks_put(const drawing *picture, int64_t node, double top, double bottom) {
  const keel__timeline *timeline = picture->timeline;
  for (size_t i = 0; i < timeline->mark_count; i++) {
    const mark *event = &timeline->marks[i];
    bool lost = event->kind == MARK_NODE_LOST;
    if ((!lost && event->kind != MARK_NODE_FENCE) || event->subject != node) continue;
    double x = x_at(&picture->whole, event->t_ns);
    fputs("<g>", picture->out);
    title_put(picture->out, "node %lld %s at %+.3f s: %s", (long long)node,
              lost ? "lost" : "fenced", seconds_in_job(picture, event->t_ns), event->text);
    line_put(picture->out, lost ? "lost" : "node-fence", x, top, x, bottom);
    fputs("</g>\n", picture->out);
    text_put(picture->out, x + 4, top + 13, lost ? "death-text" : "small",
             lost ? "node lost" : "node fenced");
  }
}

static void node_draw(const drawing *picture, int64_t node, double y) {
  node_header_put(picture, node, y);
  double lane_y = y + NODE_HEIGHT + LANE_HEIGHT / 2;
  for (size_t i = 0; i < picture->lane_count; i++) {
    const lane *process = picture->order[i];
    if (process->node != node) continue;
    lane_label_put(picture, process, lane_y, "lane-label");
    lane_draw(picture, &picture->whole, process, lane_y, LANE_HEIGHT * 0.35, true);
    lane_y += LANE_HEIGHT;
  }
  node_marks_put(picture, node, y, y + node_height(picture, node));
}

/* The distinct nodes of the lanes and of the agents, in order, unknown (-1) last. */
static size_t nodes_list(const drawing *picture, int64_t *nodes) {
  size_t count = 0;
  for (size_t i = 0; i < picture->timeline->node_count; i++)
    nodes[count++] = picture->timeline->nodes[i].node;
  for (size_t i = 0; i < count; i++)
    for (size_t j = i + 1; j < count; j++)
      if (nodes[j] < nodes[i]) {
        int64_t swap = nodes[i];
        nodes[i] = nodes[j];
        nodes[j] = swap;
      }
  if (node_lane_count(picture, -1) > 0) nodes[count++] = -1;
  return count;
}

/* ---- axes */

/* 1, 2 or 5 times a power of ten: a step that cuts range into about count pieces. */
static double nice_step(double range, double count) {
  static const double factors[] = {1, 2, 5};
  double raw = range / count, power = pow(10, floor(log10(raw)));
  for (size_t i = 0; i < sizeof factors / sizeof factors[0]; i++)
    if (power * factors[i] >= raw) return power * factors[i];
  return 10 * power;
}

/* Grid lines from top to bottom and labels under bottom, in units of unit_ns from origin. */
static void axis_put(FILE *out, const view *shown, int64_t origin_ns, double unit_ns,
                     const char *caption, double top, double bottom) {
  double from = (double)(shown->t0_ns - origin_ns) / unit_ns;
  double to = (double)(shown->t1_ns - origin_ns) / unit_ns;
  double step = nice_step(to - from, shown->width / 90);
  int decimals = step >= 1 ? 0 : (int)ceil(-log10(step) - 1e-9);
  for (double k = ceil(from / step); k * step <= to; k++) {
    double x = x_at(shown, origin_ns + (int64_t)llround(k * step * unit_ns));
    line_put(out, "grid", x, top, x, bottom);
    line_put(out, "axis", x, bottom, x, bottom + 4);
    text_put(out, x, bottom + 15, "mid", "%.*f", decimals, k * step + 0.0);
  }
  line_put(out, "axis", shown->x0, bottom, shown->x0 + shown->width, bottom);
  text_put(out, shown->x0 + shown->width, bottom + 29, "end small", "%s", caption);
  fputc('\n', out);
}

/* ---- the whole job */

/* Above the lanes: R1, R2 .. at each recovery line, and each restart's number. */
static void markers_put(const drawing *picture, double y) {
  const keel__timeline *timeline = picture->timeline;
  double label_end = -1e9;
  for (size_t i = 0; i < timeline->recovery_count; i++) {
    const recovery *line = &timeline->recoveries[i];
    double x = x_at(&picture->whole, line->t_ns);
    fputs("<g>", picture->out);
    title_put(picture->out, "R%zu: recovery at %+.3f s, epoch %lld -> %lld, world %lld -> %lld",
              i + 1, seconds_in_job(picture, line->t_ns), (long long)line->old_epoch,
              (long long)line->new_epoch, (long long)line->old_world, (long long)line->new_world);
    triangle_put(picture->out, "marker", x, y + MARKER_HEIGHT - 1, 3);
    fputs("</g>\n", picture->out);
    if (x - 8 < label_end) continue;
    text_put(picture->out, x, y + 9, "mid small", "R%zu", i + 1);
    label_end = x + 8;
  }
  for (size_t i = 0; i < timeline->restart_count; i++)
    text_put(picture->out, x_at(&picture->whole, timeline->restarts[i].begin_t_ns) + 2, y + 9,
             "small", "restart %lld", (long long)timeline->restarts[i].number);
}

/* While the job restarts, nobody trains: a shade over every lane. */
static void restarts_put(const drawing *picture, const view *shown, double top, double bottom) {
  const keel__timeline *timeline = picture->timeline;
  for (size_t i = 0; i < timeline->restart_count; i++) {
    const restart *round = &timeline->restarts[i];
    int64_t end = round->end_t_ns != NO_TIME ? round->end_t_ns : timeline_end_t_ns(timeline);
    time_rect_put(picture->out, shown, "down", NULL, round->begin_t_ns, end, top, bottom - top,
                  "restart %lld: uid %lld failed (%s); the job was down %.1f ms",
                  (long long)round->number, (long long)round->failed_uid, round->reason,
                  (double)(end - round->begin_t_ns) / NS_PER_MS);
  }
}

static double timeline_draw(const drawing *picture, double y) {
  int64_t nodes[MAX_NODES + 1];
  size_t node_count = nodes_list(picture, nodes);
  markers_put(picture, y);
  double top = y + MARKER_HEIGHT, bottom = top;
  for (size_t i = 0; i < node_count; i++) {
    double height = node_height(picture, nodes[i]);
    if (i % 2 == 0) rect_open(picture->out, "band", NULL, 0, bottom, WIDTH, height);
    if (i % 2 == 0) fputs("</rect>\n", picture->out);
    bottom += height;
  }
  axis_put(picture->out, &picture->whole, picture->timeline->start_t_ns, NS_PER_S,
           "seconds since job_start", top, bottom);
  restarts_put(picture, &picture->whole, top, bottom);
  for (size_t i = 0; i < node_count; i++) {
    node_draw(picture, nodes[i], top);
    top += node_height(picture, nodes[i]);
  }
  return bottom + AXIS_HEIGHT;
}

/* ---- the legend */
typedef enum swatch_kind {
  SWATCH_FILL,
  SWATCH_TICKS,
  SWATCH_DEATH,
  SWATCH_FENCE,
  SWATCH_FAULT,
  SWATCH_NODE_LOST,
  SWATCH_NODE_FENCE,
  SWATCH_LIFE,
  SWATCH_IDLE,
  SWATCH_EXIT_OK,
  SWATCH_EXIT_LEFT,
  SWATCH_EXIT_IDLE,
  SWATCH_DOWN,
  SWATCH_MARKER,
  SWATCH_RESUMED,
} swatch_kind;

/* A 16 px wide sample centred on (x + 8, y). */
static void swatch_put(FILE *out, swatch_kind kind, const char *colour, double x, double y) {
  double mid = x + 8;
  if (kind == SWATCH_FILL) rect_open(out, "swatch", colour, x, y - 5, 16, 10);
  if (kind == SWATCH_DOWN) rect_open(out, "down", NULL, x, y - 7, 16, 14);
  if (kind == SWATCH_TICKS)
    fprintf(out, "<path class=\"ticks\" d=\"M%.1f %.1fv8m4 -8v8m4 -8v8m4 -8v8\"/>", x + 2, y - 4);
  if (kind == SWATCH_DEATH) cross_put(out, mid, y, 4.5);
  if (kind == SWATCH_FENCE) diamond_put(out, mid, y, 5);
  if (kind == SWATCH_FAULT) triangle_put(out, "fault", mid, y + 3, 3.5);
  if (kind == SWATCH_MARKER) triangle_put(out, "marker", mid, y + 4, 3);
  if (kind == SWATCH_NODE_LOST) line_put(out, "lost", mid, y - 7, mid, y + 7);
  if (kind == SWATCH_NODE_FENCE) line_put(out, "node-fence", mid, y - 7, mid, y + 7);
  if (kind == SWATCH_LIFE) line_put(out, "life", x, y, x + 16, y);
  if (kind == SWATCH_IDLE) line_put(out, "idle", x, y, x + 16, y);
  if (kind == SWATCH_EXIT_OK) end_cap_put(out, END_OK, mid, y);
  if (kind == SWATCH_EXIT_LEFT) end_cap_put(out, END_LEFT, mid, y);
  if (kind == SWATCH_EXIT_IDLE) end_cap_put(out, END_IDLE, mid, y);
  if (kind == SWATCH_RESUMED) resumed_put(out, mid, y);
  if (kind == SWATCH_FILL || kind == SWATCH_DOWN) fputs("</rect>", out);
}

typedef struct legend_item {
  swatch_kind kind;
  const char *colour, *text;
} legend_item;

static const legend_item marks_legend[] = {
    {SWATCH_TICKS, NULL, "step (a progress line)"},
    {SWATCH_DEATH, NULL, "death: a signal or an exit code"},
    {SWATCH_FENCE, NULL, "process fenced"},
    {SWATCH_FAULT, NULL, "fault injected (KEEL_FAULT)"},
    {SWATCH_NODE_LOST, NULL, "node lost"},
    {SWATCH_NODE_FENCE, NULL, "node fenced by its agent"},
    {SWATCH_LIFE, NULL, "process alive"},
    {SWATCH_IDLE, NULL, "spare or joiner waiting for a rank"},
    {SWATCH_EXIT_OK, NULL, "exit 0"},
    {SWATCH_EXIT_LEFT, NULL, "saved and left (exit 75, 76, 77)"},
    {SWATCH_EXIT_IDLE, NULL, "stopped without a rank"},
    {SWATCH_DOWN, NULL, "job down for a restart"},
    {SWATCH_RESUMED, NULL, "training resumed (rank 0's resumed line)"},
    {SWATCH_MARKER, NULL, "recovery line (R1, R2 ..: zoomed below)"},
};

/* One item after another, wrapping at the right edge; returns the y of the last row. */
static double legend_items_put(FILE *out, const legend_item *items, size_t count, double y) {
  double x = PLOT_X;
  for (size_t i = 0; i < count; i++) {
    double width = 26 + CHAR_WIDTH_PX * (double)strlen(items[i].text) + 14;
    if (x + width > WIDTH - 10 && x > PLOT_X) {
      x = PLOT_X;
      y += 18;
    }
    fputs("<g class=\"legend-item\">", out);
    swatch_put(out, items[i].kind, items[i].colour, x, y);
    text_put(out, x + 22, y + 4, NULL, "%s", items[i].text);
    fputs("</g>\n", out);
    x += width;
  }
  return y;
}

static double legend_draw(const drawing *picture, double y) {
  legend_item phases[PHASE_COUNT + 1 + SPAN_KIND_COUNT];
  size_t count = 0;
  for (size_t i = 0; i < PHASE_COUNT; i++)
    phases[count++] = (legend_item){SWATCH_FILL, phase_kinds[i].colour, phase_kinds[i].name};
  phases[count++] = (legend_item){SWATCH_FILL, UNACCOUNTED_COLOUR, UNACCOUNTED_NAME};
  for (size_t i = 0; i < SPAN_KIND_COUNT; i++)
    phases[count++] = (legend_item){SWATCH_FILL, span_kinds[i].colour, span_kinds[i].name};
  fputs("<g class=\"legend\">\n", picture->out);
  text_put(picture->out, 8, y + 4, "heading", "Spans");
  y = legend_items_put(picture->out, phases, count, y) + 24;
  text_put(picture->out, 8, y + 4, "heading", "Marks");
  y = legend_items_put(picture->out, marks_legend, sizeof marks_legend / sizeof marks_legend[0], y);
  fputs("</g>\n", picture->out);
  return y + 30;
}

/* ---- panels that zoom in on a recovery or a restart, on a time scale of their own */
typedef struct zoom {
  view shown;
  int64_t origin_ns; /* the axis counts ms from here: the first death when known */
  const char *caption;
  const recovery *line; /* a recovery's panel has its phases as a bar above the lanes */
  const restart *round; /* or it is a restart's */
  size_t number;
  const lane *lanes[ZOOM_MAX_LANES];
  size_t lane_count, left_out;
} zoom;

/* From begin to end, with a margin. */
static view zoom_view(int64_t begin, int64_t end) {
  int64_t margin = (end - begin) / 12 + 100000;
  return (view){.t0_ns = begin - margin, .t1_ns = end + margin, .x0 = PLOT_X, .width = PLOT_WIDTH};
}

#define PRIORITY_NONE 3

/* How much a panel needs a process's lane, 0 most. A recovery's wants the failed and the one
 * that measured the phases, then the newcomers, then the other members; a restart's, the
 * failed one, then those that ended or started in its window, then the others alive in it. */
static int zoom_priority(const drawing *picture, const zoom *panel, const lane *process) {
  const recovery *line = panel->line;
  if (line != NULL) {
    if (uid_listed(line->failed, line->failed_count, process->uid)) return 0;
    if (!took_part(process, life_of(picture, process), line)) return PRIORITY_NONE;
    if (process->uid == line->reporter) return 0;
    return process->min_epoch == line->new_epoch ? 1 : 2;
  }
  int64_t begin = life_of(picture, process)->begin_t_ns, end = life_of(picture, process)->end_t_ns;
  if (!view_shows(&panel->shown, begin, end)) return PRIORITY_NONE;
  if (process->uid == panel->round->failed_uid) return 0;
  return view_shows(&panel->shown, begin, begin) || view_shows(&panel->shown, end, end) ? 1 : 2;
}

/* The lanes a panel shows, at most ZOOM_MAX_LANES of them, in the timeline's order. */
static void zoom_lanes_pick(const drawing *picture, zoom *panel) {
  bool picked[MAX_LANES] = {false};
  size_t wanted = 0, count = 0;
  for (int priority = 0; priority < PRIORITY_NONE; priority++)
    for (size_t i = 0; i < picture->lane_count; i++) {
      if (zoom_priority(picture, panel, picture->order[i]) != priority) continue;
      wanted++;
      if (count < ZOOM_MAX_LANES) picked[i] = true;
      count += picked[i];
    }
  for (size_t i = 0; i < picture->lane_count; i++)
    if (picked[i]) panel->lanes[panel->lane_count++] = picture->order[i];
  panel->left_out = wanted - panel->lane_count;
}

/* "uid 2, SIGKILL" or "node 2 lost" */
static void death_format(const mark *death, char *text, size_t capacity) {
  if (death->kind == MARK_NODE_LOST)
    snprintf(text, capacity, "node %lld lost", (long long)death->subject);
  else
    snprintf(text, capacity, "uid %lld, %s", (long long)death->subject, death->text);
}

/* "detect 8.88 ms", "revoke 0.00 ms" ..: the figures under the bar, in its colours. */
static double zoom_figures_put(const drawing *picture, const recovery *line, double y) {
  legend_item items[PHASE_COUNT];
  char texts[PHASE_COUNT][48];
  double sum = 0;
  for (size_t i = 0; i < PHASE_COUNT; i++) {
    char ms[32];
    ms_format(line->phase_ms[i], ms, sizeof ms);
    snprintf(texts[i], sizeof texts[i], "%s %s", phase_kinds[i].name, ms);
    items[i] = (legend_item){SWATCH_FILL, phase_kinds[i].colour, texts[i]};
    sum += line->phase_ms[i];
  }
  y = legend_items_put(picture->out, items, PHASE_COUNT, y);
  recovery_layout layout;
  recovery_lay_out(line, &layout);
  char ms[32], without_detect[32], between[32];
  ms_format(sum, ms, sizeof ms);
  ms_format(sum - line->phase_ms[PHASE_DETECT], without_detect, sizeof without_detect);
  ms_format((double)(layout.unaccounted_end - layout.unaccounted_begin) / NS_PER_MS, between,
            sizeof between);
  text_put(picture->out, PLOT_X, y + 20, "small",
           "sum %s; without detect (the line's total_ms) %s; %s: %s", ms, without_detect,
           UNACCOUNTED_NAME, between);
  return y + 36;
}

/* The phases as one bar, as the process that wrote the line measured them. */
static void zoom_bar_put(const drawing *picture, const zoom *panel, double y) {
  text_put(picture->out, 24, y + 4, "node", "phases (uid %lld)", (long long)panel->line->reporter);
  fprintf(picture->out, "<g class=\"breakdown\" id=\"recovery-%zu\">\n", panel->number + 1);
  phase_rects_put(picture, &panel->shown, panel->number, "phase-bar", y - 7, 14);
  recovery_layout layout;
  recovery_lay_out(panel->line, &layout);
  for (size_t i = 0; i < PHASE_COUNT; i++) {
    double x = x_at(&panel->shown, layout.begin[i]);
    double width = x_at(&panel->shown, layout.end[i]) - x;
    if (width > CHAR_WIDTH_PX * 0.85 * (double)strlen(phase_kinds[i].name) + 6)
      text_put(picture->out, x + width / 2, y + 3, "mid on-phase", "%s", phase_kinds[i].name);
  }
  fputs("</g>\n", picture->out);
}

/* Axis, bar and lanes from top; returns the y under the axis. */
static double zoom_body_draw(const drawing *picture, const zoom *panel, double top) {
  double lanes_top = top + (panel->line != NULL ? 24 : 4);
  double rows = (double)panel->lane_count + (panel->left_out > 0);
  double bottom = lanes_top + rows * ZOOM_LANE_HEIGHT + 4;
  axis_put(picture->out, &panel->shown, panel->origin_ns, NS_PER_MS, panel->caption, top, bottom);
  restarts_put(picture, &panel->shown, top, bottom);
  if (panel->line != NULL) zoom_bar_put(picture, panel, top + 12);
  for (size_t i = 0; i < panel->lane_count; i++) {
    double lane_y = lanes_top + ((double)i + 0.5) * ZOOM_LANE_HEIGHT;
    lane_label_put(picture, panel->lanes[i], lane_y, "zoom-label");
    lane_draw(picture, &panel->shown, panel->lanes[i], lane_y, ZOOM_LANE_HEIGHT * 0.35, false);
  }
  if (panel->left_out > 0)
    text_put(picture->out, 24, lanes_top + rows * ZOOM_LANE_HEIGHT - 4, "small",
             "and %zu more (on the timeline above)", panel->left_out);
  return bottom + AXIS_HEIGHT;
}

static void recovery_heading_put(const drawing *picture, const zoom *panel, const mark *death,
                                 double y) {
  const recovery *line = panel->line;
  char failed[256] = "none (a grow)";
  int used = 0;
  for (size_t i = 0; i < line->failed_count && used < (int)sizeof failed - 24; i++)
    used += snprintf(failed + used, sizeof failed - (size_t)used, i ? ", %lld" : "%lld",
                     (long long)line->failed[i]);
  text_put(picture->out, 8, y, "heading",
           "R%zu at %+.3f s: %s, epoch %lld → %lld, world %lld → %lld, failed uids: %s",
           panel->number + 1, seconds_in_job(picture, line->t_ns),
           line->policy[0] ? line->policy : "?", (long long)line->old_epoch,
           (long long)line->new_epoch, (long long)line->old_world, (long long)line->new_world,
           failed);
  if (death == NULL) return;
  char how[128];
  death_format(death, how, sizeof how);
  text_put(picture->out, 8, y + 16, "sub",
           "from the first death (%s, at %+.3f s) to the first collective of epoch %lld: %.1f ms",
           how, seconds_in_job(picture, death->t_ns), (long long)line->new_epoch,
           (double)(line->t_ns - death->t_ns) / NS_PER_MS);
}

static double recovery_zoom_draw(const drawing *picture, size_t number, double y) {
  const recovery *line = &picture->timeline->recoveries[number];
  const mark *death = NULL;
  int64_t death_t_ns =
      first_death_t_ns(picture->timeline, line->failed, line->failed_count, line->t_ns, &death);
  recovery_layout layout;
  recovery_lay_out(line, &layout);
  int64_t begin = layout.begin[PHASE_DETECT];
  if (death != NULL && death_t_ns < begin) begin = death_t_ns;
  int64_t end = layout.end[PHASE_REDO] > line->t_ns ? layout.end[PHASE_REDO] : line->t_ns;
  zoom panel = {.shown = zoom_view(begin, end),
                .origin_ns = death != NULL ? death_t_ns : layout.begin[PHASE_DETECT],
                .caption = death != NULL ? "ms after the first death"
                                         : "ms after the failed collective began",
                .line = line,
                .number = number};
  zoom_lanes_pick(picture, &panel);
  recovery_heading_put(picture, &panel, death, y);
  y = zoom_body_draw(picture, &panel, y + 26);
  return zoom_figures_put(picture, line, y + 4);
}

/* A restart, from its first death to the resumed line after it. */
static double restart_zoom_draw(const drawing *picture, size_t number, double y) {
  const restart *round = &picture->timeline->restarts[number];
  const mark *death = NULL;
  int64_t begin =
      first_death_t_ns(picture->timeline, &round->failed_uid, 1, round->begin_t_ns, &death);
  if (death == NULL) begin = round->begin_t_ns;
  int64_t started = round->end_t_ns != NO_TIME ? round->end_t_ns : round->begin_t_ns;
  int64_t end = resumed_t_ns(picture->timeline, started);
  if (end == NO_TIME) end = started + (int64_t)NS_PER_MS;
  zoom panel = {.shown = zoom_view(begin, end),
                .origin_ns = begin,
                .caption = death != NULL ? "ms after the first death" : "ms after restart_begin",
                .round = round};
  zoom_lanes_pick(picture, &panel);
  char down[64] = "the job did not start again";
  if (round->end_t_ns != NO_TIME)
    snprintf(down, sizeof down, "down %.1f ms",
             (double)(round->end_t_ns - round->begin_t_ns) / NS_PER_MS);
  text_put(picture->out, 8, y, "heading", "restart %lld at %+.3f s: uid %lld failed (%s); %s",
           (long long)round->number, seconds_in_job(picture, round->begin_t_ns),
           (long long)round->failed_uid, round->reason, down);
  text_put(picture->out, 8, y + 16, "sub", "%s to the resumed line: %.1f ms",
           death != NULL ? "from the death" : "from restart_begin",
           (double)(end - begin) / NS_PER_MS);
  return zoom_body_draw(picture, &panel, y + 26) + 8;
}

/* ---- the page */
static const char *plural(int64_t count, const char *one, const char *many) {
  return count == 1 ? one : many;
}

static double title_draw(const drawing *picture, double y) {
  const keel__timeline *timeline = picture->timeline;
  const char *program = strrchr(timeline->program, '/');
  program = program != NULL ? program + 1 : timeline->program;
  text_put(picture->out, 8, y, "title", "keel job %s: world %lld, on failure %s",
           timeline->job_id[0] ? timeline->job_id : "?", (long long)timeline->world,
           timeline->policy[0] ? timeline->policy : "?");
  char ending[96] = "no job_end (still running, or the launcher was killed)";
  if (timeline->ended)
    snprintf(ending, sizeof ending, "%.3f s, exit code %lld", timeline->seconds,
             (long long)timeline->code);
  text_put(picture->out, 8, y + 20, "sub",
           "%s · %lld %s, %lld %s, %zu %s, failure domain %s · %s · %zu %s, %zu %s",
           program[0] ? program : "?", (long long)timeline->world,
           plural(timeline->world, "worker", "workers"), (long long)timeline->spares,
           plural(timeline->spares, "spare", "spares"), timeline->node_count,
           plural((int64_t)timeline->node_count, "node", "nodes"),
           timeline->domain[0] ? timeline->domain : "?", ending, timeline->recovery_count,
           plural((int64_t)timeline->recovery_count, "recovery", "recoveries"),
           timeline->restart_count,
           plural((int64_t)timeline->restart_count, "restart", "restarts"));
  return y + 36;
}

static double notes_draw(const drawing *picture, double y, size_t skipped_lines) {
  const keel__timeline *timeline = picture->timeline;
  text_put(picture->out, 8, y, "small",
           "%zu progress lines; where ticks would be closer than %.0f px, one stands for several. "
           "Hover a mark or a span for its figures.",
           timeline->progress_count, TICK_MIN_GAP_PX);
  if (timeline->recovery_count > MAX_ZOOMS || timeline->restart_count > MAX_ZOOMS)
    text_put(picture->out, 8, y += 14, "small",
             "Recoveries and restarts after the first %d of each are drawn on the timeline only.",
             MAX_ZOOMS);
  if (skipped_lines > 0)
    text_put(picture->out, 8, y += 14, "small", "lines skipped (not a whole JSON event): %zu",
             skipped_lines);
  if (timeline->not_kept > 0)
    text_put(picture->out, 8, y += 14, "small", "%zu events beyond the drawing's limits left out.",
             timeline->not_kept);
  return y + 12;
}

static int lane_order_compare(const void *left_p, const void *right_p) {
  const lane *left = *(const lane *const *)left_p, *right = *(const lane *const *)right_p;
  /* An unknown node (-1) sorts last. */
  uint64_t left_node = (uint64_t)left->node, right_node = (uint64_t)right->node;
  if (left_node != right_node) return left_node < right_node ? -1 : 1;
  return left->uid < right->uid ? -1 : left->uid > right->uid;
}

/* A counting sort of the progress lines by lane, which keeps each lane's in the file's order.
 * False when out of memory. */
static bool ticks_sort(drawing *picture) {
  const keel__timeline *timeline = picture->timeline;
  picture->ticks = malloc((timeline->progress_count + 1) * sizeof *picture->ticks);
  if (picture->ticks == NULL) return false;
  for (size_t i = 0; i < timeline->progress_count; i++)
    picture->ticks_first[timeline->progress[i].lane + 1]++;
  for (size_t i = 0; i < timeline->lane_count; i++)
    picture->ticks_first[i + 1] += picture->ticks_first[i];
  size_t next[MAX_LANES];
  memcpy(next, picture->ticks_first, sizeof next);
  for (size_t i = 0; i < timeline->progress_count; i++)
    picture->ticks[next[timeline->progress[i].lane]++] = timeline->progress[i];
  return true;
}

static bool drawing_prepare(drawing *picture, const keel__timeline *timeline) {
  picture->timeline = timeline;
  int64_t end = timeline_end_t_ns(timeline);
  if (end <= timeline->start_t_ns) end = timeline->start_t_ns + (int64_t)NS_PER_MS;
  picture->whole =
      (view){.t0_ns = timeline->start_t_ns, .t1_ns = end, .x0 = PLOT_X, .width = PLOT_WIDTH};
  for (size_t i = 0; i < timeline->lane_count; i++) picture->order[i] = &timeline->lanes[i];
  picture->lane_count = timeline->lane_count;
  qsort(picture->order, picture->lane_count, sizeof picture->order[0], lane_order_compare);
  for (size_t i = 0; i < timeline->lane_count; i++)
    picture->lifetimes[i] = lifetime_of(timeline, &timeline->lanes[i]);
  return ticks_sort(picture);
}

/* The drawing's body; returns its height. */
static double body_draw(const drawing *picture, size_t skipped_lines) {
  double y = title_draw(picture, 28);
  y = timeline_draw(picture, y + 8);
  y = legend_draw(picture, y + 8);
  for (size_t i = 0; i < picture->timeline->recovery_count && i < MAX_ZOOMS; i++)
    y = recovery_zoom_draw(picture, i, y + 12);
  for (size_t i = 0; i < picture->timeline->restart_count && i < MAX_ZOOMS; i++)
    y = restart_zoom_draw(picture, i, y + 12);
  return notes_draw(picture, y + 8, skipped_lines);
}

static bool svg_file_write(const char *path, const char *body, size_t size, double height) {
  FILE *file = fopen(path, "we");
  if (file == NULL) return false;
  fprintf(file,
          "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
          "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
          "viewBox=\"0 0 %.0f %.0f\">\n<style>%s</style>\n"
          "<rect width=\"100%%\" height=\"100%%\" fill=\"#fff\"/>\n",
          WIDTH, ceil(height), WIDTH, ceil(height), style_sheet);
  fwrite(body, 1, size, file);
  fputs("</svg>\n", file);
  bool written = !ferror(file);
  int write_errno = errno;
  if (fclose(file) != 0)
    written = false;
  else if (!written)
    errno = write_errno;
  if (written) return true;
  /* Half a drawing is no drawing: the error says why there is none. */
  int saved_errno = errno;
  unlink(path);
  errno = saved_errno;
  return false;
}

int keel__timeline_svg_write(const keel__timeline *timeline, const char *path,
                             size_t skipped_lines) {
  if (!timeline->started) {
    fprintf(stderr,
            "keel report: no job_start event in the events file, so no timeline to draw (the "
            "file is cut, or not from keel run --events)\n");
    return KEEL__EXIT_USAGE;
  }
  drawing *picture = calloc(1, sizeof *picture);
  char *body = NULL;
  size_t size = 0;
  FILE *out = NULL;
  if (picture == NULL || !drawing_prepare(picture, timeline) ||
      (out = open_memstream(&body, &size)) == NULL) {
    fprintf(stderr, "keel report: out of memory drawing the timeline\n");
    if (picture != NULL) free(picture->ticks);
    free(picture);
    return KEEL__EXIT_FAILURE;
  }
  picture->out = out;
  double height = body_draw(picture, skipped_lines);
  bool drawn = fclose(out) == 0;
  int exit_code = 0;
  if (!drawn || !svg_file_write(path, body, size, height)) {
    fprintf(stderr, "keel report: cannot write the timeline to %s: %s\n", path,
            drawn ? strerror(errno) : "out of memory");
    exit_code = KEEL__EXIT_FAILURE;
  }
  free(body);
  free(picture->ticks);
  free(picture);
  return exit_code;
}
