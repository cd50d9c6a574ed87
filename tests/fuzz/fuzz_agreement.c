/* Fuzz target for what the agreement reads back from the store, written by other processes:
 * decisions, votes, and the runtime's notes of what a member holds. Each must be refused or
 * parsed into a value that formats back to text which parses to the same value; a parsed
 * decision also goes through the state plan every member computes from it. */
#include <stdlib.h>
#include <string.h>

#include "comm/comm_internal.h"
#include "fuzz_seed.h"
#include "runtime/runtime_internal.h"

#define MAX_TEXT ((size_t)1 << 20)

static void check_decision(const char *text) {
  static keel_decision decision, again;
  if (keel__decision_parse(text, &decision) != KEEL_OK) return;
  if (decision.member_count > KEEL_MAX_WORLD || decision.failed_count > KEEL_MAX_WORLD) abort();
  for (int m = 0; m < decision.member_count; m++) {
    if (decision.members[m] >= KEEL_MAX_UIDS) abort();
    if (strnlen(decision.notes[m], KEEL_NOTE_MAX) == KEEL_NOTE_MAX) abort();
  }
  keel_buffer formatted;
  keel_buffer_init(&formatted, KEEL_STORE_MAX_VALUE);
  if (keel__decision_format(&decision, &formatted) != KEEL_OK) abort();
  if (keel__decision_parse((const char *)formatted.data, &again) != KEEL_OK) abort();
  if (again.member_count != decision.member_count || again.epoch != decision.epoch ||
      again.flags != decision.flags || again.failed_count != decision.failed_count ||
      memcmp(again.members, decision.members, sizeof(uint32_t) * (size_t)decision.member_count) !=
          0)
    abort();
  for (int m = 0; m < decision.member_count; m++) {
    if (strcmp(again.notes[m], decision.notes[m]) != 0) abort();
  }
  keel_buffer_free(&formatted);
  /* Every member computes the plan from whatever won the agreement: it must hold up. */
  keel__state_plan plan;
  keel_status status = keel__state_plan_make(&decision, decision.member_count, &plan);
  if (status != KEEL_OK && status != KEEL_EPROTO && status != KEEL_ENOMEM) abort();
}

static void check_vote(const char *text) {
  keel_rebuild_vote vote, again;
  uint64_t epoch = 0, epoch_again = 0;
  int node = 0, node_again = 0;
  if (keel__vote_parse(text, &vote, &epoch, &node) != KEEL_OK) return;
  char formatted[512];
  if (keel__vote_format(&vote, epoch, node, formatted, sizeof formatted) != KEEL_OK) abort();
  if (keel__vote_parse(formatted, &again, &epoch_again, &node_again) != KEEL_OK) abort();
  if (epoch_again != epoch || again.flags != vote.flags || strcmp(again.note, vote.note) != 0 ||
      again.rebuild != vote.rebuild || again.admit_spares != vote.admit_spares)
    abort();
}

static void check_note(const char *text) {
  keel__position position, again;
  if (keel__position_parse(text, &position) != KEEL_OK) return;
  if (position.shards == 0 || position.shard >= position.shards) abort();
  char note[KEEL_NOTE_MAX];
  keel__position_note(&position, note, sizeof note);
  if (keel__position_parse(note, &again) != KEEL_OK) abort();
  if (again.version != position.version || again.shard != position.shard ||
      again.redo != position.redo || again.has_state != position.has_state)
    abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size > MAX_TEXT) return 0;
  char *text = malloc(size + 1);
  if (text == NULL) return 0;
  memcpy(text, data, size);
  text[size] = '\0';
  check_decision(text);
  check_vote(text);
  check_note(text);
  free(text);
  return 0;
}

size_t keel_fuzz_seed(int index, uint8_t *buffer, size_t capacity) {
  static const char *const seeds[] = {
      "epoch=7 round=0 rebuild=1 flags=1 replaced=1 joined=0 members=0,4,2,3 failed=1 "
      "notes=h1:v9:s0/2:c1:rA:i1:t0||h1:v9:s0/2:c1:rA:i1:t0|h0:v0:s1/2:c0:r0:i0:t1",
      "epoch=3 node=1 flags=4294967295 rebuild=1 shrink=0 spares=1 joiners=0 "
      "note=h1:v17:s1/4:c0:rS:i1:t0",
      "h1:v18446744073709551615:s1023/1024:c65535:rA:i1:t1",
  };
  return keel_fuzz_text_seed(seeds, sizeof seeds / sizeof seeds[0], index, buffer, capacity);
}
