/* `keel run --on-failure restart` (docs/RUNTIME.md, "Restarting the job"): the restart
 * round that lets the healthy workers save and leave after a failure, fences the ones that
 * do not, and starts the next incarnation of the job with fresh uids and epochs. */
#include <stdio.h>
#include <sys/wait.h>

#include "keel/runtime.h" /* KEEL_EXIT_RESTART */
#include "launcher.h"

/* What ended a child, as restart_begin says it: "SIGKILL", "exit 3", or why it was fenced. */
static void child_end_reason(const keel__child *child, char *text, size_t capacity) {
  if (child->fenced) {
    snprintf(text, capacity, "%s", child->fence_reason);
    return;
  }
  char outcome[32];
  keel__wait_status_text(child->wait_status, outcome, sizeof outcome);
  snprintf(text, capacity, "%s%s", WIFEXITED(child->wait_status) ? "exit " : "", outcome);
}

/* The healthy workers save and exit KEEL_EXIT_RESTART on their own; the round gives them a
 * collective deadline (in which they notice the failure) and a grace to save. */
static void restart_round_begin(keel__launcher *launcher, const keel__child *failed) {
  const keel__run_options *options = &launcher->options;
  char reason[160], escaped[320];
  child_end_reason(failed, reason, sizeof reason);
  keel__json_escape(reason, escaped, sizeof escaped);
  int code = keel__wait_status_code(failed->wait_status);
  launcher->restart_round = (keel__restart_round){
      .active = true,
      .began_ns = keel_now_ns(),
      .deadline_ns =
          keel_deadline_after_ns(options->collective_timeout_ns + options->restart_grace_ns),
      .failed_uid = failed->uid,
      .failed_code = code == 0 ? KEEL__EXIT_FAILURE : code,
  };
  keel__event_emit(launcher, "restart_begin",
                   "\"restart\":%lld,\"failed_uid\":%u,\"reason\":\"%s\"",
                   (long long)launcher->restarts_used + 1, (unsigned)failed->uid, escaped);
  keel__display_note(launcher, "uid %u ended (%s): restarting the job", (unsigned)failed->uid,
                     reason);
  KEEL_LOG_W("launcher", "uid %u ended (%s): the others save and leave, then the job restarts",
             (unsigned)failed->uid, reason);
}

/* Every process of the incarnation is gone: start the next one, or end the job when the
 * restarts are used up. */
static void restart_round_finish(keel__launcher *launcher) {
  keel__restart_round *round = &launcher->restart_round;
  const keel__run_options *options = &launcher->options;
  round->active = false;
  if (launcher->restarts_used >= options->max_restarts) {
    KEEL_LOG_E("launcher", "uid %u failed and --max-restarts %lld reached: ending the job",
               (unsigned)round->failed_uid, (long long)options->max_restarts);
    keel__launcher_begin_ending(launcher, round->failed_code);
    return;
  }
  /* The new epoch must be above every epoch the old processes used, reports of them still
   * on their way from the watcher included. */
  keel__launcher_refresh_ranks(launcher);
  launcher->restarts_used++;
  launcher->incarnation = (keel__incarnation){
      .index = launcher->restarts_used,
      .first_uid = (uint32_t)launcher->child_count,
      .first_epoch = launcher->max_epoch + 1,
  };
  launcher->max_epoch = launcher->incarnation.first_epoch;
  if (!keel__children_spawn(launcher, KEEL__ROLE_WORKER, options->world)) return;
  const keel__incarnation *incarnation = &launcher->incarnation;
  double down_ms = (double)(keel_now_ns() - round->began_ns) / 1e6;
  keel__event_emit(launcher, "restart",
                   "\"restart\":%lld,\"first_uid\":%u,\"first_epoch\":%lld,\"world\":%lld,"
                   "\"down_ms\":%.3f",
                   (long long)incarnation->index, (unsigned)incarnation->first_uid,
                   (long long)incarnation->first_epoch, (long long)options->world, down_ms);
  keel__display_note(launcher, "restart %lld: world %lld from uid %u, epoch %lld, down %.0f ms",
                     (long long)incarnation->index, (long long)options->world,
                     (unsigned)incarnation->first_uid, (long long)incarnation->first_epoch,
                     down_ms);
}

/* A rank holder of the incarnation that ends badly starts a round (an exit 75 too: a
 * healthy worker may see the failure and leave before the failed one is reaped); while it
 * lasts, exits are workers leaving for the restart, and the last one reaped ends it. */
void keel__restart_child_exited(keel__launcher *launcher, keel__child *child, bool failed) {
  if (!launcher->restart_round.active && failed && child->holds_rank) {
    restart_round_begin(launcher, child);
    keel__launcher_fence_node(launcher, child);
  }
  if (!launcher->restart_round.active) {
    keel__launcher_check_end(launcher);
    return;
  }
  if (keel__children_unreaped(launcher, launcher->incarnation.first_uid) == 0)
    restart_round_finish(launcher);
}

int64_t keel__restart_round_deadline(const keel__launcher *launcher) {
  bool waiting = launcher->restart_round.active && launcher->phase == KEEL__PHASE_RUNNING;
  return waiting ? launcher->restart_round.deadline_ns : KEEL_NO_DEADLINE;
}

/* Processes of the incarnation still there at the deadline are fenced; the round ends once
 * they are reaped. */
void keel__restart_round_tick(keel__launcher *launcher, int64_t now_ns) {
  if (now_ns < keel__restart_round_deadline(launcher)) return;
  launcher->restart_round.deadline_ns = KEEL_NO_DEADLINE;
  for (size_t i = launcher->incarnation.first_uid; i < launcher->child_count; i++)
    keel__child_fence(launcher, &launcher->children[i], "restart: did not exit in time");
}

/* A worker that exits KEEL_EXIT_RESTART during a round saved its state: no failure. */
bool keel__child_left_for_restart(const keel__launcher *launcher, const keel__child *child) {
  return launcher->restart_round.active && !child->fenced && WIFEXITED(child->wait_status) &&
         WEXITSTATUS(child->wait_status) == KEEL_EXIT_RESTART;
}

