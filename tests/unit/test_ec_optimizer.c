/* Unit tests of the ec layer's per-row optimizers: each against a plain reference written here
 * (separate float arrays, the formulas of keel/ec.h, the layout encoded by hand), bit for
 * bit; the delta against old XOR new; parity kept by deltas against re-encoding and decoding;
 * Adam's per-row step count; closed-form values; the layout's sizes; bad arguments. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "keel/ec.h"

/* The reference must round like the code under test (see src/ec/optimizer.c). */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

#define COUNT(array) (sizeof(array) / sizeof((array)[0]))

static const int dims[] = {1, 3, 64, 1000};

/* ---- the optimizers under test, one named case each */

typedef struct optimizer_case {
  const char *name;
  keel_ec_optimizer optimizer;
} optimizer_case;

static const optimizer_case cases[] = {
    {"sgd", {.kind = KEEL_EC_SGD, .learning_rate = 0.05f}},
    {"momentum 0.9", {.kind = KEEL_EC_MOMENTUM, .learning_rate = 0.01f, .momentum = 0.9f}},
    {"momentum 0", {.kind = KEEL_EC_MOMENTUM, .learning_rate = 0.3f, .momentum = 0.0f}},
    {"adagrad", {.kind = KEEL_EC_ADAGRAD, .learning_rate = 0.1f, .epsilon = 1e-10f}},
    {"adagrad accumulator 0.1",
     {.kind = KEEL_EC_ADAGRAD,
      .learning_rate = 0.01f,
      .epsilon = 1e-6f,
      .initial_accumulator = 0.1f}},
    {"adam",
     {.kind = KEEL_EC_ADAM,
      .learning_rate = 1e-3f,
      .beta1 = 0.9f,
      .beta2 = 0.999f,
      .epsilon = 1e-8f}},
    {"adam beta1 0 beta2 0.5",
     {.kind = KEEL_EC_ADAM,
      .learning_rate = 0.02f,
      .beta1 = 0.0f,
      .beta2 = 0.5f,
      .epsilon = 1e-4f}},
};

/* Values over many scales, exact zeros and negative zeros among them. */
static float random_value(keel_random *random) {
  uint64_t draw = keel_random_next(random);
  if (draw % 16 == 0) return (draw >> 4) % 2 == 0 ? 0.0f : -0.0f;
  float unit = (float)((int32_t)(draw >> 32)) / 2147483648.0f; /* [-1, 1) */
  return ldexpf(unit, (int)((draw >> 8) % 20) - 14);
}

static void fill_values(keel_random *random, float *values, int count) {
  for (int i = 0; i < count; i++) values[i] = random_value(random);
}

static size_t bytes_of(const keel_ec_optimizer *optimizer, int dim) {
  size_t bytes = 0;
  assert_int_equal(keel_ec_row_block_bytes(optimizer, dim, &bytes), KEEL_OK);
  return bytes;
}

/* ---- the reference: the row and its state as plain arrays */

typedef struct reference {
  int dim;
  float *parameters, *state, *second; /* velocity or accumulator, or Adam's m and v */
  uint64_t steps;
} reference;

static void reference_make(reference *ref, const keel_ec_optimizer *optimizer, int dim,
                           const float *parameters) {
  ref->dim = dim;
  ref->parameters = malloc((size_t)dim * sizeof(float));
  ref->state = calloc((size_t)dim, sizeof(float));
  ref->second = calloc((size_t)dim, sizeof(float));
  assert_true(ref->parameters && ref->state && ref->second);
  memcpy(ref->parameters, parameters, (size_t)dim * sizeof(float));
  if (optimizer->kind == KEEL_EC_ADAGRAD) {
    for (int i = 0; i < dim; i++) ref->state[i] = optimizer->initial_accumulator;
  }
  ref->steps = 0;
}

static void reference_free(reference *ref) {
  free(ref->second);
  free(ref->state);
  free(ref->parameters);
}

/* x^t by squaring from the lowest bit, as keel/ec.h defines it (written recursively here). */
static float reference_power(float x, uint64_t t, float accumulated) {
  if (t == 0) return accumulated;
  return reference_power(x * x, t / 2, t % 2 == 1 ? accumulated * x : accumulated);
}

