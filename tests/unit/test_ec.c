/* Unit tests of the ec layer's first piece: the codes against a plain GF(2^8) reference
 * written here (not ISA-L's), decoding of every erasure pattern, difference propagation
 * against re-encoding, the errors, and the rotating parity placement's invariants. Each case
 * is a named cmocka test; the file is its own ctest executable. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "keel/ec.h"

/* ---- a plain GF(2^8) with the polynomial x^8 + x^4 + x^3 + x^2 + 1 (0x11d), by log tables */

typedef struct gf_tables {
  uint8_t exp[512];
  int log[256];
} gf_tables;

static gf_tables gf;

static void gf_build(void) {
  unsigned value = 1;
  for (int i = 0; i < 255; i++) {
    gf.exp[i] = (uint8_t)value;
    gf.log[value] = i;
    value <<= 1;
    if (value & 0x100) value ^= 0x11d;
  }
  for (int i = 255; i < 512; i++) gf.exp[i] = gf.exp[i - 255];
}

static uint8_t gf_multiply(uint8_t a, uint8_t b) {
  if (a == 0 || b == 0) return 0;
  return gf.exp[gf.log[a] + gf.log[b]];
}

static uint8_t gf_inverse(uint8_t a) { return gf.exp[255 - gf.log[a]]; }

/* The coefficient of data block j in parity block p, as keel/ec.h specifies the codes. */
static uint8_t coefficient(keel_ec_kind kind, int k, int p, int j) {
  return kind == KEEL_EC_XOR ? 1 : gf_inverse((uint8_t)((k + p) ^ j));
}

static void reference_encode(keel_ec_kind kind, int k, int r, size_t bytes, uint8_t *const *data,
                             uint8_t **parity) {
  for (int p = 0; p < r; p++) {
    memset(parity[p], 0, bytes);
    for (int j = 0; j < k; j++) {
      uint8_t c = coefficient(kind, k, p, j);
      for (size_t b = 0; b < bytes; b++) parity[p][b] ^= gf_multiply(c, data[j][b]);
    }
  }
}

/* ---- blocks: k + r buffers of one length, at a chosen offset from 64-byte alignment */

typedef struct block_set {
  int count;
  size_t bytes;
  uint8_t *base[KEEL_EC_MAX_BLOCKS];
  uint8_t *block[KEEL_EC_MAX_BLOCKS];
} block_set;

static void blocks_make(block_set *set, int count, size_t bytes, size_t offset) {
  set->count = count;
  set->bytes = bytes;
  size_t capacity = (bytes + offset + 63) / 64 * 64 + 64;
  for (int i = 0; i < count; i++) {
    set->base[i] = aligned_alloc(64, capacity);
    assert_non_null(set->base[i]);
    set->block[i] = set->base[i] + offset;
  }
}

static void blocks_free(block_set *set) {
  for (int i = 0; i < set->count; i++) free(set->base[i]);
}

static void fill_random(keel_random *random, uint8_t *block, size_t bytes) {
  for (size_t i = 0; i < bytes; i++) block[i] = (uint8_t)keel_random_next(random);
}

static void copy_blocks(block_set *to, const block_set *from) {
  for (int i = 0; i < from->count; i++) memcpy(to->block[i], from->block[i], from->bytes);
}

static void assert_blocks_equal(const block_set *a, const block_set *b) {
  for (int i = 0; i < a->count; i++) assert_memory_equal(a->block[i], b->block[i], a->bytes);
}

/* ---- the codes under test */

typedef struct code_case {
  int k, r;
} code_case;

static const code_case code_cases[] = {{1, 1}, {2, 1}, {4, 1}, {4, 2}, {6, 3}, {10, 4}};
static const size_t sizes[] = {0, 1, 31, 32, 33, 4096, 65537};
#define COUNT(array) (sizeof(array) / sizeof((array)[0]))

/* The kinds a case runs with: XOR and RS for r = 1, RS otherwise. */
static int kinds_of(const code_case *c, keel_ec_kind *kinds) {
  int count = 0;
  if (c->r == 1) kinds[count++] = KEEL_EC_XOR;
  kinds[count++] = KEEL_EC_RS;
  return count;
}

