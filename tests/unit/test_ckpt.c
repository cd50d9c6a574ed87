/* Unit tests of the checkpoint layer: the registry's rules, the manifest's encoding (every
 * flipped byte and truncation refused), both tiers' round trips, and restore's choices: the
 * manifest-last rule, a corrupted or truncated chunk, another job's manifest, a size
 * mismatch, steps i and i+1, shards, all candidates bad; a full disk (a 64 KiB tmpfs, when
 * this process may mount one) and a save failed at each of its file operations in turn. */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <pthread.h>
#include <sched.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "ckpt/ckpt_internal.h"
#include "keel/ckpt.h"
#include "runtime/runtime_internal.h"
#include "test_support.h"

#define JOB 41
#define OTHER_JOB 42

/* ---- a small training state: odd sizes, an empty buffer, chunks that do not divide them */

typedef struct state {
  uint8_t weights[1000];
  uint8_t empty[1]; /* registered with 0 bytes */
  uint64_t step;
  uint8_t odd[37];
  keel_registry *registry;
} state;

static void state_make(state *s) {
  memset(s, 0, sizeof *s);
  assert_int_equal(keel_registry_create(&s->registry), KEEL_OK);
  assert_int_equal(keel_registry_add(s->registry, "weights", s->weights, sizeof s->weights),
                   KEEL_OK);
  assert_int_equal(keel_registry_add(s->registry, "adam.m", s->empty, 0), KEEL_OK);
  assert_int_equal(keel_registry_add(s->registry, "step", &s->step, sizeof s->step), KEEL_OK);
  assert_int_equal(keel_registry_add(s->registry, "odd", s->odd, sizeof s->odd), KEEL_OK);
}

static void state_free(state *s) { keel_registry_destroy(s->registry); }

/* The state of (shard, step, sequence): replicas of a shard at one step hold the same bytes,
 * and a different incarnation writes different bytes, so a mix of two saves shows. */
static void state_fill(state *s, uint32_t shard, uint64_t step, uint64_t sequence) {
  keel_random random;
  keel_random_seed(&random, keel_random_seed_for(shard * 1000003u + sequence, step, 7));
  for (size_t i = 0; i < sizeof s->weights; i++) s->weights[i] = (uint8_t)keel_random_next(&random);
  for (size_t i = 0; i < sizeof s->odd; i++) s->odd[i] = (uint8_t)keel_random_next(&random);
  s->step = step;
}

static bool state_holds(const state *s, uint32_t shard, uint64_t step, uint64_t sequence) {
  state expected;
  memset(&expected, 0, sizeof expected);
  state_fill(&expected, shard, step, sequence);
  return memcmp(s->weights, expected.weights, sizeof s->weights) == 0 &&
         memcmp(s->odd, expected.odd, sizeof s->odd) == 0 && s->step == step;
}

/* Marks the state with bytes no save writes, to see that a failed restore left it alone. */
static void state_poison(state *s) {
  memset(s->weights, 0x5a, sizeof s->weights);
  memset(s->odd, 0x5a, sizeof s->odd);
  s->step = 0x5a5a5a5a;
}

static bool state_poisoned(const state *s) {
  for (size_t i = 0; i < sizeof s->weights; i++)
    if (s->weights[i] != 0x5a) return false;
  for (size_t i = 0; i < sizeof s->odd; i++)
    if (s->odd[i] != 0x5a) return false;
  return s->step == 0x5a5a5a5a;
}

static keel_ckpt_identity identity_of(uint64_t job, uint32_t rank, uint32_t replica, uint64_t step,
                                      uint64_t sequence) {
  return (keel_ckpt_identity){.job_id = job,
                              .rank = rank,
                              .shard_index = 0,
                              .shard_count = 1,
                              .replica = replica,
                              .step = step,
                              .sequence = sequence};
}

static keel_ckpt_selector selector_of(uint64_t job) {
  return (keel_ckpt_selector){
      .job_id = job, .shard_index = 0, .shard_count = 1, .max_step = UINT64_MAX};
}

/* Fills the state for the identity's step and saves it under root. */
static void save_at(const char *root, state *s, const keel_ckpt_identity *identity,
                    uint64_t chunk_bytes) {
  state_fill(s, identity->shard_index, identity->step, identity->sequence);
  assert_int_equal(keel_ckpt_persistent_save(s->registry, root, identity, chunk_bytes), KEEL_OK);
}

static char *root_make(void) {
  const char *path = keel_test_tempdir("ckpt");
  assert_non_null(path);
  char *copy = strdup(path);
  assert_non_null(copy);
  return copy;
}

static void snapshot_file(char *path, size_t capacity, const char *root, uint64_t job,
                          uint64_t step, uint32_t rank, const char *file) {
  snprintf(path, capacity, "%s/%llu/step-%llu/rank-%u/%s", root, (unsigned long long)job,
           (unsigned long long)step, rank, file);
}

static bool path_exists(const char *path) {
  struct stat info;
  return stat(path, &info) == 0;
}

static void byte_flip(const char *path, off_t offset) {
  int file = open(path, O_RDWR);
  assert_true(file >= 0);
  uint8_t byte;
  assert_int_equal(pread(file, &byte, 1, offset), 1);
  byte ^= 0x10;
  assert_int_equal(pwrite(file, &byte, 1, offset), 1);
  close(file);
}

static int tree_remove_entry(const char *path, const struct stat *info, int type,
                             struct FTW *walk) {
  (void)info;
  (void)type;
  (void)walk;
  return remove(path);
}

static void tree_remove(const char *root) {
  assert_int_equal(nftw(root, tree_remove_entry, 16, FTW_DEPTH | FTW_PHYS), 0);
}

/* ---- registry */

static void test_ckpt_registry_rules(void **unused) {
  (void)unused;
  keel_registry *registry;
  assert_int_equal(keel_registry_create(&registry), KEEL_OK);
  uint8_t data[16];
  assert_int_equal(keel_registry_add(registry, "w", data, sizeof data), KEEL_OK);
  assert_int_equal(keel_registry_add(registry, "w", data, sizeof data), KEEL_EEXIST);
  assert_int_equal(keel_registry_add(registry, "", data, 1), KEEL_EINVAL);
  assert_int_equal(keel_registry_add(registry, "has space", data, 1), KEEL_EINVAL);
  assert_int_equal(keel_registry_add(registry, "tab\t", data, 1), KEEL_EINVAL);
  char longest[KEEL_STATE_NAME_MAX + 2];
  memset(longest, 'n', sizeof longest);
  longest[KEEL_STATE_NAME_MAX + 1] = '\0';
  assert_int_equal(keel_registry_add(registry, longest, data, 1), KEEL_EINVAL);
  longest[KEEL_STATE_NAME_MAX] = '\0';
  assert_int_equal(keel_registry_add(registry, longest, data, 1), KEEL_OK);
  assert_int_equal(keel_registry_add(registry, "null", NULL, 1), KEEL_EINVAL);
  assert_int_equal(keel_registry_add(registry, "empty", NULL, 0), KEEL_OK);
  assert_int_equal(keel_registry_count(registry), 3);
  assert_int_equal(keel_registry_bytes(registry), 17);
  for (int i = 3; i < KEEL_MAX_STATE_BUFFERS; i++) {
    char name[16];
    snprintf(name, sizeof name, "b%d", i);
    assert_int_equal(keel_registry_add(registry, name, data, 1), KEEL_OK);
  }
  assert_int_equal(keel_registry_add(registry, "one-more", data, 1), KEEL_ERANGE);
  keel_registry_destroy(registry);
  keel_registry_destroy(NULL);
}