static void reference_adam(const keel_ec_optimizer *o, reference *ref, const float *g) {
  if (ref->steps != UINT64_MAX) ref->steps += 1;
  float step = o->learning_rate / (1.0f - reference_power(o->beta1, ref->steps, 1.0f));
  float root = sqrtf(1.0f - reference_power(o->beta2, ref->steps, 1.0f));
  for (int i = 0; i < ref->dim; i++) {
    float *m = &ref->state[i], *v = &ref->second[i];
    *m = o->beta1 * *m + (1.0f - o->beta1) * g[i];
    *v = o->beta2 * *v + (1.0f - o->beta2) * g[i] * g[i];
    ref->parameters[i] -= step * *m / (sqrtf(*v) / root + o->epsilon);
  }
}

static void reference_step(const keel_ec_optimizer *o, reference *ref, const float *g) {
  float *p = ref->parameters, *s = ref->state;
  switch (o->kind) {
    case KEEL_EC_SGD:
      for (int i = 0; i < ref->dim; i++) p[i] -= o->learning_rate * g[i];
      break;
    case KEEL_EC_MOMENTUM:
      for (int i = 0; i < ref->dim; i++) {
        s[i] = o->momentum * s[i] + g[i];
        p[i] -= o->learning_rate * s[i];
      }
      break;
    case KEEL_EC_ADAGRAD:
      for (int i = 0; i < ref->dim; i++) {
        s[i] += g[i] * g[i];
        p[i] -= o->learning_rate * g[i] / (sqrtf(s[i]) + o->epsilon);
      }
      break;
    case KEEL_EC_ADAM:
      reference_adam(o, ref, g);
      break;
  }
}

static void put_floats(uint8_t *at, const float *values, int count) {
  for (int i = 0; i < count; i++) {
    uint32_t bits;
    memcpy(&bits, &values[i], sizeof bits);
    keel_put_le32(at + 4 * (size_t)i, bits);
  }
}

/* The block keel/ec.h's layout makes of the reference, encoded by hand: parameters, the
 * state vectors, zero padding, Adam's step count in the last 8 bytes. */
static void reference_block(const keel_ec_optimizer *optimizer, const reference *ref, size_t bytes,
                            uint8_t *block) {
  size_t vector = 4 * (size_t)ref->dim;
  memset(block, 0, bytes);
  put_floats(block, ref->parameters, ref->dim);
  if (optimizer->kind != KEEL_EC_SGD) put_floats(block + vector, ref->state, ref->dim);
  if (optimizer->kind == KEEL_EC_ADAM) {
    put_floats(block + 2 * vector, ref->second, ref->dim);
    keel_put_le64(block + bytes - 8, ref->steps);
  }
}

/* ---- the same checks for each case: the table is built in main */

typedef void (*dim_check)(const keel_ec_optimizer *optimizer, int dim, size_t bytes,
                          keel_random *random);

/* Runs check with the case's optimizer (the test's state) at every dim, all drawing from one
 * stream seeded once. */
static void for_each_dim(void **state, uint64_t seed, dim_check check) {
  const keel_ec_optimizer *optimizer = &((const optimizer_case *)*state)->optimizer;
  keel_random random;
  keel_random_seed(&random, seed);
  for (size_t d = 0; d < COUNT(dims); d++) {
    check(optimizer, dims[d], bytes_of(optimizer, dims[d]), &random);
  }
}

/* count buffers of bytes each, in one allocation (freed through buffers[0]). */
static void buffers_make(uint8_t **buffers, int count, size_t bytes) {
  uint8_t *base = malloc((size_t)count * bytes);
  assert_non_null(base);
  for (int i = 0; i < count; i++) buffers[i] = base + (size_t)i * bytes;
}

/* Several steps: the block equals the reference's, byte for byte, after each, and the
 * parameters read out equal the reference's. */