static keel_ec_code *code_make(int k, int r, keel_ec_kind kind) {
  keel_ec_code *code = NULL;
  assert_int_equal(keel_ec_code_create(k, r, kind, &code), KEEL_OK);
  assert_non_null(code);
  assert_int_equal(keel_ec_code_kind(code), kind);
  assert_int_equal(keel_ec_code_data_blocks(code), k);
  assert_int_equal(keel_ec_code_parity_blocks(code), r);
  return code;
}

/* Random data in the first k blocks of set, parity by the fast path in the last r. */
static void encode_random(keel_ec_code *code, keel_random *random, block_set *set) {
  int k = keel_ec_code_data_blocks(code);
  for (int j = 0; j < k; j++) fill_random(random, set->block[j], set->bytes);
  assert_int_equal(
      keel_ec_encode(code, set->bytes, (const uint8_t *const *)set->block, set->block + k),
      KEEL_OK);
}

/* Calls check with a fresh code for every case and each of its kinds, in that order, all
 * drawing from one stream seeded once: a test's random data depends on its seed alone. */
static void for_each_code(uint64_t seed,
                          void (*check)(keel_ec_code *code, int k, int r, keel_random *random)) {
  keel_random random;
  keel_random_seed(&random, seed);
  for (size_t c = 0; c < COUNT(code_cases); c++) {
    keel_ec_kind kinds[2];
    int kind_count = kinds_of(&code_cases[c], kinds);
    for (int t = 0; t < kind_count; t++) {
      keel_ec_code *code = code_make(code_cases[c].k, code_cases[c].r, kinds[t]);
      check(code, code_cases[c].k, code_cases[c].r, &random);
      keel_ec_code_destroy(code);
    }
  }
}

static void test_code_kinds_and_names(void **state) {
  (void)state;
  keel_ec_code *code = NULL;
  assert_int_equal(keel_ec_code_create(4, 1, KEEL_EC_AUTO, &code), KEEL_OK);
  assert_int_equal(keel_ec_code_kind(code), KEEL_EC_XOR);
  assert_string_equal(keel_ec_code_name(code), "xor");
  keel_ec_code_destroy(code);
  assert_int_equal(keel_ec_code_create(4, 2, KEEL_EC_AUTO, &code), KEEL_OK);
  assert_int_equal(keel_ec_code_kind(code), KEEL_EC_RS);
  assert_string_equal(keel_ec_code_name(code), "rs");
  keel_ec_code_destroy(code);
  assert_int_equal(keel_ec_code_create(4, 1, KEEL_EC_RS, &code), KEEL_OK);
  assert_int_equal(keel_ec_code_kind(code), KEEL_EC_RS);
  keel_ec_code_destroy(code);
  keel_ec_code_destroy(NULL);
}

/* The fast path (xor_gen, ec_encode_data) equals the plain reference bit for bit, aligned
 * (xor_gen's vector path) and one byte off (the plain path), at every size. */
static void check_encode_matches_reference(keel_ec_code *code, int k, int r, keel_random *random) {
  for (size_t s = 0; s < COUNT(sizes); s++) {
    for (size_t offset = 0; offset <= 1; offset++) {
      block_set set, expected;
      blocks_make(&set, k + r, sizes[s], offset);
      blocks_make(&expected, k + r, sizes[s], 0);
      encode_random(code, random, &set);
      copy_blocks(&expected, &set);
      reference_encode(keel_ec_code_kind(code), k, r, sizes[s], expected.block, expected.block + k);
      assert_blocks_equal(&set, &expected);
      blocks_free(&expected);
      blocks_free(&set);
    }
  }
}

static void test_encode_matches_reference(void **state) {
  (void)state;
  for_each_code(0xEC01, check_encode_matches_reference);
}

/* Calls visit for every subset of [0, n) of size 0 .. most, as a presence mask. */
static void for_each_pattern(int n, int most, bool *present, int start, int lost,
                             void (*visit)(void *context, const bool *present), void *context) {
  visit(context, present);
  if (lost == most) return;
  for (int i = start; i < n; i++) {
    present[i] = false;
    for_each_pattern(n, most, present, i + 1, lost + 1, visit, context);
    present[i] = true;
  }
}

typedef struct decode_context {
  keel_ec_decoder *decoder;
  const block_set *original;
  block_set *work;
  int patterns;
} decode_context;

