/* Per-row optimizers of the erasure-coded parameter store (ECRec §3.2): SGD, momentum, Adagrad
 * and Adam on a row block (a row and its optimizer state in one little-endian layout, see
 * keel/ec.h), with old XOR new over the block written in the same pass for the parity
 * holders. Nothing here allocates; the float arithmetic, in its fixed order, is the format. */
#include <float.h>
#include <math.h>
#include <string.h>

#include "ec/ec_internal.h"

/* The formulas are bit-exact definitions: no FMA contraction (GCC contracts nothing in ISO C
 * mode, but Clang does by default where the target has FMA) and no wider intermediates. */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif
_Static_assert(FLT_EVAL_METHOD == 0, "the optimizers' arithmetic must round to float");

#define F32_BYTES 4
#define STEP_BYTES 8

/* The vectors of a block, each dim f32 values, in this order (keel/ec.h's layout). */
enum { PARAMETERS = 0, STATE = 1, SECOND_STATE = 2 };

/* Per kind: its name, and how many f32 vectors its block holds (the parameters and its
 * state). */
static const struct {
  const char *name;
  size_t vectors;
} kinds[] = {
    [KEEL_EC_SGD] = {"sgd", 1},
    [KEEL_EC_MOMENTUM] = {"momentum", 2},
    [KEEL_EC_ADAGRAD] = {"adagrad", 2},
    [KEEL_EC_ADAM] = {"adam", 3},
};

static bool kind_known(keel_ec_optimizer_kind kind) {
  return kind >= KEEL_EC_SGD && kind <= KEEL_EC_ADAM;
}

/* Where the vectors end and the padding starts; the padding runs to the step count (Adam)
 * or to the end of the block. */
static size_t vectors_bytes(keel_ec_optimizer_kind kind, size_t dim) {
  return kinds[kind].vectors * dim * F32_BYTES;
}

static size_t block_bytes(keel_ec_optimizer_kind kind, size_t dim) {
  size_t padded = (vectors_bytes(kind, dim) + 7) / 8 * 8;
  return padded + (kind == KEEL_EC_ADAM ? STEP_BYTES : 0);
}

/* Whether a hyper-parameter is finite and >= least (strict: > least); logs the one that is
 * not, so that a refused optimizer is logged once, by its first bad field. */
static bool check_field(const keel_ec_optimizer *optimizer, const char *field, float value,
                        float least, bool strict) {
  if (isfinite(value) && (strict ? value > least : value >= least)) return true;
  KEEL_LOG_E(KEEL__EC_MODULE, "ec optimizer %s: %s %g, must be finite and %s %g",
             kinds[optimizer->kind].name, field, (double)value, strict ? ">" : ">=", (double)least);
  return false;
}

static bool check_beta(const keel_ec_optimizer *optimizer, const char *field, float value) {
  if (value >= 0.0f && value < 1.0f) return true; /* NaN fails both */
  KEEL_LOG_E(KEEL__EC_MODULE, "ec optimizer %s: %s %g, must be in [0, 1)",
             kinds[optimizer->kind].name, field, (double)value);
  return false;
}

keel_status keel_ec_optimizer_check(const keel_ec_optimizer *optimizer) {
  if (optimizer == NULL) return keel__ec_invalid("ec optimizer: NULL");
  if (!kind_known(optimizer->kind)) {
    KEEL_LOG_E(KEEL__EC_MODULE, "ec optimizer: unknown kind %d", (int)optimizer->kind);
    return KEEL_EINVAL;
  }
  bool valid = check_field(optimizer, "learning rate", optimizer->learning_rate, 0.0f, false);
  switch (optimizer->kind) {
    case KEEL_EC_SGD:
      break;
    case KEEL_EC_MOMENTUM:
      valid = valid && check_field(optimizer, "momentum", optimizer->momentum, 0.0f, false);
      break;
    case KEEL_EC_ADAGRAD:
      valid = valid && check_field(optimizer, "epsilon", optimizer->epsilon, 0.0f, true) &&
              check_field(optimizer, "initial accumulator", optimizer->initial_accumulator, 0.0f,
                          false);
      break;
    case KEEL_EC_ADAM:
      valid = valid && check_field(optimizer, "epsilon", optimizer->epsilon, 0.0f, true) &&
              check_beta(optimizer, "beta1", optimizer->beta1) &&
              check_beta(optimizer, "beta2", optimizer->beta2);
      break;
  }
  return valid ? KEEL_OK : KEEL_EINVAL;
}

