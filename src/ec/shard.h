/* Private to src/ec: what one parameter server holds (its data rows and parity blocks in slots,
 * the dense block) and the local operations on them, under striped locks. No network: the
 * server (server.c) decides what to apply and where the changes go. */
#ifndef KEEL_EC_SHARD_H
#define KEEL_EC_SHARD_H

#include <pthread.h>

#include "ec/protocol.h"
#include "keel/ec.h"

#define KEEL__EC_STRIPES 256

typedef struct keel__ec_shard {
  keel_ec_layout layout;
  keel_ec_code *code;
  keel_ec_optimizer optimizer;
  int index; /* this server */
  int dim;
  size_t block_bytes;
  uint64_t groups;
  uint64_t data_rows, parity_rows; /* slots */
  uint8_t *data;                   /* data_rows blocks */
  uint8_t *parity;                 /* parity_rows blocks */
  /* Per parity slot, per data member: 1 + the step of the last change folded in from it (0:
   * none), so that a step redone for a lost row is not folded twice. */
  uint64_t *parity_steps;
  /* Per data slot: 1 + the step of the last change applied to the row (0: none). */
  uint64_t *data_steps;
  pthread_mutex_t stripes[KEEL__EC_STRIPES];
  /* The dense block, when this server holds it. */
  bool holds_dense, dense_set;
  /* 1 + the step of the last synchronous update in the dense block (0: none), under
   * dense_lock: a replica's copy of a later step replaces it (keel__ec_shard_dense_install). */
  uint64_t dense_stamp;
  uint64_t dense_count;
  size_t dense_block_bytes;
  uint8_t *dense;
  pthread_mutex_t dense_lock;
} keel__ec_shard;

/* Makes server index's shard of the configuration: every data row as keel_ec_row_initial
 * makes it, every parity block the code of its group's initial rows. */
keel_status keel__ec_shard_create(const keel__ec_config *config, int index, keel__ec_shard *shard);
void keel__ec_shard_destroy(keel__ec_shard *shard);

/* The block of (group, member) if this server holds it, else NULL. */
uint8_t *keel__ec_shard_block(keel__ec_shard *shard, uint64_t group, int member);
/* The stripe lock that guards every block of group. */
pthread_mutex_t *keel__ec_shard_lock(keel__ec_shard *shard, uint64_t group);
/* The parity step stamp of (group, parity member, data member); NULL when not held here. */
uint64_t *keel__ec_shard_parity_step(keel__ec_shard *shard, uint64_t group, int parity_member,
                                     int data_member);

/* The stamp of data row (group, member < k) held here; NULL when not held here. */
uint64_t *keel__ec_shard_data_step(keel__ec_shard *shard, uint64_t group, int member);
/* The k stamps of block (group, member) held here into stamps: a parity block's own, or a
 * data block's at its member's place and 0 elsewhere. Caller holds the group's lock. */
void keel__ec_shard_stamps(keel__ec_shard *shard, uint64_t group, int member, uint64_t *stamps);

/* Takes block, a copy of the dense block of stamp (1 + the step of its last update), unless
 * the one held is newer: a replacement's copy from the other holder, which may arrive after
 * the step's own update (the copy is then the same bytes). Caller holds dense_lock. */
void keel__ec_shard_dense_install(keel__ec_shard *shard, const uint8_t *block, uint64_t stamp);

/* One optimizer step on block from gradient; delta (block_bytes) gets old XOR new. */
keel_status keel__ec_shard_apply(keel__ec_shard *shard, uint8_t *block, const float *gradient,
                                 uint8_t *delta);
/* Folds delta of data member into the parity block (group, parity member) held here, or into
 * the data block itself when parity_member is data_member (a replacement's copy of a lost
 * row), and stamps it with step_mark (1 + step). A change whose stamp is not newer than the
 * block's for that member is in already and left out; step_mark 0 (asynchronous mode) always
 * folds and stamps nothing. Caller holds the group's lock. */
keel_status keel__ec_shard_fold(keel__ec_shard *shard, uint64_t group, int data_member,
                                int parity_member, const uint8_t *delta, uint64_t step_mark);

#endif