/* Lost blocks are poisoned, decoded back, and every block compared with the original. */
static void decode_pattern(void *opaque, const bool *present) {
  decode_context *context = opaque;
  block_set *work = context->work;
  for (int i = 0; i < work->count; i++) {
    if (!present[i]) memset(work->block[i], 0xA5 ^ i, work->bytes);
  }
  assert_int_equal(keel_ec_decode(context->decoder, work->bytes, work->block, present), KEEL_OK);
  assert_blocks_equal(work, context->original);
  context->patterns++;
}

static int binomial(int n, int m) {
  long value = 1;
  for (int i = 1; i <= m; i++) value = value * (n - m + i) / i;
  return (int)value;
}

/* Every erasure pattern of up to r lost blocks, data or parity, decodes back bit for bit;
 * once through a decoder with the default cache and once through one that keeps a single
 * pattern (every pattern evicts the last). */
static void check_decode_every_pattern(keel_ec_code *code, int k, int r, keel_random *random) {
  int n = k + r;
  int expected_patterns = 0;
  for (int lost = 0; lost <= r; lost++) expected_patterns += binomial(n, lost);
  for (int cache = 0; cache <= 1; cache++) {
    keel_ec_decoder *decoder = NULL;
    assert_int_equal(keel_ec_decoder_create(code, cache, &decoder), KEEL_OK);
    for (size_t s = 0; s < COUNT(sizes); s++) {
      block_set original, work;
      blocks_make(&original, n, sizes[s], 0);
      blocks_make(&work, n, sizes[s], (size_t)cache); /* one byte off in the second run */
      encode_random(code, random, &original);
      copy_blocks(&work, &original);
      bool present[KEEL_EC_MAX_BLOCKS];
      for (int i = 0; i < n; i++) present[i] = true;
      decode_context context = {.decoder = decoder, .original = &original, .work = &work};
      for_each_pattern(n, r, present, 0, 0, decode_pattern, &context);
      assert_int_equal(context.patterns, expected_patterns);
      blocks_free(&work);
      blocks_free(&original);
    }
    keel_ec_decoder_destroy(decoder);
  }
}

static void test_decode_every_pattern(void **state) {
  (void)state;
  for_each_code(0xEC02, check_decode_every_pattern);
}

/* Difference propagation: random sequences of updates (whole blocks and short ranges, the
 * delta in its own buffer or in place of the old or the new block) leave the parity equal to
 * a fresh encoding of the current data. */
static void check_update_equals_reencode(keel_ec_code *code, int k, int r, keel_random *random) {
  int n = k + r;
  for (size_t s = 0; s < COUNT(sizes); s++) {
    size_t bytes = sizes[s];
    block_set set, fresh, scratch;
    blocks_make(&set, n, bytes, 0);
    blocks_make(&fresh, n, bytes, 0);
    blocks_make(&scratch, 2, bytes, 3); /* the new block and the delta */
    encode_random(code, random, &set);
    int updates = bytes > 4096 ? 12 : 40;
    for (int u = 0; u < updates; u++) {
      int index = (int)keel_random_below(random, (uint64_t)k);
      uint8_t *new_block = scratch.block[0], *delta = scratch.block[1];
      memcpy(new_block, set.block[index], bytes);
      /* A whole new block, or a few bytes of it changed (an optimizer step on a row). */
      if (bytes > 0 && keel_random_below(random, 2) == 0) {
        size_t at = (size_t)keel_random_below(random, bytes);
        size_t length = 1 + (size_t)keel_random_below(random, bytes - at);
        fill_random(random, new_block + at, length);
      } else {
        fill_random(random, new_block, bytes);
      }
      switch (keel_random_below(random, 3)) {
        case 0: /* apart */
          keel_ec_delta(bytes, set.block[index], new_block, delta);
          memcpy(set.block[index], new_block, bytes);
          break;
        case 1: /* in place of the new block: the data takes its copy first */
          memcpy(delta, set.block[index], bytes);
          memcpy(set.block[index], new_block, bytes);
          keel_ec_delta(bytes, delta, new_block, new_block);
          memcpy(delta, new_block, bytes);
          break;
        default: /* in place of the old block */
          memcpy(delta, set.block[index], bytes);
          keel_ec_delta(bytes, delta, new_block, delta);
          memcpy(set.block[index], new_block, bytes);
          break;
      }
      if (keel_random_below(random, 2) == 0) {
        assert_int_equal(keel_ec_update(code, index, bytes, delta, set.block + k), KEEL_OK);
      } else {
        /* Each parity block on its own, as the server that holds it folds a delta. */
        for (int p = 0; p < r; p++)
          assert_int_equal(keel_ec_update_parity(code, index, p, bytes, delta, set.block[k + p]),
                           KEEL_OK);
      }
      if (u % 4 == 3 || u == updates - 1) {
        copy_blocks(&fresh, &set);
        assert_int_equal(
            keel_ec_encode(code, bytes, (const uint8_t *const *)fresh.block, fresh.block + k),
            KEEL_OK);
        assert_blocks_equal(&set, &fresh);
      }
    }
    blocks_free(&scratch);
    blocks_free(&fresh);
    blocks_free(&set);
  }
}

