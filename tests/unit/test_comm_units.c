/* Unit tests of the communicator's and the runtime's pieces that need no other process: the
 * reduction kernels against their plain reference (random data, odd lengths, length 0, in
 * place), the agreement's decision as a pure function over every order of votes and deaths
 * (up to 4 members, members dying during the agreement, stale votes), spares, joiners and
 * node failure domains, the decision's and vote's text and their rejection of damage, fault
 * plans, and the standalone world of one process. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "comm/comm_internal.h"
#include "keel/keel.h"

static void fill_random(keel_random *random, keel_dtype dtype, void *buffer, size_t count) {
  for (size_t i = 0; i < count; i++) {
    double value = keel_random_unit(random) * 2000 - 1000;
    switch (dtype) {
      case KEEL_F32:
        ((float *)buffer)[i] = (float)value;
        break;
      case KEEL_F64:
        ((double *)buffer)[i] = value;
        break;
      case KEEL_I32:
        ((int32_t *)buffer)[i] = (int32_t)keel_random_next(random);
        break;
      case KEEL_I64:
        ((int64_t *)buffer)[i] = (int64_t)keel_random_next(random);
        break;
      case KEEL_BF16: {
        float narrow = (float)value;
        uint32_t bits;
        memcpy(&bits, &narrow, sizeof bits);
        /* Random low bits as well, so that sums land between bf16 values and round. */
        ((uint16_t *)buffer)[i] =
            (uint16_t)(bits >> 16) ^ (uint16_t)(keel_random_next(random) & 0x7f);
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

/* ---- the decision and the vote as text */

static void decision_round_trip(void **state) {
  (void)state;
  static keel_decision decision, parsed;
  memset(&decision, 0, sizeof decision);
  decision.epoch = 7;
  decision.round = 2;
  decision.rebuild = true;
  decision.flags = 5;
  decision.replaced_count = 1;
  decision.joined_count = 1;
  uint32_t members[] = {0, 1, 9, 3, 12};
  memcpy(decision.members, members, sizeof members);
  decision.member_count = 5;
  snprintf(decision.notes[0], KEEL_NOTE_MAX, "h1:v17:s0/1:c0:rA:i1:t0");
  snprintf(decision.notes[1], KEEL_NOTE_MAX, "h1:v17:s0/1:c1:rS:i1:t0");
  /* notes[2] and [4] stay empty: newcomers */
  snprintf(decision.notes[3], KEEL_NOTE_MAX, "x");
  decision.failed[0] = 2;
  decision.failed_count = 1;
  keel_buffer text;
  keel_buffer_init(&text, 1 << 20);
  assert_int_equal(keel__decision_format(&decision, &text), KEEL_OK);
  assert_int_equal(keel__decision_parse((const char *)text.data, &parsed), KEEL_OK);
  assert_int_equal(parsed.epoch, 7);
  assert_int_equal(parsed.round, 2);
  assert_true(parsed.rebuild);
  assert_int_equal(parsed.flags, 5);
  assert_int_equal(parsed.replaced_count, 1);
  assert_int_equal(parsed.joined_count, 1);
  assert_int_equal(parsed.member_count, 5);
  assert_memory_equal(parsed.members, members, sizeof members);
  for (int m = 0; m < 5; m++) assert_string_equal(parsed.notes[m], decision.notes[m]);
  assert_int_equal(parsed.failed_count, 1);
  assert_int_equal(parsed.failed[0], 2);
  keel_buffer_free(&text);
}

static void decision_with_nobody_failed(void **state) {
  (void)state;
  static keel_decision parsed;
  assert_int_equal(keel__decision_parse("epoch=0 round=0 rebuild=0 flags=1 replaced=0 joined=0 "
                                        "members=0,1 failed= notes=|",
                                        &parsed),
                   KEEL_OK);
  assert_int_equal(parsed.member_count, 2);
  assert_int_equal(parsed.failed_count, 0);
  assert_string_equal(parsed.notes[0], "");
}

static void damaged_decisions_are_refused(void **state) {
  (void)state;
  static keel_decision parsed;
  static const char *const damaged[] = {
      "",
      "epoch=1 round=0 rebuild=1 flags=1 replaced=0 joined=0 members=0,1", /* no lists */
      "epoch=1 round=0 rebuild=1 flags=1 replaced=0 joined=0 members=0,x failed= notes=|",
      "epoch=1 round=0 rebuild=1 flags=1 replaced=0 joined=0 members=0,9999999 failed= notes=|",
      "epoch=1 round=0 rebuild=1 flags=1 replaced=0 joined=0 members=0,,1 failed= notes=||",
      "epoch=1 round=0 rebuild=1 flags=1 replaced=0 joined=0 members=0,1 failed= notes=a",
      "epoch=1 round=0 rebuild=2 flags=1 replaced=0 joined=0 members=0 failed= notes=",
      "epoch=x round=0 rebuild=1 flags=1 replaced=0 joined=0 members=0 failed= notes=",
  };
  for (size_t i = 0; i < sizeof damaged / sizeof damaged[0]; i++) {
    if (keel__decision_parse(damaged[i], &parsed) != KEEL_ECORRUPT)
      fail_msg("accepted damaged decision %zu: '%s'", i, damaged[i]);
  }
}

static void votes_round_trip_and_refuse_damage(void **state) {
  (void)state;
  keel_rebuild_vote vote = {.flags = 0xfffffffe, .rebuild = true, .admit_spares = true};
  snprintf(vote.note, sizeof vote.note, "h1:v3:s1/2:c0:rA:i1:t0");
  char text[256];
  assert_int_equal(keel__vote_format(&vote, 41, 3, text, sizeof text), KEEL_OK);
  keel_rebuild_vote parsed;
  uint64_t epoch = 0;
  int node = 0;
  assert_int_equal(keel__vote_parse(text, &parsed, &epoch, &node), KEEL_OK);
  assert_int_equal(epoch, 41);
  assert_int_equal(node, 3);
  assert_int_equal(parsed.flags, 0xfffffffe);
  assert_true(parsed.rebuild && parsed.admit_spares && !parsed.shrink_only);
  assert_string_equal(parsed.note, vote.note);
  /* A note with a space or the decision's separator cannot travel. */
  snprintf(vote.note, sizeof vote.note, "a b");
  assert_int_equal(keel__vote_format(&vote, 1, 0, text, sizeof text), KEEL_EINVAL);
  snprintf(vote.note, sizeof vote.note, "a|b");
  assert_int_equal(keel__vote_format(&vote, 1, 0, text, sizeof text), KEEL_EINVAL);
  assert_int_equal(keel__vote_parse("epoch=1 node=0 flags=1", &parsed, &epoch, &node),
                   KEEL_ECORRUPT);
}

