/* The transports of the collectives, in order of preference, and the public collectives
 * that go through whichever one serves the epoch. The first collective of an epoch asks
 * where every rank runs, then each transport in turn whether it serves the communicator
 * (shared memory does when every rank is on this node); tcp always does. A new transport (RDMA,
 * GPU) is one file that fills keel__transport_ops and one line in the table below. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "comm/comm_internal.h"

#define MODULE "transport"

static const keel__transport_ops *const transports[] = {
    &keel__transport_shm,
    &keel__transport_tcp,
};

/* Where a rank runs. Ranks in different network namespaces stand for different nodes (tests
 * simulate nodes that way) although they share the kernel, and must talk over the network as
 * real nodes would: the namespace is part of the node. They still share this machine's cores,
 * which the boot alone names. */
typedef struct host_identity {
  uint64_t net_namespace_device, net_namespace_inode; /* 0: unknown */
  char boot_id[40];                                   /* empty: unknown */
  int32_t shm_allowed;
} host_identity;

static void host_identity_read(host_identity *identity) {
  memset(identity, 0, sizeof *identity);
  FILE *file = fopen("/proc/sys/kernel/random/boot_id", "r");
  if (file != NULL) {
    if (fgets(identity->boot_id, sizeof identity->boot_id, file) == NULL) identity->boot_id[0] = 0;
    fclose(file);
  }
  /* A namespace is named by the device and inode of its file (namespaces(7)). */
  struct stat net_namespace;
  if (stat("/proc/self/ns/net", &net_namespace) == 0) {
    identity->net_namespace_device = (uint64_t)net_namespace.st_dev;
    identity->net_namespace_inode = (uint64_t)net_namespace.st_ino;
  }
  const char *transport = getenv("KEEL_TRANSPORT");
  identity->shm_allowed = transport == NULL || strcmp(transport, "tcp") != 0;
}

/* An unknown boot proves nothing: such a rank is on a machine of its own. */
static bool same_machine(const host_identity *mine, const host_identity *other) {
  return mine->boot_id[0] != '\0' &&
         strncmp(other->boot_id, mine->boot_id, sizeof mine->boot_id) == 0;
}

static bool same_node(const host_identity *mine, const host_identity *other) {
  return same_machine(mine, other) && mine->net_namespace_inode != 0 &&
         other->net_namespace_device == mine->net_namespace_device &&
         other->net_namespace_inode == mine->net_namespace_inode;
}

/* Learns, collectively over tcp, whether every rank is on this node and may share memory, and
 * how many ranks share this machine's cores (waiting spins only while each has one). */
static keel_status hosts_learn(keel_comm *comm) {
  host_identity mine, *all = calloc((size_t)comm->size, sizeof *all);
  if (all == NULL) return KEEL_ENOMEM;
  host_identity_read(&mine);
  keel_status status = keel__transport_tcp.allgather(comm, NULL, &mine, all, sizeof mine);
  if (status == KEEL_OK) {
    bool all_on_this_node = mine.shm_allowed;
    int on_this_machine = 0;
    for (int rank = 0; rank < comm->size; rank++) {
      all_on_this_node = all_on_this_node && all[rank].shm_allowed && same_node(&mine, &all[rank]);
      on_this_machine += same_machine(&mine, &all[rank]) || rank == comm->rank;
    }
    comm->all_on_this_node = all_on_this_node;
    comm->ranks_on_this_machine = on_this_machine;
  }
  free(all);
  return status;
}

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
  keel_status learned = hosts_learn(comm);
  if (learned != KEEL_OK) return learned;
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
    return status != KEEL_OK ? status
                             : comm->transport->reduce_scatter(comm, comm->transport_state, send,
                                                               recv, count_per_rank, dtype, op);
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