static void test_update_equals_reencode(void **state) {
  (void)state;
  for_each_code(0xEC03, check_update_equals_reencode);
}

/* More than r lost: KEEL_EDATALOST and not a byte written. */
static void check_decode_too_many_erasures(keel_ec_code *code, int k, int r, keel_random *random) {
  int n = k + r;
  keel_ec_decoder *decoder = NULL;
  assert_int_equal(keel_ec_decoder_create(code, 0, &decoder), KEEL_OK);
  block_set set, before;
  blocks_make(&set, n, 100, 0);
  blocks_make(&before, n, 100, 0);
  encode_random(code, random, &set);
  for (int lost = r + 1; lost <= n; lost++) {
    for (int trial = 0; trial < 5; trial++) {
      bool present[KEEL_EC_MAX_BLOCKS];
      for (int i = 0; i < n; i++) present[i] = true;
      for (int gone = 0; gone < lost;) {
        int i = (int)keel_random_below(random, (uint64_t)n);
        if (present[i]) {
          present[i] = false;
          memset(set.block[i], 0x5A, set.bytes);
          gone++;
        }
      }
      copy_blocks(&before, &set);
      assert_int_equal(keel_ec_decode(decoder, set.bytes, set.block, present), KEEL_EDATALOST);
      assert_blocks_equal(&set, &before);
      encode_random(code, random, &set);
    }
  }
  blocks_free(&before);
  blocks_free(&set);
  keel_ec_decoder_destroy(decoder);
}

static void test_decode_too_many_erasures(void **state) {
  (void)state;
  for_each_code(0xEC04, check_decode_too_many_erasures);
}

/* The widest codes: presence keys past 64, 128 and 192 blocks, and random patterns of up to
 * r lost blocks. */
static void test_wide_codes(void **state) {
  (void)state;
  static const code_case wide[] = {{254, 1}, {200, 55}, {30, 225}, {127, 128}};
  keel_random random;
  keel_random_seed(&random, 0xEC05);
  for (size_t c = 0; c < COUNT(wide); c++) {
    int k = wide[c].k, r = wide[c].r, n = k + r;
    keel_ec_code *code = code_make(k, r, r == 1 ? KEEL_EC_XOR : KEEL_EC_RS);
    keel_ec_decoder *decoder = NULL;
    assert_int_equal(keel_ec_decoder_create(code, 2, &decoder), KEEL_OK);
    block_set original, work;
    blocks_make(&original, n, 97, 0);
    blocks_make(&work, n, 97, 0);
    encode_random(code, &random, &original);
    block_set expected;
    blocks_make(&expected, n, 97, 0);
    copy_blocks(&expected, &original);
    reference_encode(keel_ec_code_kind(code), k, r, 97, expected.block, expected.block + k);
    assert_blocks_equal(&original, &expected);
    blocks_free(&expected);
    for (int trial = 0; trial < 12; trial++) {
      copy_blocks(&work, &original);
      bool present[KEEL_EC_MAX_BLOCKS];
      for (int i = 0; i < n; i++) present[i] = true;
      int lost = 1 + (int)keel_random_below(&random, (uint64_t)r);
      for (int gone = 0; gone < lost;) {
        int i = (int)keel_random_below(&random, (uint64_t)n);
        if (present[i]) {
          present[i] = false;
          memset(work.block[i], 0, work.bytes);
          gone++;
        }
      }
      assert_int_equal(keel_ec_decode(decoder, work.bytes, work.block, present), KEEL_OK);
      assert_blocks_equal(&work, &original);
    }
    blocks_free(&work);
    blocks_free(&original);
    keel_ec_decoder_destroy(decoder);
    keel_ec_code_destroy(code);
  }
}