/* ---- the decision function over every order of votes and deaths */

enum { MAX_MEMBERS = 4 };
/* What happens to a member during the agreement. */
typedef enum fate {
  FATE_VOTE,
  FATE_DIE,
  FATE_VOTE_THEN_DIE,
  FATE_STALE_THEN_VOTE,
  FATE_COUNT
} fate;
typedef enum event_kind { EVENT_VOTE, EVENT_DIE, EVENT_STALE_VOTE } event_kind;
typedef struct event {
  int member;
  event_kind kind;
} event;

#define EPOCH 9

typedef struct table_run {
  int members;
  keel__ballot ballots[MAX_MEMBERS];
  keel_decision winner; /* the first decision written: every survivor adopts it */
  bool decided;
  long decisions_checked;
} table_run;

static uint32_t flags_of(int member) { return ~(1u << member); }

/* Checks one call of the decision function against the table it saw. */
static void check_decision(table_run *run, bool decided, const keel_decision *decision) {
  bool pending = false;
  for (int m = 0; m < run->members; m++) {
    const keel__ballot *ballot = &run->ballots[m];
    pending |= ballot->state == KEEL__BALLOT_PENDING ||
               (ballot->state == KEEL__BALLOT_CAST && ballot->vote_epoch != EPOCH);
  }
  /* It decides exactly when nobody alive is still to be heard from. */
  assert_int_equal(decided, !pending);
  if (!decided) return;
  run->decisions_checked++;
  uint32_t flags = UINT32_MAX;
  int survivors = 0, failed = 0;
  for (int m = 0; m < run->members; m++) {
    const keel__ballot *ballot = &run->ballots[m];
    if (ballot->state == KEEL__BALLOT_DEAD) {
      /* The failed set is the dead, in rank order; none of them is a member. */
      assert_int_equal(decision->failed[failed++], ballot->uid);
      continue;
    }
    flags &= flags_of(m);
    assert_int_equal(decision->members[survivors], ballot->uid);
    assert_string_equal(decision->notes[survivors], ballot->vote.note);
    survivors++;
  }
  assert_int_equal(decision->member_count, survivors);
  assert_int_equal(decision->failed_count, failed);
  /* The flags are the AND of the survivors' votes: a dead member's vote does not count. */
  assert_int_equal(decision->flags, flags);
  assert_int_equal(decision->epoch, EPOCH);
  /* Every member asked for a rebuild; with nobody left, nobody asks. */
  assert_int_equal(decision->rebuild, survivors > 0);
  assert_int_equal(decision->replaced_count, 0);
}

static void apply_event(table_run *run, const event *happening) {
  keel__ballot *ballot = &run->ballots[happening->member];
  switch (happening->kind) {
    case EVENT_VOTE:
    case EVENT_STALE_VOTE:
      if (ballot->state == KEEL__BALLOT_DEAD) return;
      ballot->state = KEEL__BALLOT_CAST;
      ballot->vote_epoch = happening->kind == EVENT_VOTE ? EPOCH : EPOCH - 1;
      ballot->vote = (keel_rebuild_vote){
          .flags = flags_of(happening->member), .rebuild = true, .shrink_only = true};
      snprintf(ballot->vote.note, sizeof ballot->vote.note, "m%d", happening->member);
      return;
    case EVENT_DIE:
      ballot->state = KEEL__BALLOT_DEAD;
      return;
  }
}

static void play(table_run *run, const event *events, int count) {
  for (int m = 0; m < run->members; m++)
    run->ballots[m] =
        (keel__ballot){.uid = (uint32_t)(10 + m), .state = KEEL__BALLOT_PENDING, .node = -1};
  run->decided = false;
  static keel_decision decision;
  keel__decide_input input = {.epoch = EPOCH,
                              .round = 0,
                              .ballots = run->ballots,
                              .count = run->members,
                              .max_world = KEEL_MAX_WORLD};
  for (int i = 0; i <= count; i++) {
    if (i > 0) apply_event(run, &events[i - 1]);
    bool decided = keel__decide(&input, &decision);
    check_decision(run, decided, &decision);
    if (decided && !run->decided) {
      run->decided = true;
      memcpy(&run->winner, &decision, sizeof decision);
    }
  }
  /* Every member ends voting or dead: the round is always settled in the end, and the
   * winner only ever excluded members that were dead when it was written. */
  assert_true(run->decided);
  for (int m = 0; m < run->winner.failed_count; m++) {
    uint32_t uid = run->winner.failed[m];
    assert_int_equal(run->ballots[uid - 10].state, KEEL__BALLOT_DEAD);
  }
}

/* Every interleaving of the members' event sequences that keeps each member's own order. */
static void interleave(table_run *run, event sequences[][2], const int *lengths, int *taken,
                       event *order, int placed, int total) {
  if (placed == total) {
    play(run, order, total);
    return;
  }
  for (int m = 0; m < run->members; m++) {
    if (taken[m] == lengths[m]) continue;
    order[placed] = sequences[m][taken[m]++];
    interleave(run, sequences, lengths, taken, order, placed + 1, total);
    taken[m]--;
  }
}

static void decide_every_order_of_votes_and_deaths(void **state) {
  (void)state;
  long interleavings = 0;
  table_run run;
  for (int members = 1; members <= MAX_MEMBERS; members++) {
    int combinations = 1;
    for (int m = 0; m < members; m++) combinations *= FATE_COUNT;
    for (int combination = 0; combination < combinations; combination++) {
      event sequences[MAX_MEMBERS][2];
      int lengths[MAX_MEMBERS], taken[MAX_MEMBERS] = {0}, total = 0;
      for (int m = 0, rest = combination; m < members; m++, rest /= FATE_COUNT) {
        fate what = (fate)(rest % FATE_COUNT);
        event first = {m, what == FATE_DIE               ? EVENT_DIE
                          : what == FATE_STALE_THEN_VOTE ? EVENT_STALE_VOTE
                                                         : EVENT_VOTE};
        sequences[m][0] = first;
        lengths[m] = 1;
        if (what == FATE_VOTE_THEN_DIE) sequences[m][lengths[m]++] = (event){m, EVENT_DIE};
        if (what == FATE_STALE_THEN_VOTE) sequences[m][lengths[m]++] = (event){m, EVENT_VOTE};
        total += lengths[m];
      }
      run.members = members;
      run.decisions_checked = 0;
      event order[2 * MAX_MEMBERS];
      interleave(&run, sequences, lengths, taken, order, 0, total);
      interleavings++;
    }
  }
  /* 4 + 16 + 64 + 256 fate combinations, each with all of its interleavings. */
  assert_int_equal(interleavings, 4 + 16 + 64 + 256);
}

