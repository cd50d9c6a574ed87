/* crc32c (Castagnoli, the iSCSI polynomial) for frames and checkpoint chunks: ISA-L's
 * optimised kernel, a plain bitwise twin that the tests hold it to, and a copy that computes
 * the crc on the way (snapshots and restores, which would otherwise read the bytes twice). */
#include <isa-l/crc.h>
#include <pthread.h>
#include <string.h>

#include "keel/core.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#define CRC32C_POLYNOMIAL 0x82F63B78u

uint32_t keel_crc32c(uint32_t crc, const void *data, size_t length) {
  /* ISA-L's crc32_iscsi keeps the register uninverted; invert around it so that the
   * value matches the standard crc32c (RFC 3720) and chains like the reference. Its
   * length is an int, so feed it at most 1 GiB at a time. */
  const uint8_t *bytes = data;
  uint32_t state = ~crc;
  while (length > 0) {
    size_t piece = length < ((size_t)1 << 30) ? length : ((size_t)1 << 30);
    state = crc32_iscsi((unsigned char *)bytes, (int)piece, state);
    bytes += piece;
    length -= piece;
  }
  return ~state;
}

uint32_t keel_crc32c_reference(uint32_t crc, const void *data, size_t length) {
  const uint8_t *bytes = data;
  crc = ~crc;
  for (size_t i = 0; i < length; i++) {
    crc ^= bytes[i];
    for (int bit = 0; bit < 8; bit++) crc = (crc >> 1) ^ (CRC32C_POLYNOMIAL & (0u - (crc & 1u)));
  }
  return ~crc;
}

/* ---- the copy. The crc32 instruction takes 3 cycles and issues every cycle, so one chain of
 * it runs at a third of the speed the copy needs: each piece is cut in three parts whose crcs
 * run as three independent chains in one loop, and are joined after with the operator that
 * moves a crc past n zero bytes (a 32x32 matrix over GF(2), as in zlib's crc32_combine). */

#define COPY_PART_BYTES ((size_t)16 << 10)
#define COPY_PIECE_BYTES (3 * COPY_PART_BYTES)

/* A linear map of the crc register: column i is the image of bit i. */
typedef struct crc_operator {
  uint32_t column[32];
} crc_operator;

static uint32_t operator_apply(const crc_operator *map, uint32_t value) {
  uint32_t result = 0;
  for (int i = 0; value != 0; i++, value >>= 1) {
    if (value & 1u) result ^= map->column[i];
  }
  return result;
}

/* first after second */
static crc_operator operator_compose(const crc_operator *first, const crc_operator *second) {
  crc_operator result;
  for (int i = 0; i < 32; i++) result.column[i] = operator_apply(first, second->column[i]);
  return result;
}

/* What feeding `bytes` zero bytes does to the (uninverted) register. */
static crc_operator operator_zeros(size_t bytes) {
  crc_operator power, result;
  /* One zero bit: shift right, the polynomial folded in when bit 0 falls out. */
  power.column[0] = CRC32C_POLYNOMIAL;
  for (int i = 1; i < 32; i++) power.column[i] = 1u << (i - 1);
  for (int i = 0; i < 32; i++) result.column[i] = 1u << i;
  for (int bit = 0; bit < 3; bit++) power = operator_compose(&power, &power); /* one byte */
  for (; bytes != 0; bytes >>= 1) {
    if (bytes & 1u) result = operator_compose(&power, &result);
    power = operator_compose(&power, &power);
  }
  return result;
}

static crc_operator past_one_part, past_two_parts;
static bool fused_available;
static pthread_once_t fused_once = PTHREAD_ONCE_INIT;

static void fused_prepare(void) {
#if defined(__x86_64__)
  fused_available = __builtin_cpu_supports("sse4.2");
#endif
  past_one_part = operator_zeros(COPY_PART_BYTES);
  past_two_parts = operator_zeros(2 * COPY_PART_BYTES);
}

#if defined(__x86_64__)
/* One 64-byte line of one part: streamed to the destination (16-byte aligned), its eight
 * words into the chain. */
__attribute__((target("sse4.2"))) static inline uint64_t line_copy(uint64_t chain, uint8_t *to,
                                                                   const uint8_t *from) {
  __m128i a = _mm_loadu_si128((const __m128i *)from);
  __m128i b = _mm_loadu_si128((const __m128i *)(from + 16));
  __m128i c = _mm_loadu_si128((const __m128i *)(from + 32));
  __m128i d = _mm_loadu_si128((const __m128i *)(from + 48));
  _mm_stream_si128((__m128i *)to, a);
  _mm_stream_si128((__m128i *)(to + 16), b);
  _mm_stream_si128((__m128i *)(to + 32), c);
  _mm_stream_si128((__m128i *)(to + 48), d);
  chain = _mm_crc32_u64(chain, (uint64_t)_mm_cvtsi128_si64(a));
  chain = _mm_crc32_u64(chain, (uint64_t)_mm_extract_epi64(a, 1));
  chain = _mm_crc32_u64(chain, (uint64_t)_mm_cvtsi128_si64(b));
  chain = _mm_crc32_u64(chain, (uint64_t)_mm_extract_epi64(b, 1));
  chain = _mm_crc32_u64(chain, (uint64_t)_mm_cvtsi128_si64(c));
  chain = _mm_crc32_u64(chain, (uint64_t)_mm_extract_epi64(c, 1));
  chain = _mm_crc32_u64(chain, (uint64_t)_mm_cvtsi128_si64(d));
  chain = _mm_crc32_u64(chain, (uint64_t)_mm_extract_epi64(d, 1));
  return chain;
}

/* One piece of three parts; state is the uninverted register before it, returned after. */
__attribute__((target("sse4.2"))) static uint32_t piece_copy(uint32_t state, uint8_t *to,
                                                             const uint8_t *from) {
  uint64_t first = state, second = 0, third = 0;
  for (size_t at = 0; at < COPY_PART_BYTES; at += 64) {
    first = line_copy(first, to + at, from + at);
    second = line_copy(second, to + COPY_PART_BYTES + at, from + COPY_PART_BYTES + at);
    third = line_copy(third, to + 2 * COPY_PART_BYTES + at, from + 2 * COPY_PART_BYTES + at);
  }
  return operator_apply(&past_two_parts, (uint32_t)first) ^
         operator_apply(&past_one_part, (uint32_t)second) ^ (uint32_t)third;
}
#endif

uint32_t keel_crc32c_copy(uint32_t crc, void *destination, const void *source, size_t length) {
  uint8_t *to = destination;
  const uint8_t *from = source;
  pthread_once(&fused_once, fused_prepare);
#if defined(__x86_64__)
  size_t head = (16 - (uintptr_t)to % 16) % 16;
  if (fused_available && length >= head + COPY_PIECE_BYTES) {
    crc = keel_crc32c(crc, from, head);
    memcpy(to, from, head);
    to += head;
    from += head;
    length -= head;
    uint32_t state = ~crc;
    for (; length >= COPY_PIECE_BYTES; length -= COPY_PIECE_BYTES) {
      state = piece_copy(state, to, from);
      to += COPY_PIECE_BYTES;
      from += COPY_PIECE_BYTES;
    }
    _mm_sfence(); /* the streamed stores are visible before anything written after */
    crc = ~state;
  }
#endif
  crc = keel_crc32c(crc, from, length);
  memcpy(to, from, length);
  return crc;
}
