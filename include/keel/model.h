/* keel model: the analytical model of wasted GPU time of the JIT checkpointing paper (§5):
 * periodic checkpoints at the optimal or a given interval (eqs. 1-6), user-level JIT (eq. 7)
 * and in-process JIT (eq. 8); and what a keel events file says about o, r and m. Pure
 * arithmetic on core only: nothing here blocks, allocates on the formula path or keeps state. */
#ifndef KEEL_MODEL_H
#define KEEL_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "keel/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The paper's inputs, in SI units (seconds). Times are per GPU; N multiplies them. */
typedef struct keel_model_params {
  double failure_rate;         /* f: failures per GPU per second (2 a day on 1000 GPUs: 2.3e-8) */
  double gpu_count;            /* N: GPUs in the job, >= 1 (need not be whole, for sweeps) */
  double checkpoint_cost_s;    /* o: time one checkpoint stalls a GPU */
  double restart_cost_s;       /* r: fixed cost of one recovery per GPU (restore, init) */
  double minibatch_s;          /* m: one minibatch; JIT redoes m/2 of it on average */
  double jit_overhead;         /* o_jit: JIT's steady-state cost, a fraction of time (eq. 7, 8) */
  double inprocess_recovery_s; /* fixed cost of an in-process recovery; 0 is eq. 8 as printed */
} keel_model_params;

/* One policy's waste per GPU per second of useful work, split into the equations' terms.
 * Sum of terms = wasted_per_time (w, eq. 5); wasted_fraction = w / (1 + w) (w_f, eq. 6). */
typedef struct keel_model_result {
  double interval_s;           /* mean time between checkpoints; INFINITY when none is written */
  double checkpoints_per_hour; /* 3600 / interval_s: the paper's c* for the periodic optimum */
  double checkpoint_term;      /* c·o (periodic) or f·o (user-level JIT: one save per failure) */
  double overhead_term;        /* o_jit (JIT policies), 0 for periodic */
  double restart_term;         /* N·f·r (in-process JIT: N·f·inprocess_recovery_s) */
  double redo_term;            /* N·f/(2c) (periodic) or N·f·m/2 (JIT) */
  double wasted_per_time;      /* w: GPU-seconds wasted per GPU-second of useful work */
  double wasted_fraction;      /* w_f: share of all GPU time that is wasted */
} keel_model_result;

/* KEEL_OK when every field is finite, N >= 1, f > 0 and the costs are >= 0; KEEL_EINVAL
 * otherwise (NaN, infinity, negative, N < 1, f = 0: no failure makes every interval
 * "optimal"). Each function below checks this first and writes nothing on error. */
keel_status keel_model_params_check(const keel_model_params *params);

/* The optimal periodic checkpoint frequency c* = sqrt(N·f / 2o), eq. 3, in checkpoints per
 * second (the paper prints it per hour: multiply by 3600; the interval is 1/c*).
 * KEEL_EINVAL also when o = 0 (free checkpoints have no optimum: c* is infinite). */
keel_status keel_model_optimal_frequency(const keel_model_params *params, double *per_second_p);

/* Periodic checkpoints every interval_s seconds: eq. 1 divided by N·t, w = c·o + N·f·r +
 * N·f/(2c) with c = 1/interval_s. KEEL_EINVAL for an interval that is not finite and > 0. */
keel_status keel_model_periodic_at(const keel_model_params *params, double interval_s,
                                   keel_model_result *result_p);

/* Periodic checkpoints at c* (eqs. 3-6): w* = 2·sqrt(N·f·o/2) + N·f·r. KEEL_EINVAL when o = 0. */
keel_status keel_model_periodic_optimal(const keel_model_params *params,
                                        keel_model_result *result_p);

/* User-level JIT (eq. 7): w = f·o + o_jit + N·f·r + N·f·m/2; one checkpoint per job failure,
 * so interval_s is the job's mean time between failures 1/(N·f). */
keel_status keel_model_jit_user(const keel_model_params *params, keel_model_result *result_p);

/* In-process ("transparent", transient-error) JIT (eq. 8): w = o_jit + N·f·m/2, plus
 * N·f·inprocess_recovery_s when that field is set (the paper takes it as negligible; keel's
 * revoke/agree/rebuild is measurable). No checkpoint is written: interval_s is INFINITY. */