static void check_matches_reference(const keel_ec_optimizer *optimizer, int dim, size_t bytes,
                                    keel_random *random) {
  uint8_t *buffer[2], *values_buffer[2];
  buffers_make(buffer, 2, bytes);
  buffers_make(values_buffer, 2, (size_t)dim * sizeof(float));
  uint8_t *block = buffer[0], *expected = buffer[1];
  float *values = (float *)values_buffer[0], *read = (float *)values_buffer[1];
  fill_values(random, values, dim);
  reference ref;
  reference_make(&ref, optimizer, dim, values);
  assert_int_equal(keel_ec_row_init(optimizer, dim, values, block), KEEL_OK);
  for (int step = 0; step <= 12; step++) {
    if (step > 0) {
      fill_values(random, values, dim);
      reference_step(optimizer, &ref, values);
      assert_int_equal(keel_ec_row_apply(optimizer, dim, block, values, NULL), KEEL_OK);
    }
    reference_block(optimizer, &ref, bytes, expected);
    assert_memory_equal(block, expected, bytes);
    assert_int_equal(keel_ec_row_read(dim, block, read), KEEL_OK);
    assert_memory_equal(read, ref.parameters, (size_t)dim * sizeof(float));
  }
  reference_free(&ref);
  free(values_buffer[0]);
  free(buffer[0]);
}

static void test_matches_reference(void **state) {
  for_each_dim(state, 0x0b71, check_matches_reference);
}

/* The delta (into a buffer full of garbage) is old XOR new over the whole block, and the
 * block comes out the same with and without one. */
static void check_delta_is_old_xor_new(const keel_ec_optimizer *optimizer, int dim, size_t bytes,
                                       keel_random *random) {
  uint8_t *buffer[5];
  buffers_make(buffer, 5, bytes);
  uint8_t *block = buffer[0], *twin = buffer[1], *old = buffer[2], *delta = buffer[3];
  uint8_t *expected = buffer[4];
  float *values = malloc((size_t)dim * sizeof(float));
  assert_non_null(values);
  fill_values(random, values, dim);
  assert_int_equal(keel_ec_row_init(optimizer, dim, values, block), KEEL_OK);
  memcpy(twin, block, bytes);
  for (int step = 0; step < 8; step++) {
    fill_values(random, values, dim);
    memcpy(old, block, bytes);
    memset(delta, 0xA5, bytes);
    assert_int_equal(keel_ec_row_apply(optimizer, dim, block, values, delta), KEEL_OK);
    assert_int_equal(keel_ec_row_apply(optimizer, dim, twin, values, NULL), KEEL_OK);
    assert_memory_equal(block, twin, bytes);
    keel_ec_delta(bytes, old, block, expected);
    assert_memory_equal(delta, expected, bytes);
  }
  free(values);
  free(buffer[0]);
}

static void test_delta_is_old_xor_new(void **state) {
  for_each_dim(state, 0x0b72, check_delta_is_old_xor_new);
}

/* Difference propagation end to end, with an XOR and an RS code: rows of a group updated by
 * the optimizer, each delta folded into the parity (keel_ec_update), give the parity of a
 * fresh encoding; rows lost (as many as the code has parity) decode back to their blocks,
 * state and step count included, and training goes on from them exactly. */
static void check_parity_code(const keel_ec_optimizer *optimizer, int dim, size_t bytes,
                              keel_random *random, keel_ec_kind kind, int k, int r) {
  keel_ec_code *code = NULL;
  assert_int_equal(keel_ec_code_create(k, r, kind, &code), KEEL_OK);
  keel_ec_decoder *decoder = NULL;
  assert_int_equal(keel_ec_decoder_create(code, 0, &decoder), KEEL_OK);
  int n = k + r;
  uint8_t *buffer[17]; /* the group's blocks, a fresh copy of them, a delta */
  assert_true(2 * n + 1 <= (int)COUNT(buffer));
  buffers_make(buffer, 2 * n + 1, bytes);
  uint8_t **blocks = buffer, **fresh = buffer + n, *delta = buffer[2 * n];
  float *values = malloc((size_t)dim * sizeof(float));
  assert_non_null(values);
  for (int i = 0; i < k; i++) {
    fill_values(random, values, dim);
    assert_int_equal(keel_ec_row_init(optimizer, dim, values, blocks[i]), KEEL_OK);
  }
  assert_int_equal(keel_ec_encode(code, bytes, (const uint8_t *const *)blocks, blocks + k),
                   KEEL_OK);
  for (int update = 0; update < 24; update++) {
    int row = (int)keel_random_below(random, (uint64_t)k);
    fill_values(random, values, dim);
    assert_int_equal(keel_ec_row_apply(optimizer, dim, blocks[row], values, delta), KEEL_OK);
    assert_int_equal(keel_ec_update(code, row, bytes, delta, blocks + k), KEEL_OK);
  }
  for (int i = 0; i < k; i++) memcpy(fresh[i], blocks[i], bytes);
  assert_int_equal(keel_ec_encode(code, bytes, (const uint8_t *const *)fresh, fresh + k), KEEL_OK);
  for (int i = k; i < n; i++) assert_memory_equal(blocks[i], fresh[i], bytes);

  bool present[8];
  for (int i = 0; i < n; i++) present[i] = i >= r; /* the first r rows are lost */
  for (int i = 0; i < r; i++) memset(blocks[i], 0x5A, bytes);
  assert_int_equal(keel_ec_decode(decoder, bytes, blocks, present), KEEL_OK);
  fill_values(random, values, dim);
  for (int i = 0; i < r; i++) {
    assert_memory_equal(blocks[i], fresh[i], bytes);
    assert_int_equal(keel_ec_row_apply(optimizer, dim, blocks[i], values, NULL), KEEL_OK);
    assert_int_equal(keel_ec_row_apply(optimizer, dim, fresh[i], values, NULL), KEEL_OK);
    assert_memory_equal(blocks[i], fresh[i], bytes);
  }
  free(values);
  free(buffer[0]);
  keel_ec_decoder_destroy(decoder);
  keel_ec_code_destroy(code);
}