static void test_code_bad_arguments(void **state) {
  (void)state;
  keel_ec_code *sentinel = (keel_ec_code *)&sentinel, *code = sentinel;
  static const struct {
    int k, r;
    keel_ec_kind kind;
  } bad[] = {
      {0, 1, KEEL_EC_AUTO}, {1, 0, KEEL_EC_AUTO},    {-1, 2, KEEL_EC_RS},
      {4, -3, KEEL_EC_RS},  {200, 56, KEEL_EC_RS},   {255, 1, KEEL_EC_XOR},
      {4, 2, KEEL_EC_XOR},  {4, 1, (keel_ec_kind)7}, {1, 255, KEEL_EC_RS},
  };
  for (size_t i = 0; i < COUNT(bad); i++) {
    assert_int_equal(keel_ec_code_create(bad[i].k, bad[i].r, bad[i].kind, &code), KEEL_EINVAL);
    assert_ptr_equal(code, sentinel); /* untouched on error */
  }
  assert_int_equal(keel_ec_code_create(4, 1, KEEL_EC_AUTO, NULL), KEEL_EINVAL);

  assert_int_equal(keel_ec_code_create(4, 2, KEEL_EC_RS, &code), KEEL_OK);
  uint8_t blocks[6][8] = {{0}};
  uint8_t *pointers[6] = {blocks[0], blocks[1], blocks[2], blocks[3], blocks[4], blocks[5]};
  const uint8_t *const *data = (const uint8_t *const *)pointers;
  assert_int_equal(keel_ec_encode(code, 8, data, pointers + 4), KEEL_OK);
  assert_int_equal(keel_ec_encode(NULL, 8, data, pointers + 4), KEEL_EINVAL);
  assert_int_equal(keel_ec_encode(code, 8, NULL, pointers + 4), KEEL_EINVAL);
  assert_int_equal(keel_ec_encode(code, 8, data, NULL), KEEL_EINVAL);
  pointers[2] = NULL;
  assert_int_equal(keel_ec_encode(code, 8, data, pointers + 4), KEEL_EINVAL);
  pointers[2] = blocks[2];
  assert_int_equal(keel_ec_update(code, -1, 8, blocks[0], pointers + 4), KEEL_EINVAL);
  assert_int_equal(keel_ec_update(code, 4, 8, blocks[0], pointers + 4), KEEL_EINVAL);
  assert_int_equal(keel_ec_update(code, 0, 8, NULL, pointers + 4), KEEL_EINVAL);
  assert_int_equal(keel_ec_update(code, 3, 8, blocks[0], pointers + 4), KEEL_OK);
  assert_int_equal(keel_ec_update_parity(code, 4, 0, 8, blocks[0], blocks[4]), KEEL_EINVAL);
  assert_int_equal(keel_ec_update_parity(code, 0, -1, 8, blocks[0], blocks[4]), KEEL_EINVAL);
  assert_int_equal(keel_ec_update_parity(code, 0, 9, 8, blocks[0], blocks[4]), KEEL_EINVAL);
  assert_int_equal(keel_ec_update_parity(code, 0, 0, 8, blocks[0], NULL), KEEL_EINVAL);
  assert_int_equal(keel_ec_update_parity(code, 0, 0, 8, NULL, blocks[4]), KEEL_EINVAL);

  keel_ec_decoder *decoder_sentinel = (keel_ec_decoder *)&decoder_sentinel;
  keel_ec_decoder *decoder = decoder_sentinel;
  assert_int_equal(keel_ec_decoder_create(code, -1, &decoder), KEEL_EINVAL);
  assert_int_equal(keel_ec_decoder_create(code, 100000, &decoder), KEEL_EINVAL);
  assert_int_equal(keel_ec_decoder_create(NULL, 0, &decoder), KEEL_EINVAL);
  assert_ptr_equal(decoder, decoder_sentinel);
  assert_int_equal(keel_ec_decoder_create(code, 0, &decoder), KEEL_OK);
  bool present[6] = {true, false, true, true, true, true};
  assert_int_equal(keel_ec_decode(decoder, 8, pointers, NULL), KEEL_EINVAL);
  assert_int_equal(keel_ec_decode(decoder, 8, NULL, present), KEEL_EINVAL);
  assert_int_equal(keel_ec_decode(NULL, 8, pointers, present), KEEL_EINVAL);
  pointers[5] = NULL;
  assert_int_equal(keel_ec_decode(decoder, 8, pointers, present), KEEL_EINVAL);
  pointers[5] = blocks[5];
  assert_int_equal(keel_ec_decode(decoder, 8, pointers, present), KEEL_OK);
  keel_ec_decoder_destroy(decoder);
  keel_ec_decoder_destroy(NULL);
  keel_ec_code_destroy(code);

  /* The largest codes are fine. */
  assert_int_equal(keel_ec_code_create(254, 1, KEEL_EC_XOR, &code), KEEL_OK);
  keel_ec_code_destroy(code);
  assert_int_equal(keel_ec_code_create(1, 254, KEEL_EC_RS, &code), KEEL_OK);
  keel_ec_code_destroy(code);
}

