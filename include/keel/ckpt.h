/* keel ckpt: the checkpoint engine over the runtime's one state registry: the snapshot
 * format (a manifest with per-chunk crc32c, counted only once written last, JIT §3.2), two
 * tiers (per-rank files, a caller-provided memory region) and the restore that picks the
 * newest complete snapshot of any data-parallel replica of a shard (JIT §3.3). On it,
 * policies: just-in-time checkpoints (the end of this header), triggered by the runtime's
 * failure hook, and the persistent tier as a state source. Depends on the runtime. */
#ifndef KEEL_CKPT_H
#define KEEL_CKPT_H

#include "keel/runtime.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- limits: every count and length read from a manifest is checked against these (and
 * the registry's, keel/limits.h) before anything is allocated. */
#define KEEL_CKPT_MAX_CHUNKS (1u << 22)                   /* chunks in one snapshot */
#define KEEL_CKPT_MAX_CHUNK_BYTES ((uint64_t)1 << 30)     /* 1 GiB */
#define KEEL_CKPT_DEFAULT_CHUNK_BYTES ((uint64_t)4 << 20) /* 4 MiB, used when 0 is passed */
/* The largest encoded manifest: header, every name at its longest, every crc, trailer. */
#define KEEL_CKPT_MANIFEST_MAX_BYTES \
  (72u + KEEL_MAX_STATE_BUFFERS * (1u + KEEL_STATE_NAME_MAX + 8u) + 4u * KEEL_CKPT_MAX_CHUNKS + 4u)

/* ---- the snapshot description. */

/* Who saved a snapshot and of what. With hybrid sharding (JIT §3.1) the state is split in
 * shard_count shards and each shard is held by several data-parallel replicas; any replica's
 * snapshot of a shard restores that shard. */
typedef struct keel_ckpt_identity {
  uint64_t job_id;      /* non-zero (KEEL_JOB_ID) */
  uint32_t rank;        /* the saving rank; names its directory */
  uint32_t shard_index; /* < shard_count */
  uint32_t shard_count; /* >= 1; 1 for plain data parallelism */
  uint32_t replica;     /* data-parallel replica index of the saving rank */
  uint64_t step;        /* the minibatch the state is at the start of */
  uint64_t sequence;    /* resilient sequence number: raised by the caller at every recovery
                           (e.g. the communicator's epoch), so that two saves of one step by
                           different incarnations of the job are ordered; the higher wins */
} keel_ckpt_identity;

/* One buffer of a snapshot: its chunks are chunk_crc32c[first_chunk .. +chunk_count). */
typedef struct keel_ckpt_entry {
  char name[KEEL_STATE_NAME_MAX + 1];
  uint64_t bytes;
  uint32_t first_chunk;
  uint32_t chunk_count; /* ceil(bytes / chunk_bytes); 0 for an empty buffer */
} keel_ckpt_entry;

/* A decoded manifest. Arrays are allocated by keel_ckpt_manifest_build/decode and freed by
 * keel_ckpt_manifest_free. */
typedef struct keel_ckpt_manifest {
  keel_ckpt_identity identity;
  uint64_t chunk_bytes; /* each buffer is cut in pieces of this size, the last one shorter */
  uint64_t total_bytes; /* sum of the buffers' bytes */
  uint32_t buffer_count;
  uint32_t chunk_count;
  keel_ckpt_entry *buffers;
  uint32_t *chunk_crc32c; /* crc32c of every chunk, buffer after buffer */
} keel_ckpt_manifest;

/* Describes the registered state as it is now: names, sizes and the crc32c of every chunk
 * (reads every registered byte; the state must not change meanwhile). chunk_bytes 0 means
 * KEEL_CKPT_DEFAULT_CHUNK_BYTES. Writes *manifest_p only on success; the caller frees it
 * with keel_ckpt_manifest_free. KEEL_EINVAL for a bad identity, KEEL_ERANGE past the limits,
 * KEEL_ENOMEM. */