static void decide_replaces_waits_for_spares_and_grows(void **state) {
  (void)state;
  keel__ballot ballots[4];
  for (int m = 0; m < 4; m++) {
    ballots[m] = (keel__ballot){.uid = (uint32_t)m,
                                .state = KEEL__BALLOT_CAST,
                                .node = m / 2,
                                .vote_epoch = 3,
                                .vote = {.flags = 1, .rebuild = true, .admit_spares = true}};
    snprintf(ballots[m].vote.note, KEEL_NOTE_MAX, "n%d", m);
  }
  ballots[1].state = KEEL__BALLOT_DEAD;
  ballots[2].state = KEEL__BALLOT_DEAD;
  uint32_t spares[] = {20, 21}, joiners[] = {30, 31, 32};
  keel__decide_input input = {.epoch = 3,
                              .ballots = ballots,
                              .count = 4,
                              .spares = spares,
                              .spare_count = 1,
                              .max_world = 5};
  static keel_decision decision;
  /* Two failed, one spare: a replacement waits for the second... */
  assert_false(keel__decide(&input, &decision));
  /* ...until it has waited enough: then the one spare takes the first failed place. */
  input.waited_enough_for_spares = true;
  assert_true(keel__decide(&input, &decision));
  uint32_t expected_short[] = {0, 20, 3};
  assert_int_equal(decision.member_count, 3);
  assert_memory_equal(decision.members, expected_short, sizeof expected_short);
  assert_string_equal(decision.notes[1], "");
  assert_int_equal(decision.replaced_count, 1);
  /* With both spares, in the failed members' places, in rank order. */
  input.spare_count = 2;
  input.waited_enough_for_spares = false;
  assert_true(keel__decide(&input, &decision));
  uint32_t expected[] = {0, 20, 21, 3};
  assert_memory_equal(decision.members, expected, sizeof expected);
  /* Joiners are admitted at the end, up to the maximum world. */
  ballots[0].vote.admit_joiners = true;
  input.joiners = joiners;
  input.joiner_count = 3;
  assert_true(keel__decide(&input, &decision));
  assert_int_equal(decision.member_count, 5);
  assert_int_equal(decision.members[4], 30);
  assert_int_equal(decision.joined_count, 1);
  /* A shrink vote takes no spares even when the others ask for them: the joiners fill the
   * world up to its maximum instead. */
  ballots[3].vote.shrink_only = true;
  assert_true(keel__decide(&input, &decision));
  uint32_t survivors[] = {0, 3, 30, 31, 32};
  assert_int_equal(decision.member_count, 5);
  assert_memory_equal(decision.members, survivors, sizeof survivors);
  assert_int_equal(decision.replaced_count, 0);
  assert_int_equal(decision.joined_count, 3);
}

/* A replace world that shrank to 2 of its 4 (no spare was ready) takes the spares there
 * now back up to 4 in a round without failures (a grow at a step boundary), appended after
 * the survivors; never beyond its size, and never without a replace vote. */
static void decide_refills_a_shrunk_replace_world(void **state) {
  (void)state;
  keel__ballot ballots[2];
  for (int m = 0; m < 2; m++)
    ballots[m] = (keel__ballot){.uid = (uint32_t)m * 2,
                                .state = KEEL__BALLOT_CAST,
                                .node = -1,
                                .vote_epoch = 5,
                                .vote = {.flags = 1, .rebuild = true, .admit_spares = true}};
  uint32_t spares[] = {7, 8, 9};
  keel__decide_input input = {.epoch = 5,
                              .ballots = ballots,
                              .count = 2,
                              .spares = spares,
                              .spare_count = 1,
                              .max_world = 4,
                              .refill_world = 4};
  static keel_decision decision;
  assert_true(keel__decide(&input, &decision));
  uint32_t one[] = {0, 2, 7};
  assert_int_equal(decision.member_count, 3);
  assert_memory_equal(decision.members, one, sizeof one);
  assert_int_equal(decision.replaced_count, 1);
  assert_int_equal(decision.failed_count, 0);
  input.spare_count = 3;
  assert_true(keel__decide(&input, &decision));
  uint32_t full[] = {0, 2, 7, 8};
  assert_int_equal(decision.member_count, 4);
  assert_memory_equal(decision.members, full, sizeof full);
  /* No refill asked for (another policy, a node domain): the world stays as it is. */
  input.refill_world = 0;
  assert_true(keel__decide(&input, &decision));
  assert_int_equal(decision.member_count, 2);
  input.refill_world = 4;
  ballots[1].vote.shrink_only = true;
  assert_true(keel__decide(&input, &decision));
  assert_int_equal(decision.member_count, 2);
}

static void decide_fails_a_dead_members_whole_node(void **state) {
  (void)state;
  keel__ballot ballots[4];
  for (int m = 0; m < 4; m++)
    ballots[m] = (keel__ballot){.uid = (uint32_t)m,
                                .state = KEEL__BALLOT_CAST,
                                .node = m / 2,
                                .vote_epoch = 0,
                                .vote = {.flags = 1, .rebuild = true, .shrink_only = true}};
  ballots[2].state = KEEL__BALLOT_DEAD; /* node 1 goes: member 3 with it */
  keel__decide_input input = {
      .epoch = 0, .ballots = ballots, .count = 4, .node_domain = true, .max_world = 8};
  static keel_decision decision;
  assert_true(keel__decide(&input, &decision));
  uint32_t members[] = {0, 1}, failed[] = {2, 3};
  assert_int_equal(decision.member_count, 2);
  assert_memory_equal(decision.members, members, sizeof members);
  assert_int_equal(decision.failed_count, 2);
  assert_memory_equal(decision.failed, failed, sizeof failed);
  input.node_domain = false;
  assert_true(keel__decide(&input, &decision));
  assert_int_equal(decision.member_count, 3);
}

