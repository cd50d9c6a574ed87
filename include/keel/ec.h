/* keel ec: the erasure-coded parameter store of ECRec (DESIGN.md). This first piece is the
 * codec (k data blocks, r parity blocks, exact codes over bits: XOR for r = 1, Reed-Solomon
 * over GF(2^8) through ISA-L) and the rotating parity placement; both on core only. */
#ifndef KEEL_EC_H
#define KEEL_EC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "keel/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* k + r at most: GF(2^8) has 256 elements and the Cauchy rows need k + r distinct ones. */
#define KEEL_EC_MAX_BLOCKS 255

/* ---- codes. A code turns k data blocks of the same length into r parity blocks such that
 * any k of the k + r blocks give back the others, bit for bit. The parity bytes are a
 * format (they are stored, sent and decoded elsewhere), so the codes are fixed here:
 *   KEEL_EC_XOR (r = 1 only): parity = data[0] ^ data[1] ^ ... ^ data[k-1].
 *   KEEL_EC_RS: parity[p] = sum over j of c(p, j) * data[j] in GF(2^8) (polynomial 0x11d,
 *     sum is XOR), c(p, j) = 1 / ((k + p) ^ j): ISA-L's gf_gen_cauchy1_matrix. Any k of
 *     the k + r rows [identity; c] are invertible, so any k blocks decode. Note that RS with
 *     r = 1 is not the XOR code (its coefficients are not all 1).
 * Both are linear over XOR, which is what difference propagation needs: the parity of
 * (data with block i XORed with delta) is the old parity XORed with the parity of delta
 * alone at position i (keel_ec_update). */
typedef enum keel_ec_kind {
  KEEL_EC_AUTO = 0, /* XOR when r = 1, RS otherwise */
  KEEL_EC_XOR = 1,
  KEEL_EC_RS = 2,
} keel_ec_kind;

typedef struct keel_ec_code keel_ec_code;
typedef struct keel_ec_decoder keel_ec_decoder;

/* Makes a code of data_blocks (k >= 1) and parity_blocks (r >= 1), k + r <=
 * KEEL_EC_MAX_BLOCKS, of the given kind (XOR needs r = 1). Setup allocates every table the
 * code needs; encode and update allocate nothing. KEEL_EINVAL (logged) for bad arguments,
 * KEEL_ENOMEM; *code_p set only on success; the caller destroys it. A code is immutable
 * once made: any number of threads may encode and update with it at once. */
keel_status keel_ec_code_create(int data_blocks, int parity_blocks, keel_ec_kind kind,
                                keel_ec_code **code_p);
/* Frees the code (NULL is fine). Its decoders must be destroyed first. */
void keel_ec_code_destroy(keel_ec_code *code);
int keel_ec_code_data_blocks(const keel_ec_code *code);
int keel_ec_code_parity_blocks(const keel_ec_code *code);
/* KEEL_EC_XOR or KEEL_EC_RS (never AUTO), and its name ("xor", "rs"). */
keel_ec_kind keel_ec_code_kind(const keel_ec_code *code);
const char *keel_ec_code_name(const keel_ec_code *code);

/* Writes the r parity blocks of the k data blocks, each block `bytes` long (any length,
 * 0 included). Parity buffers must not overlap the data. Blocks aligned to 32 bytes take
 * ISA-L's vector XOR; any alignment works. KEEL_EINVAL for NULL arguments. */
keel_status keel_ec_encode(const keel_ec_code *code, size_t bytes, const uint8_t *const *data,
                           uint8_t *const *parity);

/* Difference propagation: data block data_index changed by delta (old XOR new, see
 * keel_ec_delta); folds delta into the r parity blocks in place, so that they equal the
 * parity of the new data. Order of updates does not matter (XOR commutes). delta must not
 * overlap the parity. KEEL_EINVAL for a data_index outside [0, k) or NULL arguments. */
keel_status keel_ec_update(const keel_ec_code *code, int data_index, size_t bytes,
                           const uint8_t *delta, uint8_t *const *parity);

/* delta = old XOR new, bytes long; delta may be the same buffer as old or new. */
void keel_ec_delta(size_t bytes, const uint8_t *old, const uint8_t *new_data, uint8_t *delta);

/* Decoding needs a matrix inverse per erasure pattern; a decoder holds the scratch for it
 * and the tables of the last `cache_patterns` patterns it saw (0: min(k + r, 16); XOR needs
 * none), so that degraded reads of many rows with one failed server invert once. It borrows
 * code, which must outlive it. Setup allocates; keel_ec_decode allocates nothing. One thread
 * at a time per decoder; make one per thread. KEEL_EINVAL, KEEL_ENOMEM; *decoder_p set only
 * on success. */
