/* Unit tests of the communicator's pieces that need no other process: the reduction
 * kernels against their plain reference (random data, odd lengths, length 0, in place),
 * the recovery decision's text round trip and its rejection of damaged text, the parsing of
 * KEEL_FAULT rules, and the standalone world of one process. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "comm/comm_internal.h"

static void fill_random(keel_random *random, keel_dtype dtype, void *buffer, size_t count) {
  for (size_t i = 0; i < count; i++) {
    double value = keel_random_unit(random) * 2000 - 1000;
    switch (dtype) {
      case KEEL_F32: ((float *)buffer)[i] = (float)value; break;
      case KEEL_F64: ((double *)buffer)[i] = value; break;
      case KEEL_I32: ((int32_t *)buffer)[i] = (int32_t)keel_random_next(random); break;
      case KEEL_I64: ((int64_t *)buffer)[i] = (int64_t)keel_random_next(random); break;
      case KEEL_BF16: {
        float narrow = (float)value;
        uint32_t bits;
        memcpy(&bits, &narrow, sizeof bits);
        /* Random low bits as well, so that sums land between bf16 values and round. */
        ((uint16_t *)buffer)[i] = (uint16_t)(bits >> 16) ^ (uint16_t)(keel_random_next(random) & 0x7f);
        break;
      }
    }
  }
}

static void kernels_match_reference(void **state) {
  (void)state;
  static const size_t lengths[] = {0, 1, 2, 3, 7, 15, 16, 17, 63, 64, 65, 1000, 4099};
  static const keel_dtype dtypes[] = {KEEL_F32, KEEL_F64, KEEL_I32, KEEL_I64, KEEL_BF16};
  static const keel_reduce_op ops[] = {KEEL_SUM, KEEL_MAX};
  keel_random random;
  keel_random_seed(&random, 42);
  for (size_t l = 0; l < sizeof lengths / sizeof lengths[0]; l++) {
    for (size_t d = 0; d < sizeof dtypes / sizeof dtypes[0]; d++) {
      for (size_t o = 0; o < 2; o++) {
        size_t count = lengths[l], bytes = count * keel_dtype_size(dtypes[d]) + 8;
        uint8_t *left = malloc(bytes), *right = malloc(bytes), *fast = malloc(bytes),
                *plain = malloc(bytes);
        fill_random(&random, dtypes[d], left, count);
        fill_random(&random, dtypes[d], right, count);
        size_t used = count * keel_dtype_size(dtypes[d]);
        /* Length 0 must not touch memory: the byte past the end stays as it was. */
        fast[used] = 0xA5;
        keel__reduce(dtypes[d], ops[o], fast, left, right, count);
        keel__reduce_reference(dtypes[d], ops[o], plain, left, right, count);
        if (used > 0) assert_memory_equal(fast, plain, used);
        assert_int_equal(fast[used], 0xA5);
        /* In place, as the ring does it. */
        keel__reduce(dtypes[d], ops[o], left, left, right, count);
        if (used > 0) assert_memory_equal(left, plain, used);
        free(left);
        free(right);
        free(fast);
        free(plain);
      }
    }
  }
}

static void bf16_rounds_to_nearest_even(void **state) {
  (void)state;
  /* 1.0 is 0x3f80; one bf16 step above 1 is 2^-7. 1 + 2^-8 is a tie: stays at 1.0 (even);
   * 1 + 3*2^-8 is a tie between 0x3f81 and 0x3f82: goes to the even 0x3f82. */
  uint16_t one = 0x3f80, half_step = 0x3b80 /* 2^-8 */, three_half_steps = 0x3c40 /* 3*2^-8 */;
  uint16_t result;
  keel__reduce(KEEL_BF16, KEEL_SUM, &result, &one, &half_step, 1);
  assert_int_equal(result, 0x3f80);
  keel__reduce(KEEL_BF16, KEEL_SUM, &result, &one, &three_half_steps, 1);
  assert_int_equal(result, 0x3f82);
  uint16_t four = 0x4080;
  keel__divide(KEEL_BF16, &four, 1, 2);
  assert_int_equal(four, 0x4000); /* 2.0 */
}

static void divide_rounds_toward_zero_for_integers(void **state) {
  (void)state;
  int32_t values[] = {7, -7, 8, 0};
  keel__divide(KEEL_I32, values, 4, 2);
  assert_int_equal(values[0], 3);
  assert_int_equal(values[1], -3);
  assert_int_equal(values[2], 4);
  assert_int_equal(values[3], 0);
}

static void decision_round_trip(void **state) {
  (void)state;
  keel__decision decision = {.epoch = 7, .round = 2, .rebuild = true, .flags = 5,
                             .resilient_seq = 99, .sender = 3, .grew = true,
                             .replaced_count = 1};
  uint32_t members[] = {0, 1, 9, 3};
  memcpy(decision.members, members, sizeof members);
  decision.member_count = 4;
  decision.failed[0] = 2;
  decision.failed_count = 1;
  decision.receivers[0] = 9;
  decision.receiver_count = 1;
  keel_buffer text;
  keel_buffer_init(&text, 4096);
  assert_int_equal(keel__decision_format(&decision, &text), KEEL_OK);
  keel__decision parsed;
  assert_int_equal(keel__decision_parse((const char *)text.data, &parsed), KEEL_OK);
  assert_int_equal(parsed.epoch, 7);
  assert_int_equal(parsed.round, 2);
  assert_true(parsed.rebuild);
  assert_true(parsed.grew);
  assert_int_equal(parsed.flags, 5);
  assert_int_equal(parsed.resilient_seq, 99);
  assert_int_equal(parsed.sender, 3);
  assert_int_equal(parsed.replaced_count, 1);
  assert_int_equal(parsed.member_count, 4);
  assert_memory_equal(parsed.members, members, sizeof members);
  assert_int_equal(parsed.failed_count, 1);
  assert_int_equal(parsed.failed[0], 2);
  assert_int_equal(parsed.receiver_count, 1);
  assert_int_equal(parsed.receivers[0], 9);
  keel_buffer_free(&text);
}

