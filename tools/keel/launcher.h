/* The launcher of `keel run`: its options, its process table and the context shared by the
 * event loop (run.c), the children (run_children.c), the joiners that grow the job
 * (run_join.c), the status pipe, events file and terminal line (run_status.c) and the store
 * watchers (run_watch.c). The loop's thread owns all of it; watcher threads only write
 * fixed-size reports into a pipe the loop reads. */
#ifndef KEEL_LAUNCHER_H
#define KEEL_LAUNCHER_H

#include <signal.h>

#include "keel/ckpt.h"
#include "metrics.h"
#include "tool.h"

/* ---- options */
typedef enum keel__policy {
  KEEL__ON_FAILURE_SHRINK,
  KEEL__ON_FAILURE_REPLACE,
  KEEL__ON_FAILURE_RESTART, /* user-level JIT checkpoints: every worker starts anew */
} keel__policy;

typedef enum keel__ckpt_policy {
  KEEL__CKPT_NONE,
  KEEL__CKPT_JIT, /* just-in-time checkpoints, saved by the healthy workers on a failure */
  KEEL__CKPT_MEM, /* in-memory checkpoints every iteration, copied to peer nodes (Gemini) */
} keel__ckpt_policy;

typedef struct keel__run_options {
  int64_t world; /* n = nproc_per_node * nnodes */
  int64_t nproc_per_node;
  int64_t nnodes;     /* with --nnodes MIN:MAX, MAX: the node ranks there may be */
  int64_t nnodes_min; /* the nodes the job starts with; the others join as they come */
  bool elastic_nodes; /* --nnodes MIN:MAX with MIN < MAX */
  int64_t spares;
  keel__policy on_failure;
  bool node_failure_domain;
  keel__ckpt_policy ckpt;
  const char *ckpt_dir;   /* as given (relative or not); NULL: the default */
  const char *ckpt_mem;   /* --ckpt mem:SETTINGS: the settings ("" for plain mem) */
  keel_ckpt_mem_config mem_config; /* parsed from them */
  int64_t persist_every_steps;    /* --ckpt-persist-every N steps; 0: not by steps */
  int64_t persist_every_ns;       /* --ckpt-persist-every DURATION; 0: not by time */
  const char *resume_dir; /* --resume: the old job's checkpoint folder; NULL: none */
  int64_t max_restarts;
  int64_t min_world;
  int64_t max_world;
  int64_t join_delay_ns; /* the first max_world - world joiners start this long after */
  int64_t timeout_ns;    /* -1: none */
  int64_t collective_timeout_ns; /* with collective_timeout_auto: until steps were observed */
  bool collective_timeout_auto;  /* --collective-timeout auto (KEEL_TIMEOUT=auto) */
  int64_t verify_every;          /* --verify-replicas every=N; 0: off */
  int64_t heartbeat_ns;
  int64_t restart_grace_ns;  /* a restart round waits collective_timeout_ns plus this */
  const char *events_path;   /* NULL: no events file */
  const char *rdzv_endpoint; /* etcd://... or https://...; NULL: the embedded store */
  const char *rdzv_tls[3];   /* --rdzv-ca, --rdzv-cert, --rdzv-key; NULL where not given */
  const char *rdzv_id;       /* --rdzv-id: the job's name in an outside store; NULL: none */
  int64_t node_rank;         /* --node-rank (or SLURM_NODEID): this process is that node's agent;
                                -1: it is not an agent */
  int64_t spare_nodes;       /* --spare-nodes: nodes whose agents start only spares */
  int64_t rejoin_wait_ns;    /* --rejoin-wait: how long a fenced agent waits for a heal */
  bool agents;               /* --agents: one agent process per node on this host */
  bool netns;                /* --netns: each node an own network namespace (implies agents) */
  const char *link_rate;     /* --link-rate with --netns ("10gbit"); NULL: not shaped */
  int64_t metrics_port;      /* --metrics-port: Prometheus text served there; 0: none */
  int64_t servers;           /* --servers: parameter servers (ECRec) to start; 0: none */
  int64_t ec_data_blocks;    /* --ec k=K */
  int64_t ec_parity_blocks;  /* --ec r=R: the servers that may die before data is lost */
  bool ec_sync;              /* --ec-sync: every worker's step applied together */
  bool replace_servers;      /* --on-server-failure replace (default with --ec-sync) */
  int argc;                  /* the command's own argv, handed on to the agents */
  char **argv;
  bool quiet;
  char **program_argv; /* NULL-terminated; points into the command's argv */
} keel__run_options;

