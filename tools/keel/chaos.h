/* Private interface between the files of `keel chaos`: the failure kinds and their schedule
 * (chaos.c) and what is seen of a job from outside it -- its events file, /proc and
 * /dev/shm -- with the invariants checked on it (chaos_observe.c). */
#ifndef KEEL_CHAOS_H
#define KEEL_CHAOS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#include "keel/core.h"

typedef enum keel__chaos_kind {
  KEEL__CHAOS_KILL,          /* SIGKILL to a rank's process (keel inject kill) */
  KEEL__CHAOS_STOP,          /* SIGSTOP to a rank's process, never continued: a hang */
  KEEL__CHAOS_LAUNCHER_STOP, /* SIGSTOP to the launcher (and its store), SIGCONT later */
  KEEL__CHAOS_HANG,          /* a rank's training thread blocks for good (keel inject hang) */
  KEEL__CHAOS_BITFLIP,       /* one bit of a rank's state flipped (keel inject bitflip) */
  KEEL__CHAOS_KILL_NODE,     /* a node's agent and processes killed at once (--agents, --netns) */
  KEEL__CHAOS_PARTITION,     /* a node's link cut, healed later (--netns) */
  KEEL__CHAOS_DELAY,         /* a node's frames held back for a while (--agents, --netns) */
  KEEL__CHAOS_SERVER_KILL,   /* SIGKILL to a parameter server, replaced by keel run */
  KEEL__CHAOS_ETCD_KILL,     /* an etcd member killed, started again later (--etcd) */
  KEEL__CHAOS_ETCD_STOP,     /* an etcd member stopped, resumed later (--etcd) */
  KEEL__CHAOS_KIND_COUNT,
} keel__chaos_kind;

const char *keel__chaos_kind_name(keel__chaos_kind kind);
/* Whether a failure of kind lasts until chaos undoes it (hold_ns later). */
bool keel__chaos_kind_lasts(keel__chaos_kind kind);

#define KEEL__CHAOS_MAX_VICTIMS 32

/* One failure of the schedule and what became of it. */
typedef struct keel__chaos_failure {
  keel__chaos_kind kind;
  int64_t gap_ns;  /* after the previous injection (the first: after training began) */
  int64_t target;  /* the rank hit by kill and stop; for node kinds, which live node */
  int64_t hold_ns; /* launcher-stop, partition, delay: how long until it is undone */
  int64_t delay_ns; /* delay: how long each frame of the node waits */
  int64_t node;     /* node kinds: the node hit; etcd kinds: the member; server-kill: the
                     * first server's index; -1 otherwise */
  int64_t spread;   /* server-kill: drawn; how many servers at once (1 + spread % r) */
  bool injected;
  int attempts;        /* tries (a rank between holders cannot be hit: tried again) */
  int64_t injected_ns; /* CLOCK_MONOTONIC, the clock of the events file */
  int64_t healed_ns;   /* partition: when its link healed; 0 until then */
  /* partition: the last moment a recovery of one of its victims is its (heal + heartbeat +
   * a recovery's time): a victim that lived on dies later of something else; 0 until then */
  int64_t aftermath_end_ns;
  /* The processes hit: a rank's for kill, stop, hang and bitflip; the node's live ones for
   * kill-node and partition, and for a partition those born during it and those killed by the
   * fence it caused; none for launcher-stop and delay. */
  uint32_t victims[KEEL__CHAOS_MAX_VICTIMS];
  size_t victim_count;
  int64_t detect_ns;  /* injection to the recovery's detection; -1: not seen */
  int64_t recover_ns; /* injection to the recovery's end (a server's replacement) */
  /* etcd kinds: from the undo until the members agreed on a leader again; -1: not waited */
  int64_t leader_ns;
} keel__chaos_failure;

/* One process of the job as its spawn event named it. */
typedef struct keel__chaos_process {
  uint32_t uid;
  pid_t pid;
  int64_t node;
  bool server, agent;
  bool holds_rank;                /* a worker, or a spare since a recovery gave it a rank's state */
  unsigned long long start_ticks; /* from /proc when the spawn was read; 0: already gone */
  int64_t spawn_ns;               /* its spawn event's t_ns (CLOCK_MONOTONIC) */
  bool exited, fenced, killed_at_end;
  char ended[32]; /* "code 0", "SIGKILL" */
  /* /proc samples after each recovery it lived through (allocated; freed with the run) */
  size_t samples;
  long *fds, *threads, *rss_kib;      /* fds: less its links to the job's live processes */
  char fds_first[256], fds_last[256]; /* fds by kind at the first and the latest sample */
} keel__chaos_process;

