/* The Reed-Solomon code over GF(2^8) through ISA-L: the generator is ISA-L's Cauchy matrix
 * [identity; 1 / ((k + p) ^ j)], expanded once into the tables ec_encode_data reads.
 * Decoding inverts the k rows of the blocks it reads (gf_invert_matrix) into tables of its
 * own, built once per erasure pattern by the decoder (codec.c). */
#include <isa-l/erasure_code.h>
#include <stdlib.h>
#include <string.h>

#include "ec/ec_internal.h"

/* ISA-L expands each coefficient into 32 bytes of lookup tables. */
#define TABLE_BYTES_PER_COEFFICIENT 32

static keel_status rs_setup(keel_ec_code *code) {
  size_t k = (size_t)code->data_blocks, r = (size_t)code->parity_blocks;
  uint8_t *matrix = malloc((k + r) * k);
  if (matrix == NULL) return KEEL_ENOMEM;
  uint8_t *tables = malloc(TABLE_BYTES_PER_COEFFICIENT * k * r);
  if (tables == NULL) goto fail_free_matrix;
  gf_gen_cauchy1_matrix(matrix, (int)(k + r), (int)k);
  ec_init_tables((int)k, (int)r, matrix + k * k, tables);
  code->matrix = matrix;
  code->tables = tables;
  return KEEL_OK;

fail_free_matrix:
  free(matrix);
  return KEEL_ENOMEM;
}

static void rs_teardown(keel_ec_code *code) {
  free(code->tables);
  free(code->matrix);
}

/* outputs[0 .. rows) from the k inputs through tables (32 * k * rows bytes), in pieces ISA-L's
 * int lengths can take. ISA-L reads the inputs through non-const pointers; it writes only the
 * outputs. Lengths under 32 go to ISA-L's own base loop. */
static void encode_with(int k, int rows, const uint8_t *tables, size_t bytes,
                        const uint8_t *const *inputs, uint8_t *const *outputs) {
  unsigned char *in[KEEL_EC_MAX_BLOCKS], *out[KEEL_EC_MAX_BLOCKS];
  size_t done = 0;
  do {
    size_t piece = bytes - done;
    if (piece > KEEL__EC_PIECE_BYTES) piece = KEEL__EC_PIECE_BYTES;
    for (int j = 0; j < k; j++) in[j] = (unsigned char *)(uintptr_t)(inputs[j] + done);
    for (int p = 0; p < rows; p++) out[p] = outputs[p] + done;
    ec_encode_data((int)piece, k, rows, (unsigned char *)(uintptr_t)tables, in, out);
    done += piece;
  } while (done < bytes);
}

static void rs_encode(const keel_ec_code *code, size_t bytes, const uint8_t *const *data,
                      uint8_t *const *parity) {
  encode_with(code->data_blocks, code->parity_blocks, code->tables, bytes, data, parity);
}

/* GF(2^8) multiplication distributes over XOR, so folding c(p, i) * delta into parity p gives
 * the parity of the new data: that is what ec_encode_data_update does. */
static void rs_update(const keel_ec_code *code, int data_index, int first, int count, size_t bytes,
                      const uint8_t *delta, uint8_t *const *parity) {
  unsigned char *out[KEEL_EC_MAX_BLOCKS];
  /* The tables hold k coefficients of 32 bytes per parity row: rows from `first` on. */
  unsigned char *tables = code->tables + (size_t)first * (size_t)code->data_blocks * 32;
  size_t done = 0;
  do {
    size_t piece = bytes - done;
    if (piece > KEEL__EC_PIECE_BYTES) piece = KEEL__EC_PIECE_BYTES;
    for (int p = 0; p < count; p++) out[p] = parity[p] + done;
    ec_encode_data_update((int)piece, code->data_blocks, count, data_index, tables,
                          (unsigned char *)(uintptr_t)(delta + done), out);
    done += piece;
  } while (done < bytes);
}

static size_t rs_pattern_bytes(const keel_ec_code *code) {
  return TABLE_BYTES_PER_COEFFICIENT * (size_t)code->data_blocks * (size_t)code->parity_blocks;
}

/* With S the k x k rows of the sources, data = S^-1 * sources; a lost data block m is row m
 * of S^-1, a lost parity block is its generator row times S^-1. */
static keel_status rs_pattern_prepare(const keel_ec_code *code, const int *sources,
                                      const int *missing, int missing_count, uint8_t *scratch,
                                      uint8_t *tables) {
  int k = code->data_blocks;
  size_t square = (size_t)k * (size_t)k;
  uint8_t *rows_of_sources = scratch, *inverse = scratch + square, *rows = scratch + 2 * square;
  for (int i = 0; i < k; i++) {
    memcpy(rows_of_sources + (size_t)i * k, code->matrix + (size_t)sources[i] * k, (size_t)k);
  }
  if (gf_invert_matrix(rows_of_sources, inverse, k) != 0) {
    KEEL_LOG_E(KEEL__EC_MODULE, "rs k=%d r=%d: the rows of the blocks read are singular", k,
               code->parity_blocks);
    return KEEL_EIO;
  }
  for (int e = 0; e < missing_count; e++) {
    uint8_t *row = rows + (size_t)e * k;
    if (missing[e] < k) {
      memcpy(row, inverse + (size_t)missing[e] * k, (size_t)k);
      continue;
    }
    const uint8_t *generator = code->matrix + (size_t)missing[e] * k;
    for (int j = 0; j < k; j++) {
      uint8_t sum = 0;
      for (int t = 0; t < k; t++) sum ^= gf_mul(generator[t], inverse[(size_t)t * k + j]);
      row[j] = sum;
    }
  }
  ec_init_tables(k, missing_count, rows, tables);
  return KEEL_OK;
}

static void rs_reconstruct(const keel_ec_code *code, const uint8_t *tables, int missing_count,
                           size_t bytes, const uint8_t *const *sources, uint8_t *const *outputs) {
  encode_with(code->data_blocks, missing_count, tables, bytes, sources, outputs);
}

const keel__ec_ops keel__ec_rs_ops = {
    .name = "rs",
    .setup = rs_setup,
    .teardown = rs_teardown,
    .encode = rs_encode,
    .update = rs_update,
    .pattern_bytes = rs_pattern_bytes,
    .pattern_prepare = rs_pattern_prepare,
    .reconstruct = rs_reconstruct,
};