/* ---- placement */

typedef struct layout_case {
  int servers, k, r;
} layout_case;

/* Every layout with S from 2 to 11, r from 1 to 3 and k + r <= S, through G groups (G runs
 * past three periods, so prefixes of every residue are seen). Checks, for each:
 *  - a group's k + r members are on distinct servers, member m of group g on (g + m) mod S;
 *  - locate_row(row) is locate(row / k, row % k) and locate_slot inverts locate;
 *  - a server's slots of each role over groups [0, G') are exactly [0, count(G')) for
 *    every prefix G' (dense), with count(G') from keel_ec_layout_count;
 *  - every window of S consecutive groups gives each server exactly k data and r parity
 *    rows, so over S * (k + r) groups all loads are equal;
 *  - over a prefix G' = q*S + e, data rows are q*k + [max(0, k + e - S), min(k, e)] and both
 *    ends are reached by some server (parity alike with r). */
static void check_layout(const layout_case *c) {
  int S = c->servers, k = c->k, r = c->r, n = k + r;
  keel_ec_layout layout;
  assert_int_equal(keel_ec_layout_init(S, k, r, &layout), KEEL_OK);
  uint64_t groups = (uint64_t)(3 * S + S / 2 + 1);
  /* seen[role][server][slot] */
  size_t per_server = (size_t)groups * (size_t)n;
  uint8_t *seen = calloc(2 * (size_t)S * per_server, 1);
  uint64_t *held = calloc(2 * (size_t)S, sizeof *held); /* rows held so far, per role */
  int *window = calloc(2 * (size_t)S, sizeof *window);
  assert_non_null(seen);
  assert_non_null(held);
  assert_non_null(window);
  for (uint64_t g = 0; g < groups; g++) {
    bool used[64] = {false};
    for (int m = 0; m < n; m++) {
      keel_ec_location where, back;
      assert_int_equal(keel_ec_layout_locate(&layout, g, m, &where), KEEL_OK);
      assert_true(where.group == g && where.member == m);
      assert_int_equal(where.server, (int)((g + (uint64_t)m) % (uint64_t)S));
      assert_false(used[where.server]);
      used[where.server] = true;
      if (m < k) {
        keel_ec_location by_row;
        assert_int_equal(keel_ec_layout_locate_row(&layout, g * (uint64_t)k + (uint64_t)m, &by_row),
                         KEEL_OK);
        assert_memory_equal(&by_row, &where, sizeof where);
      }
      keel_ec_role role = m < k ? KEEL_EC_DATA : KEEL_EC_PARITY;
      assert_int_equal(keel_ec_layout_locate_slot(&layout, where.server, role, where.slot, &back),
                       KEEL_OK);
      assert_memory_equal(&back, &where, sizeof where);
      /* Dense: groups are placed in order, so each new slot is the next one. */
      size_t at = ((size_t)role * (size_t)S + (size_t)where.server);
      assert_true(where.slot == held[at]);
      assert_true(where.slot < per_server);
      assert_int_equal(seen[at * per_server + where.slot], 0);
      seen[at * per_server + where.slot] = 1;
      held[at]++;
    }
    /* Prefix [0, g + 1): the counts, their bounds, and that the bounds are reached. */
    uint64_t prefix = g + 1, q = prefix / (uint64_t)S;
    int e = (int)(prefix % (uint64_t)S);
    for (int role = 0; role < 2; role++) {
      int length = role == 0 ? k : r;
      uint64_t low = q * (uint64_t)length + (uint64_t)(length + e - S > 0 ? length + e - S : 0);
      uint64_t high = q * (uint64_t)length + (uint64_t)(length < e ? length : e);
      uint64_t least = UINT64_MAX, most = 0;
      for (int s = 0; s < S; s++) {
        uint64_t data_rows, parity_rows;
        assert_int_equal(keel_ec_layout_count(&layout, s, prefix, &data_rows, &parity_rows),
                         KEEL_OK);
        uint64_t rows = role == 0 ? data_rows : parity_rows;
        assert_true(rows == held[(size_t)role * (size_t)S + (size_t)s]);
        assert_true(rows >= low && rows <= high);
        least = rows < least ? rows : least;
        most = rows > most ? rows : most;
      }
      assert_true(least == low && most == high);
    }
  }
  /* Every window of S consecutive groups. */
  for (uint64_t start = 0; start + (uint64_t)S <= groups; start++) {
    memset(window, 0, 2 * (size_t)S * sizeof *window);
    for (uint64_t g = start; g < start + (uint64_t)S; g++) {
      for (int m = 0; m < n; m++) {
        keel_ec_location where;
        assert_int_equal(keel_ec_layout_locate(&layout, g, m, &where), KEEL_OK);
        window[(m < k ? 0 : S) + where.server]++;
      }
    }
    for (int s = 0; s < S; s++) {
      assert_int_equal(window[s], k);
      assert_int_equal(window[S + s], r);
    }
  }
  /* Over S * (k + r) groups every server's load (data + parity rows) is the same. */
  for (int s = 0; s < S; s++) {
    uint64_t data_rows, parity_rows;
    assert_int_equal(
        keel_ec_layout_count(&layout, s, (uint64_t)S * (uint64_t)n, &data_rows, &parity_rows),
        KEEL_OK);
    assert_true(data_rows == (uint64_t)n * (uint64_t)k && parity_rows == (uint64_t)n * (uint64_t)r);
  }
  free(window);
  free(held);
  free(seen);
}