typedef enum keel__parse_result {
  KEEL__PARSE_OK,
  KEEL__PARSE_HELP,  /* help printed: exit 0 */
  KEEL__PARSE_ERROR, /* one-line message printed: exit 2 */
} keel__parse_result;

/* argv[0] is "run". Writes *options_p only when it returns KEEL__PARSE_OK. */
keel__parse_result keel__run_options_parse(int argc, char **argv, keel__run_options *options_p);
/* "shrink", "replace", "restart": KEEL_ON_FAILURE and the job_start event. */
const char *keel__policy_name(keel__policy policy);
/* "jit", "mem" or "none": KEEL_CKPT and the job_start event. */
const char *keel__ckpt_name(keel__ckpt_policy ckpt);
/* "250ms", "2s": the shortest exact spelling of a duration, for KEEL_* variables. */
void keel__duration_format(int64_t duration_ns, char *text, size_t capacity);

/* ---- reports from the store watchers to the loop (one write each, under PIPE_BUF). */
typedef enum keel__report_kind {
  KEEL__REPORT_PROC,      /* proc/<uid> was created or changed */
  KEEL__REPORT_PROC_GONE, /* proc/<uid> went away: its lease ended or it was deleted */
  KEEL__REPORT_SUSPECT,   /* suspect/<uid> appeared or changed */
  KEEL__REPORT_REQUEST,   /* a key under request/ was written (no uid: the loop lists them) */
  KEEL__REPORT_NODE,      /* node/<i> was created or changed (uid: the node) */
  KEEL__REPORT_NODE_GONE, /* node/<i> went away: its agent's lease ended */
} keel__report_kind;

typedef struct keel__report {
  uint32_t kind;
  uint32_t uid;
  int64_t rank;   /* KEEL__REPORT_PROC */
  int64_t epoch;  /* KEEL__REPORT_PROC */
  int64_t node;   /* KEEL__REPORT_PROC: the node its value names (-1: none) */
  char text[160]; /* the suspect/ value ("by=<uid> reason=<text>"), NUL-terminated */
} keel__report;

typedef struct keel__watcher keel__watcher;

/* Starts a thread with its own store client that lists prefix ("proc/", "suspect/" or
 * "request/"), reports differences to report_fd and waits for the next change. Uids at or
 * above uid_limit are ignored (request/ keys hold no uid). */
keel_status keel__watcher_start(const char *endpoint, const keel_auth *auth, const char *prefix,
                                uint32_t uid_limit, int report_fd, keel__watcher **watcher_p);
/* Asks the thread to stop, joins it (within one wait slice) and frees it. NULL allowed. */
void keel__watcher_stop(keel__watcher *watcher);

/* ---- the process table */
typedef enum keel__role {
  KEEL__ROLE_WORKER,
  KEEL__ROLE_SPARE,
  KEEL__ROLE_JOINER,
  KEEL__ROLE_SERVER, /* a parameter server (`keel server`, run_servers.c), never a rank */
} keel__role;

typedef struct keel__child {
  uint32_t uid;
  pid_t pid;
  int64_t node;
  keel__role role; /* the role it was started with */
  bool alive;
  bool fenced;
  bool ready;             /* its proc/ key appeared: it has joined (a `ready` event) */
  bool holds_rank;        /* started as a worker, or its proc/ value showed a rank */
  int64_t rank;           /* the last rank it held; -1: none yet */
  int64_t epoch;          /* the latest epoch its proc/ value showed */
  int64_t lease_lost_ns;  /* when its proc/ key vanished while it lived; 0: never */
  int64_t stopped_ns;     /* when waitpid said it stopped (SIGSTOP); 0: running */
  char fence_reason[128]; /* why the launcher fenced it; empty: not fenced */
  bool death_unrecorded;  /* reaped, but its dead/ key could not be written */
  int wait_status;
  uint64_t exit_order;  /* 1 for the first process to exit, ...; 0 while alive */
  int64_t server_index; /* KEEL__ROLE_SERVER: its index (`keel server --index`) */
  bool replacement;     /* KEEL__ROLE_SERVER: started with --replace in a lost one's place */
} keel__child;

