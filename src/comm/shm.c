/* The shm transport: collectives through shared memory, for a communicator whose ranks all
 * run on one host (one kernel boot and one network namespace).
 * Each epoch gets its own segment: every rank copies a chunk of its input into its slot,
 * then reduces its slice of the chunk straight from all the slots into a shared result, and
 * copies the result out. It folds the slots in the canonical order (reduce.c), the one tcp's
 * ring and direct exchange evaluate, so a result has the same bits over either transport.
 * Slots and results are double-buffered by sequence parity, so one barrier per phase is all
 * the synchronisation there is. Waiting spins briefly, then sleeps on a futex in short
 * slices; between slices the TCP links are polled, so a dead peer or a revocation is seen
 * at once and the failure semantics stay exactly those of the TCP path. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <linux/futex.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "comm/comm_internal.h"

#define MODULE "shm"
#define CACHE_LINE 64
/* One chunk of the pipeline; the segment holds 2 per rank and 2 for results. Each chunk
 * costs two barriers, so chunks must not be small; but the chunks of every rank in flight
 * must stay in the cache (L2 is 1 MiB a core here): since waiting spins before it sleeps,
 * 1 MiB chunks beat 4 MiB ones at 64 MiB, 54 against 70 ms with 4 ranks and 22 against
 * 29 ms with 2 (medians of 4 alternating runs; BENCHMARKS.md). */
#define DEFAULT_CHUNK_BYTES ((size_t)1 << 20)
/* Up to this many bytes every rank reduces the whole buffer itself: one barrier, not two.
 * 256 KiB: at 256 KiB this was 4-5 times faster than the slice path, at 512 KiB slower. */
#define SMALL_BYTES ((size_t)256 << 10)
#define FUTEX_SLICE_NS (1000 * 1000)
#define YIELD_ROUNDS 100

typedef struct shm_counter {
  _Atomic uint64_t value;
  uint8_t pad[CACHE_LINE - sizeof(uint64_t)];
} shm_counter;

typedef struct shm_header {
  _Atomic uint32_t generation; /* bumped on every publish: the futex word */
  _Atomic uint32_t sleepers;
  uint8_t pad[CACHE_LINE - 2 * sizeof(uint32_t)];
} shm_header;

typedef struct shm_group {
  uint8_t *base;
  size_t bytes;
  size_t chunk_bytes;
  int size;
  shm_header *header;
  shm_counter *arrived; /* per rank: chunks copied in */
  shm_counter *reduced; /* per rank: chunk slices reduced */
  uint8_t *slots;       /* [rank][parity][chunk] */
  uint8_t *results;     /* [parity][chunk] */
  uint64_t sequence;    /* chunks done, the same at every rank */
  int spin_limit;
  size_t small_bytes; /* up to this, every rank reduces the whole buffer (one barrier) */
} shm_group;

static size_t align_up(size_t value, size_t alignment) {
  return (value + alignment - 1) / alignment * alignment;
}

static size_t segment_bytes(int size, size_t chunk_bytes) {
  size_t control = sizeof(shm_header) + 2 * (size_t)size * sizeof(shm_counter);
  return align_up(control, 4096) + ((size_t)size * 2 + 2) * chunk_bytes;
}

static void group_layout(shm_group *group) {
  group->header = (shm_header *)group->base;
  group->arrived = (shm_counter *)(group->base + sizeof(shm_header));
  group->reduced = group->arrived + group->size;
  size_t control = sizeof(shm_header) + 2 * (size_t)group->size * sizeof(shm_counter);
  group->slots = group->base + align_up(control, 4096);
  group->results = group->slots + (size_t)group->size * 2 * group->chunk_bytes;
}

static uint8_t *slot_of(const shm_group *group, int rank, uint64_t sequence) {
  return group->slots + ((size_t)rank * 2 + (size_t)(sequence & 1)) * group->chunk_bytes;
}

/* Rank r's slot of a round lies r strides after rank 0's. */
static size_t slot_stride(const shm_group *group) { return 2 * group->chunk_bytes; }

static uint8_t *result_of(const shm_group *group, uint64_t sequence) {
  return group->results + (size_t)(sequence & 1) * group->chunk_bytes;
}

/* ---- eligibility and setup */

static keel_status map_segment(const char *name, bool create, size_t bytes, uint8_t **base_p) {
  int fd = shm_open(name, O_RDWR | (create ? O_CREAT | O_EXCL : 0), 0600);
  if (fd < 0) return keel_status_from_errno(errno);
  keel_status status = KEEL_OK;
  if (create && ftruncate(fd, (off_t)bytes) != 0) status = keel_status_from_errno(errno);
  void *base = MAP_FAILED;
  if (status == KEEL_OK) {
    base = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) status = keel_status_from_errno(errno);
  }
  close(fd);
  if (status != KEEL_OK) return status;
  *base_p = base;
  return KEEL_OK;
}

