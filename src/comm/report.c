/* Reports to the launcher: JSON lines on KEEL_STATUS_FD (docs/RUNTIME.md), each one write
 * under PIPE_BUF so lines of several workers never interleave; and the step boundary, where
 * fault points fire and waiting joiners are noticed. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "comm/comm_internal.h"

void keel__report_line(keel_ctx *ctx, const char *event, const char *fields) {
  if (ctx->status_fd < 0) return;
  char line[4000];
  keel_comm *comm = ctx->world;
  int length = snprintf(line, sizeof line,
                        "{\"event\":\"%s\",\"uid\":%" PRIu32 ",\"rank\":%d,\"epoch\":%" PRIu64
                        ",\"t_ns\":%" PRId64 "%s%s}\n",
                        event, ctx->uid, comm ? comm->rank : -1, comm ? comm->epoch : 0,
                        keel_now_ns(), fields && *fields ? "," : "", fields ? fields : "");
  if (length <= 0 || (size_t)length >= sizeof line) return;
  ssize_t ignored = write(ctx->status_fd, line, (size_t)length);
  (void)ignored;
}

void keel_report(keel_ctx *ctx, uint64_t step, double loss, double samples_per_second) {
  int64_t now = keel_now_ns();
  if (ctx->status_fd < 0 || now - ctx->last_report_ns < 100 * 1000000) return;
  ctx->last_report_ns = now;
  char fields[256];
  snprintf(fields, sizeof fields,
           "\"world\":%d,\"step\":%" PRIu64 ",\"loss\":%.6g,\"samples_per_s\":%.1f",
           ctx->world ? ctx->world->size : 0, step, loss, samples_per_second);
  keel__report_line(ctx, "progress", fields);
}

static bool event_name_valid(const char *event) {
  size_t length = strlen(event);
  if (length == 0 || length > 31) return false;
  for (size_t i = 0; i < length; i++) {
    char c = event[i];
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_')) return false;
  }
  return true;
}

void keel_report_event(keel_ctx *ctx, const char *event, const char *json_fields) {
  if (event == NULL || !event_name_valid(event)) return;
  if (json_fields != NULL && strlen(json_fields) > 3072) return;
  keel__report_line(ctx, event, json_fields);
}

void keel_mark_resume(keel_ctx *ctx, uint64_t step, const char *kind) {
  ctx->resume_pending = true;
  ctx->resume_step = step;
  snprintf(ctx->resume_kind, sizeof ctx->resume_kind, "%s", kind ? kind : "");
}

/* The minibatch a recovery resumed at has completed once a later step begins. */
static void report_resumed(keel_ctx *ctx, uint64_t step) {
  if (!ctx->resume_pending || step <= ctx->resume_step) return;
  ctx->resume_pending = false;
  if (ctx->world == NULL || ctx->world->rank != 0) return;
  char fields[96];
  snprintf(fields, sizeof fields, "\"step\":%" PRIu64 ",\"kind\":\"%s\"", ctx->resume_step,
           ctx->resume_kind);
  keel__report_line(ctx, "resumed", fields);
}

/* Joiners are looked for at most this often: one store round trip, far from every step. */
#define JOIN_CHECK_INTERVAL_NS (200 * 1000000)

static void look_for_joiners(keel_ctx *ctx) {
  int64_t now = keel_now_ns();
  if (ctx->standalone || ctx->world == NULL || ctx->world->rank != 0 ||
      ctx->world->size >= ctx->max_world || now - ctx->last_join_check_ns < JOIN_CHECK_INTERVAL_NS)
    return;
  ctx->last_join_check_ns = now;
  keel_store_entry *entries = NULL;
  size_t count = 0;
  if (keel_store_list(ctx->store, "join/", &entries, &count, NULL) != KEEL_OK) return;
  keel_store_entries_free(entries, count);
  if (count == 0) return;
  /* Growing is a membership change like any other: revoke, and the next resilient
   * allreduce agrees on the new world with the joiners in it. */
  ctx->grow_requested = true;
  keel_comm_revoke(ctx->world);
}

keel_status keel_step(keel_ctx *ctx, uint64_t step) {
  report_resumed(ctx, step);
  ctx->current_step = step;
  ctx->step_known = true;
  keel__fault_check(ctx, "step", 0);
  look_for_joiners(ctx);
  return KEEL_OK;
}
