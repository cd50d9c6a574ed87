/* Private to src/ckpt: the checks the tiers share, the file
 * operations the persistent save goes through (a test substitutes failing ones), the memory
 * region's header, and the candidate snapshots every tier hands to the one restore. */
#ifndef KEEL_CKPT_INTERNAL_H
#define KEEL_CKPT_INTERNAL_H

#include <stdatomic.h>
#include <sys/types.h>

#include "keel/ckpt.h"

#define KEEL__CKPT_MODULE "ckpt"

/* KEEL_OK when the identity can be saved: non-zero job, shard_index < shard_count. */
keel_status keel__ckpt_identity_check(const keel_ckpt_identity *identity);
/* The identity of this rank's snapshot of the state at the start of step: its rank, shard
 * and replica in the current world, sequenced by the world's epoch. */
keel_ckpt_identity keel__ckpt_identity_now(keel_ctx *ctx, uint64_t step);
/* What a state source restores: shard index of count of the job, at exactly step. */
keel_ckpt_selector keel__ckpt_selector_exact(uint64_t job_id, uint32_t index, uint32_t count,
                                             uint64_t step);
/* chunk_bytes with 0 meaning the default; KEEL_ERANGE past KEEL_CKPT_MAX_CHUNK_BYTES. */
keel_status keel__ckpt_chunk_bytes(uint64_t requested, uint64_t *chunk_bytes_p);

/* keel_ckpt_manifest_build, with the chunks' crc32c left 0 unless checksums: for a caller
 * that computes them while it copies the bytes. */
keel_status keel__ckpt_manifest_layout(const keel_registry *registry,
                                       const keel_ckpt_identity *identity, uint64_t chunk_bytes,
                                       bool checksums, keel_ckpt_manifest *manifest_p);

/* The encoded size of the manifest of the registry with this chunk size (0: default),
 * without reading the registered bytes. */
keel_status keel__ckpt_manifest_bytes_for(const keel_registry *registry, uint64_t chunk_bytes,
                                          size_t *bytes_p);

/* ---- the persistent save's file operations, with libc's contract (-1 and errno on
 * failure) plus a context; SQLite's test VFS habit: a test wraps them to fail the N-th. */
typedef struct keel__ckpt_file_ops {
  int (*mkdirat)(void *context, int directory, const char *name, mode_t mode);
  int (*openat)(void *context, int directory, const char *name, int flags, mode_t mode);
  ssize_t (*write)(void *context, int file, const void *data, size_t length);
  int (*fsync)(void *context, int file);
  /* The descriptor is released even when this fails (Linux's close). */
  int (*close)(void *context, int file);
  int (*renameat)(void *context, int directory, const char *from, const char *to);
  int (*unlinkat)(void *context, int directory, const char *name, int flags);
} keel__ckpt_file_ops;

extern const keel__ckpt_file_ops keel__ckpt_posix_file_ops;

/* keel_ckpt_persistent_save through the given operations. reason (KEEL__CKPT_REASON_BYTES
 * bytes, or NULL): a failed save says there what failed instead of logging it, for a caller
 * that logs a run of failures once (keel__ckpt_write_failed). */
keel_status keel__ckpt_persistent_save_with(const keel__ckpt_file_ops *ops, void *context,
                                            const keel_registry *registry, const char *root,
                                            const keel_ckpt_identity *identity,
                                            uint64_t chunk_bytes, char *reason);

/* ---- the in-memory tier's region header, its first 64 bytes. Host byte order: a region is
 * read on the host that holds it (a peer's copy is a byte copy between hosts of one job,
 * all little-endian). */
typedef struct keel__ckpt_region_header {
  uint32_t magic;
  uint16_t version;
  uint16_t header_bytes;
  uint32_t manifest_bytes;
  uint32_t reserved;
  uint64_t data_offset; /* of the buffers' bytes, back to back in registry order */
  uint64_t data_bytes;
  _Atomic uint64_t seal; /* 0 or odd: no complete snapshot; even: complete, twice the saves */
  uint8_t padding[24];
} keel__ckpt_region_header;

/* Checks every chunk of buffer index of manifest, whose bytes are at data, against its
 * crc32c: KEEL_OK, or KEEL_ECORRUPT with the chunk named in reason. */
keel_status keel__ckpt_buffer_check(const keel_ckpt_manifest *manifest, uint32_t index,
                                    const uint8_t *data, char *reason);

/* keel_ckpt_memory_save that calls copied(context, b) after buffer b is copied, before the
 * seal (a fault point inside the copy). */
keel_status keel__ckpt_memory_save_with(const keel_registry *registry,
                                        const keel_ckpt_identity *identity, uint64_t chunk_bytes,
                                        const keel_ckpt_region *region,
                                        void (*copied)(void *context, size_t buffer),
                                        void *context);