static void check_parity_by_deltas(const keel_ec_optimizer *optimizer, int dim, size_t bytes,
                                   keel_random *random) {
  check_parity_code(optimizer, dim, bytes, random, KEEL_EC_XOR, 3, 1);
  check_parity_code(optimizer, dim, bytes, random, KEEL_EC_RS, 4, 2);
}

static void test_parity_by_deltas(void **state) {
  for_each_dim(state, 0x0b73, check_parity_by_deltas);
}

/* ---- single cases */

/* Lengths and offsets of keel/ec.h's layout. */
static void test_layout_sizes(void **state) {
  (void)state;
  static const int layout_dims[] = {1, 2, 3, 16, 64, 1000, 1 << 24};
  static const struct {
    keel_ec_optimizer_kind kind;
    size_t bytes[COUNT(layout_dims)];
  } expected[] = {
      {KEEL_EC_SGD, {8, 8, 16, 64, 256, 4000, (size_t)4 << 24}},
      {KEEL_EC_MOMENTUM, {8, 16, 24, 128, 512, 8000, (size_t)8 << 24}},
      {KEEL_EC_ADAGRAD, {8, 16, 24, 128, 512, 8000, (size_t)8 << 24}},
      {KEEL_EC_ADAM, {24, 32, 48, 200, 776, 12008, ((size_t)12 << 24) + 8}},
  };
  for (size_t k = 0; k < COUNT(expected); k++) {
    keel_ec_optimizer optimizer;
    assert_int_equal(keel_ec_optimizer_init(expected[k].kind, 0.1f, &optimizer), KEEL_OK);
    for (size_t d = 0; d < COUNT(layout_dims); d++) {
      assert_true(bytes_of(&optimizer, layout_dims[d]) == expected[k].bytes[d]);
    }
  }
  /* Init writes the documented bytes: 1.0f is 00 00 80 3f, Adagrad's accumulator follows
   * the parameters, the rest is zero. Read gives the parameters back bit for bit. */
  keel_ec_optimizer adagrad;
  assert_int_equal(keel_ec_optimizer_init(KEEL_EC_ADAGRAD, 0.1f, &adagrad), KEEL_OK);
  adagrad.initial_accumulator = 2.0f;
  const float parameters[3] = {1.0f, -0.0f, 1e-45f};
  uint8_t block[24];
  memset(block, 0xEE, sizeof block);
  assert_int_equal(keel_ec_row_init(&adagrad, 3, parameters, block), KEEL_OK);
  static const uint8_t expected_block[24] = {0, 0, 0x80, 0x3f, 0, 0, 0, 0x80, 1, 0, 0, 0,
                                             0, 0, 0,    0x40, 0, 0, 0, 0x40, 0, 0, 0, 0x40};
  assert_memory_equal(block, expected_block, sizeof block);
  float read[3];
  assert_int_equal(keel_ec_row_read(3, block, read), KEEL_OK);
  assert_memory_equal(read, parameters, sizeof read);
  /* Adam, dim 1: p, m, v, 4 bytes of padding, then t. */
  keel_ec_optimizer adam;
  assert_int_equal(keel_ec_optimizer_init(KEEL_EC_ADAM, 0.1f, &adam), KEEL_OK);
  uint8_t adam_block[24];
  assert_int_equal(keel_ec_row_init(&adam, 1, parameters, adam_block), KEEL_OK);
  static const uint8_t adam_expected[24] = {0, 0, 0x80, 0x3f};
  assert_memory_equal(adam_block, adam_expected, sizeof adam_block);
  const float gradient[1] = {1.0f};
  assert_int_equal(keel_ec_row_apply(&adam, 1, adam_block, gradient, NULL), KEEL_OK);
  assert_int_equal(adam_block[16], 1);
  for (int i = 12; i < 24; i++) {
    if (i != 16) assert_int_equal(adam_block[i], 0);
  }
}