static void test_layout_invariants(void **state) {
  (void)state;
  int layouts = 0;
  for (int S = 2; S <= 11; S++) {
    for (int r = 1; r <= 3; r++) {
      for (int k = 1; k + r <= S; k++) {
        layout_case c = {S, k, r};
        check_layout(&c);
        layouts++;
      }
    }
  }
  assert_int_equal(layouts, 55 + 45 + 36); /* sum over S of S - r, for r = 1, 2, 3 */
}

/* The paper's Fig. 3 (k = 3, r = 1, 4 servers) and RAID-5's rotation: with k + r = S the
 * parity of group g is on server g - 1 and its data starts on server g. */
static void test_layout_paper_figure(void **state) {
  (void)state;
  keel_ec_layout layout;
  assert_int_equal(keel_ec_layout_init(4, 3, 1, &layout), KEEL_OK);
  static const int expected[4][4] = {{0, 1, 2, 3}, {1, 2, 3, 0}, {2, 3, 0, 1}, {3, 0, 1, 2}};
  for (int g = 0; g < 4; g++) {
    for (int m = 0; m < 4; m++) {
      keel_ec_location where;
      assert_int_equal(keel_ec_layout_locate(&layout, (uint64_t)g, m, &where), KEEL_OK);
      assert_int_equal(where.server, expected[g][m]);
      /* One parity row per server in these four groups; data rows in order of group. */
      uint64_t earlier = 0;
      for (int before = 0; before < g; before++) {
        for (int other = 0; other < 4; other++) {
          if (expected[before][other] == where.server && (other < 3) == (m < 3)) earlier++;
        }
      }
      assert_true(where.slot == earlier);
      if (m == 3) assert_true(where.slot == 0);
    }
  }
}