/* ---- fault plans */

typedef struct fired_log {
  int count;
  char last[64];
} fired_log;

static void note_fired(void *context, const char *action, const char *point, uint64_t step) {
  fired_log *log = context;
  log->count++;
  snprintf(log->last, sizeof log->last, "%s@%s:%llu", action, point, (unsigned long long)step);
}

static void fault_rules_parse(void **state) {
  (void)state;
  keel_fault_plan *plan = NULL;
  assert_int_equal(keel_fault_plan_create("kill@rank=2,step=5,point=allreduce,after=3;"
                                          "delay@uid=1,ms=20;stop",
                                          7, &plan),
                   KEEL_OK);
  keel_fault_plan_destroy(plan);
  assert_int_equal(keel_fault_plan_create(NULL, 0, &plan), KEEL_OK);
  assert_false(keel_fault_plan_fire(plan, "step", 0));
  keel_fault_plan_destroy(plan);
  static const char *const bad[] = {
      "explode@rank=1", "kill@rank=x", "kill@when=3",
      "kill@rank=-1",   "kill@point=", "kill;kill;kill;kill;kill;kill;kill;kill;kill"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    plan = NULL;
    assert_int_equal(keel_fault_plan_create(bad[i], 0, &plan), KEEL_EINVAL);
    assert_null(plan);
  }
}

static void delay_rule_fires_once_at_its_point(void **state) {
  (void)state;
  keel_fault_plan *plan = NULL;
  assert_int_equal(keel_fault_plan_create("delay@point=forward,step=3,ms=1;corrupt@point=saved;"
                                          "delay@uid=5,point=forward,ms=1",
                                          4, &plan),
                   KEEL_OK);
  fired_log log = {0};
  keel_fault_plan_set_reporter(plan, note_fired, &log);
  keel_fault_plan_set_step(plan, 2);
  assert_false(keel_fault_plan_fire(plan, "forward", 0));
  assert_int_equal(log.count, 0); /* before its step */
  keel_fault_plan_set_step(plan, 3);
  keel_fault_plan_fire(plan, "optimizer", 0);
  assert_int_equal(log.count, 0); /* another point */
  keel_fault_plan_fire(plan, "forward", 0);
  assert_int_equal(log.count, 1);
  assert_string_equal(log.last, "delay@forward:3");
  keel_fault_plan_fire(plan, "forward", 0);
  assert_int_equal(log.count, 1); /* once; the uid=5 rule is another process's */
  assert_true(keel_fault_plan_fire(plan, "saved", 0));
  assert_false(keel_fault_plan_fire(plan, "saved", 0));
  keel_fault_plan_destroy(plan);
}

/* after=K counts an allreduce's points; an allreduce with fewer (the direct exchange, the
 * fold at rank 0) fires the rule at its last one, and the next operation does not again. */
static void allreduce_rule_fires_after_k_or_at_the_last_point(void **state) {
  (void)state;
  keel_fault_plan *plan = NULL;
  assert_int_equal(keel_fault_plan_create("delay@point=allreduce,after=3,ms=1;"
                                          "delay@point=allreduce,step=2,after=6,ms=1",
                                          0, &plan),
                   KEEL_OK);
  fired_log log = {0};
  keel_fault_plan_set_reporter(plan, note_fired, &log);
  keel_fault_plan_set_step(plan, 1);
  keel_fault_plan_fire(plan, "allreduce", 1);
  keel_fault_plan_fire(plan, "allreduce", 2);
  assert_int_equal(log.count, 0);
  keel_fault_plan_fire(plan, "allreduce", 3);
  assert_int_equal(log.count, 1); /* the first rule, at its third point */
  keel_fault_plan_fire_last(plan, "allreduce", 1);
  assert_int_equal(log.count, 1); /* the second is for step 2 */
  keel_fault_plan_set_step(plan, 2);
  keel_fault_plan_fire(plan, "allreduce", 1);
  assert_int_equal(log.count, 1);
  keel_fault_plan_fire_last(plan, "allreduce", 2);
  assert_int_equal(log.count, 2); /* two points, fewer than 6: at the last */
  assert_string_equal(log.last, "delay@allreduce:2");
  keel_fault_plan_fire_last(plan, "allreduce", 1);
  assert_int_equal(log.count, 2); /* once */
  keel_fault_plan_destroy(plan);
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
  assert_string_equal(keel_comm_transport(world), "self");
  float send[3] = {1, 2, 3}, recv[3] = {0};
  /* Step collectives need a step. */
  assert_int_equal(keel_step_allreduce(ctx, send, recv, 3, KEEL_F32, KEEL_AVG), KEEL_EINVAL);
  assert_int_equal(keel_step_begin(ctx, 0), KEEL_OK);
  keel_recovery recovery;
  assert_int_equal(keel_allreduce_resilient(ctx, send, recv, 3, KEEL_F32, KEEL_AVG, &recovery),
                   KEEL_OK);
  assert_memory_equal(send, recv, sizeof send);
  assert_false(recovery.recovered);
  assert_int_equal(keel_allreduce_resilient(ctx, send, send, 3, KEEL_F32, KEEL_SUM, NULL),
                   KEEL_EINVAL);
  assert_int_equal(keel_step_commit(ctx), KEEL_OK);
  assert_int_equal(keel_step_commit(ctx), KEEL_EINVAL); /* no step open */
  assert_int_equal(keel_comm_barrier(world), KEEL_OK);
  assert_int_equal(keel_start(ctx), KEEL_OK);
  uint64_t step = 99;
  assert_true(keel_current_step(ctx, &step));
  assert_int_equal(step, 0);
  keel_finalize(ctx);
}

static void exit_codes_follow_statuses(void **state) {
  (void)state;
  assert_int_equal(keel_exit_code(KEEL_OK), 0);
  assert_int_equal(keel_exit_code(KEEL_EJOBDONE), 0);
  assert_int_equal(keel_exit_code(KEEL_EEXCLUDED), 0);
  assert_int_equal(keel_exit_code(KEEL_ERESTART), KEEL_EXIT_RESTART);
  assert_int_equal(keel_exit_code(KEEL_EORPHANED), KEEL_EXIT_ORPHANED);
  assert_int_equal(keel_exit_code(KEEL_ESTOPPED), KEEL_EXIT_STOPPED);
  assert_int_equal(keel_exit_code(KEEL_EPROCFAILED), 1);
}