/* keel_ckpt_memory_restore without the staging copy: each candidate is checked where it lies
 * and copied straight into the registered buffers (bench/mem_snapshot.c: staging 1 GiB
 * cost ten times the copy, in page faults). The price: a region rewritten during that copy
 * leaves the buffers torn (the next candidate is then tried, and a failed restore leaves
 * them so). For regions nobody rewrites while they are read: a rank's own slots read by
 * that rank, a private copy fetched from a peer. */
keel_status keel__ckpt_memory_restore_in_place(keel_registry *registry,
                                               const keel_ckpt_region *regions, size_t region_count,
                                               const keel_ckpt_selector *selector,
                                               keel_ckpt_identity *used_p);

/* ---- a region as a whole (the in-memory tier's unit of replication): whether it holds a
 * sealed, well-formed snapshot whose every chunk passes its crc32c. On KEEL_OK *identity_p
 * (may be NULL) is the snapshot's and *seal_p (may be NULL) the seal it was checked under;
 * KEEL_ENOTFOUND when it is not sealed or was rewritten meanwhile, KEEL_ECORRUPT with the
 * reason (KEEL__CKPT_REASON_BYTES) otherwise. Reads every byte. */
keel_status keel__ckpt_region_check(const keel_ckpt_region *region, keel_ckpt_identity *identity_p,
                                    uint64_t *seal_p, char *reason);
/* The seal of a region: even and non-zero while it holds a complete snapshot. */
uint64_t keel__ckpt_region_seal(const keel_ckpt_region *region);
/* Seals a region whose bytes were written by someone else (a copy received from a peer):
 * first made odd with keel__ckpt_region_unseal before the bytes change, then sealed here
 * with an even value above any it held. */
void keel__ckpt_region_unseal(const keel_ckpt_region *region);
void keel__ckpt_region_seal_now(const keel_ckpt_region *region);

/* ---- restore: a candidate is a snapshot whose manifest decoded; its tier reads the
 * buffers' bytes. Reasons for refusal are written into reason (not logged: the restore
 * logs once, where it decides to skip the candidate). */
#define KEEL__CKPT_REASON_BYTES 256

/* A tier that writes every N steps, where each write may fail (a full or read-only disk)
 * while training goes on: the first failure of a run of them is logged with its reason, the
 * others only counted, and the first success after them is logged too, so that a full disk
 * gives one clear message, not one a step. */
typedef struct keel__ckpt_write_health {
  _Atomic uint64_t failed; /* failed writes in all */
  _Atomic int last_status; /* the last failure's status, KEEL_OK before any */
  uint64_t in_a_row;       /* failures since the last success (the writer's own) */
} keel__ckpt_write_health;
/* reason: what the save said (keel__ckpt_persistent_save_with); empty or NULL: the status's
 * text stands for it. */
void keel__ckpt_write_failed(keel__ckpt_write_health *health, const char *tier,
                             const char *directory, keel_status status, const char *reason);
void keel__ckpt_write_succeeded(keel__ckpt_write_health *health, const char *tier);
typedef struct keel__ckpt_candidate keel__ckpt_candidate;

typedef struct keel__ckpt_source_ops {
  /* Reads all `bytes` of buffer `index` (sized as the manifest says) into destination. */
  keel_status (*read_buffer)(const keel__ckpt_candidate *candidate, uint32_t index,
                             uint8_t *destination, uint64_t bytes, char *reason);
  /* After the buffers were read: KEEL_OK if the source did not change meanwhile, else
   * KEEL_EAGAIN with the reason written. */
  keel_status (*finish)(const keel__ckpt_candidate *candidate, char *reason);
  /* Optional: the bytes of buffer index where the tier holds them in memory. Such a
   * candidate is checked in place and copied straight into the registered buffers, with no
   * staging copy (a 1 GiB staging buffer costs more in page faults than the copy itself);
   * finish then tells whether it was rewritten during the copy. */
  const uint8_t *(*in_place)(const keel__ckpt_candidate *candidate, uint32_t index);
} keel__ckpt_source_ops;

struct keel__ckpt_candidate {
  keel_ckpt_manifest manifest;
  char label[64]; /* "step-7/rank-3", "region-1": where the snapshot is, for messages */
  const keel__ckpt_source_ops *ops;
  int directory;                  /* persistent: the job directory (not owned) */
  const keel_ckpt_region *region; /* memory: the region and the seal read with the manifest */
  uint64_t seal;
  uint64_t data_offset;
};

/* Picks among candidates (manifests decoded) by the selector and the rules of
 * keel_ckpt_persistent_restore, checks and stages the best one, falling back to the next,
 * and copies the staged state into the registry's buffers. refused counts snapshots the
 * tier already refused (malformed manifests); where names the tier for messages. Frees
 * nothing: the caller frees the candidates' manifests. */
keel_status keel__ckpt_restore_best(keel_registry *registry,
                                    const keel_ckpt_selector *selector,
                                    keel__ckpt_candidate *candidates, size_t count, size_t refused,
                                    const char *where, keel_ckpt_identity *used_p);

#endif