typedef enum keel__phase {
  KEEL__PHASE_RUNNING,
  KEEL__PHASE_ENDING,      /* the workers are done; spares get a grace period */
  KEEL__PHASE_STOPPING,    /* SIGINT/SIGTERM: job/stop is set, the workers save and leave */
  KEEL__PHASE_TERMINATING, /* a second signal or the timeout: everything is being killed */
} keel__phase;

/* What the terminal's status line shows. */
typedef struct keel__display {
  bool enabled;
  bool dirty;
  bool has_progress;
  int64_t last_draw_ns;
  int64_t step;
  int64_t world;
  int64_t epoch;
  double loss;
  double samples_per_s;
  char last_event[160];
} keel__display;

/* The processes of one start of the job. --on-failure restart starts a new incarnation of
 * every worker after each failure (fresh uids, a fresh epoch); other policies have one. */
typedef struct keel__incarnation {
  int64_t index;       /* KEEL_RESTART: restarts before this incarnation */
  uint32_t first_uid;  /* KEEL_FIRST_UID: uid of its rank 0; its ranks are uid - first_uid */
  int64_t first_epoch; /* KEEL_FIRST_EPOCH: the epoch of its first communicator */
} keel__incarnation;

/* A restart round: from the failure until every process of the incarnation is gone. */
typedef struct keel__restart_round {
  bool active;
  int64_t began_ns;
  int64_t deadline_ns; /* fence the processes left then; KEEL_NO_DEADLINE once done */
  uint32_t failed_uid;
  int failed_code; /* the job's exit code should it not restart */
} keel__restart_round;

/* Status lines are at most 4 KiB (RUNTIME.md); the buffer holds one whole line and more. */
#define KEEL__STATUS_LINE_MAX 4096

/* An agent that lost its node's lease killed its workers and exits with this code. */
#define KEEL__EXIT_FENCED 78
/* The readings of the store's election state an agent keeps while its lease is unconfirmed. */
#define KEEL__AGENT_QUORUM_READINGS 8

/* A launcher that is one node's agent (docs/NODES.md): its part of the uid space, its node's
 * lease in the store, and when it must fence itself. */
typedef struct keel__agent_state {
  bool active;
  bool supervised; /* started by `keel run --agents` on this host (KEEL_AGENT_OF) */
  int64_t node;
  int64_t workers; /* workers it starts: nproc_per_node, 0 on a spare node */
  int64_t joiners; /* on a node past --nnodes MIN: nproc_per_node, admitted by a grow */
  int64_t joiners_started;
  int64_t spares;      /* spares it starts at first */
  uint32_t uid_stride; /* uids of its spares and respawns: max_world + node * stride + k */
  int64_t workers_started;
  int64_t extras_started;
  int64_t lease;
  int64_t ttl_ns;
  int64_t lease_confirmed_ns; /* when the last keepalive the store answered was sent, or the
                                 time a reading of its members' election shows the lease safe */
  int64_t next_keepalive_ns;
  /* The store's election state, read after each failed keepalive (oldest first): a majority
   * electing at later terms than an earlier reading means no lease can expire (finding 37). */
  keel_store_quorum quorum_readings[KEEL__AGENT_QUORUM_READINGS];
  size_t quorum_reading_count;
  bool quorum_unsupported; /* the store is one process (embedded): nothing to read */
  bool leaderless_said;    /* the store_leaderless event of this outage is out */
  bool fenced;
  bool ranks_seen; /* some process of the job showed a rank: the job has begun */
  bool rejoined;   /* a later life of its node: a spare node (KEEL_AGENT_REJOIN, or found in
                     the store: rejoin_by_store) */
  bool rejoin_by_store; /* started again by the user or a scheduler (earlier_life_check) */
  /* The node's last event but progress, for keel status: sent to event/node/<i> (on the
   * agent's lease) after a keepalive the store answered, never on the fence's path. */
  char last_event[40];
  int64_t last_event_wall_ns;
  bool last_event_unsent;
  /* The root's view (run_root.c): every agent keeps it, so that any can take over. */
  bool is_root;
  uint32_t uid_limit;
  int32_t *uid_node;   /* per uid: the node its proc/ value named; -1: never seen */
  uint8_t *uid_state;  /* per uid: KEEL__UID_* flags */
  int64_t node_count;  /* nnodes + spare_nodes */
  uint8_t *node_state; /* per node: KEEL__NODE_* flags */
} keel__agent_state;