keel_status keel_ec_optimizer_init(keel_ec_optimizer_kind kind, float learning_rate,
                                   keel_ec_optimizer *optimizer_p) {
  if (optimizer_p == NULL) return keel__ec_invalid("keel_ec_optimizer_init: no output pointer");
  keel_ec_optimizer optimizer = {.kind = kind, .learning_rate = learning_rate};
  if (kind == KEEL_EC_MOMENTUM) optimizer.momentum = 0.9f;
  if (kind == KEEL_EC_ADAGRAD) optimizer.epsilon = 1e-10f;
  if (kind == KEEL_EC_ADAM) {
    optimizer.beta1 = 0.9f;
    optimizer.beta2 = 0.999f;
    optimizer.epsilon = 1e-8f;
  }
  keel_status status = keel_ec_optimizer_check(&optimizer);
  if (status != KEEL_OK) return status;
  *optimizer_p = optimizer;
  return KEEL_OK;
}

static keel_status check_dim(const char *function, int dim) {
  if (dim >= 1 && dim <= KEEL_EC_ROW_MAX_DIM) return KEEL_OK;
  KEEL_LOG_E(KEEL__EC_MODULE, "%s: dim %d (1 .. %d)", function, dim, KEEL_EC_ROW_MAX_DIM);
  return KEEL_EINVAL;
}

/* The checks the row functions with an optimizer share, each logged where it fails. */
static keel_status check_row(const char *function, const keel_ec_optimizer *optimizer, int dim) {
  if (optimizer == NULL) {
    KEEL_LOG_E(KEEL__EC_MODULE, "%s: NULL optimizer", function);
    return KEEL_EINVAL;
  }
  keel_status status = keel_ec_optimizer_check(optimizer);
  return status != KEEL_OK ? status : check_dim(function, dim);
}

keel_status keel_ec_row_block_bytes(const keel_ec_optimizer *optimizer, int dim, size_t *bytes_p) {
  keel_status status = check_row("keel_ec_row_block_bytes", optimizer, dim);
  if (status != KEEL_OK) return status;
  if (bytes_p == NULL) return keel__ec_invalid("keel_ec_row_block_bytes: no output pointer");
  *bytes_p = block_bytes(optimizer->kind, (size_t)dim);
  return KEEL_OK;
}

/* ---- fields of a block. Little-endian on every host: on a little-endian one that is a
 * plain load and store (memcpy, any alignment), elsewhere core's byte-wise helpers. */

static inline uint32_t load_bits(const uint8_t *at) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
  uint32_t bits;
  memcpy(&bits, at, sizeof bits);
  return bits;
#else
  return keel_get_le32(at);
#endif
}

static inline void store_bits(uint8_t *at, uint32_t bits) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
  memcpy(at, &bits, sizeof bits);
#else
  keel_put_le32(at, bits);
#endif
}

/* A block being written: value i of vector v is the f32 at (v * dim + i) * 4. With a delta,
 * each store also writes old XOR new at the same offset, so the difference costs no second
 * pass over the block. */
typedef struct row {
  uint8_t *block;
  uint8_t *delta; /* NULL: none wanted */
  size_t dim;
} row;

static inline size_t offset_of(const row *r, int vector, size_t i) {
  return ((size_t)vector * r->dim + i) * F32_BYTES;
}

static inline float row_get(const row *r, int vector, size_t i) {
  uint32_t bits = load_bits(r->block + offset_of(r, vector, i));
  float value;
  memcpy(&value, &bits, sizeof value);
  return value;
}

