/* The transports of the collectives, in order of preference, and the public collectives
 * that go through whichever one serves the epoch. The first collective of an epoch asks
 * each transport in turn whether it serves the communicator (shared memory does when every
 * rank is on this host); tcp always does. A new transport (RDMA, GPU) is one file that fills
 * keel__transport_ops and one line in the table below. */
#include <string.h>

#include "comm/comm_internal.h"

#define MODULE "transport"

static const keel__transport_ops *const transports[] = {
    &keel__transport_shm,
    &keel__transport_tcp,
};

void keel__transport_release(keel_comm *comm) {
  if (comm->transport != NULL && comm->transport->close != NULL)
    comm->transport->close(comm->transport_state);
  comm->transport_state = NULL;
  /* A released communicator's operations fail (it is no longer current); tcp needs no
   * state, so falling back to it keeps that failure where it is decided. */
  comm->transport = &keel__transport_tcp;
}

/* Picks the epoch's transport. Every member asks the same transports in the same order,
 * and each open is itself collective, so all pick the same. */
static keel_status transport_choose(keel_comm *comm) {
  if (comm->transport != NULL) return KEEL_OK;
  for (size_t i = 0; i < sizeof transports / sizeof transports[0]; i++) {
    void *state = NULL;
    keel_status status = transports[i]->open(comm, &state);
    if (status == KEEL_ENOTSUP) continue;
    if (status != KEEL_OK) return status;
    comm->transport = transports[i];
    comm->transport_state = state;
    KEEL_LOG_D(MODULE, "epoch %llu: collectives over %s", (unsigned long long)comm->epoch,
               transports[i]->name);
    return KEEL_OK;
  }
  return KEEL_ENOTSUP; /* tcp serves every communicator: not reached */
}

const char *keel_comm_transport(const keel_comm *comm) {
  if (comm->size == 1) return "self";
  return comm->transport != NULL ? comm->transport->name : "tcp";
}

/* Checks shared by every collective; *done_p when a world of one made it trivial. */
static keel_status collective_begin(keel_comm *comm) {
  if (comm == NULL || comm->rank < 0) return KEEL_EINVAL;
  keel_status status = keel__comm_health(comm);
  if (status != KEEL_OK) return status;
  if (comm->size == 1) return KEEL_OK;
  return transport_choose(comm);
}

keel_status keel_comm_allreduce(keel_comm *comm, const void *send, void *recv, size_t count,
                                keel_dtype dtype, keel_reduce_op op) {
  size_t element_size = keel_dtype_size(dtype);
  if (element_size == 0 || (count > 0 && (send == NULL || recv == NULL))) return KEEL_EINVAL;
  keel_status status = collective_begin(comm);
  if (status != KEEL_OK || comm->size > 1)
    return status != KEEL_OK ? status
                             : comm->transport->allreduce(comm, comm->transport_state, send, recv,
                                                          count, dtype, op);
  if (send != recv && count > 0) memmove(recv, send, count * element_size);
  return KEEL_OK;
}

keel_status keel_comm_reduce_scatter(keel_comm *comm, const void *send, void *recv,
                                     size_t count_per_rank, keel_dtype dtype, keel_reduce_op op) {
  size_t element_size = keel_dtype_size(dtype);
  if (element_size == 0 || (count_per_rank > 0 && (send == NULL || recv == NULL)))
    return KEEL_EINVAL;
  keel_status status = collective_begin(comm);
  if (status != KEEL_OK || comm->size > 1)
    return status != KEEL_OK
               ? status
               : comm->transport->reduce_scatter(comm, comm->transport_state, send, recv,
                                                 count_per_rank, dtype, op);
  if (send != recv && count_per_rank > 0) memmove(recv, send, count_per_rank * element_size);
  return KEEL_OK;
}

keel_status keel_comm_allgather(keel_comm *comm, const void *send, void *recv,
                                size_t bytes_per_rank) {
  if (bytes_per_rank > 0 && (send == NULL || recv == NULL)) return KEEL_EINVAL;
  keel_status status = collective_begin(comm);
  if (status != KEEL_OK || comm->size > 1)
    return status != KEEL_OK ? status
                             : comm->transport->allgather(comm, comm->transport_state, send, recv,
                                                          bytes_per_rank);
  if (send != recv && bytes_per_rank > 0) memmove(recv, send, bytes_per_rank);
  return KEEL_OK;
}

keel_status keel_comm_broadcast(keel_comm *comm, void *buffer, size_t bytes, int root) {
  if (comm == NULL || root < 0 || root >= comm->size || (bytes > 0 && buffer == NULL))
    return KEEL_EINVAL;
  keel_status status = collective_begin(comm);
  if (status != KEEL_OK || comm->size == 1) return status;
  return comm->transport->broadcast(comm, comm->transport_state, buffer, bytes, root);
}

keel_status keel_comm_barrier(keel_comm *comm) {
  int32_t token = 1, total = 0;
  return keel_comm_allreduce(comm, &token, &total, 1, KEEL_I32, KEEL_SUM);
}