/* A one-value row of the kind (PyTorch's defaults, learning_rate) from start through the
 * gradients: its parameter after them. */
static float one_value_row(keel_ec_optimizer_kind kind, float learning_rate, float start,
                           const float *gradients, int steps) {
  keel_ec_optimizer optimizer;
  assert_int_equal(keel_ec_optimizer_init(kind, learning_rate, &optimizer), KEEL_OK);
  uint8_t block[24];
  assert_true(bytes_of(&optimizer, 1) <= sizeof block);
  assert_int_equal(keel_ec_row_init(&optimizer, 1, &start, block), KEEL_OK);
  for (int s = 0; s < steps; s++) {
    assert_int_equal(keel_ec_row_apply(&optimizer, 1, block, &gradients[s], NULL), KEEL_OK);
  }
  float parameter;
  assert_int_equal(keel_ec_row_read(1, block, &parameter), KEEL_OK);
  return parameter;
}

/* The formulas against their closed forms, worked in decimal, with a tolerance: a check on
 * the formulas themselves, which the reference shares. */
static void test_closed_forms(void **state) {
  (void)state;
  static const struct {
    const char *what;
    keel_ec_optimizer_kind kind;
    float learning_rate, start, gradients[5];
    int steps;
    double expected, tolerance;
  } forms[] = {
      {"sgd: 1 - 0.1 * 0.5", KEEL_EC_SGD, 0.1f, 1.0f, {0.5f}, 1, 0.95, 1e-6},
      {"momentum 0.9, g = 1 thrice: velocities 1, 1.9, 2.71",
       KEEL_EC_MOMENTUM,
       0.1f,
       0.0f,
       {1, 1, 1},
       3,
       -0.561,
       1e-6},
      {"adagrad, g = 2 twice: 0.1 * 2 / 2 + 0.1 * 2 / sqrt(8)",
       KEEL_EC_ADAGRAD,
       0.1f,
       0.0f,
       {2, 2},
       2,
       -0.170710678118654752,
       1e-6},
      {"adam, g = 1: lr * sign(g)", KEEL_EC_ADAM, 0.001f, 0.0f, {1}, 1, -0.001, 1e-8},
      {"adam, g = 1 then -1: m -0.01 corrected by 0.19, v 0.001999 by 0.001999",
       KEEL_EC_ADAM,
       0.001f,
       0.0f,
       {1, -1},
       2,
       -0.001 + 0.001 * 0.01 / 0.19,
       1e-8},
      {"adam, g constant: lr * sign(g) every step",
       KEEL_EC_ADAM,
       0.001f,
       1.0f,
       {0.3f, 0.3f, 0.3f, 0.3f, 0.3f},
       5,
       0.995,
       1e-6},
  };
  for (size_t f = 0; f < COUNT(forms); f++) {
    float parameter = one_value_row(forms[f].kind, forms[f].learning_rate, forms[f].start,
                                    forms[f].gradients, forms[f].steps);
    if (fabs(parameter - forms[f].expected) >= forms[f].tolerance) {
      fail_msg("%s: %.9g, expected %.9g", forms[f].what, (double)parameter, forms[f].expected);
    }
  }
}

static uint64_t step_count(const uint8_t *block, size_t bytes) {
  return keel_get_le64(block + bytes - 8);
}

/* Adam's t is the row's own: a row first updated after another has had many updates is
 * corrected as at t = 1 (its first step is about lr * sign(g)), whatever the other's count;
 * t stops at UINT64_MAX, where both corrections are 1. */
