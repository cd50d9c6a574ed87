/* Collective algorithms over the progress engine. Large buffers go around a ring
 * (reduce-scatter then allgather), cut into segments so that reducing one segment overlaps
 * the transfer of the next; small ones use a direct exchange and a local reduction in rank
 * order. Either way the order of reduction depends only on rank and size, so results are
 * bit-for-bit the same at every rank and on every run. Every operation ends in success,
 * KEEL_EPROCFAILED, KEEL_EREVOKED or KEEL_ETIMEDOUT at its deadline. */
#include <string.h>
#include <unistd.h>

#include "comm/comm_internal.h"

#define MODULE "collective"

/* Below this many bytes per rank an allreduce exchanges whole buffers directly. */
#define DIRECT_ALLREDUCE_BYTES ((size_t)32 << 10)

typedef struct ring_plan {
  keel_comm *comm;
  keel_dtype dtype;
  keel_reduce_op op;
  size_t element_size;
  size_t count; /* elements in the whole buffer */
  const uint8_t *input;          /* this rank's contribution (reduce steps read it) */
  const uint8_t *initial_source; /* what the first step sends */
  uint8_t *work;                 /* where results are assembled */
  uint8_t *scratch;              /* where reduce steps receive */
  int first_step, end_step, reduce_steps, offset;
  size_t segment_elements;
} ring_plan;

static size_t chunk_start(const ring_plan *plan, int chunk) {
  size_t base = plan->count / (size_t)plan->comm->size;
  size_t remainder = plan->count % (size_t)plan->comm->size;
  return (size_t)chunk * base + ((size_t)chunk < remainder ? (size_t)chunk : remainder);
}

static size_t chunk_count(const ring_plan *plan, int chunk) {
  return chunk_start(plan, chunk + 1) - chunk_start(plan, chunk);
}

static int segment_total(const ring_plan *plan, int chunk) {
  size_t count = chunk_count(plan, chunk);
  size_t segments = (count + plan->segment_elements - 1) / plan->segment_elements;
  return segments == 0 ? 1 : (int)segments;
}

static int chunk_at(const ring_plan *plan, int step, int shift) {
  int size = plan->comm->size;
  int chunk = (plan->comm->rank - step + shift + plan->offset) % size;
  return chunk < 0 ? chunk + size : chunk;
}

/* Element range [*first_p, *first_p + *count_p) of segment `segment` of `chunk`. */
static void segment_range(const ring_plan *plan, int chunk, int segment, size_t *first_p,
                          size_t *count_p) {
  size_t begin = (size_t)segment * plan->segment_elements;
  size_t count = chunk_count(plan, chunk);
  size_t end = begin + plan->segment_elements < count ? begin + plan->segment_elements : count;
  *first_p = chunk_start(plan, chunk) + (begin < count ? begin : count);
  *count_p = end > begin ? end - begin : 0;
}

/* Waits until pending sends are written and done() holds, or the communicator breaks. */
typedef bool (*ready_fn)(void *state);

/* With a core per rank, polling without sleeping for a short while first saves the wake-up
 * of a blocking poll on every small message (4 KiB over TCP: 29 µs instead of 60-70 µs); with
 * more ranks than cores it would steal the core of the rank we wait for, and for large
 * operations it measured no better. */
#define BUSY_POLL_NS (50 * 1000)

static keel_status drive(keel_comm *comm, int64_t deadline_ns, ready_fn ready, void *state,
                         const int *sends_pending, bool latency_bound) {
  keel_ctx *ctx = comm->ctx;
  bool busy = latency_bound && sysconf(_SC_NPROCESSORS_ONLN) >= comm->size;
  int64_t busy_until = busy ? keel_now_ns() + BUSY_POLL_NS : 0;
  for (;;) {
    /* Done counts before health: a peer may finish this operation, leave and close its
     * link, and that is no failure of an operation that got everything it needed. */
    if (ready(state) && *sends_pending == 0) return KEEL_OK;
    keel_status health = keel__comm_health(comm);
    if (health != KEEL_OK) {
      keel__abandon_operation(ctx);
      return health;
    }
    if (keel_now_ns() >= deadline_ns) {
      KEEL_LOG_W(MODULE, "operation %llu of epoch %llu passed its deadline",
                 (unsigned long long)comm->op_seq, (unsigned long long)comm->epoch);
      keel__abandon_operation(ctx);
      return KEEL_ETIMEDOUT;
    }
    keel__progress(ctx, busy_until != 0 && keel_now_ns() < busy_until ? 0 : deadline_ns);
  }
}

