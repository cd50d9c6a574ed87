/* Reduction kernels: destination = left (op) right, element by element, written so that the
 * compiler vectorises them (restrict, simple loops), each with a plain reference twin that
 * the tests compare it with. Order of evaluation is fixed: left is the partial result that
 * arrived, right is this rank's contribution, so every run reduces in the same order. */
#include "comm/comm_internal.h"

/* Integer sums wrap (through the unsigned type) instead of overflowing, which C leaves
 * undefined; float sums are plain IEEE additions. */
#define DEFINE_KERNELS(suffix, type, unsigned_type)                                      \
  static void sum_##suffix(type *destination, const type *left, const type *right,       \
                           size_t count) {                                               \
    for (size_t i = 0; i < count; i++)                                                   \
      destination[i] = (type)((unsigned_type)left[i] + (unsigned_type)right[i]);       \
  }                                                                                      \
  static void max_##suffix(type *destination, const type *left, const type *right,       \
                           size_t count) {                                               \
    for (size_t i = 0; i < count; i++)                                                   \
      destination[i] = left[i] > right[i] ? left[i] : right[i];                          \
  }                                                                                      \
  static void divide_##suffix(type *buffer, size_t count, type divisor) {                \
    for (size_t i = 0; i < count; i++) buffer[i] = buffer[i] / divisor;                  \
  }

DEFINE_KERNELS(f32, float, float)
DEFINE_KERNELS(f64, double, double)
DEFINE_KERNELS(i32, int32_t, uint32_t)
DEFINE_KERNELS(i64, int64_t, uint64_t)

/* destination may alias left or right exactly (in place): each element is read before it
 * is written, index by index. */
void keel__reduce(keel_dtype dtype, keel_reduce_op op, void *destination, const void *left,
                  const void *right, size_t count) {
  bool maximum = op == KEEL_MAX;
  switch (dtype) {
    case KEEL_F32:
      (maximum ? max_f32 : sum_f32)(destination, left, right, count);
      return;
    case KEEL_F64:
      (maximum ? max_f64 : sum_f64)(destination, left, right, count);
      return;
    case KEEL_I32:
      (maximum ? max_i32 : sum_i32)(destination, left, right, count);
      return;
    case KEEL_I64:
      (maximum ? max_i64 : sum_i64)(destination, left, right, count);
      return;
  }
}

void keel__divide(keel_dtype dtype, void *buffer, size_t count, int divisor) {
  switch (dtype) {
    case KEEL_F32:
      divide_f32(buffer, count, (float)divisor);
      return;
    case KEEL_F64:
      divide_f64(buffer, count, (double)divisor);
      return;
    case KEEL_I32:
      divide_i32(buffer, count, (int32_t)divisor);
      return;
    case KEEL_I64:
      divide_i64(buffer, count, (int64_t)divisor);
      return;
  }
}

void keel__reduce_reference(keel_dtype dtype, keel_reduce_op op, void *destination,
                            const void *left, const void *right, size_t count) {
  for (size_t i = 0; i < count; i++) {
    switch (dtype) {
      case KEEL_F32: {
        float a = ((const float *)left)[i], b = ((const float *)right)[i];
        ((float *)destination)[i] = op == KEEL_MAX ? (a > b ? a : b) : a + b;
        break;
      }
      case KEEL_F64: {
        double a = ((const double *)left)[i], b = ((const double *)right)[i];
        ((double *)destination)[i] = op == KEEL_MAX ? (a > b ? a : b) : a + b;
        break;
      }
      case KEEL_I32: {
        int32_t a = ((const int32_t *)left)[i], b = ((const int32_t *)right)[i];
        ((int32_t *)destination)[i] =
            op == KEEL_MAX ? (a > b ? a : b) : (int32_t)((uint32_t)a + (uint32_t)b);
        break;
      }
      case KEEL_I64: {
        int64_t a = ((const int64_t *)left)[i], b = ((const int64_t *)right)[i];
        ((int64_t *)destination)[i] =
            op == KEEL_MAX ? (a > b ? a : b) : (int64_t)((uint64_t)a + (uint64_t)b);
        break;
      }
    }
  }
}