static void test_adam_per_row_step(void **state) {
  (void)state;
  keel_ec_optimizer adam;
  assert_int_equal(keel_ec_optimizer_init(KEEL_EC_ADAM, 0.01f, &adam), KEEL_OK);
  enum { DIM = 3 };
  size_t bytes = bytes_of(&adam, DIM);
  uint8_t busy[48], late[48], delta[48];
  assert_true(bytes == sizeof busy);
  const float start[DIM] = {0.5f, -0.25f, 2.0f}, gradient[DIM] = {0.3f, -2.0f, 1e-3f};
  assert_int_equal(keel_ec_row_init(&adam, DIM, start, busy), KEEL_OK);
  assert_int_equal(keel_ec_row_init(&adam, DIM, start, late), KEEL_OK);
  for (int step = 0; step < 1000; step++) {
    assert_int_equal(keel_ec_row_apply(&adam, DIM, busy, gradient, NULL), KEEL_OK);
  }
  assert_true(step_count(busy, bytes) == 1000);
  assert_true(step_count(late, bytes) == 0);
  assert_int_equal(keel_ec_row_apply(&adam, DIM, late, gradient, NULL), KEEL_OK);
  assert_true(step_count(late, bytes) == 1 && step_count(busy, bytes) == 1000);
  float p[DIM];
  assert_int_equal(keel_ec_row_read(DIM, late, p), KEEL_OK);
  for (int i = 0; i < DIM; i++) {
    double moved = (double)start[i] - (double)p[i];
    double expected = 0.01 * gradient[i] / (fabs(gradient[i]) + 1e-8);
    assert_true(fabs(moved - expected) < 1e-6);
  }
  /* The reference at t = 1 agrees bit for bit. */
  reference ref;
  reference_make(&ref, &adam, DIM, start);
  reference_step(&adam, &ref, gradient);
  assert_memory_equal(p, ref.parameters, sizeof p);
  reference_free(&ref);

  /* Near the top: t goes to UINT64_MAX and stays there; the step's delta bytes are zero
   * once it has stopped. Bias corrections are 1 there (power(beta, t) is 0). */
  keel_put_le64(late + bytes - 8, UINT64_MAX - 1);
  assert_int_equal(keel_ec_row_apply(&adam, DIM, late, gradient, delta), KEEL_OK);
  assert_true(step_count(late, bytes) == UINT64_MAX);
  assert_true(step_count(delta, bytes) == 1);
  assert_int_equal(keel_ec_row_apply(&adam, DIM, late, gradient, delta), KEEL_OK);
  assert_true(step_count(late, bytes) == UINT64_MAX);
  assert_true(step_count(delta, bytes) == 0);
  assert_int_equal(keel_ec_row_read(DIM, late, p), KEEL_OK);
  for (int i = 0; i < DIM; i++) assert_true(isfinite(p[i]));
}

static void test_optimizer_init(void **state) {
  (void)state;
  keel_ec_optimizer optimizer;
  assert_int_equal(keel_ec_optimizer_init(KEEL_EC_ADAM, 0.001f, &optimizer), KEEL_OK);
  assert_int_equal(optimizer.kind, KEEL_EC_ADAM);
  assert_true(optimizer.learning_rate == 0.001f && optimizer.beta1 == 0.9f &&
              optimizer.beta2 == 0.999f && optimizer.epsilon == 1e-8f);
  assert_int_equal(keel_ec_optimizer_init(KEEL_EC_ADAGRAD, 0.01f, &optimizer), KEEL_OK);
  assert_true(optimizer.epsilon == 1e-10f && optimizer.initial_accumulator == 0.0f);
  assert_int_equal(keel_ec_optimizer_init(KEEL_EC_MOMENTUM, 0.01f, &optimizer), KEEL_OK);
  assert_true(optimizer.momentum == 0.9f);
  assert_int_equal(keel_ec_optimizer_init(KEEL_EC_SGD, 0.0f, &optimizer), KEEL_OK);
  assert_int_equal(keel_ec_optimizer_check(&optimizer), KEEL_OK);
  for (size_t c = 0; c < COUNT(cases); c++) {
    assert_int_equal(keel_ec_optimizer_check(&cases[c].optimizer), KEEL_OK);
  }
}