#define KEEL__UID_ALIVE 1  /* its proc/ key is there */
#define KEEL__UID_MARKED 2 /* the root wrote dead/<uid> */
#define KEEL__NODE_SEEN 1  /* its node/ key appeared */
#define KEEL__NODE_LOST 2  /* the root decided it is lost (decision/node/<i>) */
#define KEEL__NODE_BACK 4  /* lost, and a new life of it appeared before the decision was done */

typedef struct keel__launcher {
  keel__run_options options;
  char program_path[PATH_MAX];
  keel_auth auth;
  keel_store_server *server;
  keel_store *store; /* the loop's own client */
  char endpoint[512];
  sigset_t old_mask;
  int signal_fd;
  int status_read_fd;
  int status_write_fd; /* kept open (close-on-exec) to hand to respawned processes */
  int report_read_fd;
  int report_write_fd;
  keel__watcher *proc_watcher;
  keel__watcher *suspect_watcher;
  keel__watcher *request_watcher;
  keel__watcher *node_watcher; /* agents: node/ */
  int events_fd;
  char job_file_path[PATH_MAX];
  char ckpt_dir[PATH_MAX];   /* absolute, made at the start; empty without --ckpt */
  char mem_dir[PATH_MAX];    /* --ckpt mem: this node's folder of snapshots in /dev/shm */
  keel_ckpt_agent *mem_agent; /* --ckpt mem: this node's snapshot service */
  char resume_dir[PATH_MAX]; /* absolute --resume folder; empty without it */
  int stop_signal;           /* the signal that began an orderly stop; 0: none */
  keel__child *children;
  size_t child_count;
  size_t child_capacity;
  int64_t restarts_used; /* respawned spares (replace) or restarts of the job (restart) */
  keel__incarnation incarnation;
  keel__restart_round restart_round;
  int64_t joiners_delayed; /* joiners of --max-world still to start at join_at_ns */
  int64_t join_at_ns;      /* KEEL_NO_DEADLINE: none delayed */
  int64_t joiners_started; /* every joiner so far, delayed or asked for by `keel join` */
  int64_t joiner_budget;   /* joiners the table has room for over the whole job */
  keel__phase phase;
  int exit_code;
  int64_t start_ns;
  int64_t timeout_deadline_ns;
  int64_t phase_deadline_ns; /* ENDING: kill the spares; TERMINATING: SIGKILL all */
  /* When to ask again whether the job is over, after the store could not say (etcd
   * electing a leader); KEEL_NO_DEADLINE: no question pending. */
  int64_t end_recheck_ns;
  int64_t stopped_grace_ns; /* a lapsed lease of a stopped process: fence after this */
  int64_t running_grace_ns; /* a lapsed lease of a process that runs: fence after this */
  int64_t max_epoch;
  uint64_t exits_seen;
  char status_buffer[2 * KEEL__STATUS_LINE_MAX];
  size_t status_length;
  bool status_discarding; /* inside a line too long to keep: drop it up to its newline */
  keel__display display;
  keel__agent_state agent;
  char store_listen[64];  /* where the embedded store listens: 127.0.0.1:0 unless --netns */
  keel__metrics *metrics; /* --metrics-port: the launcher's, or the root agent's; else NULL */
  /* --servers (run_servers.c): a table of their own, so that the children's stays indexed
   * by uid; their uids follow every uid the children's table can give. */
  keel__child *servers;    /* every server process started, replacements appended */
  size_t server_count, server_capacity;
  int64_t servers_lost;    /* servers that serve no rows now (dead, or being rebuilt) */
  bool servers_stopping;   /* SIGTERM sent: the workers are gone */
  int64_t servers_kill_ns; /* SIGKILL the servers left then; KEEL_NO_DEADLINE: not due */
} keel__launcher;