static int spin_limit_for(const keel_comm *comm) {
  /* With more ranks than cores a spinning rank steals the core of the rank it waits for:
   * sleep almost at once then. */
  return comm->endpoint->cores >= comm->ranks_on_this_machine ? 2000 : 50;
}

/* The transport's open, collective over the tcp transport: with every rank on this node
 * (transport.c found out), create and map the segment. Any rank's local failure makes every rank
 * fall back (KEEL_ENOTSUP); a peer failure is returned. */
static keel_status transport_open(keel_comm *comm, void **state_p) {
  *state_p = NULL;
  if (!comm->all_on_this_node) return KEEL_ENOTSUP;

  int64_t chunk = (int64_t)DEFAULT_CHUNK_BYTES;
  if (keel_env_int("KEEL_SHM_CHUNK", 4096, (int64_t)1 << 30, &chunk) != KEEL_OK)
    chunk = (int64_t)DEFAULT_CHUNK_BYTES;
  /* A reduce-scatter round cuts a chunk in size pieces: each must hold whole elements. */
  if (chunk < (int64_t)comm->size * CACHE_LINE) chunk = (int64_t)comm->size * CACHE_LINE;
  size_t chunk_bytes = align_up((size_t)chunk, CACHE_LINE);
  size_t bytes = segment_bytes(comm->size, chunk_bytes);
  /* Rank 0 creates the segment before it says its name, so nobody opens it too early; an
   * empty name says it could not. */
  char name[96] = "";
  uint8_t *base = NULL;
  keel_status mapped = KEEL_ENOTFOUND;
  if (comm->rank == 0) {
    keel_random random;
    keel_random_seed(&random, (uint64_t)keel_wall_ns() ^ (uint64_t)getpid());
    snprintf(name, sizeof name, "/keel-%" PRIx64 "-%" PRIu64 "-%" PRIx64,
             comm->endpoint->config.auth.job_id, comm->epoch, keel_random_next(&random));
    mapped = map_segment(name, true, bytes, &base);
    if (mapped != KEEL_OK) name[0] = '\0';
  }
  keel_status status = keel__transport_tcp.broadcast(comm, NULL, name, sizeof name, 0);
  if (status != KEEL_OK) {
    if (comm->rank == 0 && mapped == KEEL_OK) {
      shm_unlink(name);
      munmap(base, bytes);
    }
    return status;
  }
  if (comm->rank != 0 && name[0] != '\0') mapped = map_segment(name, false, bytes, &base);
  /* Everyone reports; all fall back unless all mapped. The barrier also lets rank 0
   * unlink the name once nobody needs it any more. */
  int32_t failed = mapped != KEEL_OK, any_failed = 0;
  status = keel__transport_tcp.allreduce(comm, NULL, &failed, &any_failed, 1, KEEL_I32, KEEL_MAX);
  if (comm->rank == 0 && name[0] != '\0') shm_unlink(name);
  if (status != KEEL_OK || any_failed) {
    if (mapped == KEEL_OK) munmap(base, bytes);
    if (mapped != KEEL_OK) KEEL_LOG_W(MODULE, "cannot map %s: %s", name, keel_strerror(mapped));
    return status != KEEL_OK ? status : KEEL_ENOTSUP;
  }
  shm_group *group = calloc(1, sizeof *group);
  if (group == NULL) {
    munmap(base, bytes);
    return KEEL_ENOMEM;
  }
  int64_t small = (int64_t)SMALL_BYTES;
  if (keel_env_int("KEEL_SHM_SMALL", 0, (int64_t)1 << 30, &small) != KEEL_OK)
    small = (int64_t)SMALL_BYTES;
  *group = (shm_group){.base = base,
                       .bytes = bytes,
                       .chunk_bytes = chunk_bytes,
                       .size = comm->size,
                       .spin_limit = spin_limit_for(comm),
                       .small_bytes = (size_t)small};
  group_layout(group);
  /* No pre-touching of the slots: fresh memory is slow to touch here (MACHINE-NOTES), and a
   * new epoch's first operation is usually the small redo of a recovery, which would pay
   * for megabytes it does not use. Pages are touched by the operations that need them. */
  *state_p = group;
  KEEL_LOG_D(MODULE, "epoch %" PRIu64 ": shared memory for %d ranks, %zu-byte chunks", comm->epoch,
             comm->size, chunk_bytes);
  return KEEL_OK;
}