keel_status keel_ckpt_manifest_build(const keel_registry *registry,
                                     const keel_ckpt_identity *identity, uint64_t chunk_bytes,
                                     keel_ckpt_manifest *manifest_p);
/* Bytes keel_ckpt_manifest_encode writes for this manifest. */
size_t keel_ckpt_manifest_encoded_bytes(const keel_ckpt_manifest *manifest);
/* Encodes a valid manifest (as build or decode make them) into out (the format is in
 * src/ckpt/manifest.c); allocates nothing. KEEL_ERANGE when capacity is too small,
 * KEEL_EINVAL when the manifest breaks a rule the decoder checks. */
keel_status keel_ckpt_manifest_encode(const keel_ckpt_manifest *manifest, uint8_t *out,
                                      size_t capacity, size_t *length_p);
/* Decodes untrusted bytes. Refuses (KEEL_ECORRUPT, or KEEL_ERANGE for a count past the
 * limits) anything but exactly what encode makes of a valid manifest: wrong magic, version,
 * length or crc, bad names, counts that do not add up, trailing bytes. Writes *manifest_p
 * only on success (then the caller frees it); KEEL_ENOMEM if allocation fails. Does not log:
 * the caller knows where the bytes came from. */
keel_status keel_ckpt_manifest_decode(const uint8_t *data, size_t length,
                                      keel_ckpt_manifest *manifest_p);
/* Frees the arrays and zeroes the struct; a zeroed struct is a no-op. */
void keel_ckpt_manifest_free(keel_ckpt_manifest *manifest);

/* ---- restore: which snapshots count. */
typedef struct keel_ckpt_selector {
  uint64_t job_id;      /* a snapshot of another job is refused */
  uint32_t shard_index; /* the shard to restore; other shards' snapshots are passed over */
  uint32_t shard_count; /* 0: any; otherwise a snapshot of another sharding is refused */
  uint64_t max_step;    /* the newest step at or below this; UINT64_MAX for the newest */
  uint64_t min_step;    /* and at or above this (0: any): min = max asks for one step */
  /* With shard_count > 1: only the newest step of which every shard has a complete
   * snapshot (a manifest), so that the ranks of a restarted sharded job, each restoring its
   * own shard, all restore the same step (survivors of a collective that failed on some
   * ranks and completed on others saved steps i and i+1). No older step is tried: a rank
   * cannot know that the others would too. KEEL_ENOTFOUND when no step has every shard. */
  bool common_step;
} keel_ckpt_selector;

/* ---- the persistent tier: <root>/<job_id>/step-<step>/rank-<rank>/ holds one file per
 * buffer (buffer-<index>, the buffer's bytes) and the manifest, written last: every file is
 * written under a temporary name and fsynced, then renamed, and the directory fsynced, so a
 * crash at any point leaves either the previous complete snapshot of that directory or no
 * manifest at all. */

/* Saves the registered state of this rank. Blocks on file I/O only, communicates with no
 * one (the JIT trigger calls it after a failure, from any thread, while the training thread
 * does not touch the state). root must exist; the directories under it are made. On error
 * (KEEL_ENOSPC, KEEL_EIO, ...; logged here) the new snapshot has no manifest and every other
 * snapshot is as it was, except that a save over an existing snapshot of the same step and
 * rank may leave that directory with no manifest once all new data is safely written. */
keel_status keel_ckpt_persistent_save(const keel_registry *registry, const char *root,
                                      const keel_ckpt_identity *identity, uint64_t chunk_bytes);

/* Restores the registered buffers from the newest usable snapshot under <root>/<job_id> of
 * the selector's shard, any replica: highest step, then highest sequence, then lowest
 * replica, then lowest rank. A snapshot with no manifest, a malformed manifest, another
 * job's, another sharding's, names or sizes that differ from the registry, a short or long
 * buffer file or a chunk that fails its crc is skipped with its reason logged, and the next
 * one is tried. Every chunk is read into a staging copy (as large as the registered state)
 * and checked before any registered byte is overwritten, so the buffers change only on
 * success. Writes *used_p (may be NULL) only on success. KEEL_ENOTFOUND when there is no
 * complete snapshot of the shard, KEEL_ECORRUPT when all were refused (logged),
 * KEEL_ENOMEM. Blocks on file I/O. */
