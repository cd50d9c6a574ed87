/* The DLRM example (docs/DLRM.md): trains a DLRM on synthetic click data, its parameters
 * behind a pluggable backend, and prints the held-out log-loss and AUC and a checksum of
 * every parameter and optimizer state. Worker placement comes from RANK and WORLD_SIZE. */
#include <stdio.h>
#include <stdlib.h>

#include "trainer.h"

/* This worker's rank and the number of workers: RANK and WORLD_SIZE when set; else, under
 * keel run, KEEL_UID of KEEL_WORLD (a worker's uid is its initial rank); 0 of 1 otherwise.
 * Returns false, after a message, when they are malformed. */
static bool worker_place(int *rank_p, int *world_p) {
  int64_t world = 1, rank = 0;
  bool launched = getenv("WORLD_SIZE") == NULL && getenv("KEEL_WORLD") != NULL;
  const char *world_name = launched ? "KEEL_WORLD" : "WORLD_SIZE";
  const char *rank_name = launched ? "KEEL_UID" : "RANK";
  if (keel_env_int(world_name, 1, 1 << 20, &world) != KEEL_OK ||
      keel_env_int(rank_name, 0, world - 1, &rank) != KEEL_OK) {
    fprintf(stderr, DLRM_PROGRAM ": %s must be in 0 .. %s - 1\n", rank_name, world_name);
    return false;
  }
  *rank_p = (int)rank;
  *world_p = (int)world;
  return true;
}

int main(int argc, char **argv) {
  dlrm_options options;
  int code = dlrm_options_parse(argc, argv, &options);
  if (code >= 0) return code;
  int rank, world;
  if (!worker_place(&rank, &world)) return 2;
  dlrm_trainer trainer;
  code = dlrm_trainer_setup(&trainer, &options, rank, world);
  if (code == 0)
    code = options.check_gradients ? dlrm_gradient_check(&trainer) : dlrm_trainer_run(&trainer);
  dlrm_trainer_release(&trainer);
  return code;
}