/* A buffer marked each process's own moves with the state but is left out of the checksum
 * that replicas compare (--verify-replicas, the final state's): random streams each process
 * seeded for itself would otherwise make replicas differ. */
static void test_ckpt_registry_per_process(void **unused) {
  (void)unused;
  keel_registry *registry;
  assert_int_equal(keel_registry_create(&registry), KEEL_OK);
  uint8_t weights[32] = {1, 2, 3}, streams[16] = {4};
  assert_int_equal(keel_registry_add(registry, "weights", weights, sizeof weights), KEEL_OK);
  assert_int_equal(keel_registry_add(registry, "streams", streams, sizeof streams), KEEL_OK);
  assert_int_equal(keel_registry_mark_per_process(registry, "nothing"), KEEL_ENOTFOUND);
  assert_int_equal(keel_registry_mark_per_process(registry, "streams"), KEEL_OK);
  assert_false(keel_registry_per_process(registry, 0));
  assert_true(keel_registry_per_process(registry, 1));
  assert_false(keel_registry_per_process(registry, 2));
  uint32_t crc = keel__registry_crc32c(registry);
  assert_int_equal(crc, keel_crc32c(0, weights, sizeof weights));
  streams[3] ^= 1;
  assert_int_equal(keel__registry_crc32c(registry), crc);
  weights[3] ^= 1;
  assert_int_not_equal(keel__registry_crc32c(registry), crc);
  /* Still moved: counted in the state's size. */
  assert_int_equal(keel_registry_bytes(registry), sizeof weights + sizeof streams);
  keel_registry_destroy(registry);
}

/* ---- manifest */

static void test_ckpt_manifest_round_trip(void **unused) {
  (void)unused;
  state s;
  state_make(&s);
  state_fill(&s, 0, 12, 3);
  static const uint64_t chunk_sizes[] = {1, 7, 1000, 0};
  for (size_t k = 0; k < sizeof chunk_sizes / sizeof chunk_sizes[0]; k++) {
    keel_ckpt_identity identity = {.job_id = JOB,
                                   .rank = 3,
                                   .shard_index = 1,
                                   .shard_count = 2,
                                   .replica = 1,
                                   .step = 12,
                                   .sequence = 3};
    keel_ckpt_manifest manifest;
    assert_int_equal(keel_ckpt_manifest_build(s.registry, &identity, chunk_sizes[k], &manifest),
                     KEEL_OK);
    assert_int_equal(manifest.total_bytes, 1000 + 8 + 37);
    assert_int_equal(manifest.buffers[1].chunk_count, 0);
    size_t bytes = keel_ckpt_manifest_encoded_bytes(&manifest);
    uint8_t *encoded = malloc(bytes + 1);
    assert_non_null(encoded);
    size_t length = 0;
    assert_int_equal(keel_ckpt_manifest_encode(&manifest, encoded, bytes - 1, &length),
                     KEEL_ERANGE);
    assert_int_equal(keel_ckpt_manifest_encode(&manifest, encoded, bytes, &length), KEEL_OK);
    assert_int_equal(length, bytes);

    keel_ckpt_manifest decoded;
    assert_int_equal(keel_ckpt_manifest_decode(encoded, length, &decoded), KEEL_OK);
    assert_memory_equal(&decoded.identity, &identity, sizeof identity);
    assert_int_equal(decoded.chunk_bytes, manifest.chunk_bytes);
    assert_int_equal(decoded.chunk_count, manifest.chunk_count);
    assert_int_equal(decoded.buffer_count, 4);
    assert_memory_equal(decoded.buffers, manifest.buffers, 4 * sizeof *decoded.buffers);
    assert_memory_equal(decoded.chunk_crc32c, manifest.chunk_crc32c,
                        manifest.chunk_count * sizeof *decoded.chunk_crc32c);
    keel_ckpt_manifest_free(&decoded);

    /* Every flipped bit, every truncation and a trailing byte are refused. */
    for (size_t i = 0; i < length; i++) {
      for (int bit = 0; bit < 8; bit += 3) {
        encoded[i] ^= (uint8_t)(1u << bit);
        assert_int_not_equal(keel_ckpt_manifest_decode(encoded, length, &decoded), KEEL_OK);
        encoded[i] ^= (uint8_t)(1u << bit);
      }
    }
    for (size_t cut = 0; cut < length; cut++) {
      assert_int_not_equal(keel_ckpt_manifest_decode(encoded, cut, &decoded), KEEL_OK);
    }
    encoded[length] = 0;
    assert_int_not_equal(keel_ckpt_manifest_decode(encoded, length + 1, &decoded), KEEL_OK);
    /* A NUL inside a name, resealed with a valid crc ("wei\0hts" would read as "wei" and
     * re-encode differently: found by the fuzz target). */
    assert_memory_equal(encoded + 73, "weights", 7);
    encoded[76] = 0;
    uint32_t crc = keel_crc32c(0, encoded, length - 4);
    for (int i = 0; i < 4; i++) encoded[length - 4 + i] = (uint8_t)(crc >> (8 * i));
    assert_int_equal(keel_ckpt_manifest_decode(encoded, length, &decoded), KEEL_ECORRUPT);
    free(encoded);
    keel_ckpt_manifest_free(&manifest);
  }
  /* Identities that cannot be saved. */
  keel_ckpt_manifest manifest;
  keel_ckpt_identity bad = identity_of(0, 0, 0, 1, 0);
  assert_int_equal(keel_ckpt_manifest_build(s.registry, &bad, 0, &manifest), KEEL_EINVAL);
  bad = identity_of(JOB, 0, 0, 1, 0);
  bad.shard_index = 1;
  assert_int_equal(keel_ckpt_manifest_build(s.registry, &bad, 0, &manifest), KEEL_EINVAL);
  bad.shard_index = 0;
  assert_int_equal(
      keel_ckpt_manifest_build(s.registry, &bad, KEEL_CKPT_MAX_CHUNK_BYTES + 1, &manifest),
      KEEL_ERANGE);
  state_free(&s);
}

/* ---- persistent tier */

static void test_ckpt_persistent_round_trip(void **unused) {
  (void)unused;
  char *root = root_make();
  state s;
  state_make(&s);
  static const uint64_t chunk_sizes[] = {1, 7, 4096, 0};
  for (size_t k = 0; k < sizeof chunk_sizes / sizeof chunk_sizes[0]; k++) {
    keel_ckpt_identity identity = identity_of(JOB, 2, 1, 3 + k, 1);
    save_at(root, &s, &identity, chunk_sizes[k]);
    state_poison(&s);
    keel_ckpt_selector selector = selector_of(JOB);
    keel_ckpt_identity used;
    assert_int_equal(keel_ckpt_persistent_restore(s.registry, root, &selector, &used), KEEL_OK);
    assert_memory_equal(&used, &identity, sizeof used);
    assert_true(state_holds(&s, 0, 3 + k, 1));
  }
  state_free(&s);
  tree_remove(root);
  free(root);
}