static void transport_close(void *state) {
  shm_group *group = state;
  if (group == NULL) return;
  munmap(group->base, group->bytes);
  free(group);
}

/* ---- publishing and waiting */

static void publish(shm_group *group, shm_counter *counter, uint64_t value) {
  atomic_store_explicit(&counter->value, value, memory_order_release);
  atomic_fetch_add_explicit(&group->header->generation, 1, memory_order_acq_rel);
  if (atomic_load_explicit(&group->header->sleepers, memory_order_acquire) > 0)
    syscall(SYS_futex, &group->header->generation, FUTEX_WAKE, INT32_MAX, NULL, NULL, 0);
}

static bool all_reached(const shm_group *group, const shm_counter *counters, uint64_t target) {
  for (int rank = 0; rank < group->size; rank++) {
    if (atomic_load_explicit(&counters[rank].value, memory_order_acquire) < target) return false;
  }
  return true;
}

/* Requests of the endpoint (state or checkpoint traffic) move on the links while the
 * collective waits here; with none, nothing is polled. */
static void background_progress(keel_comm *comm) {
  if (comm->endpoint->operations != NULL) keel__progress(comm->endpoint, 0);
}

static keel_status wait_all_until(keel_comm *comm, shm_group *group, shm_counter *counters,
                                  uint64_t target, int64_t *deadline_p) {
  for (int spin = 0; spin < group->spin_limit; spin++) {
    if (all_reached(group, counters, target)) return KEEL_OK;
    __builtin_ia32_pause();
  }
  /* Then yield: if the rank we wait for shares our core (more ranks than free cores), it
   * runs at once, far cheaper than a futex sleep and wake-up. */
  for (int round = 0; round < YIELD_ROUNDS; round++) {
    if (all_reached(group, counters, target)) return KEEL_OK;
    background_progress(comm);
    sched_yield();
  }
  for (;;) {
    uint32_t generation = atomic_load_explicit(&group->header->generation, memory_order_acquire);
    if (all_reached(group, counters, target)) return KEEL_OK;
    /* Shared memory gives no EOF: the links tell of a dead peer or a revocation. */
    keel_endpoint *endpoint = comm->endpoint;
    if (endpoint->config.failure_detection) keel__progress(endpoint, 0);
    keel_status health = keel__comm_health(comm);
    if (health == KEEL_OK) health = keel__interrupted(endpoint);
    if (health != KEEL_OK) return health;
    if (keel__deadline_passed(comm, deadline_p)) return KEEL_ETIMEDOUT;
    atomic_fetch_add_explicit(&group->header->sleepers, 1, memory_order_acq_rel);
    if (!all_reached(group, counters, target)) {
      struct timespec slice = {0, FUTEX_SLICE_NS};
      syscall(SYS_futex, &group->header->generation, FUTEX_WAIT, generation, &slice, NULL, 0);
    }
    atomic_fetch_sub_explicit(&group->header->sleepers, 1, memory_order_acq_rel);
  }
}

/* The wait for the others' counters, measured against its deadline as a member's declared
 * section left it (keel_wait_ended). */
static keel_status wait_all(keel_comm *comm, shm_group *group, shm_counter *counters,
                            uint64_t target, int64_t deadline_ns) {
  keel_status status = wait_all_until(comm, group, counters, target, &deadline_ns);
  keel_wait_ended(KEEL_WAIT_COLLECTIVE, deadline_ns);
  return status;
}

/* ---- the allreduce */

/* One allreduce, as each of its chunks sees it. */
typedef struct allreduce_job {
  const uint8_t *send;
  uint8_t *recv;
  size_t total; /* elements of the whole operation: with the world size, they set the order */
  size_t element_size;
  keel_dtype dtype;
  keel_reduce_op op;
  int64_t deadline_ns;
  bool small; /* every rank reduces the whole buffer itself */
} allreduce_job;

/* Folds elements [first, first + count) of the operation into destination in the canonical
 * order; the round's slots hold the chunk that begins at element chunk_first. */
static void allreduce_fold_range(const shm_group *group, uint64_t sequence,
                                 const allreduce_job *job, size_t chunk_first, size_t first,
                                 size_t count, uint8_t *destination) {
  const uint8_t *contributions =
      slot_of(group, 0, sequence) + (first - chunk_first) * job->element_size;
  keel__allreduce_fold(job->dtype, job->op, destination, contributions, slot_stride(group),
                       group->size, job->total, first, count);
}