keel_status keel_model_jit_inprocess(const keel_model_params *params, keel_model_result *result_p);

/* ---- what a run measured: keel events files (docs/RUNTIME.md), one JSON object a line. */
typedef struct keel_model_measured {
  size_t lines;                /* lines read */
  size_t skipped_lines;        /* malformed, too long, or with fields out of range */
  size_t recoveries;           /* distinct recoveries (by new_epoch; the slowest line kept) */
  size_t state_recoveries;     /* of those, the ones that transferred state (> 0 ms) */
  double checkpoint_cost_s;    /* o: mean state_transfer over state_recoveries */
  double restart_cost_s;       /* r: mean detect + revoke + agree + rebuild over recoveries */
  double inprocess_recovery_s; /* mean detect..rebuild + state_transfer over recoveries */
  double redo_s;               /* mean redo over recoveries (the redone minibatch part) */
  size_t minibatch_samples;    /* steps covered by consecutive progress lines */
  double minibatch_s;          /* m: their time over their steps */
  size_t faults;               /* "fault" lines (injected faults) */
  size_t failed_exits;         /* "exit" lines with a signal or a non-zero code */
  size_t redo_recoveries;      /* recoveries whose lines give redo_minibatches (in-process JIT) */
  double recovery_redo_minibatches; /* its mean: minibatches redone per in-process recovery */
  /* Job restarts (user-level JIT, keel_model_restart), one per failure: */
  size_t restarts;                 /* restarts put together (restart_begin or restart lines) */
  size_t saved_restarts;           /* of those, the ones with a jit_save line */
  double jit_save_s;               /* o: mean over them of the slowest rank's save */
  size_t costed_restarts;          /* the ones whose restart_cost_ms is known */
  double jit_restart_cost_s;       /* r: mean restart_cost_ms over them */
  size_t redo_restarts;            /* the ones whose redo_minibatches is known */
  double restart_redo_minibatches; /* its mean: minibatches redone per restart */
  size_t started_over;             /* restarts that restored no snapshot (the job began again) */
  /* In-memory checkpoints (--ckpt mem, docs/MEMORY.md), for keel_model_wasted_per_failure: */
  size_t mem_saves;             /* mem_save lines (a rank's first save and every 50th) */
  uint64_t mem_state_bytes;     /* one rank's state: the largest bytes of mem_save and
                                   mem_restore lines */
  double mem_save_s;            /* mean save_ms over the mem_save lines: the copy */
  double mem_wait_s;            /* mean wait_ms over them: the commit waiting for peers */
  int64_t mem_every_steps;      /* E: steps per snapshot, from two mem_save lines of one
                                   uid (steps over saves between them); 0: not told */
  size_t memory_restores;       /* mem_restore lines from memory ("local", "node-<i>") */
  double memory_restore_s;      /* their mean restore_ms */
  double memory_restore_bytes;  /* their mean bytes */
  size_t disk_restores;         /* mem_restore lines from "persistent" */
  double disk_restore_s;        /* their mean restore_ms */
  double disk_read_bytes_per_s; /* their bytes over their time; 0 when that time is 0 */
  size_t mem_services;          /* mem_service_end lines (one per node's agent) */
  uint64_t persisted_bytes;     /* bytes they wrote to the persistent tier, summed */
  double persist_s;             /* the time those writes took, summed: the write speed */
} keel_model_measured;

/* One restart of the whole job (user-level JIT: the healthy ranks save, the launcher starts
 * every worker again, they restore and redo at most one minibatch), put together from its
 * events (docs/RUNTIME.md: the failed process's exit or fault line, jit_save, restart_begin,
 * restart, jit_restore, resumed), split like the JIT paper's Table 7. Spans are in ms, NAN
 * where an event that bounds them is missing or the events disagree (a negative span). The
 * spans may overlap (the launcher may begin the restart while healthy ranks still save), so
 * they need not add up to total_ms. */