/* run_children.c */
/* Starts the next uid in role; the child gets the environment of docs/RUNTIME.md. */
keel_status keel__child_spawn(keel__launcher *launcher, keel__role role);
/* Forks and executes path with argv (NULL-terminated) as child (its uid, role and node
 * filled in) with the job's environment; sets its pid and alive and writes its `spawn`
 * event. The caller keeps child in a table of the launcher's. */
keel_status keel__child_start(keel__launcher *launcher, keel__child *child, const char *path,
                              char *const *argv);
/* `"role":"worker"`, or `"role":"server","index":I`: how events name a child's role. */
void keel__child_role_fields(const keel__child *child, char *text, size_t capacity);
keel__child *keel__child_by_uid(keel__launcher *launcher, uint32_t uid);
/* Starts count children in role; on a failure the job is killed and it returns false. */
bool keel__children_spawn(keel__launcher *launcher, keel__role role, int64_t count);
/* Children from uid first_uid on that are not reaped yet, fenced ones included. */
size_t keel__children_unreaped(const keel__launcher *launcher, size_t first_uid);
/* Writes dead/<uid> again for every reaped child whose key could not be written when it
 * was reaped (a fenced node's agent, cut off from the store); how many it wrote. */
size_t keel__children_deaths_record(keel__launcher *launcher);
/* Reaps every child that has exited and calls keel__launcher_child_exited for each. */
void keel__children_reap(keel__launcher *launcher);
/* SIGKILLs a live child on the launcher's decision and records why (a `fence` event). */
void keel__child_fence(keel__launcher *launcher, keel__child *child, const char *reason);
void keel__children_signal(keel__launcher *launcher, int signal_number);
size_t keel__children_alive(const keel__launcher *launcher, bool rank_holders_only);
/* Whether the child is stopped by a signal (SIGSTOP), as /proc/<pid>/stat says; a tracing
 * stop (a debugger, LeakSanitizer's check at exit) is not. */
bool keel__child_stopped(const keel__child *child);
/* The exit code of `keel run` (or of an agent's node: others_finished says whether ranks
 * finished on other nodes) from the ends of the current incarnation's children (the rule
 * is at its definition). */
int keel__children_verdict(const keel__launcher *launcher, bool others_finished);
/* An exit code, or 128+signal for a kill, as a shell reports it. */
int keel__wait_status_code(int wait_status);
/* "0", "3", "SIGKILL": how a wait status reads in dead/ values and events. */
void keel__wait_status_text(int wait_status, char *text, size_t capacity);

const char *keel__role_name(keel__role role);

/* run.c */
void keel__launcher_child_exited(keel__launcher *launcher, keel__child *child);
/* Kills every child: first_signal now, SIGKILL after the grace period (or at once when
 * already terminating); exit_code is the job's. */
void keel__launcher_terminate(keel__launcher *launcher, int exit_code, int first_signal);
/* The workers are done: job/done, then the spares and joiners get a grace period. */
void keel__launcher_begin_ending(keel__launcher *launcher, int exit_code);
/* SIGINT/SIGTERM: job/stop tells every process to save (where a checkpoint policy is on) and
 * leave; they get KEEL_STOP_GRACE (30 s) before they are killed. */
void keel__launcher_begin_stopping(keel__launcher *launcher, int signal_number);
/* Reads proc/ itself: rank and epoch changes the watcher may not have reported yet. False
 * when the store could not be read: then what the launcher knows may be stale. */
bool keel__launcher_refresh_ranks(keel__launcher *launcher);
/* Ends the job once no process that holds a rank is left. */
void keel__launcher_check_end(keel__launcher *launcher);
/* Counts the store's keys and bytes into a `store` event (after each recovery and at the
 * end): a job's store must not grow with its age. */
void keel__launcher_store_census(keel__launcher *launcher, const char *when);
/* With --failure-domain node, fences the failed worker's node. */
void keel__launcher_fence_node(keel__launcher *launcher, const keel__child *failed);

/* run_restart.c: --on-failure restart (RUNTIME.md, "Restarting the job"). */
/* A child of the current incarnation exited (failed: abnormally or non-zero): starts the
 * restart round, or ends it once the whole incarnation is reaped. */
