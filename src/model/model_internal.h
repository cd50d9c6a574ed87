/* Private to src/model: the events of one job's restarts (user-level JIT) that measured.c
 * scans and restart.c puts together into keel_model_restart records. Bounded tables, kept
 * until the job ends; a time of -1 means the line did not give it. And the formulas' shared
 * check of their inputs. */
#ifndef KEEL_MODEL_INTERNAL_H
#define KEEL_MODEL_INTERNAL_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>

#include "keel/model.h"

/* Processes are looked up by uid in a table indexed by uid; uids past it are not kept. */
#define KEEL__MODEL_UID_MAXIMUM 4096
#define KEEL__MODEL_RESTART_MAXIMUM 1024
/* jit_save and jit_restore lines: one per rank per restart. */
#define KEEL__MODEL_RANK_EVENT_MAXIMUM 8192

/* A time or a size a formula takes: finite and not negative (NaN is neither). */
static inline bool keel__model_is_cost(double value) { return isfinite(value) && value >= 0.0; }

/* A worker that leaves because the job restarts exits with this code (KEEL_EXIT_RESTART of
 * include/keel/comm.h, a layer above this one): it saved its state, it did not fail. */
#define KEEL__MODEL_EXIT_RESTART 75

/* When a process died, as the launcher's exit line and an injected fault's line say. */
typedef struct keel__death_mark {
  int64_t exit_t_ns;
  int64_t fault_t_ns;
  bool exit_failed; /* by a signal or a code other than 0 and KEEL__MODEL_EXIT_RESTART */
} keel__death_mark;

/* restart_begin and restart lines of one restart number. */
typedef struct keel__restart_mark {
  int64_t restart;
  int64_t failed_uid;
  char reason[32];
  int64_t begin_t_ns;
  int64_t spawn_t_ns;
  int64_t first_uid;
  int64_t world;
} keel__restart_mark;

typedef struct keel__save_mark {
  int64_t t_ns;        /* when the save ended */
  int64_t t_failed_ns; /* when the rank's collective failed */
  int64_t step;
  uint64_t bytes;
  double save_ms;
  bool ok;
} keel__save_mark;

typedef struct keel__restore_mark {
  int64_t restart;
  int64_t t_ns;
  int64_t step; /* -1 unless ok */
  double restore_ms;
  bool ok;
} keel__restore_mark;

typedef struct keel__resumed_mark {
  int64_t t_ns;
  bool in_process;
} keel__resumed_mark;

typedef struct keel__restart_log {
  keel__death_mark deaths[KEEL__MODEL_UID_MAXIMUM];
  keel__restart_mark restarts[KEEL__MODEL_RESTART_MAXIMUM];
  keel__save_mark saves[KEEL__MODEL_RANK_EVENT_MAXIMUM];
  keel__restore_mark restores[KEEL__MODEL_RANK_EVENT_MAXIMUM];
  keel__resumed_mark resumed[KEEL__MODEL_RESTART_MAXIMUM];
  size_t restart_count, save_count, restore_count, resumed_count;
} keel__restart_log;

/* Forgets every record: a new job numbers its restarts and uids afresh. */
void keel__restart_log_clear(keel__restart_log *log);

/* The record of restart number `restart`, made (all times -1) when it is new; NULL when the
 * table is full. */
keel__restart_mark *keel__restart_log_mark(keel__restart_log *log, int64_t restart);

/* Puts together the log's index-th restart (in the order the file named them). Its
 * incarnation's events are those after the previous restart spawned its workers and by this
 * one's spawn: its saves, and its death, the first failed exit or injected fault among them
 * (the launcher may name a healthy worker that saved and left before the failed one was
 * reaped), else the named process's exit. Its restores are those that name its number, its
 * resumed line the first of a restart after its spawn and before the next restart began. */
void keel__restart_assemble(const keel__restart_log *log, size_t index,
                            keel_model_restart *restart_p);

#endif