/* ---- the ring */

typedef struct ring_run {
  ring_plan *plan;
  uint64_t op_seq;
  size_t first_slot, slot_count;
  size_t processed;
  bool *done; /* per slot, in ctx scratch after the data */
  int sends_pending;
  int sends_started;
  keel_status error;
} ring_run;

static keel_status ring_send(ring_run *run, int step, int segment, const uint8_t *source) {
  ring_plan *plan = run->plan;
  keel_comm *comm = plan->comm;
  int chunk = chunk_at(plan, step, 0);
  size_t first, count;
  segment_range(plan, chunk, segment, &first, &count);
  uint32_t right = comm->uids[(comm->rank + 1) % comm->size];
  keel_status status =
      keel__send(comm->ctx, right, KEEL_FRAME_DATA, comm->epoch, KEEL__TAG(run->op_seq, step, segment),
                 source + first * plan->element_size, count * plan->element_size,
                 &run->sends_pending);
  run->sends_started++;
  keel__fault_check(comm->ctx, "allreduce", run->sends_started);
  return status;
}

/* Reduces a received segment (reduce steps) and passes it on to the next step. */
static void ring_process(ring_run *run, int step, int segment) {
  ring_plan *plan = run->plan;
  int chunk = chunk_at(plan, step, -1);
  size_t first, count;
  segment_range(plan, chunk, segment, &first, &count);
  size_t bytes_offset = first * plan->element_size;
  if (step < plan->reduce_steps) {
    keel__reduce(plan->dtype, plan->op, plan->work + bytes_offset, plan->scratch + bytes_offset,
                 plan->input + bytes_offset, count);
    if (step == plan->reduce_steps - 1 && plan->op == KEEL_AVG)
      keel__divide(plan->dtype, plan->work + bytes_offset, count, plan->comm->size);
  }
  if (step + 1 < plan->end_step && run->error == KEEL_OK)
    run->error = ring_send(run, step + 1, segment, plan->work);
}

static bool ring_ready(void *state) {
  ring_run *run = state;
  keel_ctx *ctx = run->plan->comm->ctx;
  for (size_t i = 0; i < run->slot_count; i++) {
    keel__recv_slot *slot = &ctx->slots[run->first_slot + i];
    if (run->done[i] || !slot->done) continue;
    run->done[i] = true;
    run->processed++;
    if (slot->status != KEEL_OK) {
      run->error = slot->status;
      continue;
    }
    ring_process(run, (int)((slot->tag >> 16) & 0xffff), (int)(slot->tag & 0xffff));
  }
  return run->processed == run->slot_count || run->error != KEEL_OK;
}

static keel_status ring_execute(ring_plan *plan) {
  keel_comm *comm = plan->comm;
  keel_ctx *ctx = comm->ctx;
  uint64_t op_seq = comm->op_seq++;
  int64_t deadline = keel_deadline_after_ns(comm->timeout_ns);
  uint32_t left = comm->uids[(comm->rank - 1 + comm->size) % comm->size];
  ring_run run = {.plan = plan, .op_seq = op_seq, .first_slot = ctx->slot_count};

  for (int step = plan->first_step; step < plan->end_step; step++) {
    int chunk = chunk_at(plan, step, -1);
    for (int segment = 0; segment < segment_total(plan, chunk); segment++) {
      size_t first, count;
      segment_range(plan, chunk, segment, &first, &count);
      uint8_t *base = step < plan->reduce_steps ? plan->scratch : plan->work;
      if (keel__post_recv(ctx, KEEL_FRAME_DATA, left, comm->epoch,
                          KEEL__TAG(op_seq, step, segment), base + first * plan->element_size,
                          count * plan->element_size) == NULL) {
        keel__abandon_operation(ctx);
        return KEEL_ENOMEM;
      }
    }
  }
  run.slot_count = ctx->slot_count - run.first_slot;
  bool done_flags[run.slot_count > 0 ? run.slot_count : 1];
  memset(done_flags, 0, sizeof done_flags);
  run.done = done_flags;

  int chunk = chunk_at(plan, plan->first_step, 0);
  for (int segment = 0; segment < segment_total(plan, chunk) && run.error == KEEL_OK; segment++)
    run.error = ring_send(&run, plan->first_step, segment, plan->initial_source);
  keel_status status = run.error == KEEL_OK
                           ? drive(comm, deadline, ring_ready, &run, &run.sends_pending, false)
                           : KEEL_OK;
  if (status == KEEL_OK && run.error != KEEL_OK) {
    status = run.error == KEEL_EPROTO ? KEEL_EPROTO : KEEL_EPROCFAILED;
    keel__abandon_operation(ctx);
  }
  if (status == KEEL_OK) keel__slots_reset(ctx);
  return status;
}