static void test_bad_arguments(void **state) {
  (void)state;
  keel_ec_optimizer sgd, adam, sentinel = {.kind = (keel_ec_optimizer_kind)77};
  assert_int_equal(keel_ec_optimizer_init(KEEL_EC_SGD, 0.1f, &sgd), KEEL_OK);
  assert_int_equal(keel_ec_optimizer_init(KEEL_EC_ADAM, 0.1f, &adam), KEEL_OK);

  /* Hyper-parameters: each breaks one rule of keel/ec.h. */
  keel_ec_optimizer bad[16];
  int count = 0;
  bad[count++] = (keel_ec_optimizer){0}; /* no kind */
  bad[count++] = (keel_ec_optimizer){.kind = (keel_ec_optimizer_kind)5, .learning_rate = 0.1f};
  bad[count++] = (keel_ec_optimizer){.kind = KEEL_EC_SGD, .learning_rate = -0.1f};
  bad[count++] = (keel_ec_optimizer){.kind = KEEL_EC_SGD, .learning_rate = NAN};
  bad[count++] = (keel_ec_optimizer){.kind = KEEL_EC_SGD, .learning_rate = INFINITY};
  bad[count++] = (keel_ec_optimizer){.kind = KEEL_EC_MOMENTUM, .learning_rate = 1, .momentum = -1};
  bad[count++] = (keel_ec_optimizer){.kind = KEEL_EC_ADAGRAD, .learning_rate = 1, .epsilon = 0};
  bad[count++] = (keel_ec_optimizer){
      .kind = KEEL_EC_ADAGRAD, .learning_rate = 1, .epsilon = 1e-6f, .initial_accumulator = -1};
  for (int b = 0; b < 6; b++) bad[count + b] = adam;
  bad[count++].beta1 = 1.0f;
  bad[count++].beta1 = -0.1f;
  bad[count++].beta2 = 1.5f;
  bad[count++].beta2 = NAN;
  bad[count++].epsilon = 0.0f;
  bad[count++].epsilon = -1e-8f;
  assert_true(count <= (int)COUNT(bad));
  const float values[4] = {1, 2, 3, 4};
  uint8_t block[64], before[64], delta[64];
  memset(block, 0x11, sizeof block);
  memcpy(before, block, sizeof block);
  for (int b = 0; b < count; b++) {
    size_t bytes = 99;
    assert_int_equal(keel_ec_optimizer_check(&bad[b]), KEEL_EINVAL);
    assert_int_equal(keel_ec_row_block_bytes(&bad[b], 4, &bytes), KEEL_EINVAL);
    assert_true(bytes == 99);
    assert_int_equal(keel_ec_row_init(&bad[b], 4, values, block), KEEL_EINVAL);
    assert_int_equal(keel_ec_row_apply(&bad[b], 4, block, values, delta), KEEL_EINVAL);
    assert_memory_equal(block, before, sizeof block);
  }
  keel_ec_optimizer untouched = sentinel;
  assert_int_equal(keel_ec_optimizer_init(KEEL_EC_SGD, -1.0f, &untouched), KEEL_EINVAL);
  assert_int_equal(keel_ec_optimizer_init((keel_ec_optimizer_kind)0, 1.0f, &untouched),
                   KEEL_EINVAL);
  assert_memory_equal(&untouched, &sentinel, sizeof sentinel);
  assert_int_equal(keel_ec_optimizer_init(KEEL_EC_SGD, 1.0f, NULL), KEEL_EINVAL);
  assert_int_equal(keel_ec_optimizer_check(NULL), KEEL_EINVAL);

  /* Dims and pointers. */
  static const int bad_dims[] = {0, -1, -1000, (1 << 24) + 1};
  for (size_t d = 0; d < COUNT(bad_dims); d++) {
    size_t bytes = 99;
    float read[4] = {0};
    assert_int_equal(keel_ec_row_block_bytes(&sgd, bad_dims[d], &bytes), KEEL_EINVAL);
    assert_true(bytes == 99);
    assert_int_equal(keel_ec_row_init(&sgd, bad_dims[d], values, block), KEEL_EINVAL);
    assert_int_equal(keel_ec_row_apply(&sgd, bad_dims[d], block, values, NULL), KEEL_EINVAL);
    assert_int_equal(keel_ec_row_read(bad_dims[d], block, read), KEEL_EINVAL);
    assert_true(read[0] == 0.0f);
  }
  assert_memory_equal(block, before, sizeof block);
  float read[4];
  assert_int_equal(keel_ec_row_block_bytes(NULL, 4, &(size_t){0}), KEEL_EINVAL);
  assert_int_equal(keel_ec_row_block_bytes(&sgd, 4, NULL), KEEL_EINVAL);
  assert_int_equal(keel_ec_row_init(NULL, 4, values, block), KEEL_EINVAL);
  assert_int_equal(keel_ec_row_init(&sgd, 4, NULL, block), KEEL_EINVAL);
  assert_int_equal(keel_ec_row_init(&sgd, 4, values, NULL), KEEL_EINVAL);
  assert_int_equal(keel_ec_row_apply(NULL, 4, block, values, NULL), KEEL_EINVAL);
  assert_int_equal(keel_ec_row_apply(&sgd, 4, NULL, values, NULL), KEEL_EINVAL);
  assert_int_equal(keel_ec_row_apply(&sgd, 4, block, NULL, delta), KEEL_EINVAL);
  assert_int_equal(keel_ec_row_read(4, NULL, read), KEEL_EINVAL);
  assert_int_equal(keel_ec_row_read(4, block, NULL), KEEL_EINVAL);
  assert_memory_equal(block, before, sizeof block);
}