/* A finisher's `finish` event. */
typedef struct keel__chaos_finish {
  uint32_t uid;
  int64_t rank, step, world, shard;
  char crc[16];
} keel__chaos_finish;

/* A run of consecutive steps one process committed in one epoch (its `commits` lines), or
 * (held) the one step whose committed state it received in a recovery (`received_commit`). */
typedef struct keel__chaos_commits {
  uint32_t uid, number;
  int64_t epoch, from, to;
  bool held;
} keel__chaos_commits;

/* What the commits of a run add up to: every step from the first to the last, each committed
 * once by the job (by the ranks of one epoch), less the ones redone. */
typedef struct keel__chaos_steps {
  bool known;             /* some commits were reported */
  int64_t first, last;    /* the first and the last step committed */
  int64_t redone;         /* commits of a step after its first (in a later epoch, or again) */
  int64_t skipped;        /* steps between first and last that no process committed */
  int64_t held_only;      /* steps no committer said, said by a process that received them */
  int64_t first_skipped;  /* the first of them */
  int64_t most_redone;    /* the first step committed most often, and how often */
  int64_t most_redone_times;
} keel__chaos_steps;

#define KEEL__CHAOS_MAX_PROCESSES 4096
#define KEEL__CHAOS_MAX_FINISHES 256
#define KEEL__CHAOS_MAX_SAMPLES 8192

/* What is known of one run of the job. */
typedef struct keel__chaos_run {
  FILE *events;
  char line[8192];
  size_t line_length;
  bool training; /* a progress line was seen */
  int64_t training_ns;
  bool ended;
  int64_t job_end_code;
  keel__chaos_process processes[KEEL__CHAOS_MAX_PROCESSES];
  size_t process_count;
  keel__chaos_finish finishes[KEEL__CHAOS_MAX_FINISHES];
  size_t finish_count;
  size_t recoveries_by_policy[4]; /* shrink, replace, grow, other */
  int64_t redone_minibatches;
  int64_t timeouts; /* failure events with cause KEEL_ETIMEDOUT */
  size_t mismatches;           /* replica_mismatch events (--verify-replicas) */
  int64_t verified_redo_steps; /* the steps they sent the job back */
  /* The longest the job stood still since its last failure (or that failure's undo): from one
   * progress line to the next, less the time before an injection between them; and when that
   * stillness ended. A wait past its deadline shows as one longer than the deadlines allow. */
  int64_t progress_last_ns;
  int64_t still_longest_ns, still_end_ns;
  int64_t collective_deadline_ns; /* the longest a `collective_timeout` line set (auto) */
  /* `wait_late` lines: waits that ended past their deadline, as the processes counted them
   * (KEEL_WAIT_LATE_NS past it), by kind (keel_wait_kind), and the worst. */
  int64_t waits_late[KEEL_WAIT_KIND_COUNT];
  int64_t wait_late_worst_ns;
  char wait_late_worst_kind[16];
  int64_t section_end_ns;         /* the last `section_end` line's time */
  long store_keys[KEEL__CHAOS_MAX_SAMPLES];
  size_t store_key_count;
  size_t recovery_count;
  int64_t world;             /* the latest recovery's new_world; 0 before any */
  size_t sampled_recoveries; /* recoveries after which the live processes were sampled */
  keel__chaos_commits *commits; /* allocated; freed with the run */
  size_t commit_count, commit_capacity;
} keel__chaos_run;

/* Frees what the run's processes allocated. */
void keel__chaos_run_clear(keel__chaos_run *run);
/* Process pid's fds by kind, most first, as text: "to 127.0.0.1:4000 x3" (connected to a
 * listener), "from 198.18.0.2 x2" (accepted on a port it listens on), "listen", "pipe", "shm",
 * "file", or an anonymous inode's name ("eventfd"); empty when the process is gone. */
void keel__chaos_fd_kinds(pid_t pid, char *text, size_t capacity);
/* Reads the events written since the last call and updates run; failures (count of them)
 * get their detection and recovery times from recovery lines. */
void keel__chaos_events_read(keel__chaos_run *run, keel__chaos_failure *failures, size_t count);
/* Adds up the commits reported in run (KEEL_FINISH_CRC): which steps the job committed,
 * which it committed more than once and which none of its processes did. */
void keel__chaos_steps_count(const keel__chaos_run *run, keel__chaos_steps *steps);

/* ---- chaos_reference.c: failure-free runs kept for reuse (--reference-dir) */
/* The key of a failure-free run (16 hex digits into key): the run's arguments ("run", its
 * flags, "--", the program and its arguments), the bytes of each that names a file, the
 * number of etcd members, and the bytes of the keel tool (self) and of its libkeel.so. */