static void decision_with_nobody_failed(void **state) {
  (void)state;
  keel__decision parsed;
  assert_int_equal(keel__decision_parse("epoch=0 round=0 rebuild=0 flags=1 seq=0 sender=4294967295 "
                                        "grew=0 replaced=0 members=0,1 failed= receivers=",
                                        &parsed),
                   KEEL_OK);
  assert_int_equal(parsed.member_count, 2);
  assert_int_equal(parsed.failed_count, 0);
  assert_int_equal(parsed.receiver_count, 0);
}

static void damaged_decisions_are_refused(void **state) {
  (void)state;
  keel__decision parsed;
  static const char *const damaged[] = {
      "",
      "epoch=1 members=0,1",                               /* no failed/receivers lists */
      "epoch=1 members=0,x failed= receivers=",            /* not a number */
      "epoch=1 members=0,99999 failed= receivers=",        /* uid out of range */
      "epoch=1 members=0,,1 failed= receivers=",           /* empty element */
  };
  for (size_t i = 0; i < sizeof damaged / sizeof damaged[0]; i++)
    assert_int_equal(keel__decision_parse(damaged[i], &parsed), KEEL_ECORRUPT);
}

static void fault_rules_parse(void **state) {
  (void)state;
  keel_ctx *ctx = calloc(1, sizeof *ctx);
  assert_int_equal(keel__faults_parse(ctx, "kill@rank=2,step=5,point=allreduce,after=3;"
                                           "delay@uid=1,ms=20;stop"),
                   KEEL_OK);
  assert_int_equal(ctx->fault_count, 3);
  assert_int_equal(ctx->faults[0].action, KEEL__FAULT_KILL);
  assert_int_equal(ctx->faults[0].uid, 2);
  assert_int_equal(ctx->faults[0].step, 5);
  assert_string_equal(ctx->faults[0].point, "allreduce");
  assert_int_equal(ctx->faults[0].after, 3);
  assert_int_equal(ctx->faults[1].action, KEEL__FAULT_DELAY);
  assert_int_equal(ctx->faults[1].milliseconds, 20);
  assert_string_equal(ctx->faults[1].point, "step");
  assert_int_equal(ctx->faults[2].action, KEEL__FAULT_STOP);
  assert_int_equal(ctx->faults[2].uid, -1);
  static const char *const bad[] = {"explode@rank=1", "kill@rank=x", "kill@when=3",
                                    "kill@rank=-1", "kill@point="};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    ctx->fault_count = 0;
    assert_int_equal(keel__faults_parse(ctx, bad[i]), KEEL_EINVAL);
  }
  free(ctx);
}

static void delay_rule_fires_once_at_its_point(void **state) {
  (void)state;
  keel_ctx *ctx = calloc(1, sizeof *ctx);
  ctx->status_fd = -1;
  assert_int_equal(keel__faults_parse(ctx, "delay@point=forward,step=3,ms=1"), KEEL_OK);
  ctx->step_known = true;
  ctx->current_step = 2;
  keel__fault_check(ctx, "forward", 0);
  assert_false(ctx->faults[0].fired);
  ctx->current_step = 3;
  keel__fault_check(ctx, "optimizer", 0);
  assert_false(ctx->faults[0].fired);
  keel__fault_check(ctx, "forward", 0);
  assert_true(ctx->faults[0].fired);
  free(ctx);
}

static void standalone_world_of_one(void **state) {
  (void)state;
  unsetenv("KEEL_STORE");
  unsetenv("KEEL_FAULT");
  keel_ctx *ctx = NULL;
  assert_int_equal(keel_init(&ctx), KEEL_OK);
  keel_comm *world = keel_world(ctx);
  assert_int_equal(keel_comm_rank(world), 0);
  assert_int_equal(keel_comm_size(world), 1);
  float send[3] = {1, 2, 3}, recv[3] = {0};
  keel_recovery recovery;
  assert_int_equal(keel_allreduce_resilient(ctx, send, recv, 3, KEEL_F32, KEEL_AVG, &recovery),
                   KEEL_OK);
  assert_memory_equal(send, recv, sizeof send);
  assert_false(recovery.recovered);
  assert_int_equal(keel_allreduce_resilient(ctx, send, send, 3, KEEL_F32, KEEL_SUM, NULL),
                   KEEL_EINVAL);
  assert_int_equal(keel_comm_barrier(world), KEEL_OK);
  assert_int_equal(keel_start(ctx), KEEL_OK);
  keel_finalize(ctx);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(kernels_match_reference),
      cmocka_unit_test(divide_rounds_toward_zero_for_integers),
      cmocka_unit_test(bf16_rounds_to_nearest_even),
      cmocka_unit_test(decision_round_trip),
      cmocka_unit_test(decision_with_nobody_failed),
      cmocka_unit_test(damaged_decisions_are_refused),
      cmocka_unit_test(fault_rules_parse),
      cmocka_unit_test(delay_rule_fires_once_at_its_point),
      cmocka_unit_test(standalone_world_of_one),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