/* Initial rows: a pure function of (seed, row), inside [-scale, scale), exact multiples of
 * scale * 2^-23, different from row to row and seed to seed; bad arguments refused. */
static void test_row_initial(void **state) {
  (void)state;
  enum { DIM = 64 };
  float first[DIM], again[DIM], other_row[DIM], other_seed[DIM];
  assert_int_equal(keel_ec_row_initial(7, 123456789, DIM, 0.25f, first), KEEL_OK);
  assert_int_equal(keel_ec_row_initial(7, 123456789, DIM, 0.25f, again), KEEL_OK);
  assert_memory_equal(first, again, sizeof first);
  assert_int_equal(keel_ec_row_initial(7, 123456790, DIM, 0.25f, other_row), KEEL_OK);
  assert_int_equal(keel_ec_row_initial(8, 123456789, DIM, 0.25f, other_seed), KEEL_OK);
  assert_memory_not_equal(first, other_row, sizeof first);
  assert_memory_not_equal(first, other_seed, sizeof first);
  bool negative = false, positive = false;
  for (int i = 0; i < DIM; i++) {
    assert_true(first[i] >= -0.25f && first[i] < 0.25f);
    float steps = first[i] / (0.25f * 0x1p-23f);
    assert_true(steps == (float)(int32_t)steps);
    negative |= first[i] < 0;
    positive |= first[i] > 0;
  }
  assert_true(negative && positive);
  assert_int_equal(keel_ec_row_initial(7, 0, 0, 0.25f, first), KEEL_EINVAL);
  assert_int_equal(keel_ec_row_initial(7, 0, DIM, -1.0f, first), KEEL_EINVAL);
  assert_int_equal(keel_ec_row_initial(7, 0, DIM, NAN, first), KEEL_EINVAL);
  assert_int_equal(keel_ec_row_initial(7, 0, DIM, 1.0f, NULL), KEEL_EINVAL);
}

int main(void) {
  static const struct {
    const char *what;
    CMUnitTestFunction function;
  } checks[] = {
      {"matches the reference", test_matches_reference},
      {"delta is old xor new", test_delta_is_old_xor_new},
      {"parity by deltas equals re-encoding", test_parity_by_deltas},
  };
  static const struct CMUnitTest singles[] = {
      cmocka_unit_test(test_layout_sizes),      cmocka_unit_test(test_closed_forms),
      cmocka_unit_test(test_adam_per_row_step), cmocka_unit_test(test_optimizer_init),
      cmocka_unit_test(test_bad_arguments),     cmocka_unit_test(test_row_initial),
  };
  static char names[COUNT(cases) * COUNT(checks)][96];
  struct CMUnitTest tests[COUNT(singles) + COUNT(cases) * COUNT(checks)];
  memcpy(tests, singles, sizeof singles);
  for (size_t c = 0; c < COUNT(cases); c++) {
    for (size_t k = 0; k < COUNT(checks); k++) {
      size_t at = c * COUNT(checks) + k;
      snprintf(names[at], sizeof names[at], "%s: %s", cases[c].name, checks[k].what);
      tests[COUNT(singles) + at] = (struct CMUnitTest){
          .name = names[at], .test_func = checks[k].function, .initial_state = (void *)&cases[c]};
    }
  }
  return cmocka_run_group_tests_name("test_ec_optimizer", tests, NULL, NULL);
}