/* ---- linking to a peer the job declared dead */

/* uid 0 "listens" on a port nobody opens: a connection to it is refused, again and again. */
static char closed_address[64];

static keel_status closed_port_address(void *context, uint32_t uid, char *address,
                                       size_t capacity) {
  (void)context, (void)uid;
  snprintf(address, capacity, "%s", closed_address);
  return KEEL_OK;
}

static void suspect_nobody(void *context, uint32_t uid, const char *reason) {
  (void)context, (void)uid, (void)reason;
}

static keel_status never_interrupted(void *context) {
  (void)context;
  return KEEL_OK;
}

/* A membership whose addresses come from address_of; nobody is suspected or interrupted. */
#define MEMBERSHIP_OF(address_of) \
  { .address = (address_of), .suspect = suspect_nobody, .interrupted = never_interrupted }

static const keel_membership_ops closed_port_membership = MEMBERSHIP_OF(closed_port_address);

/* A fresh job's auth, an embedded store server for it, and a client of it. */
static void store_start(keel_auth *auth, keel_store_server **server_p, keel_store **store_p) {
  assert_int_equal(keel_auth_generate(auth), KEEL_OK);
  assert_int_equal(keel_store_server_start("127.0.0.1:0", auth, server_p), KEEL_OK);
  assert_int_equal(keel_store_connect(keel_store_server_address(*server_p), auth,
                                      keel_deadline_after_ns(5000000000), store_p),
                   KEEL_OK);
}

/* An endpoint of uid on store, failures detected, addresses from membership. */
static keel_endpoint *endpoint_start(uint32_t uid, const keel_auth *auth, keel_store *store,
                                     const keel_membership_ops *membership) {
  keel_endpoint_config config = {.uid = uid,
                                 .auth = *auth,
                                 .store = store,
                                 .failure_detection = true,
                                 .membership = membership};
  keel_endpoint *endpoint = NULL;
  assert_int_equal(keel_endpoint_create(&config, &endpoint), KEEL_OK);
  return endpoint;
}

/* A dead peer's address is gone with it. */
static keel_status no_address(void *context, uint32_t uid, char *address, size_t capacity) {
  (void)context, (void)uid, (void)address, (void)capacity;
  return KEEL_ENOTFOUND;
}

static const keel_membership_ops no_address_membership = MEMBERSHIP_OF(no_address);

/* uid 1's endpoint on a fresh store with the given membership; a thread declares dead_uid
 * dead 200 ms after the start, or it is declared before the start (and the endpoint takes
 * the news in at once, before it knows of that peer) when `before` is set. */
typedef struct declared_death {
  keel_store_server *server;
  keel_store *store;
  keel_endpoint *endpoint;
  uint32_t dead_uid;
  bool before;
  pthread_t declarer;
  int64_t started_ns;
} declared_death;

static void *declare_dead_later(void *argument) {
  const declared_death *death = argument;
  struct timespec pause = {0, 200 * 1000 * 1000};
  nanosleep(&pause, NULL);
  keel_endpoint_declare_dead(death->endpoint, death->dead_uid);
  return NULL;
}

static void declared_death_start(declared_death *death, uint32_t dead_uid,
                                 const keel_membership_ops *membership, bool before) {
  *death = (declared_death){.dead_uid = dead_uid, .before = before};
  keel_auth auth;
  store_start(&auth, &death->server, &death->store);
  death->endpoint = endpoint_start(1, &auth, death->store, membership);
  if (before) {
    keel_endpoint_declare_dead(death->endpoint, dead_uid);
    /* A world of one: making it takes in the endpoint's news, this death among them. */
    static const uint32_t alone[] = {1};
    keel_comm *comm = NULL;
    assert_int_equal(
        keel_comm_create(death->endpoint, 1, alone, 1, keel_deadline_after_ns(1000000000), &comm),
        KEEL_OK);
  } else {
    assert_int_equal(pthread_create(&death->declarer, NULL, declare_dead_later, death), 0);
  }
  death->started_ns = keel_now_ns();
}

/* Joins the declarer and closes everything; the milliseconds since the start. */
static int64_t declared_death_finish(declared_death *death) {
  int64_t waited_ms = (keel_now_ns() - death->started_ns) / 1000000;
  if (!death->before) pthread_join(death->declarer, NULL);
  keel_endpoint_close(death->endpoint, 0);
  keel_store_close(death->store);
  keel_store_server_stop(death->server);
  return waited_ms;
}

/* Links uid 1 to uid 0 with a 10 s deadline while the job declares 0 dead (before, or
 * 200 ms in): it must fail as a dead peer, well before the deadline; the milliseconds it
 * took. */
/* A port that was just closed: connections to it are refused. */
static void closed_address_make(void) {
  keel_listener *listener = NULL;
  assert_int_equal(keel_listener_open("127.0.0.1:0", &listener), KEEL_OK);
  snprintf(closed_address, sizeof closed_address, "%s", keel_listener_address(listener));
  keel_listener_close(listener);
}

static int64_t link_to_declared_dead(const keel_membership_ops *membership, bool before) {
  declared_death death;
  declared_death_start(&death, 0, membership, before);
  keel_status status = keel_endpoint_link(death.endpoint, 0, keel_deadline_after_ns(10000000000));
  int64_t waited_ms = declared_death_finish(&death);
  assert_int_equal(status, KEEL_EPROCFAILED);
  assert_true(waited_ms < 5000);
  return waited_ms;
}

/* A link to a peer whose port refuses is retried until the deadline (it may not listen yet),
 * but not once the job declares the peer dead: then it fails at once, as a dead peer. */
static void link_to_a_peer_declared_dead_gives_up(void **state) {
  (void)state;
  closed_address_make();
  /* It was refused and retried until the declaration, then stopped: not at the deadline. */
  assert_true(link_to_declared_dead(&closed_port_membership, false) >= 150);
}

/* A peer whose address is not published may be starting, so it is looked up again until
 * the deadline; a dead one's address is gone for good: the declaration ends the wait. */
static void link_to_a_dead_peer_without_an_address_gives_up(void **state) {
  (void)state;
  assert_true(link_to_declared_dead(&no_address_membership, false) >= 150);
}

/* Uid 1 makes an epoch with uid 5 (which links to it), declared dead before or 200 ms in:
 * the epoch must fail as with a dead member, well before its 10 s deadline; the
 * milliseconds it took. */