/* A rank directory without its manifest is never a snapshot, whatever else it holds. */
static void test_ckpt_manifest_last(void **unused) {
  (void)unused;
  char *root = root_make();
  state s;
  state_make(&s);
  for (uint64_t step = 1; step <= 3; step++) {
    keel_ckpt_identity identity = identity_of(JOB, 0, 0, step, 0);
    save_at(root, &s, &identity, 64);
  }
  char path[512], renamed[512];
  /* step 3: a crash before the manifest's rename (its temporary is there, complete). */
  snapshot_file(path, sizeof path, root, JOB, 3, 0, "manifest");
  snapshot_file(renamed, sizeof renamed, root, JOB, 3, 0, "manifest.new");
  assert_int_equal(rename(path, renamed), 0);
  /* step 2: a crash before the manifest was written at all. */
  snapshot_file(path, sizeof path, root, JOB, 2, 0, "manifest");
  assert_int_equal(unlink(path), 0);
  state_poison(&s);
  keel_ckpt_selector selector = selector_of(JOB);
  keel_ckpt_identity used;
  assert_int_equal(keel_ckpt_persistent_restore(s.registry, root, &selector, &used), KEEL_OK);
  assert_int_equal(used.step, 1);
  assert_true(state_holds(&s, 0, 1, 0));
  state_free(&s);
  tree_remove(root);
  free(root);
}

typedef enum damage { DAMAGE_FLIP, DAMAGE_TRUNCATE, DAMAGE_EXTEND } damage;

/* Replicas 0 and 1 hold step 5; replica 0's buffer file is damaged: replica 1 is used. */
static void check_damaged_replica_skipped(damage kind, const char *file, off_t offset) {
  char *root = root_make();
  state s;
  state_make(&s);
  for (uint32_t replica = 0; replica < 2; replica++) {
    keel_ckpt_identity identity = identity_of(JOB, replica, replica, 5, 0);
    save_at(root, &s, &identity, 100);
  }
  char path[512];
  snapshot_file(path, sizeof path, root, JOB, 5, 0, file);
  struct stat info;
  assert_int_equal(stat(path, &info), 0);
  if (kind == DAMAGE_FLIP) byte_flip(path, offset);
  if (kind == DAMAGE_TRUNCATE) assert_int_equal(truncate(path, info.st_size - 1), 0);
  if (kind == DAMAGE_EXTEND) assert_int_equal(truncate(path, info.st_size + 1), 0);
  state_poison(&s);
  keel_ckpt_selector selector = selector_of(JOB);
  keel_ckpt_identity used;
  assert_int_equal(keel_ckpt_persistent_restore(s.registry, root, &selector, &used), KEEL_OK);
  assert_int_equal(used.replica, 1);
  assert_int_equal(used.step, 5);
  assert_true(state_holds(&s, 0, 5, 0));
  state_free(&s);
  tree_remove(root);
  free(root);
}

static void test_ckpt_corrupt_chunk_takes_other_replica(void **unused) {
  (void)unused;
  check_damaged_replica_skipped(DAMAGE_FLIP, "buffer-0", 0);
  check_damaged_replica_skipped(DAMAGE_FLIP, "buffer-0", 555);
  check_damaged_replica_skipped(DAMAGE_FLIP, "buffer-3", 36);
  check_damaged_replica_skipped(DAMAGE_FLIP, "buffer-2", 7);
  /* A damaged manifest is a malformed one. */
  check_damaged_replica_skipped(DAMAGE_FLIP, "manifest", 50);
}

static void test_ckpt_truncated_chunk(void **unused) {
  (void)unused;
  check_damaged_replica_skipped(DAMAGE_TRUNCATE, "buffer-0", 0);
  check_damaged_replica_skipped(DAMAGE_TRUNCATE, "buffer-3", 0);
  check_damaged_replica_skipped(DAMAGE_EXTEND, "buffer-2", 0);
  check_damaged_replica_skipped(DAMAGE_TRUNCATE, "manifest", 0);
}

static void test_ckpt_other_job_manifest(void **unused) {
  (void)unused;
  char *root = root_make();
  state s;
  state_make(&s);
  keel_ckpt_identity ours = identity_of(JOB, 0, 0, 8, 0);
  save_at(root, &s, &ours, 0);
  keel_ckpt_identity theirs = identity_of(OTHER_JOB, 0, 0, 9, 0);
  save_at(root, &s, &theirs, 0);
  /* Another job's newer snapshot copied into this job's tree. */
  char from[512], to[512];
  snprintf(from, sizeof from, "%s/%d/step-9", root, OTHER_JOB);
  snprintf(to, sizeof to, "%s/%d/step-9", root, JOB);
  assert_int_equal(rename(from, to), 0);
  state_poison(&s);
  keel_ckpt_selector selector = selector_of(JOB);
  keel_ckpt_identity used;
  assert_int_equal(keel_ckpt_persistent_restore(s.registry, root, &selector, &used), KEEL_OK);
  assert_int_equal(used.job_id, JOB);
  assert_int_equal(used.step, 8);
  assert_true(state_holds(&s, 0, 8, 0));
  state_free(&s);
  tree_remove(root);
  free(root);
}

/* A newer snapshot of a differently shaped state (another size, another name) is refused. */
static void test_ckpt_size_mismatch(void **unused) {
  (void)unused;
  char *root = root_make();
  state s;
  state_make(&s);
  keel_ckpt_identity identity = identity_of(JOB, 0, 0, 5, 0);
  save_at(root, &s, &identity, 0);
  uint8_t smaller[36], other[37];
  memset(smaller, 1, sizeof smaller);
  static const char *const last_names[] = {"odd", "renamed"};
  for (int variant = 0; variant < 2; variant++) {
    keel_registry *registry;
    assert_int_equal(keel_registry_create(&registry), KEEL_OK);
    assert_int_equal(keel_registry_add(registry, "weights", s.weights, 1000), KEEL_OK);
    assert_int_equal(keel_registry_add(registry, "adam.m", s.empty, 0), KEEL_OK);
    assert_int_equal(keel_registry_add(registry, "step", &s.step, 8), KEEL_OK);
    assert_int_equal(
        keel_registry_add(registry, last_names[variant], variant == 0 ? smaller : other,
                          variant == 0 ? sizeof smaller : sizeof other),
        KEEL_OK);
    keel_ckpt_identity newer = identity_of(JOB, 0, 0, 6 + (uint64_t)variant, 0);
    assert_int_equal(keel_ckpt_persistent_save(registry, root, &newer, 0), KEEL_OK);
    keel_registry_destroy(registry);
  }
  state_poison(&s);
  keel_ckpt_selector selector = selector_of(JOB);
  keel_ckpt_identity used;
  assert_int_equal(keel_ckpt_persistent_restore(s.registry, root, &selector, &used), KEEL_OK);
  assert_int_equal(used.step, 5);
  assert_true(state_holds(&s, 0, 5, 0));
  /* A registry with one buffer more than every snapshot: none fits. */
  uint8_t extra[4];
  assert_int_equal(keel_registry_add(s.registry, "extra", extra, sizeof extra), KEEL_OK);
  state_poison(&s);
  assert_int_equal(keel_ckpt_persistent_restore(s.registry, root, &selector, &used), KEEL_ECORRUPT);
  assert_true(state_poisoned(&s));
  state_free(&s);
  tree_remove(root);
  free(root);
}

