/* The codec's public face: checks arguments, picks the codec (codec_xor.c, codec_rs.c) and
 * drives decoding: which blocks to read, and a decoder's cache of per-pattern tables so that
 * the hot path inverts nothing it has inverted before and allocates nothing. */
#include <stdlib.h>
#include <string.h>

#include "ec/ec_internal.h"

/* Decoders keep at most this many patterns unless asked for more, and never more than the
 * maximum (the tables of one pattern of the widest code are 32 * 127 * 128 bytes). */
#define DEFAULT_CACHE_PATTERNS 16
#define MAX_CACHE_PATTERNS 1024
#define KEY_WORDS ((KEEL_EC_MAX_BLOCKS + 63) / 64)

keel_status keel__ec_invalid(const char *what) {
  KEEL_LOG_E(KEEL__EC_MODULE, "%s", what);
  return KEEL_EINVAL;
}

keel_status keel_ec_code_create(int data_blocks, int parity_blocks, keel_ec_kind kind,
                                keel_ec_code **code_p) {
  if (code_p == NULL) return keel__ec_invalid("keel_ec_code_create: no output pointer");
  if (data_blocks < 1 || parity_blocks < 1 || data_blocks > KEEL_EC_MAX_BLOCKS - parity_blocks) {
    KEEL_LOG_E(KEEL__EC_MODULE, "ec code k=%d r=%d: need k >= 1, r >= 1 and k + r <= %d",
               data_blocks, parity_blocks, KEEL_EC_MAX_BLOCKS);
    return KEEL_EINVAL;
  }
  const keel__ec_ops *ops;
  switch (kind) {
    case KEEL_EC_AUTO:
      ops = parity_blocks == 1 ? &keel__ec_xor_ops : &keel__ec_rs_ops;
      break;
    case KEEL_EC_XOR:
      if (parity_blocks != 1) {
        KEEL_LOG_E(KEEL__EC_MODULE, "the xor code has one parity block, not %d", parity_blocks);
        return KEEL_EINVAL;
      }
      ops = &keel__ec_xor_ops;
      break;
    case KEEL_EC_RS:
      ops = &keel__ec_rs_ops;
      break;
    default:
      KEEL_LOG_E(KEEL__EC_MODULE, "unknown ec code kind %d", (int)kind);
      return KEEL_EINVAL;
  }
  keel_ec_code *code = calloc(1, sizeof *code);
  if (code == NULL) goto fail_out_of_memory;
  code->ops = ops;
  code->kind = ops == &keel__ec_xor_ops ? KEEL_EC_XOR : KEEL_EC_RS;
  code->data_blocks = data_blocks;
  code->parity_blocks = parity_blocks;
  if (ops->setup(code) != KEEL_OK) goto fail_free_code;
  *code_p = code;
  return KEEL_OK;

fail_free_code:
  free(code);
fail_out_of_memory:
  KEEL_LOG_E(KEEL__EC_MODULE, "ec code k=%d r=%d: out of memory", data_blocks, parity_blocks);
  return KEEL_ENOMEM;
}

void keel_ec_code_destroy(keel_ec_code *code) {
  if (code == NULL) return;
  code->ops->teardown(code);
  free(code);
}

int keel_ec_code_data_blocks(const keel_ec_code *code) { return code->data_blocks; }
int keel_ec_code_parity_blocks(const keel_ec_code *code) { return code->parity_blocks; }
keel_ec_kind keel_ec_code_kind(const keel_ec_code *code) { return code->kind; }
const char *keel_ec_code_name(const keel_ec_code *code) { return code->ops->name; }

/* Whether none of the count pointers is NULL (the array itself included). */
static bool all_set(const void *const *pointers, int count) {
  if (pointers == NULL) return false;
  for (int i = 0; i < count; i++) {
    if (pointers[i] == NULL) return false;
  }
  return true;
}

keel_status keel_ec_encode(const keel_ec_code *code, size_t bytes, const uint8_t *const *data,
                           uint8_t *const *parity) {
  if (code == NULL || !all_set((const void *const *)data, code->data_blocks) ||
      !all_set((const void *const *)parity, code->parity_blocks)) {
    return keel__ec_invalid("keel_ec_encode: a NULL code or block");
  }
  code->ops->encode(code, bytes, data, parity);
  return KEEL_OK;
}

keel_status keel_ec_update(const keel_ec_code *code, int data_index, size_t bytes,
                           const uint8_t *delta, uint8_t *const *parity) {
  if (code == NULL || delta == NULL || !all_set((const void *const *)parity, code->parity_blocks)) {
    return keel__ec_invalid("keel_ec_update: a NULL code or block");
  }
  if (data_index < 0 || data_index >= code->data_blocks) {
    KEEL_LOG_E(KEEL__EC_MODULE, "keel_ec_update: data block %d of %d", data_index,
               code->data_blocks);
    return KEEL_EINVAL;
  }
  code->ops->update(code, data_index, 0, code->parity_blocks, bytes, delta, parity);
  return KEEL_OK;
}

