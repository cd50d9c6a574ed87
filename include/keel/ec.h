/* keel ec: the erasure-coded parameter store of ECRec (DESIGN.md). So far: the codec (k data
 * blocks, r parity blocks, exact codes over bits: XOR for r = 1, Reed-Solomon over GF(2^8)
 * through ISA-L), the rotating parity placement, and the per-row optimizers whose row blocks
 * (a row and its optimizer state) the parity covers; all on core only. */
#ifndef KEEL_EC_H
#define KEEL_EC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "keel/core.h"
#include "keel/net.h"
#include "keel/store.h"

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

/* keel_ec_update for one parity block alone, parity block parity_index (0 .. r-1): what a
 * server that holds that parity block does with a delta it receives. The same bytes as
 * keel_ec_update gives that block. KEEL_EINVAL for indexes out of range or NULL arguments. */
keel_status keel_ec_update_parity(const keel_ec_code *code, int data_index, int parity_index,
                                  size_t bytes, const uint8_t *delta, uint8_t *parity);

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
 * Returns KEEL_EDATALOST (not logged: the caller knows what it lost) when fewer than k blocks are
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

/* ---- per-row optimizers (ECRec §3.2). A server applies the optimizer to its own embedding
 * rows and sends the change of the row *and of its optimizer state* to the parity holders
 * (difference propagation): parity over the row alone would leave the state unrecoverable.
 * So a row and its state are one "row block" of bytes, and the change is old XOR new over
 * the whole block, which keel_ec_update folds into the parity; a block decoded from parity
 * is the row and its state, bit for bit, and training goes on from it exactly.
 *
 * The optimizers are PyTorch's (torch.optim, no weight decay), per element of a row of dim
 * f32 values, with parameter p, gradient g and the hyper-parameters of keel_ec_optimizer:
 *   KEEL_EC_SGD       torch.optim.SGD without momentum:
 *                       p = p - learning_rate * g
 *   KEEL_EC_MOMENTUM  torch.optim.SGD, dampening 0, no nesterov; velocity b, from 0:
 *                       b = momentum * b + g
 *                       p = p - learning_rate * b
 *                     (from b = 0 the first step gives b = g, PyTorch's clone of g, but for
 *                     a gradient of -0, which gives +0)
 *   KEEL_EC_ADAGRAD   torch.optim.Adagrad, lr_decay 0; accumulator s, from
 *                     initial_accumulator:
 *                       s = s + g * g
 *                       p = p - learning_rate * g / (sqrtf(s) + epsilon)
 *   KEEL_EC_ADAM      torch.optim.Adam, amsgrad off; moments m and v, from 0; t the row's
 *                     own step count (below), 1 at its first update:
 *                       step = learning_rate / (1 - power(beta1, t))    once per row
 *                       root = sqrtf(1 - power(beta2, t))               once per row
 *                       m = beta1 * m + (1 - beta1) * g
 *                       v = beta2 * v + (1 - beta2) * g * g
 *                       p = p - step * m / (sqrtf(v) / root + epsilon)
 *                     (PyTorch's _single_tensor_adam; it writes m as lerp(m, g, 1 - beta1),
 *                     the same value up to rounding)
 * These lines are the definition, bit for bit: every value but t is a float, each operation
 * is rounded to float and evaluated left to right (a * b / c is (a * b) / c), nothing is
 * contracted into FMA; 1 - beta1 is 1.0f - beta1; power(x, t) is by squaring, from the
 * lowest bit of t: result = 1, then for each bit, result *= x if it is set, and x *= x.
 * sqrtf is IEEE's correctly rounded root, so a block and a gradient give the same new block
 * on every machine. PyTorch's own numbers agree up to rounding, not bit for bit (it
 * computes its scalars, 1 - beta and the corrections, in double, and its vector kernels use
 * FMA).
 *
 * Bias correction, per row: a table's rows are updated only when a batch touches them, so
 * Adam's t is the number of updates of this row, kept in its block, not the trainer's
 * iteration: a row first touched at iteration 1000 is corrected as at t = 1, as if each row
 * were a parameter of its own in PyTorch. (With a shared t, once both powers are near 0, a
 * late row's first update would be uncorrected from m = v = 0: about learning_rate *
 * (1 - beta1) / sqrt(1 - beta2), 3.2 times learning_rate with the defaults, where the
 * corrected one is about learning_rate.) t stops at UINT64_MAX rather than wrap to 0.
 *
 * Row block layout (a format: its parity is stored, sent and decoded elsewhere). Every
 * field little-endian, f32 as IEEE binary32 bits; d = dim; offsets in bytes:
 *   [0, 4d)         the parameters p, in every kind (keel_ec_row_read needs no optimizer)
 *   SGD             then zero padding to a multiple of 8: 4d rounded up to 8 bytes
 *   MOMENTUM        [4d, 8d) the velocity b: 8d bytes
 *   ADAGRAD         [4d, 8d) the accumulator s: 8d bytes
 *   ADAM            [4d, 8d) m, [8d, 12d) v, zero padding to a multiple of 8, then t as a
 *                   u64 in the last 8 bytes: 12d rounded up to 8, plus 8
 * Padding bytes are zero from keel_ec_row_init on and never change (their delta is zero).
 * A multiple of 8 keeps t's 8 bytes aligned wherever the block is, at a cost of at most 4
 * bytes a row. A multiple of 32 (ISA-L's vector XOR alignment) would cost up to 28 (12% of
 * a 16-dim Adam row) for what only whole-group encoding and decoding gain; difference
 * propagation (keel_ec_update) and the delta here run at any alignment, and a store that
 * wants 32-byte slots can round its stride up itself. */