static inline void row_set(const row *r, int vector, size_t i, float value) {
  size_t offset = offset_of(r, vector, i);
  uint32_t bits;
  memcpy(&bits, &value, sizeof bits);
  if (r->delta != NULL) store_bits(r->delta + offset, load_bits(r->block + offset) ^ bits);
  store_bits(r->block + offset, bits);
}

/* Adam's per-row step count t: the last 8 bytes of the block. */
static uint64_t step_get(const row *r, size_t bytes) {
  return keel_get_le64(r->block + bytes - STEP_BYTES);
}

static void step_set(const row *r, size_t bytes, uint64_t step) {
  uint8_t *at = r->block + bytes - STEP_BYTES;
  if (r->delta != NULL) keel_put_le64(r->delta + bytes - STEP_BYTES, keel_get_le64(at) ^ step);
  keel_put_le64(at, step);
}

/* ---- the optimizers: keel/ec.h's formulas, in its order of operations */

static void apply_sgd(const keel_ec_optimizer *optimizer, const row *r, const float *gradient) {
  float learning_rate = optimizer->learning_rate;
  for (size_t i = 0; i < r->dim; i++) {
    row_set(r, PARAMETERS, i, row_get(r, PARAMETERS, i) - learning_rate * gradient[i]);
  }
}

static void apply_momentum(const keel_ec_optimizer *optimizer, const row *r,
                           const float *gradient) {
  float learning_rate = optimizer->learning_rate, momentum = optimizer->momentum;
  for (size_t i = 0; i < r->dim; i++) {
    float velocity = momentum * row_get(r, STATE, i) + gradient[i];
    row_set(r, STATE, i, velocity);
    row_set(r, PARAMETERS, i, row_get(r, PARAMETERS, i) - learning_rate * velocity);
  }
}

static void apply_adagrad(const keel_ec_optimizer *optimizer, const row *r, const float *gradient) {
  float learning_rate = optimizer->learning_rate, epsilon = optimizer->epsilon;
  for (size_t i = 0; i < r->dim; i++) {
    float g = gradient[i];
    float sum = row_get(r, STATE, i) + g * g;
    row_set(r, STATE, i, sum);
    row_set(r, PARAMETERS, i,
            row_get(r, PARAMETERS, i) - learning_rate * g / (sqrtf(sum) + epsilon));
  }
}

/* base^exponent by squaring from the lowest bit (keel/ec.h), in float: libm's powf is not
 * correctly rounded, so its bits could differ between machines. At most 64 rounds a row. */
static float power(float base, uint64_t exponent) {
  float result = 1.0f;
  for (; exponent > 0; exponent >>= 1) {
    if (exponent & 1) result *= base;
    base *= base;
  }
  return result;
}

static void apply_adam(const keel_ec_optimizer *optimizer, const row *r, size_t bytes,
                       const float *gradient) {
  uint64_t t = step_get(r, bytes);
  if (t < UINT64_MAX) t++; /* a wrap to 0 would make the bias correction 0 / 0 */
  float beta1 = optimizer->beta1, beta2 = optimizer->beta2, epsilon = optimizer->epsilon;
  float one_minus_beta1 = 1.0f - beta1, one_minus_beta2 = 1.0f - beta2;
  /* Both corrections are positive: power(beta, t) <= beta < 1 for t >= 1. */
  float step = optimizer->learning_rate / (1.0f - power(beta1, t));
  float root = sqrtf(1.0f - power(beta2, t));
  for (size_t i = 0; i < r->dim; i++) {
    float g = gradient[i];
    float m = beta1 * row_get(r, STATE, i) + one_minus_beta1 * g;
    float v = beta2 * row_get(r, SECOND_STATE, i) + one_minus_beta2 * g * g;
    row_set(r, STATE, i, m);
    row_set(r, SECOND_STATE, i, v);
    row_set(r, PARAMETERS, i, row_get(r, PARAMETERS, i) - step * m / (sqrtf(v) / root + epsilon));
  }
  step_set(r, bytes, t);
}

