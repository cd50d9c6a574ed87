/* The tcp transport: collectives as messages over the endpoint's links. Large buffers go
 * around a ring (reduce-scatter then allgather), cut into segments so that reducing one
 * segment overlaps the transfer of the next; small ones use a direct exchange and a local
 * reduction; with more ranks than cores, up to a few MiB fold at rank 0. Either way the order of
 * reduction is the canonical one (reduce.c), which the shm transport evaluates too, so results are
 * bit-for-bit the same at every rank, on every run and over either transport. */
#include <string.h>

#include "comm/comm_internal.h"

#define MODULE "tcp"

typedef struct ring_plan {
  keel_comm *comm;
  keel_dtype dtype;
  keel_reduce_op op;
  size_t element_size;
  size_t count;                  /* elements in the whole buffer */
  const uint8_t *input;          /* this rank's contribution (reduce steps read it) */
  const uint8_t *initial_source; /* what the first step sends */
  uint8_t *work;                 /* where results are assembled */
  uint8_t *scratch;              /* where reduce steps receive */
  int first_step, end_step, reduce_steps, offset;
  size_t segment_elements;
} ring_plan;

static size_t chunk_start(const ring_plan *plan, int chunk) {
  return keel__part_start(plan->count, plan->comm->size, chunk);
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

/* ---- the ring */

typedef struct ring_run {
  ring_plan *plan;
  keel__op *op;
  uint64_t op_seq;
  size_t slot_count;
  size_t processed;
  bool *done; /* per slot */
  int sends_started, sends_total;
  keel_status error;
} ring_run;

static keel_status ring_send(ring_run *run, int step, int segment, const uint8_t *source) {
  ring_plan *plan = run->plan;
  keel_comm *comm = plan->comm;
  int chunk = chunk_at(plan, step, 0);
  size_t first, count;
  segment_range(plan, chunk, segment, &first, &count);
  uint32_t right = comm->uids[(comm->rank + 1) % comm->size];
  keel_status status = keel__op_send(
      run->op, right, KEEL_FRAME_DATA, comm->epoch, KEEL__TAG(run->op_seq, step, segment),
      source + first * plan->element_size, count * plan->element_size);
  run->sends_started++;
  if (run->sends_started < run->sends_total)
    keel__fault(comm->endpoint, "allreduce", run->sends_started);
  else
    keel__fault_last(comm->endpoint, "allreduce", run->sends_started);
  return status;
}

/* Reduces a received segment (reduce steps; it lies at received) and passes it on to the
 * next step. */
static void ring_process(ring_run *run, int step, int segment, const uint8_t *received) {
  ring_plan *plan = run->plan;
  int chunk = chunk_at(plan, step, -1);
  size_t first, count;
  segment_range(plan, chunk, segment, &first, &count);
  size_t bytes_offset = first * plan->element_size;
  if (step < plan->reduce_steps) {
    /* The partial that arrived, then this rank's contribution: chunk c's fold starts at the
     * rank that sent it first, c (c + 1 with offset -1), the canonical order of reduce.c. */
    keel__reduce(plan->dtype, plan->op, plan->work + bytes_offset, received,
                 plan->input + bytes_offset, count);
    if (step == plan->reduce_steps - 1 && plan->op == KEEL_AVG)
      keel__divide(plan->dtype, plan->work + bytes_offset, count, plan->comm->size);
  }
  if (step + 1 < plan->end_step && run->error == KEEL_OK)
    run->error = ring_send(run, step + 1, segment, plan->work);
}

static bool ring_ready(void *state) {
  ring_run *run = state;
  for (size_t i = 0; i < run->slot_count; i++) {
    keel__recv_slot *slot = &run->op->slots[i];
    if (run->done[i] || !slot->done || slot->status != KEEL_OK) continue;
    run->done[i] = true;
    run->processed++;
    ring_process(run, (int)((slot->tag >> 16) & 0xffff), (int)(slot->tag & 0xffff), slot->data);
  }
  return run->processed == run->slot_count || run->error != KEEL_OK;
}

static keel_status ring_execute(ring_plan *plan) {
  keel_comm *comm = plan->comm;
  keel__op *op = &comm->collective;
  uint64_t op_seq = comm->op_seq++;
  int64_t deadline = keel_deadline_after_ns(comm->timeout_ns);
  uint32_t left = comm->uids[(comm->rank - 1 + comm->size) % comm->size];
  ring_run run = {.plan = plan, .op = op, .op_seq = op_seq};
  keel__op_begin(comm->endpoint, op);
  for (int step = plan->first_step; step < plan->end_step; step++) {
    int chunk = chunk_at(plan, step, -1);
    for (int segment = 0; segment < segment_total(plan, chunk); segment++) {
      size_t first, count;
      segment_range(plan, chunk, segment, &first, &count);
      /* A reduce step's segment is read once, by ring_process: wherever it arrived. */
      bool reduce = step < plan->reduce_steps;
      uint8_t *destination = (reduce ? plan->scratch : plan->work) + first * plan->element_size;
      keel_status (*post)(keel__op *, uint16_t, uint32_t, uint64_t, uint64_t, void *, size_t,
                          size_t *) = reduce ? keel__op_post_recv_adopting : keel__op_post_recv;
      keel_status posted =
          post(op, KEEL_FRAME_DATA, left, comm->epoch, KEEL__TAG(op_seq, step, segment),
               destination, count * plan->element_size, NULL);
      if (posted != KEEL_OK) {
        keel__op_abandon(op);
        return KEEL_ENOMEM;
      }
    }
  }
  run.slot_count = op->slot_count;
  for (int step = plan->first_step; step < plan->end_step; step++)
    run.sends_total += segment_total(plan, chunk_at(plan, step, 0));
  bool done_flags[run.slot_count > 0 ? run.slot_count : 1];
  memset(done_flags, 0, sizeof done_flags);
  run.done = done_flags;

  int chunk = chunk_at(plan, plan->first_step, 0);
  for (int segment = 0; segment < segment_total(plan, chunk) && run.error == KEEL_OK; segment++)
    run.error = ring_send(&run, plan->first_step, segment, plan->initial_source);
  keel_status status = run.error;
  if (status == KEEL_OK)
    status = keel__drive(comm, op, deadline, ring_ready, &run);
  else
    keel__op_abandon(op);
  if (status == KEEL_OK && run.error != KEEL_OK) {
    status = run.error == KEEL_EPROTO ? KEEL_EPROTO : KEEL_EPROCFAILED;
    keel__op_abandon(op);
  }
  if (status == KEEL_OK) keel__op_end(op);
  return status;
}

static size_t segment_elements_for(size_t element_size) {
  return KEEL__MAX_SEGMENT_BYTES / element_size;
}

/* ---- the direct exchange for small buffers */

/* Every rank sends its whole block to every other rank; blocks land in `gathered` at
 * rank * bytes. Used by the small allreduce. */
static keel_status direct_exchange(keel_comm *comm, uint8_t *gathered, size_t bytes) {
  keel__op *op = &comm->collective;
  uint64_t op_seq = comm->op_seq++;
  int64_t deadline = keel_deadline_after_ns(comm->timeout_ns);
  keel__op_begin(comm->endpoint, op);
  for (int rank = 0; rank < comm->size; rank++) {
    if (rank == comm->rank) continue;
    if (keel__op_post_recv(op, KEEL_FRAME_DATA, comm->uids[rank], comm->epoch,
                           KEEL__TAG(op_seq, 0, 0), gathered + (size_t)rank * bytes, bytes,
                           NULL) != KEEL_OK) {
      keel__op_abandon(op);
      return KEEL_ENOMEM;
    }
  }
  for (int rank = 0; rank < comm->size; rank++) {
    if (rank == comm->rank) continue;
    keel__op_send(op, comm->uids[rank], KEEL_FRAME_DATA, comm->epoch, KEEL__TAG(op_seq, 0, 0),
                  gathered + (size_t)comm->rank * bytes, bytes);
  }
  keel__fault_last(comm->endpoint, "allreduce", 1);
  keel_status status = keel__drive(comm, op, deadline, NULL, NULL);
  if (status == KEEL_OK) keel__op_end(op);
  return status;
}

/* A rank but 0 of the fold at rank 0: sends its block, waits for the result. Its fault
 * points (KEEL_FAULT point=allreduce,after=N) are 1 once its block is queued, 2 (the last)
 * once the result arrived. */
static keel_status at_root_contribute(keel_comm *comm, uint64_t op_seq, const void *send,
                                      void *recv, size_t bytes) {
  keel__op *op = &comm->collective;
  int64_t deadline = keel_deadline_after_ns(comm->timeout_ns);
  keel__op_begin(comm->endpoint, op);
  if (keel__op_post_recv(op, KEEL_FRAME_DATA, comm->uids[0], comm->epoch, KEEL__TAG(op_seq, 1, 0),
                         recv, bytes, NULL) != KEEL_OK) {
    keel__op_abandon(op);
    return KEEL_ENOMEM;
  }
  keel__op_send(op, comm->uids[0], KEEL_FRAME_DATA, comm->epoch, KEEL__TAG(op_seq, 0, 0), send,
                bytes);
  keel__fault(comm->endpoint, "allreduce", 1);
  keel_status status = keel__drive(comm, op, deadline, NULL, NULL);
  if (status != KEEL_OK) return status;
  keel__op_end(op);
  keel__fault_last(comm->endpoint, "allreduce", 2);
  return KEEL_OK;
}

/* Rank 0 of the fold at rank 0: gathers every block, folds, sends the result to each rank.
 * Its fault points are 1 once it waits for the blocks, then 1 + i once the result to rank i
 * is queued, n the last (a rank 0 that dies there leaves some ranks with the result). */
static keel_status at_root_fold(keel_comm *comm, uint64_t op_seq, const void *send, void *recv,
                                size_t count, keel_dtype dtype, keel_reduce_op reduce) {
  size_t bytes = count * keel_dtype_size(dtype);
  keel__op *op = &comm->collective;
  int64_t deadline = keel_deadline_after_ns(comm->timeout_ns);
  keel_status status = keel__scratch_reserve(comm->endpoint, bytes * (size_t)comm->size);
  if (status != KEEL_OK) return status;
  uint8_t *gathered = comm->endpoint->scratch;
  if (bytes > 0) memcpy(gathered, send, bytes);
  keel__op_begin(comm->endpoint, op);
  for (int rank = 1; rank < comm->size; rank++) {
    if (keel__op_post_recv(op, KEEL_FRAME_DATA, comm->uids[rank], comm->epoch,
                           KEEL__TAG(op_seq, 0, 0), gathered + (size_t)rank * bytes, bytes,
                           NULL) != KEEL_OK) {
      keel__op_abandon(op);
      return KEEL_ENOMEM;
    }
  }
  keel__fault(comm->endpoint, "allreduce", 1);
  status = keel__drive(comm, op, deadline, NULL, NULL);
  if (status != KEEL_OK) return status;
  keel__op_end(op);
  keel__allreduce_fold(dtype, reduce, recv, gathered, bytes, comm->size, count, 0, count);
  keel__op_begin(comm->endpoint, op);
  for (int rank = 1; rank < comm->size; rank++) {
    keel__op_send(op, comm->uids[rank], KEEL_FRAME_DATA, comm->epoch, KEEL__TAG(op_seq, 1, 0), recv,
                  bytes);
    if (rank + 1 < comm->size)
      keel__fault(comm->endpoint, "allreduce", 1 + rank);
    else
      keel__fault_last(comm->endpoint, "allreduce", 1 + rank);
  }
  status = keel__drive(comm, op, deadline, NULL, NULL);
  if (status == KEEL_OK) keel__op_end(op);
  return status;
}

/* The fold at one rank: every rank sends its block to rank 0, which folds them in the
 * canonical order for the size (keel__allreduce_fold: the bits are those of the direct
 * exchange or the ring) and sends the result back. Two hops, but 2(n-1) messages where the
 * direct exchange sends n(n-1) and the ring waits 2(n-1) rounds at every rank: where ranks
 * outnumber the machine's cores nobody spins and every wait is a wake-up, and fewer waits
 * win (4 ranks on 2 cores: 1.3-2x faster from 4 KiB to 1 MiB, BENCHMARKS.md). */
static keel_status allreduce_at_root(keel_comm *comm, const void *send, void *recv, size_t count,
                                     keel_dtype dtype, keel_reduce_op reduce) {
  uint64_t op_seq = comm->op_seq++;
  if (comm->rank == 0) return at_root_fold(comm, op_seq, send, recv, count, dtype, reduce);
  return at_root_contribute(comm, op_seq, send, recv, count * keel_dtype_size(dtype));
}

/* Whether the fold at rank 0 serves an allreduce of bytes: with more ranks on this machine
 * than cores (as the spin of keel__drive), more than two ranks (with two it is the direct
 * exchange in two hops), and while rank 0 sends no more than AT_ROOT_ALLREDUCE_SENT_BYTES. */
static bool allreduce_at_root_pays(const keel_comm *comm, size_t bytes) {
  return comm->size > 2 && comm->ranks_on_this_machine > comm->endpoint->cores &&
         bytes <= KEEL__AT_ROOT_ALLREDUCE_SENT_BYTES / (size_t)(comm->size - 1);
}

static keel_status allreduce_direct(keel_comm *comm, const void *send, void *recv, size_t count,
                                    keel_dtype dtype, keel_reduce_op op) {
  size_t bytes = count * keel_dtype_size(dtype);
  keel_status status = keel__scratch_reserve(comm->endpoint, bytes * (size_t)comm->size);
  if (status != KEEL_OK) return status;
  uint8_t *gathered = comm->endpoint->scratch;
  if (bytes > 0) memcpy(gathered + (size_t)comm->rank * bytes, send, bytes);
  status = direct_exchange(comm, gathered, bytes);
  if (status != KEEL_OK) return status;
  keel__allreduce_fold(dtype, op, recv, gathered, bytes, comm->size, count, 0, count);
  return KEEL_OK;
}

/* ---- the operations table */

static keel_status tcp_open(keel_comm *comm, void **state_p) {
  *state_p = NULL;
  return KEEL_OK;
}

static keel_status tcp_allreduce(keel_comm *comm, void *state, const void *send, void *recv,
                                 size_t count, keel_dtype dtype, keel_reduce_op op) {
  size_t element_size = keel_dtype_size(dtype);
  size_t bytes = count * element_size;
  if (allreduce_at_root_pays(comm, bytes))
    return allreduce_at_root(comm, send, recv, count, dtype, op);
  if (keel__allreduce_is_direct(bytes, comm->size))
    return allreduce_direct(comm, send, recv, count, dtype, op);
  keel_status status = keel__scratch_reserve(comm->endpoint, bytes);
  if (status != KEEL_OK) return status;
  ring_plan plan = {.comm = comm,
                    .dtype = dtype,
                    .op = op,
                    .element_size = element_size,
                    .count = count,
                    .input = send,
                    .initial_source = send,
                    .work = recv,
                    .scratch = comm->endpoint->scratch,
                    .first_step = 0,
                    .end_step = 2 * comm->size - 2,
                    .reduce_steps = comm->size - 1,
                    .offset = 0,
                    .segment_elements = segment_elements_for(element_size)};
  return ring_execute(&plan);
}

static keel_status tcp_reduce_scatter(keel_comm *comm, void *state, const void *send, void *recv,
                                      size_t count_per_rank, keel_dtype dtype, keel_reduce_op op) {
  size_t element_size = keel_dtype_size(dtype);
  size_t block = count_per_rank * element_size;
  size_t total = block * (size_t)comm->size;
  keel_status status = keel__scratch_reserve(comm->endpoint, 2 * total);
  if (status != KEEL_OK) return status;
  ring_plan plan = {.comm = comm,
                    .dtype = dtype,
                    .op = op,
                    .element_size = element_size,
                    .count = count_per_rank * (size_t)comm->size,
                    .input = send,
                    .initial_source = send,
                    .work = comm->endpoint->scratch + total,
                    .scratch = comm->endpoint->scratch,
                    .first_step = 0,
                    .end_step = comm->size - 1,
                    .reduce_steps = comm->size - 1,
                    .offset = -1,
                    .segment_elements = segment_elements_for(element_size)};
  status = ring_execute(&plan);
  if (status == KEEL_OK && block > 0) memcpy(recv, plan.work + (size_t)comm->rank * block, block);
  return status;
}

static keel_status tcp_allgather(keel_comm *comm, void *state, const void *send, void *recv,
                                 size_t bytes_per_rank) {
  uint8_t *own = (uint8_t *)recv + (size_t)comm->rank * bytes_per_rank;
  if (own != send && bytes_per_rank > 0) memmove(own, send, bytes_per_rank);
  ring_plan plan = {.comm = comm,
                    .dtype = KEEL_I32,
                    .op = KEEL_SUM,
                    .element_size = 1,
                    .count = bytes_per_rank * (size_t)comm->size,
                    .input = recv,
                    .initial_source = recv,
                    .work = recv,
                    .scratch = recv,
                    .first_step = 0,
                    .end_step = comm->size - 1,
                    .reduce_steps = 0,
                    .offset = 0,
                    .segment_elements = KEEL__MAX_SEGMENT_BYTES};
  return ring_execute(&plan);
}

/* Broadcast: the root sends the buffer, in segments, to every other rank. */
static keel_status tcp_broadcast(keel_comm *comm, void *state, void *buffer, size_t bytes,
                                 int root) {
  keel__op *op = &comm->collective;
  uint64_t op_seq = comm->op_seq++;
  int64_t deadline = keel_deadline_after_ns(comm->timeout_ns);
  size_t segments =
      bytes == 0 ? 1 : (bytes + KEEL__MAX_SEGMENT_BYTES - 1) / KEEL__MAX_SEGMENT_BYTES;
  keel__op_begin(comm->endpoint, op);
  for (size_t segment = 0; segment < segments; segment++) {
    size_t first = segment * KEEL__MAX_SEGMENT_BYTES;
    size_t length =
        bytes - first < KEEL__MAX_SEGMENT_BYTES ? bytes - first : KEEL__MAX_SEGMENT_BYTES;
    uint64_t tag = KEEL__TAG(op_seq, 0, segment);
    if (comm->rank != root) {
      if (keel__op_post_recv(op, KEEL_FRAME_DATA, comm->uids[root], comm->epoch, tag,
                             (uint8_t *)buffer + first, length, NULL) != KEEL_OK) {
        keel__op_abandon(op);
        return KEEL_ENOMEM;
      }
      continue;
    }
    for (int rank = 0; rank < comm->size; rank++) {
      if (rank == root) continue;
      keel__op_send(op, comm->uids[rank], KEEL_FRAME_DATA, comm->epoch, tag,
                    (uint8_t *)buffer + first, length);
    }
  }
  keel_status status = keel__drive(comm, op, deadline, NULL, NULL);
  if (status == KEEL_OK) keel__op_end(op);
  return status;
}

const keel__transport_ops keel__transport_tcp = {
    .name = "tcp",
    .open = tcp_open,
    .close = NULL,
    .allreduce = tcp_allreduce,
    .broadcast = tcp_broadcast,
    .allgather = tcp_allgather,
    .reduce_scatter = tcp_reduce_scatter,
};
