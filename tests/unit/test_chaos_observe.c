/* Unit tests of what `keel chaos` concludes from a job's events file: which processes a node's
 * fence killed, and which injected partition (if any) explains that fence. The events are
 * written by the test, so each case pins down one timing that a soak met only by chance. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "chaos.h"
#include "test_support.h"

#define MS 1000000LL

/* Node 2: an agent of an earlier life and a worker of it (uid 3, never an exit event: it
 * died with that agent), the current agent, two workers (uids 4, 5), one that exited
 * in an orderly way (uid 7); node 3: a worker (uid 6). */
static const char node_lives[] =
    "{\"event\":\"agent_spawn\",\"node\":2,\"pid\":0,\"t_ns\":10000000}\n"
    "{\"event\":\"spawn\",\"node\":2,\"uid\":3,\"pid\":0,\"role\":\"worker\",\"t_ns\":50000000}\n"
    "{\"event\":\"agent_spawn\",\"node\":2,\"pid\":0,\"t_ns\":100000000}\n"
    "{\"event\":\"spawn\",\"node\":2,\"uid\":4,\"pid\":0,\"role\":\"worker\",\"t_ns\":200000000}\n"
    "{\"event\":\"spawn\",\"node\":2,\"uid\":5,\"pid\":0,\"role\":\"worker\",\"t_ns\":200000000}\n"
    "{\"event\":\"spawn\",\"node\":2,\"uid\":7,\"pid\":0,\"role\":\"worker\",\"t_ns\":200000000}\n"
    "{\"event\":\"spawn\",\"node\":3,\"uid\":6,\"pid\":0,\"role\":\"worker\",\"t_ns\":200000000}\n"
    "{\"event\":\"exit\",\"uid\":7,\"code\":0,\"t_ns\":900000000}\n";

typedef struct observed {
  keel__chaos_run *run;
  keel__chaos_failure partition;
} observed;

/* A partition of node 2 injected at 1 s and healed at healed_ms (0: not healed). */
static void partition_set(keel__chaos_failure *partition, int64_t healed_ms) {
  *partition = (keel__chaos_failure){.kind = KEEL__CHAOS_PARTITION,
                                     .node = 2,
                                     .injected = true,
                                     .injected_ns = 1000 * MS,
                                     .healed_ns = healed_ms * MS,
                                     .detect_ns = -1,
                                     .recover_ns = -1};
}

/* Reads text as the events written since the last read, the way chaos does while a job runs. */
static void events_read(observed *o, const char *text) {
  o->run->events = fmemopen((void *)text, strlen(text), "r");
  assert_non_null(o->run->events);
  keel__chaos_events_read(o->run, &o->partition, 1);
  fclose(o->run->events);
  o->run->events = NULL;
}

static int setup(void **state) {
  observed *o = calloc(1, sizeof *o);
  if (o == NULL || (o->run = calloc(1, sizeof *o->run)) == NULL) return -1;
  *state = o;
  return 0;
}

static int teardown(void **state) {
  observed *o = *state;
  keel__chaos_run_clear(o->run);
  free(o->run);
  free(o);
  return 0;
}

static void assert_victims(const keel__chaos_failure *failure, const uint32_t *uids, size_t count) {
  for (size_t i = 0; i < count; i++)
    if (!keel__chaos_failure_hit(failure, uids[i]))
      fail_msg("uid %u is not among the partition's victims", (unsigned)uids[i]);
  assert_int_equal(failure->victim_count, count);
}

/* The soak's finding 28: the link healed at 2.5 s, the agent started a process at 2.6 s, and
 * fenced at 2.7 s, its lease silent since 1.45 s (a keepalive lost to the cut): the fence and
 * every process it killed are the partition's, the one born after the heal included, and none
 * of an earlier life of the node, of another node, or that had exited. */
static void test_fence_just_after_heal_is_the_partitions(void **state) {
  observed *o = *state;
  partition_set(&o->partition, 2500);
  events_read(o, node_lives);
  events_read(o,
              "{\"event\":\"spawn\",\"node\":2,\"uid\":9,\"pid\":0,\"role\":\"spare\","
              "\"t_ns\":2600000000}\n"
              "{\"event\":\"node_fence\",\"node\":2,\"silent_ms\":1250.0,\"ttl_ms\":2000.0,"
              "\"killed\":3,\"dead\":3,\"fenced_ms\":1251.0,\"t_ns\":2700000000}\n"
              "{\"event\":\"exit\",\"uid\":9,\"signal\":\"SIGKILL\",\"t_ns\":2710000000}\n");
  const uint32_t victims[] = {4, 5, 9};
  assert_victims(&o->partition, victims, 3);
}

/* A fence whose silence began after the link healed is no partition's: nothing explains the
 * deaths it caused, and the chaos verdict must see them as false. */
static void test_fence_after_a_healed_silence_is_unexplained(void **state) {
  observed *o = *state;
  partition_set(&o->partition, 2500);
  events_read(o, node_lives);
  events_read(o,
              "{\"event\":\"node_fence\",\"node\":2,\"silent_ms\":1250.0,\"t_ns\":5000000000}\n");
  assert_victims(&o->partition, NULL, 0);
}

/* A fence of another node than the partitioned one, and a fence before the partition began,
 * are not the partition's either. */
static void test_fence_of_another_node_or_before_is_unexplained(void **state) {
  observed *o = *state;
  partition_set(&o->partition, 0);
  events_read(o, node_lives);
  events_read(o,
              "{\"event\":\"node_fence\",\"node\":2,\"silent_ms\":1250.0,\"t_ns\":900000000}\n"
              "{\"event\":\"node_fence\",\"node\":3,\"silent_ms\":1250.0,\"t_ns\":2000000000}\n");
  assert_victims(&o->partition, NULL, 0);
}

/* A partition longer than the lease: the node fences while still cut off. */
static void test_fence_during_the_partition_is_its(void **state) {
  observed *o = *state;
  partition_set(&o->partition, 0);
  events_read(o, node_lives);
  events_read(o,
              "{\"event\":\"node_fence\",\"node\":2,\"silent_ms\":1250.0,\"t_ns\":2300000000}\n");
  const uint32_t victims[] = {4, 5};
  assert_victims(&o->partition, victims, 2);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_fence_just_after_heal_is_the_partitions, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_fence_after_a_healed_silence_is_unexplained, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_fence_of_another_node_or_before_is_unexplained, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_fence_during_the_partition_is_its, setup, teardown),
  };
  return keel_test_finish(cmocka_run_group_tests(tests, NULL, NULL));
}
