/* The XOR code (r = 1): the parity is the XOR of the k data blocks and any one lost block is
 * the XOR of the other k. ISA-L's xor_gen does the bulk where its rules allow (at least two
 * sources, every block 32-byte aligned); plain C does the rest and the tails. */
#include <isa-l/raid.h>
#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "ec/ec_internal.h"

/* xor_gen's vector loads are aligned ones. */
#define XOR_GEN_ALIGNMENT 32

static bool aligned(const void *pointer) { return (uintptr_t)pointer % XOR_GEN_ALIGNMENT == 0; }

/* output = sources[0] ^ ... ^ sources[count - 1]; output overlaps none of them. */
static void xor_sources(size_t bytes, int count, const uint8_t *const *sources, uint8_t *output) {
  size_t done = 0;
  bool vector = count >= 2 && aligned(output);
  for (int j = 0; vector && j < count; j++) vector = aligned(sources[j]);
  if (vector) {
    /* Whole 32-byte units only: the tail is ours on every ISA-L port. xor_gen reads the
     * sources through a non-const array; it writes only the last pointer. */
    void *array[KEEL_EC_MAX_BLOCKS + 1];
    size_t vector_bytes = bytes - bytes % XOR_GEN_ALIGNMENT;
    while (done < vector_bytes) {
      size_t piece = vector_bytes - done;
      if (piece > KEEL__EC_PIECE_BYTES) piece = KEEL__EC_PIECE_BYTES;
      for (int j = 0; j < count; j++) array[j] = (void *)(uintptr_t)(sources[j] + done);
      array[count] = output + done;
      (void)xor_gen(count + 1, (int)piece, array); /* fails only for fewer than 2 sources */
      done += piece;
    }
#if defined(__x86_64__)
    /* xor_gen's AVX kernel writes with non-temporal stores, which a later release store does
     * not order: fence them so that another thread that sees our next store sees the parity. */
    if (done > 0) _mm_sfence();
#endif
  }
  if (done == bytes) return;
  memcpy(output + done, sources[0] + done, bytes - done);
  for (int j = 1; j < count; j++) keel__ec_xor_into(bytes - done, output + done, sources[j] + done);
}

static keel_status xor_setup(keel_ec_code *code) { return KEEL_OK; }

static void xor_teardown(keel_ec_code *code) {}

static void xor_encode(const keel_ec_code *code, size_t bytes, const uint8_t *const *data,
                       uint8_t *const *parity) {
  xor_sources(bytes, code->data_blocks, data, parity[0]);
}

/* The parity's coefficient of every data block is 1: the delta folds in as it is. */
static void xor_update(const keel_ec_code *code, int data_index, int first, int count, size_t bytes,
                       const uint8_t *delta, uint8_t *const *parity) {
  keel__ec_xor_into(bytes, parity[0], delta);
}

static size_t xor_pattern_bytes(const keel_ec_code *code) { return 0; }

/* At most one block is missing (r = 1), and it is the XOR of the k others, data or parity. */
static void xor_reconstruct(const keel_ec_code *code, const uint8_t *tables, int missing_count,
                            size_t bytes, const uint8_t *const *sources, uint8_t *const *outputs) {
  xor_sources(bytes, code->data_blocks, sources, outputs[0]);
}

const keel__ec_ops keel__ec_xor_ops = {
    .name = "xor",
    .setup = xor_setup,
    .teardown = xor_teardown,
    .encode = xor_encode,
    .update = xor_update,
    .pattern_bytes = xor_pattern_bytes,
    .pattern_prepare = NULL,
    .reconstruct = xor_reconstruct,
};