static int64_t epoch_with_declared_dead(bool before) {
  declared_death death;
  declared_death_start(&death, 5, &closed_port_membership, before);
  static const uint32_t members[] = {1, 5};
  keel_comm *comm = NULL;
  keel_status status =
      keel_comm_create(death.endpoint, 2, members, 2, keel_deadline_after_ns(10000000000), &comm);
  int64_t waited_ms = declared_death_finish(&death);
  assert_int_equal(status, KEEL_EPROCFAILED);
  assert_true(waited_ms < 5000);
  return waited_ms;
}

/* The job's verdict came before this process knew of the peer (it had never linked to it)
 * and was taken in then: it still holds when a later decision names the peer, whether this
 * process links to it (a lower uid) or waits for it (a higher one). Found by keel chaos: a
 * spare killed with its node as a decision named it held the job for 25 s. */
static void link_to_a_peer_declared_dead_before_it_was_named_gives_up(void **state) {
  (void)state;
  closed_address_make();
  link_to_declared_dead(&closed_port_membership, true);
  epoch_with_declared_dead(true);
}

/* A new epoch's member of a higher uid links to this one; one that never will (the job
 * declared it dead while the decision naming it was made: a spare on a node cut off) fails
 * the epoch at once, not at the deadline, which would hold every member's next agreement
 * up for as long. */
static void epoch_with_a_member_declared_dead_fails_at_once(void **state) {
  (void)state;
  assert_true(epoch_with_declared_dead(false) >= 150);
}

/* Every uid listens at the hub's address: the spokes link to the hub (uid 0). */
static char hub_address[128];

static keel_status hub_address_of(void *context, uint32_t uid, char *address, size_t capacity) {
  (void)context, (void)uid;
  snprintf(address, capacity, "%s", hub_address);
  return KEEL_OK;
}

static const keel_membership_ops hub_membership = MEMBERSHIP_OF(hub_address_of);

#define SPOKES 20
#define HUB_ROOM 16 /* links the hub's poll list holds before it first grows */

/* Drives the hub until it has taken in count links. */
static void hub_takes_in(keel_endpoint *hub, size_t count) {
  int64_t deadline = keel_deadline_after_ns(5000000000);
  while (hub->linked_count < count && keel_now_ns() < deadline)
    keel__progress(hub, keel_deadline_after_ns(50000000));
  assert_int_equal(hub->linked_count, count);
}

/* One turn of the progress loop takes in waiting links while links already polled have
 * news (here: their peers closed). Taking the links in grows the poll list past its room,
 * which moves it; the turn must not read the old list afterwards (a job whose spare nodes
 * came back crashed there, SIGSEGV; ASan calls it a use after free). */
static void links_taken_in_while_others_have_news(void **state) {
  (void)state;
  keel_auth auth;
  keel_store_server *server = NULL;
  keel_store *store = NULL;
  store_start(&auth, &server, &store);
  keel_endpoint *hub = NULL, *spokes[SPOKES] = {0};
  for (uint32_t uid = 0; uid <= SPOKES; uid++) {
    keel_endpoint *endpoint = endpoint_start(uid, &auth, store, &hub_membership);
    if (uid > 0) {
      spokes[uid - 1] = endpoint;
      continue;
    }
    hub = endpoint;
    snprintf(hub_address, sizeof hub_address, "%s", keel_endpoint_address(hub));
  }
  int64_t deadline = keel_deadline_after_ns(5000000000);
  for (int i = 0; i < HUB_ROOM; i++)
    assert_int_equal(keel_endpoint_link(spokes[i], 0, deadline), KEEL_OK);
  hub_takes_in(hub, HUB_ROOM);
  /* At once: links waiting to be taken in, and polled links whose peers closed. */
  for (int i = HUB_ROOM; i < SPOKES; i++)
    assert_int_equal(keel_endpoint_link(spokes[i], 0, deadline), KEEL_OK);
  for (int i = 0; i < HUB_ROOM / 2; i++) {
    keel_endpoint_close(spokes[i], 0);
    spokes[i] = NULL;
  }
  struct timespec pause = {0, 100 * 1000 * 1000};
  nanosleep(&pause, NULL);
  hub_takes_in(hub, SPOKES);
  /* The closed ones were seen to fail, in the same turn or the next. */
  for (int turn = 0; turn < 20 && !keel__peer_find(hub, HUB_ROOM / 2)->failed; turn++)
    keel__progress(hub, keel_deadline_after_ns(50000000));
  for (uint32_t uid = 1; uid <= HUB_ROOM / 2; uid++) assert_true(keel__peer_find(hub, uid)->failed);
  for (uint32_t uid = HUB_ROOM / 2 + 1; uid <= SPOKES; uid++)
    assert_false(keel__peer_find(hub, uid)->failed);
  for (int i = 0; i < SPOKES; i++) keel_endpoint_close(spokes[i], 0);
  keel_endpoint_close(hub, 0);
  keel_store_close(store);
  keel_store_server_stop(server);
}

/* ---- a member that finds another dead still links the rest */

/* Four members, each at its own address: 0 lives, 1 (a joiner) linked to it earlier, 2 (a
 * survivor) was told 0 died, 3 comes late. */
#define MEMBERS 4
static char member_addresses[MEMBERS][128];
static const uint32_t member_uids[MEMBERS] = {0, 1, 2, 3};

static keel_status member_address_of(void *context, uint32_t uid, char *address, size_t capacity) {
  (void)context;
  if (uid >= MEMBERS || member_addresses[uid][0] == '\0') return KEEL_ENOTFOUND;
  snprintf(address, capacity, "%s", member_addresses[uid]);
  return KEEL_OK;
}

static const keel_membership_ops member_membership = MEMBERSHIP_OF(member_address_of);

/* A member's part in its thread: the new epoch, then the state uid 2 was to send it. */
typedef struct member_run {
  keel_endpoint *endpoint;
  pthread_t thread;
  keel_status created, received;
  int64_t took_ms;
  atomic_bool done;
} member_run;