keel_status keel_ckpt_persistent_restore(keel_registry *registry, const char *root,
                                         const keel_ckpt_selector *selector,
                                         keel_ckpt_identity *used_p);

/* The newest step (within the selector's min and max) of which <root>/<job_id> holds a
 * complete snapshot (a manifest) of the selector's shard; its chunks are not read, so a
 * restore may still refuse it. KEEL_ENOTFOUND when there is none. */
keel_status keel_ckpt_persistent_newest(const char *root, const keel_ckpt_selector *selector,
                                        uint64_t *step_p);

/* ---- the in-memory tier: a snapshot in a memory region the caller provides (later, the
 * agent's shared memory and its copies on peers). Layout: a 64-byte header whose seal word
 * is even and non-zero only while the region holds a complete snapshot, the encoded
 * manifest, then the buffers' bytes back to back from a 64-byte aligned offset. */
typedef struct keel_ckpt_region {
  void *base;   /* 8-byte aligned (an mmap'ed segment is) */
  size_t bytes; /* capacity */
} keel_ckpt_region;

/* The region size a snapshot of the registry with this chunk size needs. */
keel_status keel_ckpt_memory_bytes(const keel_registry *registry, uint64_t chunk_bytes,
                                   size_t *bytes_p);
/* Saves the registered state into the region, replacing what it held: the seal is made odd
 * (incomplete) first and made even with a release store last, so a reader that finds it even
 * before and after reading saw one complete snapshot. A crash mid-save leaves an incomplete
 * region (keep two regions to always have a complete one). One writer at a time; readers
 * may run concurrently. KEEL_ERANGE when the region is too small (nothing written). */
keel_status keel_ckpt_memory_save(const keel_registry *registry, const keel_ckpt_identity *identity,
                                  uint64_t chunk_bytes, const keel_ckpt_region *region);
/* Restore from memory regions (this rank's and copies of other replicas'), by the rules and
 * with the guarantees of keel_ckpt_persistent_restore: an unsealed region, or one rewritten
 * while it was read, is skipped like a snapshot with no manifest. */
keel_status keel_ckpt_memory_restore(keel_registry *registry, const keel_ckpt_region *regions,
                                     size_t region_count, const keel_ckpt_selector *selector,
                                     keel_ckpt_identity *used_p);

/* ---- the persistent tier as a policy and a state source: the registered state is saved
 * (persistent tier, under <directory>/<job_id>/step-<s+1>/rank-<r>/) when every_steps-th
 * step s commits; and a rank that lacks its shard after a failure (no survivor holds it)
 * gets the snapshot of exactly the step the job is at from it. Call before keel_start, so
 * that a spare admitted there can restore from it. The caller owns *persist_p
 * and frees it after keel_finalize. KEEL_EINVAL, KEEL_ERANGE (no room for another hook or
 * source), or the status of making the folder. Event: persist_save (step, bytes, save_ms,
 * status: "ok" or the failure's name). A save that fails (a full or read-only disk) never fails
 * the step: training goes on, the snapshots saved before stay whole and usable, and the log
 * says why once per run of failures (and again when a save succeeds). */
typedef struct keel_ckpt_persist keel_ckpt_persist;
keel_status keel_ckpt_persist_enable(keel_ctx *ctx, const char *directory, uint64_t every_steps,
                                     keel_ckpt_persist **persist_p);
/* How many snapshots this process has saved. */
uint64_t keel_ckpt_persist_saves(const keel_ckpt_persist *persist);
void keel_ckpt_persist_destroy(keel_ckpt_persist *persist);

/* ---- in-memory checkpoints every iteration (Gemini, docs/MEMORY.md). Each worker copies
 * its registered state into its node's shared memory at every `every`-th step commit (two
 * slots per rank: the previous complete snapshot stays until the new one is sealed); the
 * node's agent sends each new snapshot to the replicas - 1 peer nodes that Gemini's
 * Algorithm 1 names, in chunks, with a few in flight; a rank that lacks its shard after a
 * failure restores it from its node's memory or fetches it from a peer that holds a copy. */

