/* Point-to-point requests: one message to or from one rank of a communicator, as an
 * operation of its own in the progress engine. Nothing waits for a request but its caller,
 * yet it moves whenever anything drives the engine (a collective's wait included), which is
 * what lets state and checkpoint traffic run in the background of training. */
#include <stdlib.h>

#include "comm/comm_internal.h"

#define MODULE "request"

struct keel_request {
  keel__op op;
  keel_comm *comm;
  keel_status failure; /* sticky once set */
  bool finished;       /* completed or failed: the op is no longer registered */
};

/* A request is checked against the same failures as a collective of its communicator. */
static keel_status request_check(keel_request *request) {
  if (request->finished) return request->failure;
  keel_status status = keel__op_slot_error(&request->op);
  if (status == KEEL_OK && keel__op_complete(&request->op)) {
    keel__op_end(&request->op);
    request->finished = true;
    return KEEL_OK;
  }
  if (status == KEEL_OK) status = keel__comm_health(request->comm);
  if (status == KEEL_OK && request->op.send_error != KEEL_OK &&
      request->comm->endpoint->config.failure_detection)
    status = request->op.send_error;
  if (status == KEEL_OK) return KEEL_EAGAIN;
  keel__op_abandon(&request->op);
  request->failure = status;
  request->finished = true;
  return status;
}

static keel_status request_start(keel_comm *comm, int rank, keel_request **request_p) {
  if (comm == NULL || request_p == NULL || rank < 0 || rank >= comm->size || rank == comm->rank ||
      comm->endpoint->standalone)
    return KEEL_EINVAL;
  keel_status status = keel__comm_health(comm);
  if (status != KEEL_OK) return status;
  keel_request *request = calloc(1, sizeof *request);
  if (request == NULL) return KEEL_ENOMEM;
  request->comm = comm;
  keel__op_begin(comm->endpoint, &request->op);
  *request_p = request;
  return KEEL_OK;
}

keel_status keel_comm_isend(keel_comm *comm, int rank, uint64_t tag, const void *buffer,
                            size_t bytes, keel_request **request_p) {
  if (buffer == NULL && bytes > 0) return KEEL_EINVAL;
  keel_request *request = NULL;
  keel_status status = request_start(comm, rank, &request);
  if (status != KEEL_OK) return status;
  status = keel__op_send(&request->op, comm->uids[rank], KEEL_FRAME_MESSAGE, comm->epoch, tag,
                         buffer, bytes);
  if (status == KEEL_ENOMEM) {
    keel_request_free(request);
    return status;
  }
  /* A peer that failed shows in the request's status, like any later failure. */
  *request_p = request;
  return KEEL_OK;
}

keel_status keel_comm_irecv(keel_comm *comm, int rank, uint64_t tag, void *buffer, size_t bytes,
                            keel_request **request_p) {
  if (buffer == NULL && bytes > 0) return KEEL_EINVAL;
  keel_request *request = NULL;
  keel_status status = request_start(comm, rank, &request);
  if (status != KEEL_OK) return status;
  status = keel__op_post_recv(&request->op, KEEL_FRAME_MESSAGE, comm->uids[rank], comm->epoch, tag,
                              buffer, bytes, NULL);
  if (status != KEEL_OK) {
    keel_request_free(request);
    return status;
  }
  *request_p = request;
  return KEEL_OK;
}

keel_status keel_request_test(keel_request *request, bool *done_p) {
  if (request == NULL || done_p == NULL) return KEEL_EINVAL;
  if (!request->finished) keel__progress(request->comm->endpoint, 0);
  keel_status status = request_check(request);
  *done_p = status != KEEL_EAGAIN;
  return status == KEEL_EAGAIN ? KEEL_OK : status;
}

keel_status keel_request_wait(keel_request *request, int64_t deadline_ns) {
  if (request == NULL) return KEEL_EINVAL;
  if (request->finished) return request->failure;
  keel_status status = keel__drive(request->comm, &request->op, deadline_ns, NULL, NULL);
  if (status == KEEL_OK) keel__op_end(&request->op);
  request->failure = status;
  request->finished = true;
  return status;
}

void keel_request_free(keel_request *request) {
  if (request == NULL) return;
  if (!request->finished) keel__op_abandon(&request->op);
  keel__op_free(&request->op);
  free(request);
}

keel_status keel_comm_send(keel_comm *comm, int rank, uint64_t tag, const void *buffer,
                           size_t bytes) {
  keel_request *request = NULL;
  keel_status status = keel_comm_isend(comm, rank, tag, buffer, bytes, &request);
  if (status != KEEL_OK) return status;
  status = keel_request_wait(request, keel_deadline_after_ns(comm->timeout_ns));
  keel_request_free(request);
  return status;
}

keel_status keel_comm_recv(keel_comm *comm, int rank, uint64_t tag, void *buffer, size_t bytes) {
  keel_request *request = NULL;
  keel_status status = keel_comm_irecv(comm, rank, tag, buffer, bytes, &request);
  if (status != KEEL_OK) return status;
  status = keel_request_wait(request, keel_deadline_after_ns(comm->timeout_ns));
  keel_request_free(request);
  return status;
}