static void *member_main(void *argument) {
  member_run *run = argument;
  int64_t started = keel_now_ns();
  keel_comm *comm = NULL;
  run->created = keel_comm_create(run->endpoint, 2, member_uids, MEMBERS,
                                  keel_deadline_after_ns(10000000000), &comm);
  run->received = run->created;
  if (run->created == KEEL_OK) {
    uint8_t state = 0;
    keel_request *request = NULL;
    run->received = keel_comm_irecv(comm, 2, 1, &state, 1, &request);
    if (run->received == KEEL_OK)
      run->received = keel_request_wait(request, keel_deadline_after_ns(10000000000));
    keel_request_free(request);
  }
  run->took_ms = (keel_now_ns() - started) / 1000000;
  atomic_store(&run->done, true);
  return NULL;
}

/* The member's epoch ended as revoked, well before its 10 s deadline. */
static void expect_revoked_soon(const member_run *run, const char *who) {
  if (run->received != KEEL_EREVOKED || run->took_ms >= 5000)
    fail_msg("the %s's epoch ended with %s (creating it: %s) after %lld ms", who,
             keel_status_name(run->received), keel_status_name(run->created),
             (long long)run->took_ms);
}

/* Finding 24 (RELIABILITY.md). A decision named a joiner (uid 1) and a member the survivor
 * (uid 2) knew dead (uid 0). The survivor failed on uid 0 and left the epoch before it
 * linked the joiner, so its revocation (links only) never reached it: the joiner waited for
 * the survivor's link until the deadline (30 s in the soak), and every member's next
 * agreement with it. The survivor must link the rest all the same, and a member that links
 * to it after it revoked the epoch (uid 3) must hear the revocation too. */
static void member_that_finds_another_dead_still_links_the_rest(void **state) {
  (void)state;
  keel_auth auth;
  keel_store_server *server = NULL;
  keel_store *store = NULL;
  store_start(&auth, &server, &store);
  keel_endpoint *endpoints[MEMBERS] = {0};
  for (uint32_t uid = 0; uid < MEMBERS; uid++) {
    endpoints[uid] = endpoint_start(uid, &auth, store, &member_membership);
    snprintf(member_addresses[uid], sizeof member_addresses[uid], "%s",
             keel_endpoint_address(endpoints[uid]));
  }
  assert_int_equal(keel_endpoint_link(endpoints[1], 0, keel_deadline_after_ns(5000000000)),
                   KEEL_OK);
  keel_endpoint_declare_dead(endpoints[2], 0);
  member_run joiner = {.endpoint = endpoints[1]}, late = {.endpoint = endpoints[3]};
  atomic_init(&joiner.done, false);
  atomic_init(&late.done, false);
  assert_int_equal(pthread_create(&joiner.thread, NULL, member_main, &joiner), 0);
  keel_comm *comm = NULL;
  keel_status status = keel_comm_create(endpoints[2], 2, member_uids, MEMBERS,
                                        keel_deadline_after_ns(10000000000), &comm);
  assert_int_equal(status, KEEL_EPROCFAILED);
  /* What the survivor's next recovery round does first; then it waits on the store for the
   * next agreement, its links moving meanwhile. */
  keel_comm_revoke(comm);
  assert_int_equal(pthread_create(&late.thread, NULL, member_main, &late), 0);
  int64_t deadline = keel_deadline_after_ns(15000000000);
  while (!(atomic_load(&joiner.done) && atomic_load(&late.done)) && keel_now_ns() < deadline)
    keel__progress(endpoints[2], keel_deadline_after_ns(50000000));
  pthread_join(joiner.thread, NULL);
  pthread_join(late.thread, NULL);
  for (uint32_t uid = 0; uid < MEMBERS; uid++) keel_endpoint_close(endpoints[uid], 0);
  keel_store_close(store);
  keel_store_server_stop(server);
  expect_revoked_soon(&joiner, "joiner");
  expect_revoked_soon(&late, "late member");
}

/* ---- an agreement that waits for a spare keeps its round */

/* Three members at their own addresses; uid 2 dies once the epoch is made (the detector's
 * view: `spare_dead`), and a suspicion of a live member is counted. */
#define SPARE_MEMBERS 3
static char spare_member_addresses[SPARE_MEMBERS][128];
static const uint32_t spare_member_uids[SPARE_MEMBERS] = {0, 1, 2};
static atomic_bool spare_dead;
static atomic_int spare_suspicions;

static keel_status spare_member_address(void *context, uint32_t uid, char *address,
                                        size_t capacity) {
  (void)context;
  if (uid >= SPARE_MEMBERS || spare_member_addresses[uid][0] == '\0') return KEEL_ENOTFOUND;
  snprintf(address, capacity, "%s", spare_member_addresses[uid]);
  return KEEL_OK;
}

static bool spare_member_dead(void *context, uint32_t uid) {
  (void)context;
  return uid == 2 && atomic_load(&spare_dead);
}

/* Suspicions of the live members only: uid 2's broken links are suspected too, rightly. */
static void spare_member_suspect(void *context, uint32_t uid, const char *reason) {
  (void)context, (void)reason;
  if (uid != 2) atomic_fetch_add(&spare_suspicions, 1);
}

static const keel_membership_ops spare_membership = {.address = spare_member_address,
                                                     .suspect = spare_member_suspect,
                                                     .dead = spare_member_dead,
                                                     .interrupted = never_interrupted};

typedef struct spare_member {
  keel_store *store; /* its own client, as a process has: a store wait holds its client */
  keel_endpoint *endpoint;
  keel_comm *comm;
  int64_t timeout_ns;
  pthread_t thread;
  keel_status status;
  keel_decision decision;
} spare_member;

static void *spare_member_create(void *argument) {
  spare_member *member = argument;
  member->status = keel_comm_create(member->endpoint, 3, spare_member_uids, SPARE_MEMBERS,
                                    keel_deadline_after_ns(10000000000), &member->comm);
  return NULL;
}

static void *spare_member_decide(void *argument) {
  spare_member *member = argument;
  keel_comm_set_timeout(member->comm, member->timeout_ns);
  keel_rebuild_vote vote = {.rebuild = true, .admit_spares = true};
  member->status = keel_comm_decide(member->comm, &vote, &member->decision);
  return NULL;
}

/* Finding 32 (RELIABILITY.md). uid 2 died and the survivors' agreement waited for a spare
 * that took longer to start than two of a member's deadlines (a Python spare imports torch).
 * The member with the shorter deadline gave the round up, began the next, and suspected the
 * other, still waiting in time in the first: a live process fenced. A round whose members
 * have all voted and that waits only for a spare must wait as long as the decision does:
 * here deadlines of 150 and 400 ms, a spare registered 1.2 s in, and one decision in the
 * first round, with uid 3 in uid 2's place, nobody suspected. */
