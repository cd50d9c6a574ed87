/* Fault injection (KEEL_FAULT, docs/RUNTIME.md): a plan of rules parsed once per process and
 * fired at named points by every layer (the communicator's allreduce and agreement, the
 * runtime's steps and state transfers, the checkpoint engine's saves), so that tests and
 * users can make the very failure they want to survive, where they want it. */
#include <inttypes.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "keel/core.h"

#define MODULE "fault"

typedef enum fault_action {
  FAULT_KILL,
  FAULT_STOP,
  FAULT_DELAY,
  FAULT_EXIT,
  FAULT_CORRUPT, /* the point's caller damages what it just wrote */
  FAULT_HANG,    /* the calling thread blocks for good; the rest of the process runs */
  FAULT_BITFLIP, /* as corrupt: at "step", the runtime flips one bit of the registered state */
  FAULT_NONE,    /* no request pending (keel_fault_plan_request) */
} fault_action;

static const char *const action_names[] = {"kill",    "stop", "delay",  "exit",
                                           "corrupt", "hang", "bitflip"};

typedef struct fault_rule {
  fault_action action;
  int64_t uid;  /* -1: any */
  int64_t node; /* -1: any */
  int64_t step; /* -1: any */
  char point[32];
  int64_t after; /* allreduce: chunk sends before firing */
  int64_t milliseconds;
  int64_t code;
  bool fired;
} fault_rule;

struct keel_fault_plan {
  uint32_t uid;
  int64_t node; /* -1: not known (rules with node= do not fire) */
  uint64_t step;
  bool step_known;
  fault_rule rules[KEEL_MAX_FAULT_RULES];
  int count;
  keel_fault_report_cb report;
  void *report_context;
  atomic_int requested; /* keel_fault_plan_request: the action the next "step" point takes */
};

static keel_status parse_action(const char *text, size_t length, fault_action *action_p) {
  for (size_t i = 0; i < sizeof action_names / sizeof action_names[0]; i++) {
    if (strlen(action_names[i]) == length && strncmp(text, action_names[i], length) == 0) {
      *action_p = (fault_action)i;
      return KEEL_OK;
    }
  }
  return KEEL_EINVAL;
}

static bool name_is(const char *setting, size_t length, const char *name) {
  return strlen(name) == length && strncmp(setting, name, length) == 0;
}

static keel_status parse_setting(fault_rule *rule, const char *setting) {
  const char *equals = strchr(setting, '=');
  if (equals == NULL) return KEEL_EINVAL;
  size_t length = (size_t)(equals - setting);
  const char *value = equals + 1;
  if (name_is(setting, length, "point")) {
    if (strlen(value) >= sizeof rule->point || *value == '\0') return KEEL_EINVAL;
    snprintf(rule->point, sizeof rule->point, "%s", value);
    return KEEL_OK;
  }
  int64_t number = 0;
  if (keel_parse_int(value, 0, INT64_MAX / 2, &number) != KEEL_OK) return KEEL_EINVAL;
  if (name_is(setting, length, "rank") || name_is(setting, length, "uid"))
    rule->uid = number;
  else if (name_is(setting, length, "node"))
    rule->node = number;
  else if (name_is(setting, length, "step"))
    rule->step = number;
  else if (name_is(setting, length, "after"))
    rule->after = number;
  else if (name_is(setting, length, "ms"))
    rule->milliseconds = number;
  else if (name_is(setting, length, "code"))
    rule->code = number;
  else
    return KEEL_EINVAL;
  return KEEL_OK;
}

static keel_status parse_rule(fault_rule *rule, char *text) {
  *rule = (fault_rule){.uid = -1, .node = -1, .step = -1, .after = 1, .code = 1};
  snprintf(rule->point, sizeof rule->point, "step");
  char *at = strchr(text, '@');
  size_t action_length = at ? (size_t)(at - text) : strlen(text);
  if (parse_action(text, action_length, &rule->action) != KEEL_OK) return KEEL_EINVAL;
  if (at == NULL) return KEEL_OK;
  char *cursor = at + 1, *setting;
  while ((setting = strsep(&cursor, ",")) != NULL) {
    if (*setting != '\0' && parse_setting(rule, setting) != KEEL_OK) return KEEL_EINVAL;
  }
  return KEEL_OK;
}

keel_status keel_fault_plan_create(const char *text, uint32_t uid, keel_fault_plan **plan_p) {
  keel_fault_plan *plan = calloc(1, sizeof *plan);
  if (plan == NULL) return KEEL_ENOMEM;
  plan->uid = uid;
  plan->node = -1;
  atomic_init(&plan->requested, (int)FAULT_NONE);
  char copy[1024];
  if (text != NULL && strlen(text) >= sizeof copy) {
    KEEL_LOG_E(MODULE, "KEEL_FAULT is longer than %zu bytes", sizeof copy - 1);
    goto fail_free_plan;
  }
  snprintf(copy, sizeof copy, "%s", text ? text : "");
  char *cursor = copy, *rule_text;
  while ((rule_text = strsep(&cursor, ";")) != NULL) {
    if (*rule_text == '\0') continue;
    char shown[sizeof copy];
    snprintf(shown, sizeof shown, "%s", rule_text); /* strsep cuts the rule as it parses */
    if (plan->count == KEEL_MAX_FAULT_RULES ||
        parse_rule(&plan->rules[plan->count], rule_text) != KEEL_OK) {
      KEEL_LOG_E(MODULE,
                 "KEEL_FAULT: cannot read rule '%s' (expected e.g. "
                 "kill@rank=2,step=5,point=allreduce; at most %d rules)",
                 shown, KEEL_MAX_FAULT_RULES);
      goto fail_free_plan;
    }
    plan->count++;
  }
  *plan_p = plan;
  return KEEL_OK;

fail_free_plan:
  free(plan);
  return KEEL_EINVAL;
}