/* JIT §3.3: replicas may have saved step i or i+1; i+1 wins, whichever replica holds it. */
static void test_ckpt_newest_step_of_any_replica(void **unused) {
  (void)unused;
  char *root = root_make();
  state s;
  state_make(&s);
  keel_ckpt_identity at_i = identity_of(JOB, 0, 0, 10, 0);
  save_at(root, &s, &at_i, 0);
  keel_ckpt_identity at_next = identity_of(JOB, 3, 1, 11, 0);
  save_at(root, &s, &at_next, 0);
  keel_ckpt_selector selector = selector_of(JOB);
  keel_ckpt_identity used;
  state_poison(&s);
  assert_int_equal(keel_ckpt_persistent_restore(s.registry, root, &selector, &used), KEEL_OK);
  assert_int_equal(used.step, 11);
  assert_int_equal(used.replica, 1);
  assert_int_equal(used.rank, 3);
  assert_true(state_holds(&s, 0, 11, 0));
  /* max_step holds the choice back (all shards agreeing on one step). */
  selector.max_step = 10;
  assert_int_equal(keel_ckpt_persistent_restore(s.registry, root, &selector, &used), KEEL_OK);
  assert_int_equal(used.step, 10);
  assert_true(state_holds(&s, 0, 10, 0));
  /* The same step saved by a later incarnation (higher sequence) wins over the earlier. */
  keel_ckpt_identity later = identity_of(JOB, 2, 2, 11, 4);
  save_at(root, &s, &later, 0);
  selector.max_step = UINT64_MAX;
  state_poison(&s);
  assert_int_equal(keel_ckpt_persistent_restore(s.registry, root, &selector, &used), KEEL_OK);
  assert_int_equal(used.sequence, 4);
  assert_int_equal(used.replica, 2);
  assert_true(state_holds(&s, 0, 11, 4));
  state_free(&s);
  tree_remove(root);
  free(root);
}

static void test_ckpt_all_bad_leaves_state(void **unused) {
  (void)unused;
  char *root = root_make();
  state s;
  state_make(&s);
  keel_ckpt_selector selector = selector_of(JOB);
  keel_ckpt_identity used = {0};
  /* Nothing saved at all. */
  state_poison(&s);
  assert_int_equal(keel_ckpt_persistent_restore(s.registry, root, &selector, &used),
                   KEEL_ENOTFOUND);
  assert_true(state_poisoned(&s));
  /* Two replicas, each with one bad byte (the second in the last chunk of a buffer). */
  for (uint32_t replica = 0; replica < 2; replica++) {
    keel_ckpt_identity identity = identity_of(JOB, replica, replica, 4, 0);
    save_at(root, &s, &identity, 64);
  }
  char path[512];
  snapshot_file(path, sizeof path, root, JOB, 4, 0, "buffer-0");
  byte_flip(path, 999);
  snapshot_file(path, sizeof path, root, JOB, 4, 1, "buffer-2");
  byte_flip(path, 0);
  state_poison(&s);
  assert_int_equal(keel_ckpt_persistent_restore(s.registry, root, &selector, &used), KEEL_ECORRUPT);
  assert_true(state_poisoned(&s));
  assert_int_equal(used.step, 0);
  state_free(&s);
  tree_remove(root);
  free(root);
}

/* Hybrid sharding: two shards, two replicas each, all in one job directory. */
static void test_ckpt_shards(void **unused) {
  (void)unused;
  char *root = root_make();
  state s;
  state_make(&s);
  for (uint32_t rank = 0; rank < 4; rank++) {
    keel_ckpt_identity identity = {.job_id = JOB,
                                   .rank = rank,
                                   .shard_index = rank % 2,
                                   .shard_count = 2,
                                   .replica = rank / 2,
                                   .step = 20};
    save_at(root, &s, &identity, 0);
  }
  keel_ckpt_selector selector = {
      .job_id = JOB, .shard_index = 1, .shard_count = 2, .max_step = UINT64_MAX};
  keel_ckpt_identity used;
  state_poison(&s);
  assert_int_equal(keel_ckpt_persistent_restore(s.registry, root, &selector, &used), KEEL_OK);
  assert_int_equal(used.shard_index, 1);
  assert_int_equal(used.rank, 1);
  assert_true(state_holds(&s, 1, 20, 0));
  /* Another sharding's snapshots do not fit. */
  selector.shard_count = 4;
  state_poison(&s);
  assert_int_equal(keel_ckpt_persistent_restore(s.registry, root, &selector, &used), KEEL_ECORRUPT);
  assert_true(state_poisoned(&s));
  /* A shard nobody saved. */
  selector.shard_count = 0;
  selector.shard_index = 2;
  assert_int_equal(keel_ckpt_persistent_restore(s.registry, root, &selector, &used),
                   KEEL_ENOTFOUND);
  state_free(&s);
  tree_remove(root);
  free(root);
}

/* A collective that failed on some ranks and completed on others leaves a sharded job's
 * survivors a step apart: shard 0 at steps 6 (rank 2) and 7 (rank 0), shard 1 at step 6
 * only (rank 1; rank 3 died). Each rank of the restart restores its own shard; with
 * common_step every shard comes from step 6, the newest one they all have. */
static void save_shard(const char *root, state *s, uint32_t rank, uint64_t step) {
  keel_ckpt_identity identity = {.job_id = JOB,
                                 .rank = rank,
                                 .shard_index = rank % 2,
                                 .shard_count = 2,
                                 .replica = rank / 2,
                                 .step = step};
  save_at(root, s, &identity, 0);
}

static void test_ckpt_shards_restore_one_common_step(void **unused) {
  (void)unused;
  char *root = root_make();
  state s;
  state_make(&s);
  save_shard(root, &s, 0, 7);
  save_shard(root, &s, 2, 6);
  save_shard(root, &s, 1, 6);
  keel_ckpt_selector selector = {.job_id = JOB,
                                 .shard_index = 0,
                                 .shard_count = 2,
                                 .max_step = UINT64_MAX,
                                 .common_step = true};
  keel_ckpt_identity used;
  for (uint32_t shard = 0; shard < 2; shard++) {
    selector.shard_index = shard;
    state_poison(&s);
    assert_int_equal(keel_ckpt_persistent_restore(s.registry, root, &selector, &used), KEEL_OK);
    assert_int_equal(used.step, 6);
    assert_true(state_holds(&s, shard, 6, 0));
  }
  /* Without it, shard 0 alone would take its newest step. */
  selector.shard_index = 0;
  selector.common_step = false;
  assert_int_equal(keel_ckpt_persistent_restore(s.registry, root, &selector, &used), KEEL_OK);
  assert_int_equal(used.step, 7);
  /* When the only step-6 snapshot of shard 1 is damaged, no older step is tried: the rank
   * says so rather than restore a step the other shard's ranks would not. */
  char path[512];
  snapshot_file(path, sizeof path, root, JOB, 6, 1, "buffer-0");
  byte_flip(path, 0);
  selector.shard_index = 1;
  selector.common_step = true;
  state_poison(&s);
  assert_int_equal(keel_ckpt_persistent_restore(s.registry, root, &selector, &used), KEEL_ECORRUPT);
  assert_true(state_poisoned(&s));
  /* No step with both shards: nothing is restored. */
  snapshot_file(path, sizeof path, root, JOB, 6, 1, "manifest");
  assert_int_equal(unlink(path), 0);
  selector.shard_index = 0;
  state_poison(&s);
  assert_int_equal(keel_ckpt_persistent_restore(s.registry, root, &selector, &used),
                   KEEL_ENOTFOUND);
  assert_true(state_poisoned(&s));
  state_free(&s);
  tree_remove(root);
  free(root);
}

