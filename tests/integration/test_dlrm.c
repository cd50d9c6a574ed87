/* Tests of examples/dlrm, run as a program: it learns the synthetic clicks (held-out
 * log-loss below the base rate's, AUC above 0.7), its parameter checksum is a function of
 * its flags (same flags, same bits; another seed, other bits; evaluation changes nothing),
 * every optimizer trains, its gradients agree with finite differences, and bad command
 * lines exit 2 with a message. */
#include <limits.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "test_support.h"

#define RUN_TIMEOUT_MS 60000
#define MAX_FLAGS 40

#define LIST(...) ((const char *const[]){__VA_ARGS__, NULL})
/* The small configuration: 4 tables of 1000 rows, width 8, a quarter of a second of
 * training. */
#define SMALL "--tables", "4", "--rows", "1000", "--dim", "8", "--eval-samples", "8192", "--quiet"

typedef struct dlrm_result {
  int code;
  bool evaluated;
  double log_loss, auc, base_log_loss, bayes_log_loss, bayes_auc, click_rate;
  char checksum[16]; /* empty when there was no params-crc32c line */
  char output[PATH_MAX + 32];
} dlrm_result;

static char directory[PATH_MAX];
static int run_count;

static int group_setup(void **state) {
  (void)state;
  const char *made = keel_test_tempdir("keel-dlrm");
  if (made == NULL) return -1;
  snprintf(directory, sizeof directory, "%s", made);
  return 0;
}

static int group_teardown(void **state) {
  (void)state;
  char path[PATH_MAX + 32];
  for (int i = 0; i < run_count; i++) {
    snprintf(path, sizeof path, "%s/run-%d.txt", directory, i);
    unlink(path);
  }
  rmdir(directory);
  return 0;
}

static void result_parse(dlrm_result *result) {
  char line[512];
  if (keel_test_last_line_with(result->output, "eval log-loss", line, sizeof line)) {
    result->evaluated =
        sscanf(line,
               "eval log-loss %lf auc %lf base-log-loss %lf bayes-log-loss %lf bayes-auc %lf "
               "click-rate %lf",
               &result->log_loss, &result->auc, &result->base_log_loss, &result->bayes_log_loss,
               &result->bayes_auc, &result->click_rate) == 6;
  }
  if (keel_test_last_line_with(result->output, "params-crc32c ", line, sizeof line) &&
      sscanf(line, "params-crc32c %15s", result->checksum) != 1)
    result->checksum[0] = '\0';
}

/* Runs dlrm with flags (and extra environment, may be NULL) to completion; its stdout and
 * stderr go to a file of its own, kept for the messages. */
static void dlrm_run(const char *const *flags, char *const *environment, dlrm_result *result) {
  memset(result, 0, sizeof *result);
  snprintf(result->output, sizeof result->output, "%s/run-%d.txt", directory, run_count++);
  char program[PATH_MAX];
  snprintf(program, sizeof program, "%s", keel_test_bin("dlrm"));
  char *argv[MAX_FLAGS + 2] = {program};
  size_t count = 1;
  for (size_t i = 0; flags[i] != NULL; i++) {
    assert_true(count < MAX_FLAGS + 1);
    argv[count++] = (char *)flags[i];
  }
  argv[count] = NULL;
  result->code = keel_test_run(argv, environment, result->output, RUN_TIMEOUT_MS);
  result_parse(result);
}

/* A run that must succeed with both result lines. */
static void dlrm_run_ok(const char *const *flags, dlrm_result *result) {
  dlrm_run(flags, NULL, result);
  if (result->code != 0 || !result->evaluated || result->checksum[0] == '\0') {
    keel_test_print_file("dlrm output", result->output);
    fail_msg("dlrm exited %d, evaluated %d, checksum '%s'", result->code, result->evaluated,
             result->checksum);
  }
}

static void test_learns_and_repeats_bit_for_bit(void **state) {
  (void)state;
  dlrm_result first, second;
  dlrm_run_ok(LIST(SMALL, "--steps", "500"), &first);
  dlrm_run_ok(LIST(SMALL, "--steps", "500"), &second);
  print_message("eval log-loss %.4f (base rate %.4f, Bayes %.4f) auc %.4f (Bayes %.4f)\n",
                first.log_loss, first.base_log_loss, first.bayes_log_loss, first.auc,
                first.bayes_auc);
  /* The data is what docs/DLRM.md says: a click rate of 20-40%, a Bayes AUC near 0.8. */
  assert_true(first.click_rate > 0.2 && first.click_rate < 0.4);
  assert_true(first.bayes_auc > 0.75 && first.bayes_auc < 0.85);
  assert_true(first.log_loss < first.base_log_loss - 0.04);
  assert_true(first.auc > 0.7);
  /* No model beats the hidden one by more than the noise of 8192 samples. */
  assert_true(first.log_loss > first.bayes_log_loss - 0.01);
  assert_string_equal(first.checksum, second.checksum);
  assert_true(first.log_loss == second.log_loss && first.auc == second.auc);
}

static void test_seeds_change_the_checksum(void **state) {
  (void)state;
  dlrm_result base, seed, data_seed;
  dlrm_run_ok(LIST(SMALL, "--steps", "100"), &base);
  dlrm_run_ok(LIST(SMALL, "--steps", "100", "--seed", "2"), &seed);
  dlrm_run_ok(LIST(SMALL, "--steps", "100", "--data-seed", "2"), &data_seed);
  assert_string_not_equal(base.checksum, seed.checksum);
  assert_string_not_equal(base.checksum, data_seed.checksum);
  assert_string_not_equal(seed.checksum, data_seed.checksum);
}