void keel_fault_plan_destroy(keel_fault_plan *plan) { free(plan); }

void keel_fault_plan_set_reporter(keel_fault_plan *plan, keel_fault_report_cb report,
                                  void *context) {
  plan->report = report;
  plan->report_context = context;
}

void keel_fault_plan_set_node(keel_fault_plan *plan, int64_t node) {
  if (plan != NULL) plan->node = node;
}

void keel_fault_plan_set_step(keel_fault_plan *plan, uint64_t step) {
  if (plan == NULL) return;
  plan->step = step;
  plan->step_known = true;
}

static bool rule_applies(const keel_fault_plan *plan, const fault_rule *rule, const char *point,
                         int64_t counter, bool last) {
  if (rule->fired || strcmp(rule->point, point) != 0) return false;
  if (rule->uid >= 0 && (uint64_t)rule->uid != plan->uid) return false;
  if (rule->node >= 0 && rule->node != plan->node) return false;
  if (rule->step >= 0 && (!plan->step_known || plan->step < (uint64_t)rule->step)) return false;
  /* after= counts the point's own events: an allreduce's chunk sends (its last one fires a
   * rule whose count it did not reach), or any point fired with a count (a snapshot
   * service's chunks); a point fired without one (0) ignores it. */
  if (strcmp(point, "allreduce") == 0) return counter >= rule->after || last;
  return counter == 0 || counter >= rule->after;
}

static void announce(const keel_fault_plan *plan, fault_action action, const char *point) {
  const char *name = action_names[action];
  if (plan->report != NULL) plan->report(plan->report_context, name, point, plan->step);
  KEEL_LOG_W(MODULE, "injected fault: %s at %s, step %" PRIu64, name, point, plan->step);
}

/* The failure the user asked for: a training thread stuck for good (a deadlock, a device call
 * that never returns) in a process whose other threads, its heartbeat among them, go on. The
 * job's collective deadline catches it and its launcher or agent fences the process. */
static _Noreturn void hang_forever(void) {
  for (;;) {
    struct timespec pause = {1, 0};
    nanosleep(&pause, NULL);
  }
}

/* Carries out a rule; true for a `corrupt` rule, which the point's caller carries out. */
static bool fire(keel_fault_plan *plan, fault_rule *rule, const char *point) {
  rule->fired = true;
  announce(plan, rule->action, point);
  switch (rule->action) {
    /* To the calling thread (raise), so that it takes the signal before it runs on: a
     * process-directed SIGSTOP wakes one thread, maybe another, and the caller could still
     * act (release a lock, send an answer) before the stop reached it. */
    case FAULT_KILL:
      raise(SIGKILL);
      break;
    case FAULT_STOP:
      raise(SIGSTOP);
      break;
    case FAULT_DELAY: {
      struct timespec pause = {(time_t)(rule->milliseconds / 1000),
                               (long)(rule->milliseconds % 1000) * 1000000};
      nanosleep(&pause, NULL);
      break;
    }
    case FAULT_EXIT:
      /* The one place the library ends its process: the user asked for exactly this
       * failure with KEEL_FAULT=exit@...,code=N, a process that vanishes mid-job. */
      _exit((int)rule->code);
    case FAULT_CORRUPT:
    case FAULT_BITFLIP:
      return true;
    case FAULT_HANG:
      hang_forever();
    case FAULT_NONE:
      break;
  }
  return false;
}

keel_status keel_fault_plan_request(keel_fault_plan *plan, const char *action) {
  fault_action parsed;
  if (plan == NULL || action == NULL || parse_action(action, strlen(action), &parsed) != KEEL_OK ||
      (parsed != FAULT_HANG && parsed != FAULT_BITFLIP))
    return KEEL_EINVAL;
  atomic_store(&plan->requested, (int)parsed);
  return KEEL_OK;
}

/* A requested action, taken at the first "step" point after the request. */
static bool request_take(keel_fault_plan *plan, const char *point) {
  if (strcmp(point, "step") != 0) return false;
  fault_action action = (fault_action)atomic_exchange(&plan->requested, (int)FAULT_NONE);
  if (action == FAULT_NONE) return false;
  announce(plan, action, point);
  if (action == FAULT_HANG) hang_forever();
  return true; /* a bitflip: the caller flips */
}

static bool plan_fire(keel_fault_plan *plan, const char *point, int64_t counter, bool last) {
  if (plan == NULL) return false;
  if (request_take(plan, point)) return true;
  bool corrupt = false;
  for (int i = 0; i < plan->count; i++) {
    if (rule_applies(plan, &plan->rules[i], point, counter, last))
      corrupt = fire(plan, &plan->rules[i], point) || corrupt;
  }
  return corrupt;
}

bool keel_fault_plan_fire(keel_fault_plan *plan, const char *point, int64_t counter) {
  return plan_fire(plan, point, counter, false);
}

bool keel_fault_plan_fire_last(keel_fault_plan *plan, const char *point, int64_t counter) {
  return plan_fire(plan, point, counter, true);
}
