/* Node failure domain (ULFM elastic paper, 3.3.1-3.3.2): with --failure-domain node, the
 * death of one process takes its whole node out. Shrink drops the node in one recovery and
 * the survivors end consistent; replace puts a spare in each lost rank and ends with the
 * parameters of a run without failure, bit for bit. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "test_job.h"
#include "test_support.h"

#define KILL_RANK_2 "kill@rank=2,step=10,point=allreduce,after=2"

typedef struct outcome {
  int exit_code;
  int finished;
  int world;
  char crc[16];
  bool consistent;
  keel_test_job job;
} outcome;

/* Runs toy_train under keel run with 2 nodes of 2 processes and extra launcher flags. */
static void run_job(const char *const *extra_flags, const char *fault, outcome *result) {
  static const char *const toy_args[] = {"--steps", "40", "--params", "100000", NULL};
  const char *flags[16] = {"--nnodes", "2", "--nproc-per-node", "2"};
  size_t used = 4;
  for (size_t i = 0; extra_flags && extra_flags[i] && used < 15; i++)
    flags[used++] = extra_flags[i];
  flags[used] = NULL;
  assert_true(keel_test_job_prepare(&result->job, "keel-node"));
  result->exit_code = keel_test_job_run(&result->job, "60s", 90000, flags,
                                        keel_test_program("toy_train"), toy_args, fault);
  char *text = keel_test_read_file(result->job.output, NULL);
  assert_non_null(text);
  result->finished = 0;
  result->consistent = true;
  for (char *line = strstr(text, "toy-final"); line; line = strstr(line + 1, "toy-final")) {
    char crc[16] = "";
    int world = 0;
    const char *world_text = strstr(line, "world=");
    const char *crc_text = strstr(line, "crc=");
    if (world_text) world = atoi(world_text + 6);
    if (crc_text) snprintf(crc, sizeof crc, "%.8s", crc_text + 4);
    if (result->finished == 0) {
      memcpy(result->crc, crc, sizeof crc);
      result->world = world;
    }
    result->consistent &= strcmp(crc, result->crc) == 0 && world == result->world;
    result->finished++;
  }
  free(text);
}

static void node_failure_shrinks_by_the_whole_node(void **state) {
  (void)state;
  static const char *const flags[] = {"--failure-domain", "node", NULL};
  outcome result;
  run_job(flags, KILL_RANK_2, &result);
  assert_int_equal(result.exit_code, 0);
  assert_int_equal(result.finished, 2);
  assert_int_equal(result.world, 2);
  assert_true(result.consistent);
  char *events = keel_test_read_file(result.job.events, NULL);
  assert_non_null(strstr(events, "\"failed\":[2,3]"));
  free(events);
}

static void node_failure_replaced_by_spares_is_exact(void **state) {
  (void)state;
  outcome baseline, replaced;
  run_job(NULL, NULL, &baseline);
  assert_int_equal(baseline.exit_code, 0);
  assert_int_equal(baseline.finished, 4);
  static const char *const flags[] = {"--failure-domain", "node", "--spares", "2",
                                      "--on-failure", "replace", NULL};
  run_job(flags, KILL_RANK_2, &replaced);
  assert_int_equal(replaced.exit_code, 0);
  assert_int_equal(replaced.finished, 4);
  assert_int_equal(replaced.world, 4);
  assert_true(replaced.consistent);
  assert_string_equal(replaced.crc, baseline.crc);
  char *events = keel_test_read_file(replaced.job.events, NULL);
  assert_non_null(strstr(events, "\"replaced\":2"));
  free(events);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(node_failure_shrinks_by_the_whole_node),
      cmocka_unit_test(node_failure_replaced_by_spares_is_exact),
  };
  return keel_test_finish(cmocka_run_group_tests(tests, NULL, NULL));
}