keel_status keel_ec_decoder_create(const keel_ec_code *code, int cache_patterns,
                                   keel_ec_decoder **decoder_p);
void keel_ec_decoder_destroy(keel_ec_decoder *decoder);

/* blocks: k + r pointers, the data blocks then the parity blocks, each `bytes` long;
 * present: k + r flags. Rebuilds every block whose flag is false (data or parity) in place,
 * in the buffer given for it, from the first k present blocks; present ones are only read.
 * Returns KEEL_EIO (not logged: the caller knows what it lost) when fewer than k blocks are
 * present, with nothing written; KEEL_EINVAL for NULL arguments. */
keel_status keel_ec_decode(keel_ec_decoder *decoder, size_t bytes, uint8_t *const *blocks,
                           const bool *present);

/* ---- parity placement: the rotating layout of ECRec (§3.2); with k + r = S it is RAID-5's
 * symmetric layout (parity one server further on for each group, data right after it).
 *
 * S servers; embedding rows are numbered globally from 0; row i is data position i % k of
 * group g = i / k (a table of N rows has ceil(N / k) groups; rows past N in its last group
 * count as zeros in the parity). Group g has n = k + r members: member m < k is its data row
 * at position m, member m >= k its parity block m - k. Member m of group g lives on
 *     server (g + m) mod S
 * so a group's members are n consecutive servers (distinct, since n <= S), starting one
 * server further on for each group: data on g, g+1, ..., g+k-1 and parity on g+k, ...,
 * g+n-1 (mod S). For k = 3, r = 1, S = 4: group 0 has data on servers 0, 1, 2 and parity
 * on 3; group 1 data on 1, 2, 3, parity on 0; and so on (the paper's Fig. 3).
 *
 * Load: over any S consecutive groups, every server holds exactly k data rows and r parity
 * rows (for a fixed server s, g runs over every residue, so (s - g) mod S takes each member
 * index once). Over groups [0, G), with G = q*S + e, a server holds q*k data rows plus
 * between max(0, k + e - S) and min(k, e) more, and q*r parity rows plus between
 * max(0, r + e - S) and min(r, e) more; some server is at each bound. A failed server s
 * shares groups with servers s-n+1 ... s+n-1 only; when n = S that is every other server.
 *
 * Slots: each server keeps its data rows and its parity rows in two arrays, ordered by
 * group; the slot of a block is its index there, dense from 0: for a table of G groups the
 * data slots of server s are exactly [0, data rows of s) (keel_ec_layout_count). */
typedef struct keel_ec_layout {
  int servers;       /* S */
  int data_blocks;   /* k */
  int parity_blocks; /* r */
} keel_ec_layout;

typedef enum keel_ec_role {
  KEEL_EC_DATA = 0,
  KEEL_EC_PARITY = 1,
} keel_ec_role;

/* One member of one group, and where it lives. */
typedef struct keel_ec_location {
  uint64_t group;
  int member;    /* < k: data position; >= k: parity block member - k */
  int server;    /* 0 .. S-1 */
  uint64_t slot; /* index among that server's data rows (member < k) or parity rows */
} keel_ec_location;

/* KEEL_EINVAL (logged) unless k >= 1, r >= 1, k + r <= min(S, KEEL_EC_MAX_BLOCKS); the
 * layout is written only on success. Every function below is pure arithmetic on it. */
keel_status keel_ec_layout_init(int servers, int data_blocks, int parity_blocks,
                                keel_ec_layout *layout_p);
/* Where member `member` (0 .. k+r-1) of group `group` lives. KEEL_EINVAL for a member out of
 * range. */
keel_status keel_ec_layout_locate(const keel_ec_layout *layout, uint64_t group, int member,
                                  keel_ec_location *location_p);
/* The data row `row`: group row / k, member row % k, its server and data slot. */
keel_status keel_ec_layout_locate_row(const keel_ec_layout *layout, uint64_t row,
                                      keel_ec_location *location_p);
/* The inverse, for a rebuild: the block that server keeps at slot of its data rows
 * (KEEL_EC_DATA) or parity rows (KEEL_EC_PARITY). KEEL_EINVAL for a server out of range,
 * KEEL_ERANGE when the group would pass UINT64_MAX. */
keel_status keel_ec_layout_locate_slot(const keel_ec_layout *layout, int server, keel_ec_role role,
                                       uint64_t slot, keel_ec_location *location_p);
/* How many data rows and parity rows server holds in a table of `groups` groups: its slots
 * are [0, *data_rows_p) and [0, *parity_rows_p); enumerating them with locate_slot lists
 * every (group, member) the server holds. */
keel_status keel_ec_layout_count(const keel_ec_layout *layout, int server, uint64_t groups,
                                 uint64_t *data_rows_p, uint64_t *parity_rows_p);

#ifdef __cplusplus
}
#endif
#endif
