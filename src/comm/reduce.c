/* Reduction kernels: destination = left (op) right, element by element, written so that the
 * compiler vectorises them (restrict, simple loops), each with a plain reference twin that
 * the tests compare it with; and the one canonical order in which every transport folds the
 * ranks' contributions, so that a result's bits never depend on the transport. Left is always
 * the partial result, right the next rank's contribution. */
#include <string.h>

#include "comm/comm_internal.h"

/* Integer sums wrap (through the unsigned type) instead of overflowing, which C leaves
 * undefined; float sums are plain IEEE additions. */
#define DEFINE_KERNELS(suffix, type, unsigned_type)                                                \
  static void sum_##suffix(type *destination, const type *left, const type *right, size_t count) { \
    for (size_t i = 0; i < count; i++)                                                             \
      destination[i] = (type)((unsigned_type)left[i] + (unsigned_type)right[i]);                   \
  }                                                                                                \
  static void max_##suffix(type *destination, const type *left, const type *right, size_t count) { \
    for (size_t i = 0; i < count; i++) destination[i] = left[i] > right[i] ? left[i] : right[i];   \
  }                                                                                                \
  static void divide_##suffix(type *buffer, size_t count, type divisor) {                          \
    for (size_t i = 0; i < count; i++) buffer[i] = buffer[i] / divisor;                            \
  }

DEFINE_KERNELS(f32, float, float)
DEFINE_KERNELS(f64, double, double)
DEFINE_KERNELS(i32, int32_t, uint32_t)
DEFINE_KERNELS(i64, int64_t, uint64_t)

/* bfloat16 is the top half of an f32: widening is exact; narrowing rounds to nearest, ties
 * to even, and keeps NaN a NaN. */
static inline float bf16_to_f32(uint16_t bits) {
  uint32_t wide = (uint32_t)bits << 16;
  float value;
  memcpy(&value, &wide, sizeof value);
  return value;
}

static inline uint16_t f32_to_bf16(float value) {
  uint32_t bits;
  memcpy(&bits, &value, sizeof bits);
  if ((bits & 0x7f800000u) == 0x7f800000u && (bits & 0x007fffffu) != 0)
    return (uint16_t)((bits >> 16) | 0x0040u);
  uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return (uint16_t)((bits + rounding) >> 16);
}

static void sum_bf16(uint16_t *destination, const uint16_t *left, const uint16_t *right,
                     size_t count) {
  for (size_t i = 0; i < count; i++)
    destination[i] = f32_to_bf16(bf16_to_f32(left[i]) + bf16_to_f32(right[i]));
}

static void max_bf16(uint16_t *destination, const uint16_t *left, const uint16_t *right,
                     size_t count) {
  for (size_t i = 0; i < count; i++)
    destination[i] = bf16_to_f32(left[i]) > bf16_to_f32(right[i]) ? left[i] : right[i];
}

static void divide_bf16(uint16_t *buffer, size_t count, int divisor) {
  for (size_t i = 0; i < count; i++)
    buffer[i] = f32_to_bf16(bf16_to_f32(buffer[i]) / (float)divisor);
}

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
    case KEEL_BF16:
      (maximum ? max_bf16 : sum_bf16)(destination, left, right, count);
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
    case KEEL_BF16:
      divide_bf16(buffer, count, divisor);
      return;
  }
}

/* The reference narrows by the definition: the nearer of the two bf16 neighbours, the even
 * one on a tie. */
static uint16_t reference_narrow(float value) {
  if (value != value) {
    uint32_t bits;
    memcpy(&bits, &value, sizeof bits);
    return (uint16_t)((bits >> 16) | 0x0040u);
  }
  uint32_t bits;
  memcpy(&bits, &value, sizeof bits);
  uint16_t low = (uint16_t)(bits >> 16), high = (uint16_t)(low + 1);
  double exact = value, below = bf16_to_f32(low), above = bf16_to_f32(high);
  if ((bits & 0xffffu) == 0) return low;
  double distance_below = exact - below >= 0 ? exact - below : below - exact;
  double distance_above = above - exact >= 0 ? above - exact : exact - above;
  if (distance_below < distance_above) return low;
  if (distance_above < distance_below) return high;
  return (low & 1u) ? high : low;
}