typedef struct keel_model_restart {
  int64_t restart;           /* its number in the job, from 1 */
  int64_t failed_uid;        /* the process whose failure caused it; -1: not named */
  char reason[32];           /* how it failed ("SIGKILL"), as restart_begin says; may be empty */
  int64_t begin_t_ns;        /* restart_begin's t_ns (CLOCK_MONOTONIC); -1: no such line */
  int64_t first_uid;         /* the respawned workers are uids first_uid.. (-1: no restart line) */
  int64_t world;             /* how many were respawned; -1: no restart line */
  double detect_ms;          /* the failed process's death -> the first failed collective */
  double save_ms;            /* that -> the last healthy rank's save ended */
  double restart_ms;         /* restart_begin -> restart: teardown and respawn */
  double restore_ms;         /* the slowest rank's restore alone */
  double start_restore_ms;   /* restart -> the last rank restored: process start, init, restore */
  double redo_ms;            /* last rank restored -> the restored minibatch completed (resumed) */
  double total_ms;           /* death -> resumed */
  double slowest_save_ms;    /* the slowest rank's own save time: the model's o for this failure */
  double restart_cost_ms;    /* death -> last rank restored, less slowest_save_ms: the model's r */
  int64_t newest_saved_step; /* the newest minibatch a healthy rank saved (or tried to); -1 */
  int64_t restored_step;     /* the step the new workers restored (the oldest if they differ) */
  int64_t redo_minibatches;  /* newest_saved_step - restored_step + 1, or newest_saved_step + 1
                                when the job started over at step 0; -1: unknown */
  bool started_over;         /* jit_restore lines came, and none restored a snapshot */
  size_t saved_ranks;        /* jit_save lines with status "ok" */
  size_t failed_saves;       /* jit_save lines with another status */
  size_t restored_ranks;     /* jit_restore lines with status "ok" */
  uint64_t save_bytes;       /* bytes of the saves that succeeded, summed over ranks */
} keel_model_restart;

/* Reads the events file at path and fills *measured_p. Progress lines give m from pairs
 * of lines of one uid within one epoch (a recovery's pause is not a minibatch); recovery
 * lines give o and r of keel's in-process recovery, and job restarts (user-level JIT) give
 * them for a restart (jit_save_s, jit_restart_cost_s); mem_save, mem_restore and
 * mem_service_end lines the in-memory tier's (mem_*, memory_*, disk_*, persist*: negative
 * sizes, counts and times refuse the line); a value whose count is 0 is left 0.
 * Lines over 64 KiB, lines that do
 * not scan and lines with negative or non-finite times are skipped and counted. Blocks on
 * the file's reads; allocates bounded tables, freed before return. On error nothing is
 * written or logged (the caller reports it): errno's status when the file cannot be opened
 * (KEEL_ENOTFOUND when it does not exist), KEEL_EIO for a failed read, KEEL_ENOMEM, and
 * KEEL_EINVAL for NULL arguments. */
keel_status keel_model_measure_file(const char *path, keel_model_measured *measured_p);

/* keel_model_measure_file that also hands back each job restart the file tells of, in the
 * file's order: the first capacity of them into restarts (the caller's array; NULL when
 * capacity is 0), and in *restart_count_p (may be NULL) how many there were. measured_p may
 * be NULL. Restarts, saves and restores past the reader's bounded tables are not put
 * together. Blocks, allocates and fails like keel_model_measure_file, but on error only
 * *measured_p and *restart_count_p are left as they were: restarts may hold some records.
 * Restarts are told apart within one job: a job_start line begins a new one. */
keel_status keel_model_measure_restarts(const char *path, keel_model_measured *measured_p,
                                        keel_model_restart *restarts, size_t capacity,
                                        size_t *restart_count_p);

/* ---- wasted time per failure (Gemini, Figure 10): the work lost since the checkpoint
 * that a recovery goes back to, plus the time to retrieve that checkpoint. In-memory
 * snapshots every E iterations of m seconds against a periodic disk checkpoint every T. */
typedef struct keel_model_wasted_params {
  double iteration_s;           /* m: one training iteration, > 0 */
  double every_steps;           /* E: an in-memory snapshot every E iterations, >= 1 */
  double memory_retrieval_s;    /* one rank's restore from memory, >= 0 */
  double disk_interval_s;       /* T: a disk checkpoint every T seconds, > 0 */
  double state_bytes;           /* one rank's state, >= 0 */
  double disk_read_bytes_per_s; /* the speed one rank reads it back from disk, > 0 */
} keel_model_wasted_params;