void keel__restart_child_exited(keel__launcher *launcher, keel__child *child, bool failed);
/* When the round's processes that have not left are fenced (KEEL_NO_DEADLINE: none). */
int64_t keel__restart_round_deadline(const keel__launcher *launcher);
void keel__restart_round_tick(keel__launcher *launcher, int64_t now_ns);
/* A worker that exited KEEL_EXIT_RESTART during a round: it saved, it did not fail. */
bool keel__child_left_for_restart(const keel__launcher *launcher, const keel__child *child);

/* run_join.c: growing the job (RUNTIME.md, "Growing the job"). */
/* At the start: the max_world - world joiners of --max-world, now or after --join-delay. */
void keel__joiners_schedule(keel__launcher *launcher);
/* Starts the delayed joiners once their time has come (and the job still runs). */
void keel__joiners_tick(keel__launcher *launcher, int64_t now_ns);
/* When the delayed joiners are due (KEEL_NO_DEADLINE: none). */
int64_t keel__joiners_deadline(const keel__launcher *launcher);
/* Handles every request/join/ key in the store: starts the joiners it asks for and deletes
 * it, or refuses it (the world would pass --max-world) by rewriting its value. */
void keel__join_requests_handle(keel__launcher *launcher);

/* run_agent.c: a launcher that is one node's agent (docs/NODES.md). */
/* Reads the node's part of the job from the options; inactive unless --node-rank. */
void keel__agent_init(keel__launcher *launcher);
/* The job's identity: from the supervising `keel run` (KEEL_JOB_ID, KEEL_JOB_TOKEN,
 * KEEL_STORE) or, on a host of its own, --rdzv-id and a token the first agent puts in the
 * store. Connects launcher->store. */
keel_status keel__agent_store_open(keel__launcher *launcher);
/* The uid of the next child in role: workers hold ranks node * P + k, the rest their own
 * range, so that the agents of a job never give the same uid twice. */
uint32_t keel__agent_next_uid(keel__launcher *launcher, keel__role role);
/* The largest uid any agent of the job may give, plus one. */
uint32_t keel__agent_uid_limit(const keel__launcher *launcher);
/* Grants the node's lease and puts node/<i>. */
keel_status keel__agent_register(keel__launcher *launcher);
/* Keeps the lease alive; fences the node when the store has not confirmed it for too long. */
void keel__agent_tick(keel__launcher *launcher, int64_t now_ns);
/* Notes an event of the node (the agent's own or a worker's line) for keel status. */
void keel__agent_event_note(keel__launcher *launcher, const char *event);
int64_t keel__agent_deadline(const keel__launcher *launcher);
/* The job is over when no process of any node holds a rank: puts job/done then. */
void keel__agent_check_end(keel__launcher *launcher);
/* A process of the job showed a rank: the job has begun (job/began, for agents started later). */
void keel__agent_note_ranks(keel__launcher *launcher);
/* Revokes the node's lease (its node/ key goes with it). */
void keel__agent_close(keel__launcher *launcher);
/* After a fence, with --rejoin-wait: waits for the store to answer again (a healed
 * partition) while the job goes on; true when the node should rejoin as a spare node. The
 * launcher's loop is over by then: every process of the node is dead. */
bool keel__agent_rejoin_wait(keel__launcher *launcher);
/* Set for an agent that starts as a spare node in a node's place (the same agent after its
 * fence and heal, or a new one for a killed node): how many of the node's own uids (past
 * its workers') are used. */
#define KEEL__AGENT_REJOIN_VARIABLE "KEEL_AGENT_REJOIN"
/* Records (in the store, without a lease) how many of node's own uids are used; the count
 * recorded, 0 when none is. */
void keel__agent_uids_note(keel_store *store, int64_t node, int64_t used);
int64_t keel__agent_uids_used(keel_store *store, int64_t node);
/* How many uids each node has of its own (its spares' and respawned processes'). */
uint32_t keel__agent_uid_stride(const keel__run_options *options);
/* Starts this agent again (same pid, group and namespace) as a spare node: KEEL_AGENT_REJOIN
 * tells the new one which of the node's uids are used. Returns only when the exec failed. */
void keel__agent_rejoin_exec(const keel__run_options *options, int64_t extras_started);