/* Evaluating pulls rows the training has not touched yet; the local backend makes them
 * then, which must leave the parameters as if it had made them at the start. */
static void test_evaluation_changes_nothing(void **state) {
  (void)state;
  dlrm_result plain, evaluated;
  dlrm_run_ok(LIST(SMALL, "--steps", "100"), &plain);
  dlrm_run_ok(LIST(SMALL, "--steps", "100", "--eval-every", "25"), &evaluated);
  assert_string_equal(plain.checksum, evaluated.checksum);
}

static void test_every_optimizer_trains(void **state) {
  (void)state;
  static const char *const names[] = {"sgd", "momentum", "adagrad", "adam"};
  dlrm_result results[4];
  for (size_t i = 0; i < 4; i++) {
    dlrm_run_ok(LIST(SMALL, "--steps", "300", "--optimizer", names[i]), &results[i]);
    print_message("%s: eval log-loss %.4f (base rate %.4f) auc %.4f\n", names[i],
                  results[i].log_loss, results[i].base_log_loss, results[i].auc);
    assert_true(results[i].log_loss < results[i].base_log_loss - 0.02);
    for (size_t j = 0; j < i; j++)
      assert_string_not_equal(results[i].checksum, results[j].checksum);
  }
}

/* Tables of 1 row up to 50000, several ids per bag: rows that repeat within a batch. */
static void test_uneven_tables_and_bags(void **state) {
  (void)state;
  dlrm_result result;
  dlrm_run_ok(
      LIST("--table-rows", "1,7,1000,50000", "--hotness", "3", "--dim", "4", "--steps", "100",
           "--eval-samples", "1000", "--bottom", "16,8,4", "--top", "8,1", "--quiet"),
      &result);
}

static void test_gradients_match_finite_differences(void **state) {
  (void)state;
  const char *const *const cases[] = {
      LIST("--check-gradients", "--tables", "3", "--rows", "20", "--dim", "4", "--bottom", "8,4",
           "--top", "8,1", "--batch", "8", "--hotness", "2", "--quiet"),
      LIST("--check-gradients", "--table-rows", "7,5,30,2,9", "--dim", "6", "--dense-features", "3",
           "--bottom", "5,6", "--top", "9,4,1", "--batch", "16", "--hotness", "3", "--quiet"),
      LIST("--check-gradients", "--tables", "1", "--rows", "3", "--dim", "2", "--bottom", "2",
           "--top", "1", "--batch", "4", "--quiet"),
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    dlrm_result result;
    dlrm_run(cases[i], NULL, &result);
    char line[512];
    bool reported = keel_test_last_line_with(result.output, "gradient-check", line, sizeof line);
    if (result.code != 0 || !reported) {
      keel_test_print_file("dlrm output", result.output);
      fail_msg("gradient check %zu exited %d", i, result.code);
    }
  }
}

typedef struct refusal {
  const char *const *flags;
  const char *message; /* a piece of what it must say */
} refusal;

static void test_bad_command_lines_exit_2(void **state) {
  (void)state;
  const refusal cases[] = {
      {LIST("--no-such-flag"), "no-such-flag"},
      {LIST("--rows", "0"), "--rows"},
      {LIST("--rows", "4294967297"), "--rows"},
      {LIST("--rows", "12x"), "--rows"},
      {LIST("--tables", "2", "--table-rows", "3,4"), "not both"},
      {LIST("--table-rows", "3,,4"), "--table-rows"},
      {LIST("--dim", "8", "--bottom", "64,16"), "--dim"},
      {LIST("--top", "64,2"), "click logit"},
      {LIST("--optimizer", "rmsprop"), "--optimizer"},
      {LIST("--lr", "-1"), "--lr"},
      {LIST("--lr", "fast"), "--lr"},
      {LIST("--zipf", "11"), "--zipf"},
      {LIST("--batch", "0"), "--batch"},
      {LIST("--backend", "servers"), "--backend"},
      {LIST("--steps"), "--steps"},
      {LIST("--steps", "10", "extra"), "extra"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    dlrm_result result;
    dlrm_run(cases[i].flags, NULL, &result);
    char *text = keel_test_read_file(result.output, NULL);
    bool said = text != NULL && strstr(text, cases[i].message) != NULL;
    free(text);
    if (result.code != 2 || !said) {
      keel_test_print_file("dlrm output", result.output);
      fail_msg("case %zu (%s): exit %d, message '%s' %s", i, cases[i].flags[0], result.code,
               cases[i].message, said ? "given" : "missing");
    }
  }
}

static void test_local_backend_refuses_several_workers(void **state) {
  (void)state;
  char world[] = "WORLD_SIZE=2", rank[] = "RANK=1";
  char *const environment[] = {world, rank, NULL};
  dlrm_result result;
  dlrm_run(LIST(SMALL, "--steps", "10"), environment, &result);
  assert_int_equal(result.code, 2);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_learns_and_repeats_bit_for_bit),
      cmocka_unit_test(test_seeds_change_the_checksum),
      cmocka_unit_test(test_evaluation_changes_nothing),
      cmocka_unit_test(test_every_optimizer_trains),
      cmocka_unit_test(test_uneven_tables_and_bags),
      cmocka_unit_test(test_gradients_match_finite_differences),
      cmocka_unit_test(test_bad_command_lines_exit_2),
      cmocka_unit_test(test_local_backend_refuses_several_workers),
  };
  return keel_test_finish(cmocka_run_group_tests(tests, group_setup, group_teardown));
}