typedef enum keel_ec_optimizer_kind {
  /* 0 is no kind, so that a zeroed keel_ec_optimizer is refused rather than a no-op SGD */
  KEEL_EC_SGD = 1,
  KEEL_EC_MOMENTUM = 2,
  KEEL_EC_ADAGRAD = 3,
  KEEL_EC_ADAM = 4,
} keel_ec_optimizer_kind;

/* A hard maximum: far above any embedding, and it keeps every block length under 2^31. */
#define KEEL_EC_ROW_MAX_DIM (1 << 24)

/* An optimizer: its kind and hyper-parameters, plain values the caller owns. Fields that
 * the kind does not use are ignored. Valid (keel_ec_optimizer_check) when every field the
 * kind uses is finite and, as in PyTorch: learning_rate >= 0; momentum >= 0; 0 <= beta1,
 * beta2 < 1; initial_accumulator >= 0; epsilon > 0 (PyTorch allows 0, with which a zero
 * gradient on a fresh row is 0 / 0). */
typedef struct keel_ec_optimizer {
  keel_ec_optimizer_kind kind;
  float learning_rate;
  float momentum;            /* MOMENTUM */
  float epsilon;             /* ADAGRAD, ADAM */
  float initial_accumulator; /* ADAGRAD */
  float beta1, beta2;        /* ADAM */
} keel_ec_optimizer;

/* Fills *optimizer_p with kind, learning_rate and PyTorch's defaults for the rest (Adagrad:
 * epsilon 1e-10, initial_accumulator 0; Adam: beta1 0.9, beta2 0.999, epsilon 1e-8),
 * momentum 0.9 (PyTorch has no default; 0.9 is the usual one); unused fields 0. The caller
 * may change fields afterwards. KEEL_EINVAL (logged) for an unknown kind or a bad
 * learning_rate; *optimizer_p set only on success. */
keel_status keel_ec_optimizer_init(keel_ec_optimizer_kind kind, float learning_rate,
                                   keel_ec_optimizer *optimizer_p);
/* KEEL_OK when the optimizer is valid (above), KEEL_EINVAL (logged, with the rule it
 * breaks) otherwise. Every row function below checks its optimizer so. */
keel_status keel_ec_optimizer_check(const keel_ec_optimizer *optimizer);

/* The length of a row block of dim values (1 .. KEEL_EC_ROW_MAX_DIM) for the optimizer,
 * per the layout above, into *bytes_p (set only on success). KEEL_EINVAL (logged) for a
 * bad optimizer, dim or NULL. */
keel_status keel_ec_row_block_bytes(const keel_ec_optimizer *optimizer, int dim, size_t *bytes_p);

/* Writes a whole row block (keel_ec_row_block_bytes long, any alignment) of the dim
 * parameters: the optimizer state at its start (zero; Adagrad's accumulator at
 * initial_accumulator), t = 0, padding zero. KEEL_EINVAL (logged) for bad arguments, with
 * the block untouched. */
keel_status keel_ec_row_init(const keel_ec_optimizer *optimizer, int dim, const float *parameters,
                             uint8_t *block);

/* One optimizer step on one row: updates the row and its state in block (made by
 * keel_ec_row_init with the same kind and dim; the hyper-parameters, a learning rate say,
 * may change between steps) in place from the dim gradient values.
 * With delta not NULL, also writes old XOR new over the whole block (its length; zero where
 * nothing changed) in the same pass: the difference to send to the parity holders
 * (keel_ec_update). Neither block, gradient nor delta may overlap another. Allocates
 * nothing and does not block; one thread at a time per block, any number of threads on
 * different blocks with one optimizer. Non-finite gradients are applied as given.
 * KEEL_EINVAL (logged) for bad arguments, with nothing written. */
keel_status keel_ec_row_apply(const keel_ec_optimizer *optimizer, int dim, uint8_t *block,
                              const float *gradient, uint8_t *delta);