keel_status keel_ec_update_parity(const keel_ec_code *code, int data_index, int parity_index,
                                  size_t bytes, const uint8_t *delta, uint8_t *parity) {
  if (code == NULL || delta == NULL || parity == NULL)
    return keel__ec_invalid("keel_ec_update_parity: a NULL code or block");
  if (data_index < 0 || data_index >= code->data_blocks || parity_index < 0 ||
      parity_index >= code->parity_blocks) {
    KEEL_LOG_E(KEEL__EC_MODULE, "keel_ec_update_parity: data block %d of %d, parity %d of %d",
               data_index, code->data_blocks, parity_index, code->parity_blocks);
    return KEEL_EINVAL;
  }
  uint8_t *const one[1] = {parity};
  code->ops->update(code, data_index, parity_index, 1, bytes, delta, one);
  return KEEL_OK;
}

/* The plain XOR loops run on the compiler's vectors; the build targets baseline x86-64
 * (SSE2), so where the compiler can, it adds an AVX2 clone picked at load time (about 1.7x
 * on 64 KiB blocks here). xor_gen is no help for these two: in place, its non-temporal
 * stores make it slower than either. */
#if defined(__x86_64__) && defined(__has_attribute) && !defined(__clang__)
/* Not with clang: Debian's clang 14 names the dispatcher "<name>.ifunc", and the callers'
 * references to <name> stay undefined (`make fuzz` builds with clang). */
#if __has_attribute(target_clones)
#define VECTOR_CLONES __attribute__((target_clones("avx2", "default")))
#endif
#endif
#ifndef VECTOR_CLONES
#define VECTOR_CLONES
#endif

VECTOR_CLONES
void keel__ec_xor_into(size_t bytes, uint8_t *restrict target, const uint8_t *restrict source) {
  for (size_t i = 0; i < bytes; i++) target[i] ^= source[i];
}

/* out = a ^ b, out apart from both. */
VECTOR_CLONES
static void xor_apart(size_t bytes, uint8_t *restrict out, const uint8_t *restrict a,
                      const uint8_t *restrict b) {
  for (size_t i = 0; i < bytes; i++) out[i] = a[i] ^ b[i];
}

void keel_ec_delta(size_t bytes, const uint8_t *old, const uint8_t *new_data, uint8_t *delta) {
  /* In place is the common case (the old row's buffer becomes the delta); keep it on the
   * vectorised loop rather than on the one the compiler falls back to for aliasing. */
  if (delta == old) {
    keel__ec_xor_into(bytes, delta, new_data);
  } else if (delta == new_data) {
    keel__ec_xor_into(bytes, delta, old);
  } else {
    xor_apart(bytes, delta, old, new_data);
  }
}

/* ---- decoding */

typedef struct pattern_slot {
  uint64_t present[KEY_WORDS]; /* the key: which blocks were present */
  bool valid;
} pattern_slot;

struct keel_ec_decoder {
  const keel_ec_code *code;
  size_t pattern_bytes;
  int slot_count;
  int next_slot; /* the one to replace next: round robin */
  pattern_slot *slots;
  uint8_t *tables;  /* slot_count * pattern_bytes */
  uint8_t *scratch; /* 2 * k * k + r * k: the codec's inversion */
};