typedef struct keel_ckpt_mem_config {
  uint32_t replicas;      /* copies of each snapshot, its own node's included (1..8) */
  uint64_t every_steps;   /* a snapshot at every N-th commit (>= 1) */
  uint32_t buffers;       /* chunks in flight to a peer before the first is acknowledged */
  uint64_t chunk_bytes;   /* the pieces a snapshot travels in (and its crc32c granule) */
  bool blocking;          /* the baseline: the commit waits until every peer holds the snapshot */
  uint32_t profile_steps; /* steps whose collectives are timed to learn the idle windows
                             (Gemini §5.4); 0: no windows, copies go out at once */
} keel_ckpt_mem_config;

/* Parses "replicas=2,every=1,buffers=4,chunk=4MiB,profile=10,blocking" (each key optional,
 * any order; defaults 2, 1, 4, 4 MiB, 10, not blocking). KEEL_EINVAL with a message in error
 * (capacity error_bytes) for anything else. */
keel_status keel_ckpt_mem_config_parse(const char *text, keel_ckpt_mem_config *config_p,
                                       char *error, size_t error_bytes);

/* The worker's side. Call before keel_start (a spare admitted there restores through it),
 * after every buffer is registered. Without KEEL_CKPT=mem in the environment (`keel run
 * --ckpt mem:...` sets it, with KEEL_CKPT_MEM and the node's folder KEEL_CKPT_MEM_DIR),
 * *mem_p is an engine that does nothing. Adds a commit hook (the snapshot) and the state
 * source "memory". The caller frees *mem_p after keel_finalize. Events: mem_save (step,
 * bytes, save_ms, wait_ms: how long the commit waited for the replicas of the slot it
 * reuses), mem_restore (step, shard, from: "local" or "node-<i>"). */
typedef struct keel_ckpt_mem keel_ckpt_mem;
keel_status keel_ckpt_mem_enable(keel_ctx *ctx, keel_ckpt_mem **mem_p);
/* Snapshots this process has taken. */
uint64_t keel_ckpt_mem_saves(const keel_ckpt_mem *mem);
void keel_ckpt_mem_destroy(keel_ckpt_mem *mem);

/* The agent's side: the node's snapshot service. It listens on host (port 0: any), takes
 * copies that peer agents send and keeps them in the node's folder, sends the snapshots of
 * its node's workers to the peers that placement names (the store's node/<i> keys say where
 * their services listen: `ckpt=<address>`), and serves a fetch of a shard to any member of
 * the job. Runs two threads of its own plus one per open connection; stops in
 * keel_ckpt_agent_stop. */
typedef struct keel_ckpt_agent_options {
  keel_auth auth;        /* the job's id and token */
  const char *store;     /* the job's store endpoint (KEEL_STORE) */
  const char *host;      /* the address to listen on, "127.0.0.1" or the node's */
  const char *directory; /* the node's folder of snapshots (made if missing) */
  uint32_t node, nodes;  /* this node and how many the placement spreads over */
  /* Ranks node i starts with: i * ranks_per_node and up. A spare node (node >= nodes) whose
   * workers take a rank of node i takes node i's place in the placement: it sends where node
   * i sent and says in the store (ckpt/holder/<i>) that node i's copies now go to it. 0: no
   * spare node takes a place. */
  uint32_t ranks_per_node;
  keel_ckpt_mem_config config;
  /* The persistent tier behind memory (NULL: none): every persist_every_steps-th step, or
   * once persist_every_ns passed (0: not by time), the agent writes its node's snapshots
   * there, in the background from a copy of its memory, never holding training back (a
   * write still going when the next is due makes that one wait for the next turn). */
  const char *persist_directory;
  uint64_t persist_every_steps;
  int64_t persist_every_ns;
} keel_ckpt_agent_options;
typedef struct keel_ckpt_agent keel_ckpt_agent;
keel_status keel_ckpt_agent_start(const keel_ckpt_agent_options *options,
                                  keel_ckpt_agent **agent_p);