static size_t segment_elements_for(size_t element_size) {
  return KEEL__MAX_SEGMENT_BYTES / element_size;
}

/* ---- the direct exchange for small buffers */

typedef struct direct_run {
  keel_ctx *ctx;
  size_t first_slot, slot_count;
  keel_status error;
} direct_run;

static bool direct_ready(void *state) {
  direct_run *run = state;
  for (size_t i = 0; i < run->slot_count; i++) {
    keel__recv_slot *slot = &run->ctx->slots[run->first_slot + i];
    if (!slot->done) return false;
    if (slot->status != KEEL_OK) run->error = slot->status;
  }
  return true;
}

/* Every rank sends its whole block to every other rank; blocks land in `gathered` at
 * rank * bytes. Used by the small allreduce and the allgather of small blocks. */
static keel_status direct_exchange(keel_comm *comm, uint8_t *gathered, size_t bytes) {
  keel_ctx *ctx = comm->ctx;
  uint64_t op_seq = comm->op_seq++;
  int64_t deadline = keel_deadline_after_ns(comm->timeout_ns);
  direct_run run = {.ctx = ctx, .first_slot = ctx->slot_count};
  int sends_pending = 0;
  for (int rank = 0; rank < comm->size; rank++) {
    if (rank == comm->rank) continue;
    if (keel__post_recv(ctx, KEEL_FRAME_DATA, comm->uids[rank], comm->epoch,
                        KEEL__TAG(op_seq, 0, 0), gathered + (size_t)rank * bytes, bytes) == NULL) {
      keel__abandon_operation(ctx);
      return KEEL_ENOMEM;
    }
  }
  run.slot_count = ctx->slot_count - run.first_slot;
  for (int rank = 0; rank < comm->size; rank++) {
    if (rank == comm->rank) continue;
    keel__send(ctx, comm->uids[rank], KEEL_FRAME_DATA, comm->epoch, KEEL__TAG(op_seq, 0, 0),
               gathered + (size_t)comm->rank * bytes, bytes, &sends_pending);
  }
  keel__fault_check(ctx, "allreduce", 1);
  keel_status status = drive(comm, deadline, direct_ready, &run, &sends_pending, true);
  if (status == KEEL_OK && run.error != KEEL_OK) {
    keel__abandon_operation(ctx);
    return run.error;
  }
  if (status == KEEL_OK) keel__slots_reset(ctx);
  return status;
}

static keel_status check_operation(keel_comm *comm) {
  if (comm == NULL || comm->rank < 0) return KEEL_EINVAL;
  return keel__comm_health(comm);
}

static keel_status allreduce_direct(keel_comm *comm, const void *send, void *recv, size_t count,
                                    keel_dtype dtype, keel_reduce_op op) {
  size_t bytes = count * keel_dtype_size(dtype);
  keel_status status = keel__scratch_reserve(comm->ctx, bytes * (size_t)comm->size);
  if (status != KEEL_OK) return status;
  uint8_t *gathered = comm->ctx->scratch;
  if (bytes > 0) memcpy(gathered + (size_t)comm->rank * bytes, send, bytes);
  status = direct_exchange(comm, gathered, bytes);
  if (status != KEEL_OK) return status;
  /* Rank order, the same at every rank: ((x0 op x1) op x2) op ... */
  keel__reduce(dtype, op, recv, gathered, gathered + bytes, count);
  for (int rank = 2; rank < comm->size; rank++)
    keel__reduce(dtype, op, recv, recv, gathered + (size_t)rank * bytes, count);
  if (op == KEEL_AVG) keel__divide(dtype, recv, count, comm->size);
  return KEEL_OK;
}