keel_status keel_ec_row_init(const keel_ec_optimizer *optimizer, int dim, const float *parameters,
                             uint8_t *block) {
  keel_status status = check_row("keel_ec_row_init", optimizer, dim);
  if (status != KEEL_OK) return status;
  if (parameters == NULL || block == NULL)
    return keel__ec_invalid("keel_ec_row_init: NULL parameters or block");
  row r = {.block = block, .delta = NULL, .dim = (size_t)dim};
  /* Zero is every state's start (and t's, and the padding's) but Adagrad's accumulator. */
  memset(block, 0, block_bytes(optimizer->kind, r.dim));
  for (size_t i = 0; i < r.dim; i++) row_set(&r, PARAMETERS, i, parameters[i]);
  if (optimizer->kind == KEEL_EC_ADAGRAD) {
    for (size_t i = 0; i < r.dim; i++) row_set(&r, STATE, i, optimizer->initial_accumulator);
  }
  return KEEL_OK;
}

keel_status keel_ec_row_apply(const keel_ec_optimizer *optimizer, int dim, uint8_t *block,
                              const float *gradient, uint8_t *delta) {
  keel_status status = check_row("keel_ec_row_apply", optimizer, dim);
  if (status != KEEL_OK) return status;
  if (block == NULL || gradient == NULL)
    return keel__ec_invalid("keel_ec_row_apply: NULL block or gradient");
  row r = {.block = block, .delta = delta, .dim = (size_t)dim};
  size_t bytes = block_bytes(optimizer->kind, r.dim);
  switch (optimizer->kind) {
    case KEEL_EC_SGD:
      apply_sgd(optimizer, &r, gradient);
      break;
    case KEEL_EC_MOMENTUM:
      apply_momentum(optimizer, &r, gradient);
      break;
    case KEEL_EC_ADAGRAD:
      apply_adagrad(optimizer, &r, gradient);
      break;
    case KEEL_EC_ADAM:
      apply_adam(optimizer, &r, bytes, gradient);
      break;
  }
  /* The padding never changes; its delta is zero like the rest of an unchanged block. */
  if (delta != NULL) {
    size_t padding = vectors_bytes(optimizer->kind, r.dim);
    size_t padding_end = bytes - (optimizer->kind == KEEL_EC_ADAM ? STEP_BYTES : 0);
    memset(delta + padding, 0, padding_end - padding);
  }
  return KEEL_OK;
}

keel_status keel_ec_row_read(int dim, const uint8_t *block, float *parameters) {
  keel_status status = check_dim("keel_ec_row_read", dim);
  if (status != KEEL_OK) return status;
  if (block == NULL || parameters == NULL)
    return keel__ec_invalid("keel_ec_row_read: NULL block or parameters");
  for (size_t i = 0; i < (size_t)dim; i++) {
    uint32_t bits = load_bits(block + i * F32_BYTES);
    memcpy(&parameters[i], &bits, sizeof bits);
  }
  return KEEL_OK;
}

keel_status keel_ec_row_initial(uint64_t seed, uint64_t row_index, int dim, float scale,
                                float *parameters) {
  keel_status status = check_dim("keel_ec_row_initial", dim);
  if (status != KEEL_OK) return status;
  if (parameters == NULL || !isfinite(scale) || scale < 0.0f)
    return keel__ec_invalid("keel_ec_row_initial: NULL parameters or a bad scale");
  /* A stream of its own per row, so any process makes any row without the others. */
  keel_random random;
  keel_random_seed(&random, keel_random_seed_for(seed, row_index, 0));
  for (size_t i = 0; i < (size_t)dim; i++) {
    /* 24 random bits: every value is exact in float, so no rounding mode matters. */
    float unit = (float)(keel_random_next(&random) >> 40) * 0x1p-24f;
    parameters[i] = (2.0f * unit - 1.0f) * scale;
  }
  return KEEL_OK;
}
