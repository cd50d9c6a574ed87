/* Fault injection inside the runtime (KEEL_FAULT, docs/RUNTIME.md): rules such as
 * "kill@rank=2,step=5,point=allreduce,after=2" make this process die, hang or stall at a
 * chosen point, so tests and users can make the very failure they want to survive. */
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "comm/comm_internal.h"

#define MODULE "fault"

static keel_status parse_action(const char *text, size_t length, keel__fault_action *action_p) {
  static const struct {
    const char *name;
    keel__fault_action action;
  } actions[] = {{"kill", KEEL__FAULT_KILL}, {"stop", KEEL__FAULT_STOP},
                 {"delay", KEEL__FAULT_DELAY}, {"exit", KEEL__FAULT_EXIT},
                 {"corrupt", KEEL__FAULT_CORRUPT}};
  for (size_t i = 0; i < sizeof actions / sizeof actions[0]; i++) {
    if (strlen(actions[i].name) == length && strncmp(text, actions[i].name, length) == 0) {
      *action_p = actions[i].action;
      return KEEL_OK;
    }
  }
  return KEEL_EINVAL;
}

static keel_status parse_setting(keel__fault_rule *rule, const char *setting) {
  const char *equals = strchr(setting, '=');
  if (equals == NULL) return KEEL_EINVAL;
  size_t name_length = (size_t)(equals - setting);
  const char *value = equals + 1;
  int64_t number = 0;
  if (name_length == 5 && strncmp(setting, "point", 5) == 0) {
    if (strlen(value) >= sizeof rule->point || *value == '\0') return KEEL_EINVAL;
    snprintf(rule->point, sizeof rule->point, "%s", value);
    return KEEL_OK;
  }
  if (keel_parse_int(value, 0, INT64_MAX / 2, &number) != KEEL_OK) return KEEL_EINVAL;
  if ((name_length == 4 && strncmp(setting, "rank", 4) == 0) ||
      (name_length == 3 && strncmp(setting, "uid", 3) == 0))
    rule->uid = number;
  else if (name_length == 4 && strncmp(setting, "step", 4) == 0) rule->step = number;
  else if (name_length == 5 && strncmp(setting, "after", 5) == 0) rule->after = number;
  else if (name_length == 2 && strncmp(setting, "ms", 2) == 0) rule->milliseconds = number;
  else if (name_length == 4 && strncmp(setting, "code", 4) == 0) rule->code = number;
  else return KEEL_EINVAL;
  return KEEL_OK;
}

static keel_status parse_rule(keel__fault_rule *rule, char *text) {
  *rule = (keel__fault_rule){.uid = -1, .step = -1, .after = 1, .code = 1};
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

keel_status keel__faults_parse(keel_ctx *ctx, const char *text) {
  char copy[1024];
  if (strlen(text) >= sizeof copy) return KEEL_EINVAL;
  snprintf(copy, sizeof copy, "%s", text);
  char *cursor = copy, *rule_text;
  while ((rule_text = strsep(&cursor, ";")) != NULL) {
    if (*rule_text == '\0') continue;
    if (ctx->fault_count == KEEL__MAX_FAULT_RULES ||
        parse_rule(&ctx->faults[ctx->fault_count], rule_text) != KEEL_OK) {
      KEEL_LOG_E(MODULE, "KEEL_FAULT: cannot read rule '%s' (expected e.g. "
                         "kill@rank=2,step=5,point=allreduce)", rule_text);
      return KEEL_EINVAL;
    }
    ctx->fault_count++;
  }
  return KEEL_OK;
}

static bool rule_applies(const keel_ctx *ctx, const keel__fault_rule *rule, const char *point,
                         int64_t counter) {
  if (rule->fired || strcmp(rule->point, point) != 0) return false;
  if (rule->uid >= 0 && (uint64_t)rule->uid != ctx->uid) return false;
  if (rule->step >= 0 && (!ctx->step_known || ctx->current_step < (uint64_t)rule->step))
    return false;
  return strcmp(point, "allreduce") != 0 || counter >= rule->after;
}

/* Returns true for a `corrupt` rule, which the point's caller carries out. */
static bool fire(keel_ctx *ctx, keel__fault_rule *rule, const char *point) {
  static const char *const names[] = {"kill", "stop", "delay", "exit", "corrupt"};
  rule->fired = true;
  char fields[160];
  snprintf(fields, sizeof fields, "\"action\":\"%s\",\"point\":\"%s\",\"step\":%" PRIu64,
           names[rule->action], point, ctx->current_step);
  keel__report_line(ctx, "fault", fields);
  KEEL_LOG_W(MODULE, "injected fault: %s at %s, step %" PRIu64, names[rule->action], point,
             ctx->current_step);
  switch (rule->action) {
    case KEEL__FAULT_KILL:
      kill(getpid(), SIGKILL);
      break;
    case KEEL__FAULT_STOP:
      kill(getpid(), SIGSTOP);
      break;
    case KEEL__FAULT_DELAY: {
      struct timespec pause = {(time_t)(rule->milliseconds / 1000),
                               (long)(rule->milliseconds % 1000) * 1000000};
      nanosleep(&pause, NULL);
      break;
    }
    case KEEL__FAULT_EXIT:
      _exit((int)rule->code);
    case KEEL__FAULT_CORRUPT:
      return true;
  }
  return false;
}

bool keel__fault_check(keel_ctx *ctx, const char *point, int64_t counter) {
  bool corrupt = false;
  for (int i = 0; i < ctx->fault_count; i++) {
    if (rule_applies(ctx, &ctx->faults[i], point, counter))
      corrupt = fire(ctx, &ctx->faults[i], point) || corrupt;
  }
  return corrupt;
}

bool keel_fault_point(keel_ctx *ctx, const char *point) {
  return keel__fault_check(ctx, point, 0);
}