/* run_root.c: the root agent (docs/NODES.md), elected through the store. */
/* Allocates the root's view of the job; KEEL_ENOMEM. */
keel_status keel__root_init(keel__launcher *launcher);
void keel__root_free(keel__launcher *launcher);
/* Tries to become the root: creates "root" under the node's lease unless another has it. */
void keel__root_try(keel__launcher *launcher);
/* What the watchers saw: a process's proc/ key (node >= 0) or its going, a node's key or its
 * going. The root turns a lost node's processes whose own leases are gone into dead/<uid>. */
void keel__root_note_report(keel__launcher *launcher, const keel__report *report);
/* An agent that ends in order says so (decision/node/<i> = left) before its lease goes, so
 * that the root does not take its node for lost. */
void keel__root_leave(keel__launcher *launcher);

/* Starts the metrics server of --metrics-port (the launcher; an agent once it is root);
 * a failure is logged and the job goes on without it. */
void keel__launcher_metrics_start(keel__launcher *launcher);

/* run_servers.c: the parameter servers of --servers (RUNTIME.md, "Parameter servers"). */
/* Starts `keel server --index i --store <the job's>` for every i, before the workers; on a
 * failure the job is killed and it returns false. */
bool keel__servers_spawn(keel__launcher *launcher);
/* The live server whose pid this is, or NULL. */
keel__child *keel__server_by_pid(keel__launcher *launcher, pid_t pid);
/* server/<index> (tool.h): where `keel ps` and `keel inject server:I` find the server;
 * status_text is KEEL__SERVER_RUNNING, or how it ended once it is reaped. */
void keel__server_key_put(keel__launcher *launcher, const keel__child *server,
                          const char *status_text);
/* A reaped server (its key and exit event are written): while the launcher has not stopped
 * the servers it is a lost one; more servers serving no rows than --ec r=R ends the job
 * (exit 1); else, with --on-server-failure replace, a replacement takes its place. */
void keel__server_exited(keel__launcher *launcher, keel__child *server);
/* Sends signal_number to every live server. */
void keel__servers_signal(keel__launcher *launcher, int signal_number);
size_t keel__servers_unreaped(const keel__launcher *launcher);
/* Once the job is over and every other child is reaped: SIGTERM to the servers, SIGKILL to
 * those left after the grace period. */
void keel__servers_tick(keel__launcher *launcher, int64_t now_ns);
/* When keel__servers_tick has something to do (KEEL_NO_DEADLINE: nothing). */
int64_t keel__servers_deadline(const keel__launcher *launcher);

/* run_nodes.c: `keel run --agents/--netns`, several nodes on this host. */
int keel__nodes_run(const keel__run_options *options);

/* run.c, shared with run_nodes.c */
/* Signals, store, events file and job file: what a supervisor of agents needs too. */
keel_status keel__launcher_open_base(keel__launcher *launcher);
void keel__launcher_close_base(keel__launcher *launcher);
void keel__launcher_init(keel__launcher *launcher, const keel__run_options *options);
void keel__launcher_emit_start(keel__launcher *launcher);

/* run_status.c */
/* Appends one launcher event to the events file: {"event":E,"t_ns":..,"wall_ns":..,FIELDS}
 * where fields_format (may be NULL) prints the rest of the object's members. */
void keel__event_emit(keel__launcher *launcher, const char *event, const char *fields_format, ...)
    __attribute__((format(printf, 3, 4)));
/* Reads what the status pipe holds and handles each complete line. */
void keel__status_drain(keel__launcher *launcher);
/* Sets the "last event" part of the terminal's status line. */
void keel__display_note(keel__launcher *launcher, const char *format, ...)
    __attribute__((format(printf, 2, 3)));
/* Redraws the status line if it changed and 100 ms have passed since the last draw. */
void keel__display_tick(keel__launcher *launcher, int64_t now_ns);
/* When the next redraw is due (KEEL_NO_DEADLINE: none pending). */
int64_t keel__display_deadline(const keel__launcher *launcher);
/* Draws the final status line and ends it with a newline. */
void keel__display_finish(keel__launcher *launcher);

/* ---- --ckpt mem (run_memory.c): the node's snapshot service, its folder in /dev/shm. */
keel_status keel__mem_service_start(keel__launcher *launcher);
void keel__mem_service_stop(keel__launcher *launcher);
/* Removes the job's folder of every node (/dev/shm/keel-<job id>). */
void keel__mem_folder_remove(const keel__launcher *launcher);

#endif