static void agreement_waiting_for_a_spare_keeps_its_round(void **state) {
  (void)state;
  keel_auth auth;
  keel_store_server *server = NULL;
  keel_store *store = NULL;
  store_start(&auth, &server, &store);
  atomic_store(&spare_dead, false);
  atomic_store(&spare_suspicions, 0);
  spare_member members[SPARE_MEMBERS] = {{.timeout_ns = 150000000}, {.timeout_ns = 400000000}};
  for (uint32_t uid = 0; uid < SPARE_MEMBERS; uid++) {
    assert_int_equal(keel_store_connect(keel_store_server_address(server), &auth,
                                        keel_deadline_after_ns(5000000000), &members[uid].store),
                     KEEL_OK);
    keel_endpoint_config config = {.uid = uid,
                                   .auth = auth,
                                   .store = members[uid].store,
                                   .failure_detection = true,
                                   .spare_wait_ns = 5000000000,
                                   .membership = &spare_membership};
    assert_int_equal(keel_endpoint_create(&config, &members[uid].endpoint), KEEL_OK);
    snprintf(spare_member_addresses[uid], sizeof spare_member_addresses[uid], "%s",
             keel_endpoint_address(members[uid].endpoint));
  }
  for (int i = 0; i < SPARE_MEMBERS; i++)
    assert_int_equal(pthread_create(&members[i].thread, NULL, spare_member_create, &members[i]), 0);
  for (int i = 0; i < SPARE_MEMBERS; i++) {
    pthread_join(members[i].thread, NULL);
    assert_int_equal(members[i].status, KEEL_OK);
  }
  keel_endpoint_close(members[2].endpoint, 0);
  atomic_store(&spare_dead, true);
  int64_t started = keel_now_ns();
  for (int i = 0; i < 2; i++)
    assert_int_equal(pthread_create(&members[i].thread, NULL, spare_member_decide, &members[i]), 0);
  struct timespec pause = {1, 200 * 1000 * 1000};
  nanosleep(&pause, NULL);
  assert_int_equal(keel_store_put(store, "spare/3", "ready", 5, 0, NULL), KEEL_OK);
  for (int i = 0; i < 2; i++) pthread_join(members[i].thread, NULL);
  int64_t took_ms = (keel_now_ns() - started) / 1000000;
  for (int i = 0; i < 2; i++) {
    if (members[i].status != KEEL_OK)
      fail_msg("uid %d's agreement ended with %s after %lld ms", i,
               keel_status_name(members[i].status), (long long)took_ms);
    assert_int_equal(members[i].decision.round, 0);
    assert_int_equal(members[i].decision.member_count, 3);
    assert_int_equal(members[i].decision.members[2], 3);
  }
  assert_int_equal(atomic_load(&spare_suspicions), 0);
  assert_true(took_ms >= 1200 && took_ms < 5000);
  for (int i = 0; i < 2; i++) keel_endpoint_close(members[i].endpoint, 0);
  for (int i = 0; i < SPARE_MEMBERS; i++) keel_store_close(members[i].store);
  keel_store_close(store);
  keel_store_server_stop(server);
}

/* Finding 38: a spare that started during an etcd election left with its offer's first
 * failure. A store that comes back on the same address breaks the client's link: the first
 * put after it fails (KEEL_ECLOSED), and the offer, the same put each time, is sent again. */
static void offer_survives_a_store_restart(void **unused) {
  (void)unused;
  keel_auth auth;
  keel_store_server *server = NULL;
  keel_store *store = NULL;
  store_start(&auth, &server, &store);
  keel_endpoint *endpoint = endpoint_start(5, &auth, store, &no_address_membership);
  char address[64];
  snprintf(address, sizeof address, "%s", keel_store_server_address(server));
  keel_store_server_stop(server);
  assert_int_equal(keel_store_server_start(address, &auth, &server), KEEL_OK);
  uint64_t reconnects = keel_store_reconnects(store);
  assert_int_equal(keel_endpoint_offer(endpoint, KEEL_OFFER_SPARE), KEEL_OK);
  /* The link really broke, and the offer is in the new server's keys. */
  assert_true(keel_store_reconnects(store) > reconnects);
  keel_store_entry *entries = NULL;
  size_t count = 0;
  assert_int_equal(keel_store_list(store, "spare/", &entries, &count, NULL), KEEL_OK);
  assert_int_equal(count, 1);
  assert_string_equal(entries[0].key, "spare/5");
  keel_store_entries_free(entries, count);
  keel_endpoint_close(endpoint, 0);
  keel_store_close(store);
  keel_store_server_stop(server);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(kernels_match_reference),
      cmocka_unit_test(divide_rounds_toward_zero_for_integers),
      cmocka_unit_test(bf16_rounds_to_nearest_even),
      cmocka_unit_test(decision_round_trip),
      cmocka_unit_test(decision_with_nobody_failed),
      cmocka_unit_test(damaged_decisions_are_refused),
      cmocka_unit_test(votes_round_trip_and_refuse_damage),
      cmocka_unit_test(decide_every_order_of_votes_and_deaths),
      cmocka_unit_test(decide_replaces_waits_for_spares_and_grows),
      cmocka_unit_test(decide_fails_a_dead_members_whole_node),
      cmocka_unit_test(decide_refills_a_shrunk_replace_world),
      cmocka_unit_test(fault_rules_parse),
      cmocka_unit_test(delay_rule_fires_once_at_its_point),
      cmocka_unit_test(allreduce_rule_fires_after_k_or_at_the_last_point),
      cmocka_unit_test(standalone_world_of_one),
      cmocka_unit_test(exit_codes_follow_statuses),
      cmocka_unit_test(link_to_a_peer_declared_dead_gives_up),
      cmocka_unit_test(link_to_a_dead_peer_without_an_address_gives_up),
      cmocka_unit_test(link_to_a_peer_declared_dead_before_it_was_named_gives_up),
      cmocka_unit_test(links_taken_in_while_others_have_news),
      cmocka_unit_test(epoch_with_a_member_declared_dead_fails_at_once),
      cmocka_unit_test(member_that_finds_another_dead_still_links_the_rest),
      cmocka_unit_test(agreement_waiting_for_a_spare_keeps_its_round),
      cmocka_unit_test(offer_survives_a_store_restart),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
