/* The agreement's decision, as a pure function of a table of votes: given what every member
 * of the communicator voted (or that it is dead, or not heard from yet), the idle spares and
 * the waiting joiners, it says whether the round is settled and, if so, what the next epoch
 * is. The protocol around it (agree.c) makes exactly one decision win per round; this file
 * decides nothing about time, the store or the network, so its table tests cover every
 * order of arrivals and deaths. */
#include <string.h>

#include "comm/comm_internal.h"

/* A vote of another epoch (a stale key, a replayed message) is no vote of this one. */
static bool ballot_counts(const keel__decide_input *input, const keel__ballot *ballot) {
  return ballot->state == KEEL__BALLOT_CAST && ballot->vote_epoch == input->epoch;
}

/* With the node as the failure domain, a member on the node of a dead member is failed
 * too: its node is being fenced as a whole. */
static bool on_failed_node(const keel__decide_input *input, int node) {
  if (!input->node_domain || node < 0) return false;
  for (int i = 0; i < input->count; i++) {
    const keel__ballot *ballot = &input->ballots[i];
    if (ballot->state == KEEL__BALLOT_DEAD && ballot->node == node) return true;
  }
  return false;
}

static void member_add(keel_decision *decision, uint32_t uid, const char *note) {
  int index = decision->member_count++;
  decision->members[index] = uid;
  size_t length = strnlen(note, KEEL_NOTE_MAX - 1);
  memcpy(decision->notes[index], note, length);
  decision->notes[index][length] = '\0';
}

bool keel__decide(const keel__decide_input *input, keel_decision *decision) {
  bool failed[KEEL_MAX_WORLD];
  int failed_count = 0;
  if (input->count > KEEL_MAX_WORLD) return false;
  for (int i = 0; i < input->count; i++) {
    const keel__ballot *ballot = &input->ballots[i];
    failed[i] = ballot->state == KEEL__BALLOT_DEAD;
    if (!failed[i] && !ballot_counts(input, ballot)) return false; /* alive, not heard yet */
  }
  for (int i = 0; i < input->count; i++) {
    failed[i] = failed[i] || on_failed_node(input, input->ballots[i].node);
    failed_count += failed[i];
  }

  uint32_t flags = UINT32_MAX;
  bool rebuild = false, shrink_only = false, admit_spares = false, admit_joiners = false;
  for (int i = 0; i < input->count; i++) {
    if (failed[i]) continue;
    const keel_rebuild_vote *vote = &input->ballots[i].vote;
    flags &= vote->flags;
    rebuild |= vote->rebuild;
    shrink_only |= vote->shrink_only;
    admit_spares |= vote->admit_spares;
    admit_joiners |= vote->admit_joiners;
  }
  bool replace = rebuild && admit_spares && !shrink_only;
  if (replace && input->spare_count < failed_count && !input->waited_enough_for_spares)
    return false; /* a replacement is starting; give it time */

  memset(decision, 0, sizeof *decision);
  decision->epoch = input->epoch;
  decision->round = input->round;
  decision->rebuild = rebuild;
  decision->flags = flags;
  int spares_used = 0;
  for (int i = 0; i < input->count; i++) {
    const keel__ballot *ballot = &input->ballots[i];
    if (!failed[i]) {
      member_add(decision, ballot->uid, ballot->vote.note);
      continue;
    }
    decision->failed[decision->failed_count++] = ballot->uid;
    /* Without a rebuild the failed are only reported; with one, a spare takes the place. */
    if (replace && spares_used < input->spare_count)
      member_add(decision, input->spares[spares_used++], "");
  }
  /* A replace that found too few spares shrank the world; the spares that are there now
   * take it back to its size (appended: the survivors keep their ranks). */
  int refill = input->refill_world < KEEL_MAX_WORLD ? input->refill_world : KEEL_MAX_WORLD;
  while (replace && spares_used < input->spare_count && decision->member_count < refill)
    member_add(decision, input->spares[spares_used++], "");
  decision->replaced_count = spares_used;
  int limit = input->max_world < KEEL_MAX_WORLD ? input->max_world : KEEL_MAX_WORLD;
  for (int j = 0; rebuild && admit_joiners && j < input->joiner_count; j++) {
    if (decision->member_count >= limit) break;
    member_add(decision, input->joiners[j], "");
    decision->joined_count++;
  }
  return true;
}
