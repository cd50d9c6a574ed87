/* Bit-exactness across placement (DESIGN.md, Determinism): the bits of a reduction depend
 * only on the contributions, the ranks and the world size, never on the transport. The same
 * jobs run over shared memory and over tcp (KEEL_TRANSPORT=tcp) under the real launcher:
 * placement_bits's allreduces and reduce-scatters of every dtype and operation, counts from 1
 * element to a few MiB, over 2, 3, 4, 5 and 8 ranks, must print the same crc for every case, and
 * toy_train must end with the same parameters. A first case, without processes, checks where
 * the canonical order starts each element's fold, for 1 to 8 ranks. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "comm/comm_internal.h"
#include "test_job.h"
#include "test_support.h"

#define JOB_TIMEOUT "60s"
#define JOB_TIMEOUT_MS 70000
#define MAX_CASES 512
/* The names of mismatched cases a failure lists before it says how many more there are. */
#define MISMATCHES_SHOWN 8

#define LIST(...) ((const char *const[]){__VA_ARGS__, NULL})

/* ---- one job, over one transport */

/* NULL: the default choice, shared memory on this host; "tcp": shared memory turned off.
 * The launcher passes its environment on to the workers. */
static void transport_select(const char *transport) {
  if (transport == NULL)
    unsetenv("KEEL_TRANSPORT");
  else
    setenv("KEEL_TRANSPORT", transport, 1);
}

/* Runs program under `keel run` with flags over transport to its end, asserting exit 0;
 * job's output holds what it printed. */
static void job_run_over(keel_test_job *job, const char *transport, const char *const *flags,
                         const char *program, const char *const *program_args) {
  assert_true(keel_test_job_prepare(job, "keel-bits"));
  transport_select(transport);
  int code = keel_test_job_run(job, JOB_TIMEOUT, JOB_TIMEOUT_MS, flags, keel_test_program(program),
                               program_args, NULL);
  transport_select(NULL);
  if (code != 0) keel_test_print_file("job output", job->output);
  assert_int_equal(code, 0);
}

/* ---- placement_bits's lines */

typedef struct bits_case {
  char name[96];
  unsigned crc;
  bool has_naive;
  unsigned naive; /* the crc of the plain rank-order fold */
} bits_case;

typedef struct bits_run {
  char transport[16];
  int ranks;
  bits_case cases[MAX_CASES];
  size_t count;
  int done_cases; /* from the "done" line; -1: none */
} bits_run;

static void bits_line_parse(const char *line, bits_run *run) {
  bits_case *c = &run->cases[run->count];
  char naive[16];
  if (sscanf(line, "placement-bits transport=%15s ranks=%d", run->transport, &run->ranks) == 2)
    return;
  if (sscanf(line, "placement-bits done cases=%d", &run->done_cases) == 1) return;
  if (run->count < MAX_CASES &&
      sscanf(line, "placement-bits case=%95s crc=%x naive=%15s", c->name, &c->crc, naive) == 3) {
    c->has_naive = strcmp(naive, "-") != 0;
    c->naive = c->has_naive ? (unsigned)strtoul(naive, NULL, 16) : 0;
    run->count++;
  }
}

/* Runs placement_bits over `ranks` ranks and transport; *run gets its lines. */
static void bits_run_over(const char *ranks, const char *transport, bits_run *run) {
  keel_test_job job;
  job_run_over(&job, transport, LIST("-n", ranks), "placement_bits", LIST(NULL));
  memset(run, 0, sizeof *run);
  run->done_cases = -1;
  char *text = keel_test_read_file(job.output, NULL);
  assert_non_null(text);
  char *saved = NULL;
  for (char *line = strtok_r(text, "\n", &saved); line != NULL; line = strtok_r(NULL, "\n", &saved))
    bits_line_parse(line, run);
  free(text);
  if (run->done_cases < 0 || (size_t)run->done_cases != run->count) {
    keel_test_print_file("job output", job.output);
    fail_msg("placement_bits over %s: %zu case lines, done line says %d", run->transport,
             run->count, run->done_cases);
  }
}

/* ---- cases: every collective case has the same bits over shm and tcp */

typedef struct world_case {
  const char *name;
  const char *ranks;
} world_case;

/* How many cases of run have a naive crc other than their crc; sums_p: how many of those
 * are sums. */
static size_t naive_differences(const bits_run *run, size_t *sums_p) {
  size_t differences = 0;
  *sums_p = 0;
  for (size_t i = 0; i < run->count; i++) {
    const bits_case *c = &run->cases[i];
    if (!c->has_naive || c->naive == c->crc) continue;
    differences++;
    *sums_p += strstr(c->name, "/sum/") != NULL;
  }
  return differences;
}