static keel_status allreduce_run(keel_comm *comm, const void *send, void *recv, size_t count,
                                keel_dtype dtype, keel_reduce_op op) {
  keel_status status = check_operation(comm);
  if (status != KEEL_OK) return status;
  size_t element_size = keel_dtype_size(dtype);
  size_t bytes = count * element_size;
  if (element_size == 0 || (count > 0 && (send == NULL || recv == NULL))) return KEEL_EINVAL;
  if (comm->size == 1) {
    if (send != recv && bytes > 0) memmove(recv, send, bytes);
    return KEEL_OK;
  }
  bool used_shared_memory = false;
  status = keel__shm_allreduce(comm, send, recv, count, dtype, op, &used_shared_memory);
  if (used_shared_memory || status != KEEL_OK) return status;
  if (bytes <= DIRECT_ALLREDUCE_BYTES) return allreduce_direct(comm, send, recv, count, dtype, op);
  if ((status = keel__scratch_reserve(comm->ctx, bytes)) != KEEL_OK) return status;
  ring_plan plan = {.comm = comm, .dtype = dtype, .op = op, .element_size = element_size,
                    .count = count, .input = send, .initial_source = send, .work = recv,
                    .scratch = comm->ctx->scratch, .first_step = 0,
                    .end_step = 2 * comm->size - 2, .reduce_steps = comm->size - 1,
                    .offset = 0, .segment_elements = segment_elements_for(element_size)};
  return ring_execute(&plan);
}

static keel_status reduce_scatter_run(keel_comm *comm, const void *send, void *recv,
                                     size_t count_per_rank, keel_dtype dtype, keel_reduce_op op) {
  keel_status status = check_operation(comm);
  if (status != KEEL_OK) return status;
  size_t element_size = keel_dtype_size(dtype);
  size_t block = count_per_rank * element_size;
  size_t total = block * (size_t)comm->size;
  if (element_size == 0) return KEEL_EINVAL;
  if (comm->size == 1) {
    if (send != recv && block > 0) memmove(recv, send, block);
    return KEEL_OK;
  }
  bool used_shared_memory = false;
  status = keel__shm_reduce_scatter(comm, send, recv, count_per_rank, dtype, op,
                                    &used_shared_memory);
  if (used_shared_memory || status != KEEL_OK) return status;
  if ((status = keel__scratch_reserve(comm->ctx, 2 * total)) != KEEL_OK) return status;
  ring_plan plan = {.comm = comm, .dtype = dtype, .op = op, .element_size = element_size,
                    .count = count_per_rank * (size_t)comm->size, .input = send,
                    .initial_source = send, .work = comm->ctx->scratch + total,
                    .scratch = comm->ctx->scratch, .first_step = 0,
                    .end_step = comm->size - 1, .reduce_steps = comm->size - 1, .offset = -1,
                    .segment_elements = segment_elements_for(element_size)};
  status = ring_execute(&plan);
  if (status == KEEL_OK && block > 0)
    memcpy(recv, plan.work + (size_t)comm->rank * block, block);
  return status;
}

static keel_status allgather_run(keel_comm *comm, const void *send, void *recv,
                                size_t bytes_per_rank) {
  keel_status status = check_operation(comm);
  if (status != KEEL_OK) return status;
  uint8_t *own = (uint8_t *)recv + (size_t)comm->rank * bytes_per_rank;
  if (comm->size > 1) {
    bool used_shared_memory = false;
    status = keel__shm_allgather(comm, send, recv, bytes_per_rank, &used_shared_memory);
    if (used_shared_memory || status != KEEL_OK) return status;
  }
  if (own != send && bytes_per_rank > 0) memmove(own, send, bytes_per_rank);
  if (comm->size == 1) return KEEL_OK;
  ring_plan plan = {.comm = comm, .dtype = KEEL_I32, .op = KEEL_SUM, .element_size = 1,
                    .count = bytes_per_rank * (size_t)comm->size, .input = recv,
                    .initial_source = recv, .work = recv, .scratch = recv, .first_step = 0,
                    .end_step = comm->size - 1, .reduce_steps = 0, .offset = 0,
                    .segment_elements = KEEL__MAX_SEGMENT_BYTES};
  return ring_execute(&plan);
}

/* ---- broadcast: the root sends the buffer, in segments, to every other rank. */