/* Copies the dim parameters out of a row block (of any kind: they lead every block), for a
 * pull. KEEL_EINVAL (logged) for a bad dim or NULL, with nothing written. */
keel_status keel_ec_row_read(int dim, const uint8_t *block, float *parameters);

/* The initial parameters of row row_index of a table made from seed: dim values uniform in
 * [-scale, scale), (2u - 1) * scale with u a multiple of 2^-24 drawn from keel_random seeded by
 * keel_random_seed_for(seed, row_index, 0). A pure function, so that every server and every worker
 * makes the same rows without sending them. KEEL_EINVAL (logged) for a bad dim, scale or NULL. */
keel_status keel_ec_row_initial(uint64_t seed, uint64_t row_index, int dim, float scale,
                                float *parameters);

/* ---- parameter servers (ECRec). S servers hold the embedding rows of every table (numbered
 * globally from 0, all of one dim) by the rotating placement above, each row as a row block
 * with its optimizer state, and the r parity blocks of every group; the dense parameters (one
 * row block of dense_count values) live on server 0, and on server 1 too when replicated. A
 * server that applies an update to its row sends the change (old XOR new of the block) to the
 * group's parity holders, which fold it in (difference propagation), so the parity stays the
 * code of the current rows, bit for bit.
 *
 * When a server is lost (its link breaks or it refuses connections), the first caller to see
 * it declares it lost in the job's store (ec/lost/<i>); from then on the first parity holder
 * of each group that is not lost acts for the group's lost rows: it decodes them on the fly
 * for reads (degraded reads) and for updates, and folds the change of an updated lost row
 * into the parity like any other. Up to r lost servers are tolerated; training never pauses.
 *
 * Synchronous mode (workers > 0): every worker sends every server one push per step (empty
 * where it has nothing for that server); a server applies a step once all workers' pushes of
 * the step are in, the gradients of a row summed in worker order, and answers them all after.
 * Every run of the same job then ends with the same bits, lost servers or not. Asynchronous
 * mode (workers = 0) applies each push as it comes. */
typedef struct keel_ec_config {
  int servers, data_blocks, parity_blocks; /* S, k, r */
  int dim;                                 /* floats per embedding row */
  keel_ec_optimizer optimizer;             /* for rows and the dense block */
  uint64_t total_rows;                     /* rows of all tables */
  uint64_t dense_count;                    /* dense parameters (0: none) */
  uint64_t seed;                           /* rows start as keel_ec_row_initial(seed, ..) */
  float init_scale;
  int workers;           /* synchronous mode's workers; 0: asynchronous */
  bool two_phase_commit; /* parity changes prepared everywhere before any is folded */
  bool replicate_dense;  /* the dense block on servers 0 and 1 */
  /* No parity at all: changes are not propagated and a lost server's rows are gone. No fault
   * tolerance: the baseline the benchmarks measure ECRec against. */
  bool without_parity;
  /* A replacement's rebuild (keel_ec_server_replace), local to the server that rebuilds and
   * never sent: groups rebuilt per round, each read together and installed under its lock
   * (0: 1024), and a pause after each round that leaves the other servers to training
   * (0: none). */
  uint32_t rebuild_chunk_groups;
  uint32_t rebuild_pause_ms;
} keel_ec_config;

/* The configuration in the job's store (key ec/config), for servers started before anyone
 * knows the tables' sizes: the first worker publishes it, the servers wait for it. publish
 * writes it once: KEEL_OK when it is there already and the same, KEEL_ECONFLICT when another
 * is there, KEEL_EINVAL (logged) for an invalid one. wait returns it once it is there,
 * KEEL_ETIMEDOUT at the deadline. */
keel_status keel_ec_config_publish(keel_store *directory, const keel_ec_config *config);
keel_status keel_ec_config_wait(keel_store *directory, int64_t deadline_ns,
                                keel_ec_config *config_p);

typedef struct keel_ec_server keel_ec_server;

/* Starts server `index` of config: its rows and parity blocks as the seed makes them, a
 * listener on listen_address ("host:port", port 0 picks one) that accepts links of the job
 * (auth), threads that serve them, and its address published in directory (the job's store,
 * which the server uses from its own threads; the caller keeps it open until the server is
 * stopped and uses it meanwhile only through keel_ec_server calls). KEEL_EINVAL (logged) for
 * a bad config or index, KEEL_ENOMEM, or the listener's or the store's status. */
keel_status keel_ec_server_start(const keel_ec_config *config, int index,
                                 const char *listen_address, keel_store *directory,
                                 const keel_auth *auth, keel_ec_server **server_p);