static void test_collectives_same_bits(void **state) {
  const world_case *world = *state;
  static bits_run shm, tcp; /* large: off the stack */
  bits_run_over(world->ranks, NULL, &shm);
  bits_run_over(world->ranks, "tcp", &tcp);
  /* Without shared memory here the test would compare tcp with itself. */
  assert_string_equal(shm.transport, "shm");
  assert_string_equal(tcp.transport, "tcp");
  assert_int_equal(shm.count, tcp.count);
  size_t mismatches = 0;
  for (size_t i = 0; i < shm.count; i++) {
    assert_string_equal(shm.cases[i].name, tcp.cases[i].name);
    if (shm.cases[i].crc == tcp.cases[i].crc) continue;
    if (mismatches++ < MISMATCHES_SHOWN)
      fprintf(stderr, "%s ranks: %s: shm %08x, tcp %08x\n", world->ranks, shm.cases[i].name,
              shm.cases[i].crc, tcp.cases[i].crc);
  }
  if (mismatches > 0)
    fail_msg("%zu of %zu cases have other bits over shm than over tcp with %s ranks", mismatches,
             shm.count, world->ranks);
  /* The inputs must tell orders apart, or the comparison proves nothing: some result folded
   * in plain rank order differs from tcp's (a sum from 3 ranks on: with 2, a + b is b + a;
   * max(+0, -0) still tells the two orders of 2 apart). */
  size_t sums, differences = naive_differences(&tcp, &sums);
  if (differences == 0 || (atoi(world->ranks) >= 3 && sums == 0))
    fail_msg(
        "with %s ranks no result (%zu of sums) differs from the rank-order fold: the inputs "
        "cannot tell a wrong order from the right one",
        world->ranks, sums);
}

/* ---- a job: toy_train ends with the same parameters over shm and tcp */

/* 100000 parameters make toy_train's allreduce take tcp's ring and shm's sliced path. */
static void test_toy_train_same_params(void **state) {
  (void)state;
  const char *const *toy_args = LIST("--steps", "20", "--params", "100000", "--compute-ms", "0");
  keel_test_job shm_job, tcp_job;
  job_run_over(&shm_job, NULL, LIST("-n", "4"), "toy_train", toy_args);
  unsigned shm_crc = keel_test_toy_assert_consistent(shm_job.output, 4, 20);
  job_run_over(&tcp_job, "tcp", LIST("-n", "4"), "toy_train", toy_args);
  unsigned tcp_crc = keel_test_toy_assert_consistent(tcp_job.output, 4, 20);
  if (shm_crc != tcp_crc)
    fail_msg("toy_train's parameters: crc %08x over shm, %08x over tcp", shm_crc, tcp_crc);
}

/* ---- the order itself, without processes */

/* Checks every element's fold start of a count-element allreduce over size ranks: rank 0 for
 * the whole buffer at or under the direct limits (the buffer's bytes, or the bytes each rank
 * sends to the others); above them the rank whose ring chunk holds the element, with the run
 * ending where that chunk does. */
static void assert_fold_starts(size_t count, size_t element_size, int size) {
  size_t bytes = count * element_size;
  bool direct = bytes <= KEEL__DIRECT_ALLREDUCE_BYTES ||
                (size > 1 && bytes * (size_t)(size - 1) <= KEEL__DIRECT_ALLREDUCE_SENT_BYTES);
  for (size_t index = 0; index < count; index++) {
    size_t run_end = 0;
    int first_rank = keel__allreduce_fold_start(count, element_size, size, index, &run_end);
    size_t chunk_begin = keel__part_start(count, size, first_rank);
    size_t chunk_end = keel__part_start(count, size, first_rank + 1);
    bool right = direct ? first_rank == 0 && run_end == count
                        : first_rank >= 0 && first_rank < size && chunk_begin <= index &&
                              index < chunk_end && run_end == chunk_end;
    if (!right)
      fail_msg("count %zu x %zu bytes, %d ranks: element %zu starts at rank %d, run to %zu", count,
               element_size, size, index, first_rank, run_end);
  }
}

/* Counts below, at and above the world size (empty chunks included), elements just under and
 * over the direct limits. */
static void test_fold_starts_follow_the_ring(void **state) {
  (void)state;
  for (int size = 1; size <= 8; size++) {
    for (size_t count = 0; count <= 64; count++) {
      assert_fold_starts(count, 1, size);
      assert_fold_starts(count, KEEL__DIRECT_ALLREDUCE_BYTES / 2, size);
    }
    assert_fold_starts(KEEL__DIRECT_ALLREDUCE_BYTES / 4, 4, size);
    assert_fold_starts(KEEL__DIRECT_ALLREDUCE_BYTES / 4 + 1, 4, size);
    if (size > 1) {
      size_t sent_limit = KEEL__DIRECT_ALLREDUCE_SENT_BYTES / (size_t)(size - 1) / 4;
      assert_fold_starts(sent_limit, 4, size);
      assert_fold_starts(sent_limit + 1, 4, size);
    }
    assert_fold_starts(100003, 8, size);
  }
  assert_int_equal(keel__reduce_scatter_fold_start(4, 3), 0);
  assert_int_equal(keel__reduce_scatter_fold_start(4, 1), 2);
}

/* ---- the table of cases */
static world_case worlds[] = {
    {"collectives_2_ranks", "2"}, {"collectives_3_ranks", "3"}, {"collectives_4_ranks", "4"},
    {"collectives_5_ranks", "5"}, {"collectives_8_ranks", "8"},
};

#define CASE_COUNT(table) (sizeof table / sizeof table[0])

int main(void) {
  struct CMUnitTest tests[CASE_COUNT(worlds) + 2];
  size_t count = 0;
  tests[count++] = (struct CMUnitTest)cmocka_unit_test(test_fold_starts_follow_the_ring);
  for (size_t i = 0; i < CASE_COUNT(worlds); i++)
    tests[count++] =
        (struct CMUnitTest){worlds[i].name, test_collectives_same_bits, NULL, NULL, &worlds[i]};
  tests[count++] = (struct CMUnitTest)cmocka_unit_test(test_toy_train_same_params);
  return keel_test_finish(cmocka_run_group_tests(tests, NULL, NULL));
}