/* ---- failures during a save */

/* Fails the fail_at-th file operation of a save: writes with ENOSPC, the rest with EIO.
 * Closes still release the descriptor, as Linux's do. */
typedef struct fault_shim {
  int calls;
  int fail_at;
  bool fired;
} fault_shim;

static bool shim_fails(void *context, int error_number) {
  fault_shim *shim = context;
  if (shim->calls++ != shim->fail_at) return false;
  shim->fired = true;
  errno = error_number;
  return true;
}
static int shim_mkdirat(void *context, int directory, const char *name, mode_t mode) {
  return shim_fails(context, EIO) ? -1 : mkdirat(directory, name, mode);
}
static int shim_openat(void *context, int directory, const char *name, int flags, mode_t mode) {
  return shim_fails(context, EIO) ? -1 : openat(directory, name, flags, mode);
}
static ssize_t shim_write(void *context, int file, const void *data, size_t length) {
  return shim_fails(context, ENOSPC) ? -1 : write(file, data, length);
}
static int shim_fsync(void *context, int file) {
  return shim_fails(context, EIO) ? -1 : fsync(file);
}
static int shim_close(void *context, int file) {
  int result = close(file);
  return shim_fails(context, EIO) ? -1 : result;
}
static int shim_renameat(void *context, int directory, const char *from, const char *to) {
  return shim_fails(context, EIO) ? -1 : renameat(directory, from, directory, to);
}
static int shim_unlinkat(void *context, int directory, const char *name, int flags) {
  return shim_fails(context, EIO) ? -1 : unlinkat(directory, name, flags);
}
static const keel__ckpt_file_ops shim_ops = {
    .mkdirat = shim_mkdirat,
    .openat = shim_openat,
    .write = shim_write,
    .fsync = shim_fsync,
    .close = shim_close,
    .renameat = shim_renameat,
    .unlinkat = shim_unlinkat,
};

static bool temporaries_left(const char *root, uint64_t step) {
  char path[512];
  for (int b = 0; b < 4; b++) {
    char name[32];
    snprintf(name, sizeof name, "buffer-%d.new", b);
    snapshot_file(path, sizeof path, root, JOB, step, 0, name);
    if (path_exists(path)) return true;
  }
  snapshot_file(path, sizeof path, root, JOB, step, 0, "manifest.new");
  return path_exists(path);
}

/* Saves identity failing each operation in turn until a save succeeds. Each failed save
 * must return an error and leave no temporaries; the restore that follows must load a
 * snapshot whose bytes are those of the identity it reports, at least at step `oldest`. */
static int save_failing_each_operation(const char *root, state *s,
                                       const keel_ckpt_identity *identity, uint64_t oldest,
                                       bool new_directory) {
  int failures = 0;
  for (int fail_at = 0; fail_at < 1000; fail_at++) {
    fault_shim shim = {.fail_at = fail_at};
    state_fill(s, 0, identity->step, identity->sequence);
    keel_status status =
        keel__ckpt_persistent_save_with(&shim_ops, &shim, s->registry, root, identity, 300, NULL);
    if (status == KEEL_OK) {
      /* No failure, or one past the commit that does not matter (closing a directory). */
      keel_ckpt_selector selector = selector_of(JOB);
      keel_ckpt_identity used;
      state_poison(s);
      assert_int_equal(keel_ckpt_persistent_restore(s->registry, root, &selector, &used), KEEL_OK);
      assert_memory_equal(&used, identity, sizeof used);
      assert_true(state_holds(s, 0, identity->step, identity->sequence));
      return failures;
    }
    assert_true(shim.fired);
    failures++;
    assert_int_not_equal(status, KEEL_OK);
    assert_false(temporaries_left(root, identity->step));
    char path[512];
    snapshot_file(path, sizeof path, root, JOB, identity->step, 0, "manifest");
    if (new_directory) assert_false(path_exists(path));
    state_poison(s);
    keel_ckpt_selector selector = selector_of(JOB);
    keel_ckpt_identity used;
    assert_int_equal(keel_ckpt_persistent_restore(s->registry, root, &selector, &used), KEEL_OK);
    assert_true(used.step >= oldest);
    assert_true(state_holds(s, 0, used.step, used.sequence));
  }
  fail_msg("the save never finished");
  return failures;
}

static void test_ckpt_save_fails_at_each_operation(void **unused) {
  (void)unused;
  char *root = root_make();
  state s;
  state_make(&s);
  keel_ckpt_identity first = identity_of(JOB, 0, 0, 1, 1);
  save_at(root, &s, &first, 300);
  /* A new step: the previous snapshot must restore after every failure. */
  keel_ckpt_identity second = identity_of(JOB, 0, 0, 2, 1);
  int failures = save_failing_each_operation(root, &s, &second, 1, true);
  assert_true(failures > 20);
  /* The same step and rank again, by a later incarnation: the old snapshot of step 2 or the
   * one of step 1 restores, never a mix. */
  keel_ckpt_identity again = identity_of(JOB, 0, 0, 2, 2);
  failures = save_failing_each_operation(root, &s, &again, 1, false);
  assert_true(failures > 20);
  keel_ckpt_selector selector = selector_of(JOB);
  keel_ckpt_identity used;
  state_poison(&s);
  assert_int_equal(keel_ckpt_persistent_restore(s.registry, root, &selector, &used), KEEL_OK);
  assert_int_equal(used.sequence, 2);
  assert_true(state_holds(&s, 0, 2, 2));
  state_free(&s);
  tree_remove(root);
  free(root);
}

/* The full-disk case mounts a tmpfs on a fresh directory; the teardown takes it away even
 * when an assertion ends the test early, so that no mount outlives the test. */
static int disk_full_setup(void **test_state) {
  *test_state = root_make();
  return 0;
}

static int disk_full_teardown(void **test_state) {
  char *root = *test_state;
  keel_test_tmpfs_release(NULL);
  tree_remove(root);
  free(root);
  return 0;
}

