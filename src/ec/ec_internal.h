/* Private to src/ec: the code object and the operations table each codec fills (codec_xor.c,
 * codec_rs.c); codec.c checks arguments, picks the codec and drives decoding through it. */
#ifndef KEEL_EC_INTERNAL_H
#define KEEL_EC_INTERNAL_H

#include "keel/ec.h"

#define KEEL__EC_MODULE "ec"
/* The most servers a job may have (int arithmetic on 2 * S must hold): a placement refuses
 * more, and server indexes on the wire are below it. */
#define KEEL__EC_SERVERS_LIMIT (1 << 30)

/* ISA-L takes lengths as int: the codecs feed it pieces of at most this many bytes. */
#define KEEL__EC_PIECE_BYTES ((size_t)1 << 30)

typedef struct keel__ec_ops keel__ec_ops;

struct keel_ec_code {
  const keel__ec_ops *ops;
  keel_ec_kind kind;
  int data_blocks;   /* k */
  int parity_blocks; /* r */
  /* RS only: the (k + r) x k generator [identity; Cauchy] and ISA-L's expanded tables of its
   * r parity rows (32 * k * r bytes). NULL for XOR. */
  uint8_t *matrix;
  uint8_t *tables;
};

/* A codec. Arguments are checked by codec.c; these only compute. Blocks are `bytes` long. */
struct keel__ec_ops {
  const char *name;
  /* Allocates code->matrix and code->tables as the codec needs; KEEL_ENOMEM. */
  keel_status (*setup)(keel_ec_code *code);
  void (*teardown)(keel_ec_code *code);
  void (*encode)(const keel_ec_code *code, size_t bytes, const uint8_t *const *data,
                 uint8_t *const *parity);
  /* Folds the delta of data block data_index into parity blocks first .. first + count - 1,
   * given as parity[0 .. count). */
  void (*update)(const keel_ec_code *code, int data_index, int first, int count, size_t bytes,
                 const uint8_t *delta, uint8_t *const *parity);
  /* Bytes of decode tables per erasure pattern (0: the codec needs none). */
  size_t (*pattern_bytes)(const keel_ec_code *code);
  /* Fills tables (pattern_bytes long) for rebuilding blocks missing[0 .. missing_count) from
   * blocks sources[0 .. k), using scratch (2 * k * k + r * k bytes). KEEL_EIO if the chosen
   * rows are singular (never for these codes). NULL when pattern_bytes is 0. */
  keel_status (*pattern_prepare)(const keel_ec_code *code, const int *sources, const int *missing,
                                 int missing_count, uint8_t *scratch, uint8_t *tables);
  /* outputs[i] = block missing[i], from the k sources, with the pattern's tables (NULL when
   * the codec needs none). */
  void (*reconstruct)(const keel_ec_code *code, const uint8_t *tables, int missing_count,
                      size_t bytes, const uint8_t *const *sources, uint8_t *const *outputs);
};

extern const keel__ec_ops keel__ec_xor_ops;
extern const keel__ec_ops keel__ec_rs_ops;

/* Logs what (a caller's mistake) and returns KEEL_EINVAL. */
keel_status keel__ec_invalid(const char *what);

/* target ^= source over bytes; the two must not overlap (the codecs' in-place fold). */
void keel__ec_xor_into(size_t bytes, uint8_t *target, const uint8_t *source);

#endif