void keel__chaos_reference_key(char *const *argv, int argc, const char *self, int64_t etcd_members,
                               char *key, size_t capacity);
/* Reads a kept run's finish lines into reference; false when there is none (or no finish). */
bool keel__chaos_reference_load(const char *path, keel__chaos_run *reference);
/* Keeps the finish lines of a failure-free run's events at path (atomically); false if not. */
bool keel__chaos_reference_save(const char *events_path, const char *path);
/* Keeps the trace lines of a failure-free run's output at path (atomically; none: empty). */
bool keel__chaos_reference_save_trace(const char *output_path, const char *path);

/* ---- chaos_trace.c: where a run with another model parted from the failure-free run */
/* A program may print lines `trace step S rank R WORD...` (what it read or computed at step S:
 * checksums, say). A redone step prints again; its last line counts. */
#define KEEL__CHAOS_TRACE_PREFIX "trace step "
/* Whether a line of a program's output starts as a trace line. */
bool keel__chaos_is_trace_line(const char *text);
/* Into where: the first step and rank (in that order) whose trace lines differ between the
 * two outputs, with the first word that differs, or that they agree wherever both printed
 * one. False when either file cannot be read or has no trace line. */
bool keel__chaos_trace_parting(const char *reference_output, const char *run_output, char *where,
                               size_t capacity);
/* How far a series' floor rose: the median of its last quarter less that of its second.
 * Counts that move with each recovery (a link closed, another opened, a key written and
 * cleaned up a lease later) come back to their floor; a leak raises it. The first quarter is
 * the warm-up: a job's first failures leave keys whose leases have not yet run out, so the
 * store's count climbs to a plateau that repeated failures keep it at. A median, not the
 * least value: a server's links to two servers killed at once are closed a moment before
 * their replacements' are made, and one sample taken then read as a floor two lower (a hunt
 * for finding 58: 10 8 8 6 8 8 8 ..., a "rise" of 2 with nothing leaked). */
long keel__chaos_floor_rise(const long *values, size_t count);
/* Samples the fds, threads and RSS of the live rank holders and servers, after a recovery
 * (while the next failure has not yet come). */
void keel__chaos_survivors_sample(keel__chaos_run *run);
/* What keel__chaos_survivors_sample does in two steps, apart for the tests: the connections
 * of the job's live processes (NULL when memory ran out: every link then counts), then one
 * process's sample, its fds less its links to them (its own read at the sample). */
typedef struct keel__chaos_live_links keel__chaos_live_links;
keel__chaos_live_links *keel__chaos_live_links_read(const keel__chaos_run *run);
void keel__chaos_live_links_free(keel__chaos_live_links *live);
void keel__chaos_process_sample(keel__chaos_process *p, const keel__chaos_live_links *live);
/* Whether the process recorded as p still lives, as that process (a reused pid has another
 * start time). */
bool keel__chaos_process_alive(const keel__chaos_process *p);
/* The process of uid in run, or NULL. */
keel__chaos_process *keel__chaos_process_find(keel__chaos_run *run, uint32_t uid);
/* Whether failure hit uid. */
bool keel__chaos_failure_hit(const keel__chaos_failure *failure, uint32_t uid);
/* The ranks the job has now: the world it started with until a recovery said less (a replace
 * that found no spare ready shrinks the job until a grow takes it back). */
int64_t keel__chaos_world_now(const keel__chaos_run *run, int64_t started_world);
/* Lists uid among failure's victims (once); a full list says on stderr whom it leaves out. */
void keel__chaos_victim_add(keel__chaos_failure *failure, uint32_t uid);

/* What the checks found once the job is over. */
typedef struct keel__chaos_leaks {
  size_t processes; /* of the job, alive after it ended */
  size_t shm;       /* /dev/shm entries of the job id */
  size_t job_files; /* its job file */
  size_t networks;  /* namespaces, veths and bridges of its launcher (--netns) */
  char first[320];  /* the first thing left, for the message */
} keel__chaos_leaks;

/* Counts what job_id's run (its launcher: launcher) left behind: processes (by pid and start
 * time), shared memory, its job file, its network namespaces. */
void keel__chaos_leaks_count(const keel__chaos_run *run, uint64_t job_id, pid_t launcher,
                             keel__chaos_leaks *leaks);
/* Kills (SIGKILL) every process of run still alive with its recorded start time. */
void keel__chaos_processes_kill(const keel__chaos_run *run);
/* The start time of pid in clock ticks since boot (field 22 of /proc/pid/stat); 0 if gone. */
unsigned long long keel__chaos_start_ticks(pid_t pid);

#endif