/* A real full disk: a 64 KiB tmpfs holds one snapshot of a 40 KiB state, not two. */
static void test_ckpt_disk_full(void **test_state) {
  const char *root = *test_state;
  if (!keel_test_tmpfs_mount(__func__, root, 0, "size=64k")) skip();
  static uint8_t big[40 * 1024];
  keel_registry *registry;
  assert_int_equal(keel_registry_create(&registry), KEEL_OK);
  assert_int_equal(keel_registry_add(registry, "big", big, sizeof big), KEEL_OK);
  memset(big, 1, sizeof big);
  keel_ckpt_identity first = identity_of(JOB, 0, 0, 1, 0);
  assert_int_equal(keel_ckpt_persistent_save(registry, root, &first, 0), KEEL_OK);
  memset(big, 2, sizeof big);
  keel_ckpt_identity second = identity_of(JOB, 0, 0, 2, 0);
  assert_int_equal(keel_ckpt_persistent_save(registry, root, &second, 0), KEEL_ENOSPC);
  char path[512];
  snapshot_file(path, sizeof path, root, JOB, 2, 0, "manifest");
  assert_false(path_exists(path));
  assert_false(temporaries_left(root, 2));
  /* Over the same step: the old snapshot stays. */
  keel_ckpt_identity again = identity_of(JOB, 0, 0, 1, 1);
  assert_int_equal(keel_ckpt_persistent_save(registry, root, &again, 0), KEEL_ENOSPC);
  memset(big, 0, sizeof big);
  keel_ckpt_selector selector = selector_of(JOB);
  keel_ckpt_identity used;
  assert_int_equal(keel_ckpt_persistent_restore(registry, root, &selector, &used), KEEL_OK);
  assert_int_equal(used.step, 1);
  assert_int_equal(used.sequence, 0);
  for (size_t i = 0; i < sizeof big; i++) assert_int_equal(big[i], 1);
  keel_registry_destroy(registry);
}

/* A disk that turns read-only (a remount, as after file-system errors): saves fail with
 * KEEL_EACCES, whose name says why, the step's directory gets nothing torn, and the snapshot
 * saved before still restores. */
static void test_ckpt_disk_read_only(void **test_state) {
  const char *root = *test_state;
  if (!keel_test_tmpfs_mount(__func__, root, 0, "size=1m")) skip();
  static uint8_t state_bytes[8 * 1024];
  keel_registry *registry;
  assert_int_equal(keel_registry_create(&registry), KEEL_OK);
  assert_int_equal(keel_registry_add(registry, "state", state_bytes, sizeof state_bytes), KEEL_OK);
  memset(state_bytes, 1, sizeof state_bytes);
  keel_ckpt_identity first = identity_of(JOB, 0, 0, 1, 0);
  assert_int_equal(keel_ckpt_persistent_save(registry, root, &first, 0), KEEL_OK);
  assert_int_equal(mount("tmpfs", root, "tmpfs", MS_REMOUNT | MS_RDONLY, "size=1m"), 0);
  memset(state_bytes, 2, sizeof state_bytes);
  keel_ckpt_identity second = identity_of(JOB, 0, 0, 2, 0);
  char reason[KEEL__CKPT_REASON_BYTES] = "";
  assert_int_equal(keel__ckpt_persistent_save_with(&keel__ckpt_posix_file_ops, NULL, registry, root,
                                                   &second, 0, reason),
                   KEEL_EACCES);
  if (strstr(reason, "Read-only file system") == NULL) fail_msg("reason: '%s'", reason);
  assert_string_equal(keel_status_name(KEEL_EACCES), "KEEL_EACCES");
  assert_false(temporaries_left(root, 2));
  memset(state_bytes, 0, sizeof state_bytes);
  keel_ckpt_selector selector = selector_of(JOB);
  keel_ckpt_identity used;
  assert_int_equal(keel_ckpt_persistent_restore(registry, root, &selector, &used), KEEL_OK);
  assert_int_equal(used.step, 1);
  for (size_t i = 0; i < sizeof state_bytes; i++) assert_int_equal(state_bytes[i], 1);
  keel_registry_destroy(registry);
}

/* ---- in-memory tier */

typedef struct region_pair {
  keel_ckpt_region regions[2];
  size_t bytes;
} region_pair;

static void regions_make(region_pair *pair, const state *s, uint64_t chunk_bytes) {
  assert_int_equal(keel_ckpt_memory_bytes(s->registry, chunk_bytes, &pair->bytes), KEEL_OK);
  for (int i = 0; i < 2; i++) {
    pair->regions[i].base = aligned_alloc(64, (pair->bytes + 63) / 64 * 64);
    assert_non_null(pair->regions[i].base);
    memset(pair->regions[i].base, 0, pair->bytes);
    pair->regions[i].bytes = pair->bytes;
  }
}

static void regions_free(region_pair *pair) {
  for (int i = 0; i < 2; i++) free(pair->regions[i].base);
}

static void memory_save_at(state *s, const keel_ckpt_identity *identity, uint64_t chunk_bytes,
                           const keel_ckpt_region *region) {
  state_fill(s, identity->shard_index, identity->step, identity->sequence);
  assert_int_equal(keel_ckpt_memory_save(s->registry, identity, chunk_bytes, region), KEEL_OK);
}

static void test_ckpt_memory_round_trip(void **unused) {
  (void)unused;
  state s;
  state_make(&s);
  static const uint64_t chunk_sizes[] = {1, 7, 4096, 0};
  for (size_t k = 0; k < sizeof chunk_sizes / sizeof chunk_sizes[0]; k++) {
    region_pair pair;
    regions_make(&pair, &s, chunk_sizes[k]);
    keel_ckpt_selector selector = selector_of(JOB);
    keel_ckpt_identity used;
    /* Never written: no complete snapshot. */
    assert_int_equal(keel_ckpt_memory_restore(s.registry, pair.regions, 2, &selector, &used),
                     KEEL_ENOTFOUND);
    keel_ckpt_identity identity = identity_of(JOB, 1, 1, 30 + k, 2);
    memory_save_at(&s, &identity, chunk_sizes[k], &pair.regions[0]);
    state_poison(&s);
    assert_int_equal(keel_ckpt_memory_restore(s.registry, pair.regions, 2, &selector, &used),
                     KEEL_OK);
    assert_memory_equal(&used, &identity, sizeof used);
    assert_true(state_holds(&s, 0, 30 + k, 2));
    /* One byte short: refused, and the region keeps its snapshot. */
    keel_ckpt_region small = {.base = pair.regions[0].base, .bytes = pair.bytes - 1};
    keel_ckpt_identity newer = identity_of(JOB, 1, 1, 99, 2);
    assert_int_equal(keel_ckpt_memory_save(s.registry, &newer, chunk_sizes[k], &small),
                     KEEL_ERANGE);
    assert_int_equal(keel_ckpt_memory_restore(s.registry, pair.regions, 1, &selector, &used),
                     KEEL_OK);
    assert_int_equal(used.step, 30 + k);
    regions_free(&pair);
  }
  state_free(&s);
}