/* One policy's time wasted per failure, in seconds. total = lost + retrieval. */
typedef struct keel_model_wasted_policy {
  double interval_s;   /* between two checkpoints: E·m, or T */
  double lost_mean_s;  /* work redone on average */
  double lost_worst_s; /* work redone at worst */
  double retrieval_s;  /* getting the checkpoint back */
  double total_mean_s;
  double total_worst_s;
} keel_model_wasted_policy;

typedef struct keel_model_wasted {
  keel_model_wasted_policy memory; /* in-memory snapshots every E iterations */
  keel_model_wasted_policy disk;   /* periodic disk checkpoints every T */
  double ratio_mean;               /* disk.total_mean_s / memory.total_mean_s */
  double ratio_worst;              /* disk.total_worst_s / memory.total_worst_s */
} keel_model_wasted;

/* Both policies' wasted time per failure (src/model/wasted.c gives the reasoning): memory
 * loses E·m/2 on average and 2·E·m at worst and retrieves in memory_retrieval_s; disk loses
 * T/2 on average and T at worst and retrieves in state_bytes / disk_read_bytes_per_s.
 * KEEL_EINVAL, nothing written, for a value that is not finite or out of the ranges above. */
keel_status keel_model_wasted_per_failure(const keel_model_wasted_params *params,
                                          keel_model_wasted *wasted_p);

/* ---- checkpoint placement (Gemini, Algorithm 1) and the odds of recovering from memory.
 * Nodes 0..N-1 each have one snapshot, kept on k nodes (itself and k-1 peers). When k
 * divides N the nodes form N/k groups of k consecutive nodes and every node of a group
 * holds every snapshot of it ("group"). Otherwise the first floor(N/k)-1 groups are such
 * groups and the last k + (N mod k) nodes form a ring in which each node's snapshot is on
 * itself and the k-1 nodes before it ("mixed"). */
#define KEEL_MODEL_PLACEMENT_MAX_NODES 4096
#define KEEL_MODEL_PLACEMENT_MAX_REPLICAS 8

typedef enum keel_placement_strategy {
  KEEL_PLACEMENT_GROUP,
  KEEL_PLACEMENT_MIXED,
} keel_placement_strategy;

typedef struct keel_model_placement {
  uint32_t nodes;    /* N */
  uint32_t replicas; /* k, each snapshot's copies, its own node's included */
  keel_placement_strategy strategy;
  uint32_t groups;   /* floor(N/k): with mixed, the last one is the ring */
} keel_model_placement;

/* KEEL_EINVAL unless 1 <= replicas <= KEEL_MODEL_PLACEMENT_MAX_REPLICAS and
 * replicas <= nodes <= KEEL_MODEL_PLACEMENT_MAX_NODES. */
keel_status keel_model_placement_make(uint32_t nodes, uint32_t replicas,
                                      keel_model_placement *placement_p);
/* Group g (< groups) is the nodes first .. first + count - 1. */
void keel_model_placement_group(const keel_model_placement *placement, uint32_t group,
                                uint32_t *first_p, uint32_t *count_p);
/* The replicas nodes that hold node's snapshot, node itself first. */
void keel_model_placement_holders(const keel_model_placement *placement, uint32_t node,
                                  uint32_t *holders);
/* The exact probability that, when failed nodes (0..N) chosen uniformly at random fail at
 * once, every snapshot still has a live holder: counted, not sampled (disjoint groups by
 * generating function, the ring by enumeration), in long double. */
keel_status keel_model_placement_odds(const keel_model_placement *placement, uint32_t failed,
                                      double *recover_p);
/* Gemini's Corollary 1, the case it states exactly: group placement (k divides N) and
 * failed < 2k: 1 when failed < k, else 1 - (N/k) C(N-k, f-k) / C(N, f). KEEL_ENOTSUP
 * outside that case (for f >= 2k the paper gives this only as a bound). */
keel_status keel_model_placement_corollary1(const keel_model_placement *placement,
                                            uint32_t failed, double *recover_p);
/* Monte Carlo: trials draws of failed nodes from the random stream of seed, each checked
 * against every node's holders; the share in which every snapshot survived. */
keel_status keel_model_placement_simulate(const keel_model_placement *placement, uint32_t failed,
                                          uint64_t trials, uint64_t seed, double *recover_p);

#ifdef __cplusplus
}
#endif
#endif