void keel__reduce_reference(keel_dtype dtype, keel_reduce_op op, void *destination,
                            const void *left, const void *right, size_t count) {
  for (size_t i = 0; i < count; i++) {
    switch (dtype) {
      case KEEL_BF16: {
        uint16_t a = ((const uint16_t *)left)[i], b = ((const uint16_t *)right)[i];
        float fa = bf16_to_f32(a), fb = bf16_to_f32(b);
        ((uint16_t *)destination)[i] =
            op == KEEL_MAX ? (fa > fb ? a : b) : reference_narrow(fa + fb);
        break;
      }
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

/* ---- the canonical order of every reduction
 *
 * Float sums are not associative, so the order of a fold decides the bits, and DESIGN.md
 * promises bits that depend only on the contributions, the ranks and the world size. The
 * order is the one the tcp transport's algorithms produce, because a ring cannot change its
 * order without extra steps, while shared memory holds every contribution and folds them in
 * any order at the same cost:
 *   - a small allreduce (keel__allreduce_is_direct) is tcp's direct exchange: every element
 *     folds ranks 0, 1, ..., n-1;
 *   - a larger allreduce is tcp's ring: the buffer is cut in n chunks
 *     (keel__part_start), and chunk c starts at rank c, whose contribution the ring
 *     carries first, then adds ranks c+1, ..., c+n-1 (mod n) as it passes them;
 *   - a reduce-scatter is tcp's ring shifted by one, so that rank b ends with block b: block b
 *     folds ranks b+1, ..., b+n (mod n).
 * An algorithm that evaluates another order (a tree, a hierarchical reduce) gives this
 * guarantee up, so it may only be used where the caller asked for that explicitly. */

bool keel__allreduce_is_direct(size_t bytes, int size) {
  if (bytes <= KEEL__DIRECT_ALLREDUCE_BYTES) return true;
  return size > 1 && bytes <= KEEL__DIRECT_ALLREDUCE_SENT_BYTES / (size_t)(size - 1);
}

size_t keel__part_start(size_t count, int parts, int part) {
  size_t base = count / (size_t)parts, remainder = count % (size_t)parts;
  return (size_t)part * base + ((size_t)part < remainder ? (size_t)part : remainder);
}

/* The ring chunk that element index of a count-element buffer falls in: the first count % size
 * chunks hold one element more than the others. */
static int ring_chunk_of(size_t count, int size, size_t index) {
  size_t base = count / (size_t)size, remainder = count % (size_t)size;
  size_t long_part = remainder * (base + 1);
  if (index < long_part) return (int)(index / (base + 1));
  return (int)(remainder + (index - long_part) / base);
}

int keel__allreduce_fold_start(size_t count, size_t element_size, int size, size_t index,
                               size_t *run_end_p) {
  if (keel__allreduce_is_direct(count * element_size, size)) {
    *run_end_p = count;
    return 0;
  }
  int chunk = ring_chunk_of(count, size, index);
  *run_end_p = keel__part_start(count, size, chunk + 1);
  return chunk;
}

int keel__reduce_scatter_fold_start(int size, int block) { return (block + 1) % size; }

void keel__reduce_fold(keel_dtype dtype, keel_reduce_op op, void *destination,
                       const uint8_t *contributions, size_t stride, int size, int first_rank,
                       size_t count) {
  if (count == 0) return;
  size_t bytes = count * keel_dtype_size(dtype);
  const uint8_t *first = contributions + (size_t)first_rank * stride;
  if (size == 1) {
    memmove(destination, first, bytes);
  } else {
    const uint8_t *second = contributions + (size_t)((first_rank + 1) % size) * stride;
    keel__reduce(dtype, op, destination, first, second, count);
  }
  for (int step = 2; step < size; step++) {
    const uint8_t *next = contributions + (size_t)((first_rank + step) % size) * stride;
    keel__reduce(dtype, op, destination, destination, next, count);
  }
  if (op == KEEL_AVG) keel__divide(dtype, destination, count, size);
}

void keel__allreduce_fold(keel_dtype dtype, keel_reduce_op op, void *destination,
                          const uint8_t *contributions, size_t stride, int size, size_t total,
                          size_t first, size_t count) {
  size_t element_size = keel_dtype_size(dtype);
  for (size_t done = 0; done < count;) {
    size_t index = first + done, run_end;
    int first_rank = keel__allreduce_fold_start(total, element_size, size, index, &run_end);
    size_t run = run_end - index < count - done ? run_end - index : count - done;
    keel__reduce_fold(dtype, op, (uint8_t *)destination + done * element_size,
                      contributions + done * element_size, stride, size, first_rank, run);
    done += run;
  }
}