/* Every rank publishes that its slot of the round is written and waits for all the others':
 * the round's slots can then be read until this rank writes the same parity two rounds
 * later, which needs every rank's arrival in the next round, so after they read this one. */
static keel_status round_meet(keel_comm *comm, shm_group *group, bool allreduce,
                              int64_t deadline_ns) {
  uint64_t sequence = group->sequence;
  publish(group, &group->arrived[comm->rank], sequence + 1);
  background_progress(comm);
  if (allreduce) keel__fault(comm->endpoint, "allreduce", (int64_t)sequence + 1);
  return wait_all(comm, group, group->arrived, sequence + 1, deadline_ns);
}

/* Elements [chunk_first, chunk_first + count) of the allreduce: one round through the slots. */
static keel_status shm_chunk(keel_comm *comm, shm_group *group, const allreduce_job *job,
                             size_t chunk_first, size_t count) {
  size_t element_size = job->element_size;
  uint8_t *recv = job->recv + chunk_first * element_size;
  uint64_t sequence = group->sequence;
  if (count > 0)
    memcpy(slot_of(group, comm->rank, sequence), job->send + chunk_first * element_size,
           count * element_size);
  keel_status status = round_meet(comm, group, true, job->deadline_ns);
  if (status != KEEL_OK) return status;
  if (job->small) {
    allreduce_fold_range(group, sequence, job, chunk_first, chunk_first, count, recv);
  } else {
    size_t first = keel__part_start(count, group->size, comm->rank);
    size_t mine = keel__part_start(count, group->size, comm->rank + 1) - first;
    allreduce_fold_range(group, sequence, job, chunk_first, chunk_first + first, mine,
                         result_of(group, sequence) + first * element_size);
    publish(group, &group->reduced[comm->rank], sequence + 1);
    status = wait_all(comm, group, group->reduced, sequence + 1, job->deadline_ns);
    if (status != KEEL_OK) return status;
    if (count > 0) memcpy(recv, result_of(group, sequence), count * element_size);
  }
  group->sequence = sequence + 1;
  return KEEL_OK;
}

/* Every shared-memory operation counts as one operation of the epoch, to keep op_seq in
 * step with the tcp transport's (which transport_open uses). */
static keel_status shm_allreduce(keel_comm *comm, void *state, const void *send, void *recv,
                                 size_t count, keel_dtype dtype, keel_reduce_op op) {
  shm_group *group = state;
  comm->op_seq++;
  size_t element_size = keel_dtype_size(dtype);
  size_t per_chunk = group->chunk_bytes / element_size;
  size_t bytes = count * element_size;
  allreduce_job job = {.send = send,
                       .recv = recv,
                       .total = count,
                       .element_size = element_size,
                       .dtype = dtype,
                       .op = op,
                       .deadline_ns = keel_deadline_after_ns(comm->timeout_ns),
                       .small = bytes <= group->small_bytes && bytes <= group->chunk_bytes};
  size_t done = 0;
  do {
    size_t count_now = count - done < per_chunk ? count - done : per_chunk;
    keel_status status = shm_chunk(comm, group, &job, done, count_now);
    if (status != KEEL_OK) return status;
    done += count_now;
  } while (done < count);
  return KEEL_OK;
}

/* The collectives that move bytes through the slots in rounds: `total` bytes (of one rank's
 * contribution or block) go a stretch [done, done + length) a round; before each meeting
 * `put` fills this rank's slot, after it `take` reads the round's slots. */
typedef struct shm_rounds {
  shm_group *group;
  int rank;
  uint64_t sequence;
  size_t per_round; /* the most a round moves: the size of a slot's piece */
  size_t done, length;
  void *context;
} shm_rounds;

typedef void (*shm_round_fn)(const shm_rounds *round);

static keel_status rounds_run(keel_comm *comm, shm_group *group, size_t total, size_t pieces,
                              size_t element_size, shm_round_fn put, shm_round_fn take,
                              void *context) {
  comm->op_seq++;
  keel_status status;
  /* A slot is cut in `pieces` pieces of whole elements (setup makes a chunk hold at least
   * a cache line per rank). */
  size_t per_round = group->chunk_bytes / pieces / element_size * element_size;
  int64_t deadline = keel_deadline_after_ns(comm->timeout_ns);
  shm_rounds round = {
      .group = group, .rank = comm->rank, .per_round = per_round, .context = context};
  do {
    round.sequence = group->sequence;
    round.length = total - round.done < per_round ? total - round.done : per_round;
    if (round.length > 0) put(&round);
    if ((status = round_meet(comm, group, false, deadline)) != KEEL_OK) return status;
    if (round.length > 0) take(&round);
    group->sequence = round.sequence + 1;
    round.done += round.length;
  } while (round.done < total);
  return KEEL_OK;
}