/* "host:port" the service listens on. */
const char *keel_ckpt_agent_address(const keel_ckpt_agent *agent);
/* What the service did so far. */
typedef struct keel_ckpt_agent_stats {
  uint64_t sent;            /* complete copies sent to peers */
  uint64_t received;        /* complete copies received from peers (checked, sealed) */
  uint64_t persisted;       /* snapshots written to the persistent tier */
  uint64_t persisted_bytes; /* their state bytes */
  int64_t persist_ns;       /* the time those writes took (fsyncs included) */
  uint64_t persist_failed;  /* writes to the persistent tier that failed (a full disk) */
  keel_status persist_last_status; /* the last failure's status; KEEL_OK before any */
} keel_ckpt_agent_stats;
void keel_ckpt_agent_stats_get(const keel_ckpt_agent *agent, keel_ckpt_agent_stats *stats_p);
/* Stops the threads and closes every connection; the folder's files stay (the launcher
 * removes the folder when the job ends). NULL is a no-op. */
void keel_ckpt_agent_stop(keel_ckpt_agent *agent);

/* ---- just-in-time checkpoints (JIT paper §3, §4.2): nothing is saved in steady state.
 * When a collective of the job fails or passes its deadline, every healthy rank saves its
 * registered state, with no collective, into <directory>/<job_id>/step-<s>/rank-<r>/
 * (manifest last), where s is the minibatch in progress: its starting state, since the
 * optimizer runs only after the step's allreduce. The launcher then starts the job's
 * processes again (`keel run --ckpt jit`, KEEL_ON_FAILURE=restart) and each restores the
 * newest complete snapshot of its shard from any replica, step i or i+1, and redoes at most
 * that minibatch. With KEEL_ON_FAILURE=replace (in-process JIT) healthy workers never exit:
 * the runtime hands the step's state to the replacement from a healthy replica, so nothing
 * is written. Events (docs/RUNTIME.md): jit_save, jit_restore, resumed. */
typedef struct keel_ckpt_jit keel_ckpt_jit;

/* Hybrid sharding (JIT §3.1) is the runtime's: with keel_state_shard(ctx, K) rank r saves
 * and restores shard r % K, any replica group's snapshot of it will do. */
typedef struct keel_ckpt_jit_options {
  const char *directory; /* NULL: KEEL_CKPT_DIR, which `keel run` sets */
  uint64_t chunk_bytes;  /* 0: KEEL_CKPT_DEFAULT_CHUNK_BYTES */
} keel_ckpt_jit_options;

/* Turns just-in-time checkpoints on when the launcher asks for them (KEEL_CKPT=jit);
 * otherwise *jit_p is an engine that does nothing, so a program can always call this. Call
 * after keel_start, once every state buffer is registered: the engine adds its failure hook
 * and, in a restarted process (keel_restart_count > 0) or a resumed job (`keel run
 * --resume DIR`: the old job's snapshots), restores the registered state now from the
 * newest complete snapshot of this shard (a failure before any save leaves the state as it
 * is: the job starts over, with a warning). A stop of the job or a lost launcher saves like
 * a restart does. options may be
 * NULL. KEEL_EINVAL for a bad KEEL_CKPT or options, KEEL_ECORRUPT when every snapshot was
 * refused (each reason logged). The caller owns *jit_p and frees it after keel_finalize
 * (the runtime's hook points at it until then). */
keel_status keel_ckpt_jit_enable(keel_ctx *ctx, const keel_ckpt_jit_options *options,
                                 keel_ckpt_jit **jit_p);
/* true when enable restored the state; *used_p (may be NULL) says from which snapshot. */
bool keel_ckpt_jit_restored(const keel_ckpt_jit *jit, keel_ckpt_identity *used_p);
/* Frees the engine; call after keel_finalize. NULL is a no-op. */
void keel_ckpt_jit_destroy(keel_ckpt_jit *jit);

#ifdef __cplusplus
}
#endif
#endif