static keel_status broadcast_run(keel_comm *comm, void *buffer, size_t bytes, int root) {
  keel_status status = check_operation(comm);
  if (status != KEEL_OK) return status;
  if (root < 0 || root >= comm->size) return KEEL_EINVAL;
  if (comm->size == 1) return KEEL_OK;
  bool used_shared_memory = false;
  status = keel__shm_broadcast(comm, buffer, bytes, root, &used_shared_memory);
  if (used_shared_memory || status != KEEL_OK) return status;
  keel_ctx *ctx = comm->ctx;
  uint64_t op_seq = comm->op_seq++;
  int64_t deadline = keel_deadline_after_ns(comm->timeout_ns);
  size_t segments = bytes == 0 ? 1 : (bytes + KEEL__MAX_SEGMENT_BYTES - 1) / KEEL__MAX_SEGMENT_BYTES;
  direct_run run = {.ctx = ctx, .first_slot = ctx->slot_count};
  int sends_pending = 0;
  for (size_t segment = 0; segment < segments; segment++) {
    size_t first = segment * KEEL__MAX_SEGMENT_BYTES;
    size_t length = bytes - first < KEEL__MAX_SEGMENT_BYTES ? bytes - first : KEEL__MAX_SEGMENT_BYTES;
    uint64_t tag = KEEL__TAG(op_seq, 0, segment);
    if (comm->rank != root) {
      if (keel__post_recv(ctx, KEEL_FRAME_DATA, comm->uids[root], comm->epoch, tag,
                          (uint8_t *)buffer + first, length) == NULL) {
        keel__abandon_operation(ctx);
        return KEEL_ENOMEM;
      }
      continue;
    }
    for (int rank = 0; rank < comm->size; rank++) {
      if (rank == root) continue;
      keel__send(ctx, comm->uids[rank], KEEL_FRAME_DATA, comm->epoch, tag,
                 (uint8_t *)buffer + first, length, &sends_pending);
    }
  }
  run.slot_count = ctx->slot_count - run.first_slot;
  status = drive(comm, deadline, direct_ready, &run, &sends_pending,
                 bytes <= DIRECT_ALLREDUCE_BYTES);
  if (status == KEEL_OK && run.error != KEEL_OK) {
    keel__abandon_operation(ctx);
    return run.error;
  }
  if (status == KEEL_OK) keel__slots_reset(ctx);
  return status;
}

/* The public operations: each runs, then tells the runtime when it failed (failure hooks,
 * and the revoke that spreads the news). */
keel_status keel_comm_allreduce(keel_comm *comm, const void *send, void *recv, size_t count,
                                keel_dtype dtype, keel_reduce_op op) {
  return keel__operation_end(comm, allreduce_run(comm, send, recv, count, dtype, op));
}

keel_status keel_comm_reduce_scatter(keel_comm *comm, const void *send, void *recv,
                                     size_t count_per_rank, keel_dtype dtype, keel_reduce_op op) {
  return keel__operation_end(comm,
                             reduce_scatter_run(comm, send, recv, count_per_rank, dtype, op));
}

keel_status keel_comm_allgather(keel_comm *comm, const void *send, void *recv,
                                size_t bytes_per_rank) {
  return keel__operation_end(comm, allgather_run(comm, send, recv, bytes_per_rank));
}

keel_status keel_comm_broadcast(keel_comm *comm, void *buffer, size_t bytes, int root) {
  return keel__operation_end(comm, broadcast_run(comm, buffer, bytes, root));
}

keel_status keel_comm_barrier(keel_comm *comm) {
  int32_t token = 1, total = 0;
  return keel_comm_allreduce(comm, &token, &total, 1, KEEL_I32, KEEL_SUM);
}

keel_status keel__wait_posted(keel_comm *comm, size_t first_slot, int *sends_pending,
                              int64_t deadline_ns) {
  keel_ctx *ctx = comm->ctx;
  direct_run run = {.ctx = ctx, .first_slot = first_slot, .slot_count = ctx->slot_count - first_slot};
  keel_status status = drive(comm, deadline_ns, direct_ready, &run, sends_pending, false);
  if (status == KEEL_OK && run.error != KEEL_OK) {
    keel__abandon_operation(ctx);
    return run.error;
  }
  if (status == KEEL_OK) keel__slots_reset(ctx);
  return status;
}