static void test_ckpt_memory_replicas(void **unused) {
  (void)unused;
  state s;
  state_make(&s);
  region_pair pair;
  regions_make(&pair, &s, 128);
  keel_ckpt_identity at_i = identity_of(JOB, 0, 0, 4, 0);
  memory_save_at(&s, &at_i, 128, &pair.regions[0]);
  keel_ckpt_identity at_next = identity_of(JOB, 1, 1, 5, 0);
  memory_save_at(&s, &at_next, 128, &pair.regions[1]);
  keel_ckpt_selector selector = selector_of(JOB);
  keel_ckpt_identity used;
  state_poison(&s);
  assert_int_equal(keel_ckpt_memory_restore(s.registry, pair.regions, 2, &selector, &used),
                   KEEL_OK);
  assert_int_equal(used.step, 5);
  assert_true(state_holds(&s, 0, 5, 0));

  /* A bad byte in step 5's data: step 4 of the other replica. */
  uint8_t *base = pair.regions[1].base;
  base[pair.bytes - 1] ^= 1;
  state_poison(&s);
  assert_int_equal(keel_ckpt_memory_restore(s.registry, pair.regions, 2, &selector, &used),
                   KEEL_OK);
  assert_int_equal(used.step, 4);
  assert_true(state_holds(&s, 0, 4, 0));
  base[pair.bytes - 1] ^= 1;

  /* A save that died before its seal (odd): that region does not count. */
  keel__ckpt_region_header *header = pair.regions[1].base;
  uint64_t seal = atomic_load(&header->seal);
  atomic_store(&header->seal, seal + 1);
  assert_int_equal(keel_ckpt_memory_restore(s.registry, pair.regions, 2, &selector, &used),
                   KEEL_OK);
  assert_int_equal(used.step, 4);
  atomic_store(&header->seal, seal);

  /* Both bad: the state is left alone. */
  uint8_t *other = pair.regions[0].base;
  other[pair.bytes - 5] ^= 1;
  base[sizeof *header + 20] ^= 1; /* inside the manifest */
  state_poison(&s);
  assert_int_equal(keel_ckpt_memory_restore(s.registry, pair.regions, 2, &selector, &used),
                   KEEL_ECORRUPT);
  assert_true(state_poisoned(&s));
  assert_int_equal(keel_ckpt_memory_restore(s.registry, NULL, 0, &selector, &used), KEEL_ENOTFOUND);
  regions_free(&pair);
  state_free(&s);
}

/* ---- a reader restoring while a writer saves into the same region. The state is the small
 * one plus a large buffer, so that one save takes milliseconds; the region header's seal
 * (odd while a save writes) tells the reader when a save is in progress. */
#define RACE_BIG_WORDS ((size_t)2 << 20) /* 16 MiB */
#define RACE_CHUNK_BYTES (64u << 10)
#define RACE_MAX_SAVES 400
/* Once the reader has this many restores of each kind, the writer stops. */
#define RACE_ENOUGH 10
/* The bound on each wait of the reader or the writer for the other (times the slowdown). */
#define RACE_WAIT_MS 2000

typedef struct race_state {
  state small;
  uint64_t *big;
} race_state;

/* Word k of the large buffer at step: every word differs from one step to the next, so a mix
 * of two saves shows. */
static uint64_t race_word(uint64_t step, size_t k) {
  return step * 0x9e3779b97f4a7c15u + (uint64_t)k * 0xbf58476d1ce4e5b9u;
}

static void race_state_make(race_state *s) {
  state_make(&s->small);
  s->big = malloc(RACE_BIG_WORDS * sizeof *s->big);
  assert_non_null(s->big);
  assert_int_equal(
      keel_registry_add(s->small.registry, "activations", s->big, RACE_BIG_WORDS * sizeof *s->big),
      KEEL_OK);
}

static void race_state_free(race_state *s) {
  state_free(&s->small);
  free(s->big);
}

static void race_state_fill(race_state *s, uint64_t step) {
  state_fill(&s->small, 0, step, 0);
  for (size_t k = 0; k < RACE_BIG_WORDS; k++) s->big[k] = race_word(step, k);
}

static bool race_state_holds(const race_state *s, uint64_t step) {
  if (!state_holds(&s->small, 0, step, 0)) return false;
  for (size_t k = 0; k < RACE_BIG_WORDS; k++)
    if (s->big[k] != race_word(step, k)) return false;
  return true;
}

static void race_state_poison(race_state *s) {
  state_poison(&s->small);
  memset(s->big, 0x5a, RACE_BIG_WORDS * sizeof *s->big);
}

static bool race_state_poisoned(const race_state *s) {
  static uint8_t poison[64 << 10];
  if (poison[0] != 0x5a) memset(poison, 0x5a, sizeof poison);
  if (!state_poisoned(&s->small)) return false;
  /* memcmp, not a loop over bytes: fast in the sanitizer build too. */
  const uint8_t *bytes = (const uint8_t *)s->big;
  for (size_t i = 0; i < RACE_BIG_WORDS * sizeof *s->big; i += sizeof poison)
    if (memcmp(bytes + i, poison, sizeof poison) != 0) return false;
  return true;
}

typedef struct race {
  keel_ckpt_region region;
  race_state *writer_state;
  int64_t wait_ns;
  _Atomic uint64_t waiting;     /* the step after whose save the writer waits; 0: it does not */
  _Atomic uint64_t reader_turn; /* the newest step the reader restored from a sealed region */
  atomic_bool stop;             /* the reader has seen enough: the writer may finish */
  atomic_bool done;             /* the writer has finished */
  uint64_t saved;               /* saves made; read after the join */
} race;

/* What the reader's restores showed. */
typedef struct race_tally {
  int inside;    /* ran wholly inside one save (same odd seal before and after): refused */
  int loaded;    /* loaded a complete snapshot */
  int overtaken; /* a save began or ended meanwhile, and the restore was refused */
  int racing;    /* of loaded: a save began or ended meanwhile */
} race_tally;

static uint64_t race_seal(const race *r) {
  keel__ckpt_region_header *header = r->region.base;
  return atomic_load(&header->seal);
}

/* The writer: a training loop that saves every step. After every other save it waits
 * (bounded) for the reader to restore that save, as training leaves time between
 * checkpoints; after the others it goes straight on, so a save may overtake a restore. No
 * cmocka assertion here: they cannot jump out of another thread. */
static void *race_writer(void *argument) {
  race *r = argument;
  race_state *s = r->writer_state;
  uint64_t step = 1;
  for (; step <= RACE_MAX_SAVES && !atomic_load(&r->stop); step++) {
    race_state_fill(s, step);
    keel_ckpt_identity identity = identity_of(JOB, 0, 0, step, 0);
    if (keel_ckpt_memory_save(s->small.registry, &identity, RACE_CHUNK_BYTES, &r->region) !=
        KEEL_OK)
      abort();
    if (step % 2 != 0) continue;
    atomic_store(&r->waiting, step);
    int64_t deadline = keel_now_ns() + r->wait_ns;
    while (atomic_load(&r->reader_turn) < step && !atomic_load(&r->stop) &&
           keel_now_ns() < deadline)
      sched_yield();
    atomic_store(&r->waiting, 0);
  }
  r->saved = step - 1;
  atomic_store(&r->done, true);
  return NULL;
}

/* Waits (bounded) until the seal is odd (a save in progress) or, for odd false, even and not
 * 0 (a complete snapshot); true with the seal read. False when the writer finished first, the
 * bound passed, or (odd) the writer waits for the reader and will not save meanwhile. */