/* Groups and slots near the top of uint64_t: no overflow, and KEEL_ERANGE past it. */
static void test_layout_extremes(void **state) {
  (void)state;
  keel_ec_layout layout;
  assert_int_equal(keel_ec_layout_init(7, 4, 2, &layout), KEEL_OK);
  static const uint64_t groups[] = {UINT64_MAX, UINT64_MAX - 1, UINT64_MAX - 6, UINT64_MAX / 7};
  for (size_t i = 0; i < COUNT(groups); i++) {
    for (int m = 0; m < 6; m++) {
      keel_ec_location where, back;
      assert_int_equal(keel_ec_layout_locate(&layout, groups[i], m, &where), KEEL_OK);
      assert_true(where.slot <= where.group);
      assert_int_equal(
          keel_ec_layout_locate_slot(&layout, where.server, m < 4 ? KEEL_EC_DATA : KEEL_EC_PARITY,
                                     where.slot, &back),
          KEEL_OK);
      assert_memory_equal(&back, &where, sizeof where);
    }
  }
  keel_ec_location where;
  assert_int_equal(keel_ec_layout_locate_slot(&layout, 0, KEEL_EC_DATA, UINT64_MAX, &where),
                   KEEL_ERANGE);
  uint64_t data_rows, parity_rows;
  assert_int_equal(keel_ec_layout_count(&layout, 3, UINT64_MAX, &data_rows, &parity_rows), KEEL_OK);
  /* UINT64_MAX = 7q + 1: one more group, residue 0, which has data on server 3 (member 3)
   * and parity on servers 4 and 5. */
  assert_true(data_rows == UINT64_MAX / 7 * 4 + 1 && parity_rows == UINT64_MAX / 7 * 2);
  assert_int_equal(keel_ec_layout_locate_row(&layout, UINT64_MAX, &where), KEEL_OK);
  assert_true(where.group == UINT64_MAX / 4 && where.member == (int)(UINT64_MAX % 4));
}

static void test_layout_bad_arguments(void **state) {
  (void)state;
  keel_ec_layout layout = {.servers = -5}, sentinel = layout;
  static const layout_case bad[] = {
      {4, 4, 1},  {4, 0, 1}, {4, 3, 0},      {0, 1, 1},
      {-1, 1, 1}, {1, 1, 1}, {300, 200, 56}, {(1 << 30) + 1, 2, 1},
  };
  for (size_t i = 0; i < COUNT(bad); i++) {
    assert_int_equal(keel_ec_layout_init(bad[i].servers, bad[i].k, bad[i].r, &layout), KEEL_EINVAL);
    assert_memory_equal(&layout, &sentinel, sizeof layout);
  }
  assert_int_equal(keel_ec_layout_init(4, 2, 1, NULL), KEEL_EINVAL);
  assert_int_equal(keel_ec_layout_init(4, 2, 1, &layout), KEEL_OK);
  keel_ec_location where;
  uint64_t data_rows, parity_rows;
  assert_int_equal(keel_ec_layout_locate(&layout, 0, -1, &where), KEEL_EINVAL);
  assert_int_equal(keel_ec_layout_locate(&layout, 0, 3, &where), KEEL_EINVAL);
  assert_int_equal(keel_ec_layout_locate(&layout, 0, 0, NULL), KEEL_EINVAL);
  assert_int_equal(keel_ec_layout_locate(NULL, 0, 0, &where), KEEL_EINVAL);
  assert_int_equal(keel_ec_layout_locate_slot(&layout, 4, KEEL_EC_DATA, 0, &where), KEEL_EINVAL);
  assert_int_equal(keel_ec_layout_locate_slot(&layout, -1, KEEL_EC_DATA, 0, &where), KEEL_EINVAL);
  assert_int_equal(keel_ec_layout_locate_slot(&layout, 0, (keel_ec_role)2, 0, &where), KEEL_EINVAL);
  assert_int_equal(keel_ec_layout_count(&layout, 4, 10, &data_rows, &parity_rows), KEEL_EINVAL);
  assert_int_equal(keel_ec_layout_count(&layout, 0, 10, NULL, &parity_rows), KEEL_EINVAL);
  assert_int_equal(keel_ec_layout_init(255, 254, 1, &layout), KEEL_OK);
}

int main(void) {
  gf_build();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_code_kinds_and_names),
      cmocka_unit_test(test_encode_matches_reference),
      cmocka_unit_test(test_decode_every_pattern),
      cmocka_unit_test(test_update_equals_reencode),
      cmocka_unit_test(test_decode_too_many_erasures),
      cmocka_unit_test(test_wide_codes),
      cmocka_unit_test(test_code_bad_arguments),
      cmocka_unit_test(test_layout_invariants),
      cmocka_unit_test(test_layout_paper_figure),
      cmocka_unit_test(test_layout_extremes),
      cmocka_unit_test(test_layout_bad_arguments),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