/* Starts server `index` as the replacement of a lost one (docs/ECREC.md): it declares the
 * old one lost if nobody has, takes its place in the directory as REBUILDING (rows still
 * served through the parity, every change sent to it too), rebuilds its rows and parity
 * blocks from the others in the background while training goes on, and is then REBUILT; the
 * first worker moves it back at a step boundary, from which it serves its rows. Synchronous
 * jobs only, and not a server that holds the dense block (KEEL_ENOTSUP, logged). */
keel_status keel_ec_server_replace(const keel_ec_config *config, int index,
                                   const char *listen_address, keel_store *directory,
                                   const keel_auth *auth, keel_ec_server **server_p);
const char *keel_ec_server_address(const keel_ec_server *server);
/* Writes the server's rows and dense block to path (created or replaced: written to a
 * temporary file, synced, renamed), each stripe of rows copied under its lock while training
 * goes on: the checkpoint-to-disk baseline that ECRec is measured against. *bytes_p
 * (optional): bytes written. KEEL_EIO / KEEL_ENOSPC and the like from the file system. */
keel_status keel_ec_server_checkpoint(keel_ec_server *server, const char *path, uint64_t *bytes_p);
/* Stops accepting, closes every link, joins the threads, frees everything. NULL is fine. */
void keel_ec_server_stop(keel_ec_server *server);
/* Which of the job's `servers` do not fully serve their rows now, as the directory (the job's
 * store) says: lost, or a replacement not yet back for good (rebuilding, rebuilt, or back
 * from a step whose mark has not gone yet, two steps after it). A server that died but that
 * nobody declared lost yet reads as serving. down[i] for i < servers. */
keel_status keel_ec_servers_down(keel_store *directory, int servers, bool *down);

typedef struct keel_ec_client keel_ec_client;

/* A worker's client of the servers the directory names. It asks a server for the
 * configuration (*config_p, optional) and checks that every server it reaches has the same.
 * worker: this worker's index (< workers in synchronous mode). */
keel_status keel_ec_client_open(keel_store *directory, const keel_auth *auth, int worker,
                                keel_ec_config *config_p, keel_ec_client **client_p);
/* For a worker of `keel run --servers S --ec k=K,r=R`: fills config's servers, data_blocks,
 * parity_blocks and workers (0 unless the job is synchronous) from what keel run sets
 * (KEEL_EC_SERVERS, KEEL_EC_DATA_BLOCKS, KEEL_EC_PARITY_BLOCKS, KEEL_EC_WORKERS), leaving the
 * rest (the tables' shape, the optimizer) as the caller set it. KEEL_ENOTFOUND when the job
 * has no parameter servers, KEEL_EINVAL (logged) for a malformed variable. */
keel_status keel_ec_config_from_env(keel_ec_config *config);
/* keel_ec_config_from_env, then a client through the job's store (KEEL_STORE, KEEL_JOB_ID,
 * KEEL_JOB_TOKEN), which the client owns: publishes the configuration (every worker may: the
 * same one is accepted) and opens the client as worker `worker`. */
keel_status keel_ec_client_open_env(const keel_ec_config *tables, int worker,
                                    keel_ec_client **client_p);
void keel_ec_client_close(keel_ec_client *client);
/* values[i * dim ..] = the parameters of rows[i]; rows strictly increasing, < total_rows. */
keel_status keel_ec_client_pull_rows(keel_ec_client *client, const uint64_t *rows, size_t count,
                                     float *values);
/* One optimizer step on each of rows (strictly increasing) from its gradient, the push of
 * `step` (synchronous mode: returns once every worker's push of the step is applied). */
keel_status keel_ec_client_push_rows(keel_ec_client *client, uint64_t step, const uint64_t *rows,
                                     size_t count, const float *gradients);
/* The dense parameters (dense_count floats). */
keel_status keel_ec_client_pull_dense(keel_ec_client *client, float *values);
keel_status keel_ec_client_push_dense(keel_ec_client *client, uint64_t step,
                                      const float *gradients);
/* Sets the dense parameters where they were never set (the first worker's call wins). */
keel_status keel_ec_client_init_dense(keel_ec_client *client, const float *values);
/* crc32c over every row block in row order (lost ones decoded), then the dense block:
 * parameters and optimizer state, bit for bit. */
keel_status keel_ec_client_checksum(keel_ec_client *client, uint32_t *crc32c_p);
/* Scrubs the parity: for every group, checks that each parity block the servers not lost hold
 * is the code of the group's rows (those lost decoded from the others), which difference
 * propagation and two-phase commit must keep true. *inconsistent_p: the groups where some
 * parity block is not. */
keel_status keel_ec_client_verify(keel_ec_client *client, uint64_t *inconsistent_p);
/* Servers this client has seen declared lost, as a bit set (bit i: server i). */
uint64_t keel_ec_client_lost(const keel_ec_client *client);

#ifdef __cplusplus
}
#endif
#endif