keel_status keel_ec_decoder_create(const keel_ec_code *code, int cache_patterns,
                                   keel_ec_decoder **decoder_p) {
  if (code == NULL || decoder_p == NULL)
    return keel__ec_invalid("keel_ec_decoder_create: NULL argument");
  if (cache_patterns < 0 || cache_patterns > MAX_CACHE_PATTERNS) {
    KEEL_LOG_E(KEEL__EC_MODULE, "ec decoder: %d cached patterns (0 .. %d)", cache_patterns,
               MAX_CACHE_PATTERNS);
    return KEEL_EINVAL;
  }
  size_t k = (size_t)code->data_blocks, r = (size_t)code->parity_blocks;
  size_t pattern_bytes = code->ops->pattern_bytes(code);
  int slot_count = 0;
  if (pattern_bytes > 0) {
    int blocks = (int)(k + r);
    slot_count = cache_patterns > 0                ? cache_patterns
                 : blocks < DEFAULT_CACHE_PATTERNS ? blocks
                                                   : DEFAULT_CACHE_PATTERNS;
  }
  keel_ec_decoder *decoder = calloc(1, sizeof *decoder);
  if (decoder == NULL) goto fail_out_of_memory;
  decoder->code = code;
  decoder->pattern_bytes = pattern_bytes;
  decoder->slot_count = slot_count;
  if (slot_count > 0) {
    decoder->slots = calloc((size_t)slot_count, sizeof *decoder->slots);
    if (decoder->slots == NULL) goto fail_free_decoder;
    decoder->tables = malloc((size_t)slot_count * pattern_bytes);
    if (decoder->tables == NULL) goto fail_free_slots;
    decoder->scratch = malloc(2 * k * k + r * k);
    if (decoder->scratch == NULL) goto fail_free_tables;
  }
  *decoder_p = decoder;
  return KEEL_OK;

fail_free_tables:
  free(decoder->tables);
fail_free_slots:
  free(decoder->slots);
fail_free_decoder:
  free(decoder);
fail_out_of_memory:
  KEEL_LOG_E(KEEL__EC_MODULE, "ec decoder k=%d r=%d: out of memory", code->data_blocks,
             code->parity_blocks);
  return KEEL_ENOMEM;
}

void keel_ec_decoder_destroy(keel_ec_decoder *decoder) {
  if (decoder == NULL) return;
  free(decoder->scratch);
  free(decoder->tables);
  free(decoder->slots);
  free(decoder);
}

/* The tables for the pattern `key`: from the cache, or prepared into the slot whose turn it
 * is to be replaced. */
static keel_status pattern_tables(keel_ec_decoder *decoder, const uint64_t *key, const int *sources,
                                  const int *missing, int missing_count, const uint8_t **tables_p) {
  for (int s = 0; s < decoder->slot_count; s++) {
    pattern_slot *slot = &decoder->slots[s];
    if (slot->valid && memcmp(slot->present, key, sizeof slot->present) == 0) {
      *tables_p = decoder->tables + (size_t)s * decoder->pattern_bytes;
      return KEEL_OK;
    }
  }
  int s = decoder->next_slot;
  decoder->next_slot = (s + 1) % decoder->slot_count;
  pattern_slot *slot = &decoder->slots[s];
  uint8_t *tables = decoder->tables + (size_t)s * decoder->pattern_bytes;
  slot->valid = false;
  keel_status status = decoder->code->ops->pattern_prepare(decoder->code, sources, missing,
                                                           missing_count, decoder->scratch, tables);
  if (status != KEEL_OK) return status;
  memcpy(slot->present, key, sizeof slot->present);
  slot->valid = true;
  *tables_p = tables;
  return KEEL_OK;
}

keel_status keel_ec_decode(keel_ec_decoder *decoder, size_t bytes, uint8_t *const *blocks,
                           const bool *present) {
  if (decoder == NULL || present == NULL) return keel__ec_invalid("keel_ec_decode: NULL argument");
  const keel_ec_code *code = decoder->code;
  int k = code->data_blocks, n = code->data_blocks + code->parity_blocks;
  if (!all_set((const void *const *)blocks, n))
    return keel__ec_invalid("keel_ec_decode: a NULL block");
  /* The first k present blocks are read: data before parity, so that with every data block
   * present nothing but the lost parity is computed. */
  int sources[KEEL_EC_MAX_BLOCKS], missing[KEEL_EC_MAX_BLOCKS];
  int source_count = 0, missing_count = 0;
  uint64_t key[KEY_WORDS] = {0};
  for (int i = 0; i < n; i++) {
    if (!present[i]) {
      missing[missing_count++] = i;
      continue;
    }
    key[i / 64] |= (uint64_t)1 << (i % 64);
    if (source_count < k) sources[source_count++] = i;
  }
  if (source_count < k) {
    KEEL_LOG_D(KEEL__EC_MODULE, "ec decode: %d of %d blocks present, %d needed", n - missing_count,
               n, k);
    return KEEL_EDATALOST;
  }
  if (missing_count == 0) return KEEL_OK;
  const uint8_t *tables = NULL;
  if (decoder->pattern_bytes > 0) {
    keel_status status = pattern_tables(decoder, key, sources, missing, missing_count, &tables);
    if (status != KEEL_OK) return status;
  }
  const uint8_t *inputs[KEEL_EC_MAX_BLOCKS];
  uint8_t *outputs[KEEL_EC_MAX_BLOCKS];
  for (int i = 0; i < k; i++) inputs[i] = blocks[sources[i]];
  for (int e = 0; e < missing_count; e++) outputs[e] = blocks[missing[e]];
  code->ops->reconstruct(code, tables, missing_count, bytes, inputs, outputs);
  return KEEL_OK;
}