/* Allgather: every rank puts the next piece of its contribution in its slot, then copies
 * every rank's piece to its place. */
typedef struct allgather_job {
  const uint8_t *send;
  uint8_t *recv;
  size_t bytes_per_rank;
} allgather_job;

static void allgather_put(const shm_rounds *round) {
  const allgather_job *job = round->context;
  memcpy(slot_of(round->group, round->rank, round->sequence), job->send + round->done,
         round->length);
}

static void allgather_take(const shm_rounds *round) {
  const allgather_job *job = round->context;
  for (int rank = 0; rank < round->group->size; rank++)
    memcpy(job->recv + (size_t)rank * job->bytes_per_rank + round->done,
           slot_of(round->group, rank, round->sequence), round->length);
}

static keel_status shm_allgather(keel_comm *comm, void *state, const void *send, void *recv,
                                 size_t bytes_per_rank) {
  allgather_job job = {.send = send, .recv = recv, .bytes_per_rank = bytes_per_rank};
  return rounds_run(comm, state, bytes_per_rank, 1, 1, allgather_put, allgather_take, &job);
}

/* Broadcast: the root puts each piece in its slot; the others copy it. */
typedef struct broadcast_job {
  uint8_t *buffer;
  int root;
} broadcast_job;

static void broadcast_put(const shm_rounds *round) {
  const broadcast_job *job = round->context;
  if (round->rank == job->root)
    memcpy(slot_of(round->group, job->root, round->sequence), job->buffer + round->done,
           round->length);
}

static void broadcast_take(const shm_rounds *round) {
  const broadcast_job *job = round->context;
  if (round->rank != job->root)
    memcpy(job->buffer + round->done, slot_of(round->group, job->root, round->sequence),
           round->length);
}

static keel_status shm_broadcast(keel_comm *comm, void *state, void *buffer, size_t bytes,
                                 int root) {
  broadcast_job job = {.buffer = buffer, .root = root};
  return rounds_run(comm, state, bytes, 1, 1, broadcast_put, broadcast_take, &job);
}

/* Reduce-scatter: a round carries the same stretch of every rank's block (the slot is cut in
 * size pieces), so every rank has its share of the reduction in every round; after the
 * meeting each rank reduces its block's piece over all slots, in the canonical order of a
 * reduce-scatter, into recv. */
typedef struct reduce_scatter_job {
  const uint8_t *send;
  uint8_t *recv;
  size_t block_bytes, element_size;
  keel_dtype dtype;
  keel_reduce_op op;
} reduce_scatter_job;

static void reduce_scatter_put(const shm_rounds *round) {
  const reduce_scatter_job *job = round->context;
  uint8_t *slot = slot_of(round->group, round->rank, round->sequence);
  for (int block = 0; block < round->group->size; block++)
    memcpy(slot + (size_t)block * round->per_round,
           job->send + (size_t)block * job->block_bytes + round->done, round->length);
}

static void reduce_scatter_take(const shm_rounds *round) {
  const reduce_scatter_job *job = round->context;
  const shm_group *group = round->group;
  const uint8_t *pieces =
      slot_of(group, 0, round->sequence) + (size_t)round->rank * round->per_round;
  keel__reduce_fold(job->dtype, job->op, job->recv + round->done, pieces, slot_stride(group),
                    group->size, keel__reduce_scatter_fold_start(group->size, round->rank),
                    round->length / job->element_size);
}

static keel_status shm_reduce_scatter(keel_comm *comm, void *state, const void *send, void *recv,
                                      size_t count_per_rank, keel_dtype dtype, keel_reduce_op op) {
  size_t element_size = keel_dtype_size(dtype);
  reduce_scatter_job job = {.send = send,
                            .recv = recv,
                            .block_bytes = count_per_rank * element_size,
                            .element_size = element_size,
                            .dtype = dtype,
                            .op = op};
  return rounds_run(comm, state, job.block_bytes, (size_t)comm->size, element_size,
                    reduce_scatter_put, reduce_scatter_take, &job);
}

const keel__transport_ops keel__transport_shm = {
    .name = "shm",
    .open = transport_open,
    .close = transport_close,
    .allreduce = shm_allreduce,
    .broadcast = shm_broadcast,
    .allgather = shm_allgather,
    .reduce_scatter = shm_reduce_scatter,
};