static bool race_wait_seal(const race *r, bool odd, uint64_t *seal_p) {
  int64_t deadline = keel_now_ns() + r->wait_ns;
  while (!atomic_load(&r->done) && keel_now_ns() < deadline) {
    uint64_t seal = race_seal(r);
    if (seal != 0 && (seal % 2 == 1) == odd) {
      *seal_p = seal;
      return true;
    }
    if (odd && atomic_load(&r->waiting) != 0) return false;
    sched_yield();
  }
  return false;
}

/* One restore, its seal read just before (before); checks what it did against the seal read
 * just after. Save k (the k-th, of step k) makes the seal 2k-1, then 2k. Writes what is wrong
 * into problem (capacity bytes; empty when all is right): the writer is still running, so no
 * cmocka assertion may jump out of here. */
static void race_restore(const race *r, race_state *s, uint64_t before, race_tally *tally,
                         char *problem, size_t capacity) {
  keel_ckpt_selector selector = selector_of(JOB);
  keel_ckpt_identity used = {0};
  race_state_poison(s);
  keel_status status = keel_ckpt_memory_restore(s->small.registry, &r->region, 1, &selector, &used);
  uint64_t after = race_seal(r);
  bool loaded = status == KEEL_OK;
  const char *wrong = NULL;
  if (!loaded && status != KEEL_ENOTFOUND) {
    wrong = "refused with another status than KEEL_ENOTFOUND";
  } else if (!loaded && !race_state_poisoned(s)) {
    wrong = "refused, but the state was overwritten";
  } else if (loaded && !race_state_holds(s, used.step)) {
    wrong = "loaded bytes that are not those of the step it reports";
  } else if (before == after && before % 2 == 1) {
    /* The whole restore ran inside one save: it must be refused as incomplete. */
    if (loaded) wrong = "loaded a snapshot while the save was in progress";
    tally->inside++;
  } else if (before == after) {
    /* No save touched the region meanwhile: its snapshot loads. */
    if (!loaded || used.step != before / 2) wrong = "did not load the sealed snapshot";
    tally->loaded++;
  } else if (loaded) {
    /* A save began or ended meanwhile: what loaded is still one complete snapshot. */
    if (used.step < before / 2 || used.step > after / 2) wrong = "loaded a step out of range";
    tally->loaded++;
    tally->racing++;
  } else {
    tally->overtaken++;
  }
  if (wrong != NULL)
    snprintf(problem, capacity,
             "restore with the seal at %llu before and %llu after: %s (%s, step %llu)",
             (unsigned long long)before, (unsigned long long)after, wrong, keel_status_name(status),
             (unsigned long long)used.step);
}

static void test_ckpt_memory_concurrent_save(void **unused) {
  (void)unused;
  race_state reader, writer;
  race_state_make(&reader);
  race_state_make(&writer);
  size_t bytes = 0;
  assert_int_equal(keel_ckpt_memory_bytes(reader.small.registry, RACE_CHUNK_BYTES, &bytes),
                   KEEL_OK);
  race r = {.region = {.base = aligned_alloc(64, (bytes + 63) / 64 * 64), .bytes = bytes},
            .writer_state = &writer,
            .wait_ns = (int64_t)RACE_WAIT_MS * keel_test_slowdown() * 1000000};
  assert_non_null(r.region.base);
  memset(r.region.base, 0, bytes);
  atomic_init(&r.reader_turn, 0);
  atomic_init(&r.stop, false);
  atomic_init(&r.done, false);
  int64_t start = keel_now_ns();
  pthread_t writer_thread;
  assert_int_equal(pthread_create(&writer_thread, NULL, race_writer, &r), 0);
  race_tally tally = {0};
  char problem[256] = "";
  while (!atomic_load(&r.done) && problem[0] == '\0') {
    uint64_t before = 0;
    /* Into a save: the seal is odd, restore at once. */
    if (race_wait_seal(&r, true, &before))
      race_restore(&r, &reader, before, &tally, problem, sizeof problem);
    /* From a sealed region; then the writer, if it waits, may go on. */
    if (problem[0] == '\0' && race_wait_seal(&r, false, &before)) {
      race_restore(&r, &reader, before, &tally, problem, sizeof problem);
      atomic_store(&r.reader_turn, before / 2);
    }
    if (tally.inside >= RACE_ENOUGH && tally.loaded >= RACE_ENOUGH) atomic_store(&r.stop, true);
  }
  atomic_store(&r.stop, true);
  assert_int_equal(pthread_join(writer_thread, NULL), 0);
  if (problem[0] != '\0') fail_msg("%s", problem);
  int64_t took_ms = (keel_now_ns() - start) / 1000000;
  fprintf(stderr,
          "test_ckpt_memory_concurrent_save: %llu saves of %zu bytes in %lld ms; restores: %d "
          "inside a save (refused), %d loaded a complete snapshot (%d while a save began or "
          "ended), %d overtaken by a save (refused)\n",
          (unsigned long long)r.saved, bytes, (long long)took_ms, tally.inside, tally.loaded,
          tally.racing, tally.overtaken);
  /* The overlap must have happened, both ways, for this test to show anything. */
  if (tally.inside == 0) fail_msg("no restore ran while a save was in progress");
  if (tally.loaded == 0) fail_msg("no restore loaded a complete snapshot during the saves");
  keel_ckpt_selector selector = selector_of(JOB);
  keel_ckpt_identity used;
  race_state_poison(&reader);
  assert_int_equal(keel_ckpt_memory_restore(reader.small.registry, &r.region, 1, &selector, &used),
                   KEEL_OK);
  assert_int_equal(used.step, r.saved);
  assert_true(race_state_holds(&reader, r.saved));
  free(r.region.base);
  race_state_free(&writer);
  race_state_free(&reader);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_ckpt_registry_rules),
      cmocka_unit_test(test_ckpt_registry_per_process),
      cmocka_unit_test(test_ckpt_manifest_round_trip),
      cmocka_unit_test(test_ckpt_persistent_round_trip),
      cmocka_unit_test(test_ckpt_manifest_last),
      cmocka_unit_test(test_ckpt_corrupt_chunk_takes_other_replica),
      cmocka_unit_test(test_ckpt_truncated_chunk),
      cmocka_unit_test(test_ckpt_other_job_manifest),
      cmocka_unit_test(test_ckpt_size_mismatch),
      cmocka_unit_test(test_ckpt_newest_step_of_any_replica),
      cmocka_unit_test(test_ckpt_all_bad_leaves_state),
      cmocka_unit_test(test_ckpt_shards),
      cmocka_unit_test(test_ckpt_shards_restore_one_common_step),
      cmocka_unit_test(test_ckpt_save_fails_at_each_operation),
      cmocka_unit_test_setup_teardown(test_ckpt_disk_full, disk_full_setup, disk_full_teardown),
      cmocka_unit_test_setup_teardown(test_ckpt_disk_read_only, disk_full_setup,
                                      disk_full_teardown),
      cmocka_unit_test(test_ckpt_memory_round_trip),
      cmocka_unit_test(test_ckpt_memory_replicas),
      cmocka_unit_test(test_ckpt_memory_concurrent_save),
  };
  return keel_test_finish(cmocka_run_group_tests(tests, NULL, NULL));
}
