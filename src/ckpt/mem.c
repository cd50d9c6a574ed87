/* In-memory checkpoints, the worker's side (Gemini §3, §6): at every N-th step commit the
 * registered state is copied into one of the rank's three slots in the node's shared memory
 * (the others keep the two snapshots before); a new one is written only once the agent has
 * sent the one before it to every peer (or the agent stopped looking). As a state source it
 * restores a shard from the node's own slots first, then fetches it from a peer agent. */
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ckpt/mem_internal.h"

#define MODULE "mem"
#define SECOND_NS INT64_C(1000000000)
/* An agent that has not looked at its slots for this long is not waited for. */
#define AGENT_SILENT_NS (2 * SECOND_NS)
/* Events: the first save and then one in this many (the rest are counted in them). */
#define SAVE_EVENT_EVERY 50
#define FETCH_DEADLINE_NS (30 * SECOND_NS)
#define PROFILE_SAMPLES 32
/* The job's first steps are slower (caches, connections): not profiled. */
#define PROFILE_SKIPPED_STEPS 2

struct keel_ckpt_mem {
  keel_ctx *ctx;
  bool enabled;
  keel_ckpt_mem_config config;
  char directory[PATH_MAX];
  char persist_directory[PATH_MAX]; /* the agents' persistent tier; "" without one */
  int node;
  keel__ckpt_slot slots[KEEL__CKPT_OWN_SLOTS];
  keel__ckpt_slot control_slot;
  keel__ckpt_slot heartbeat_slot; /* the agent's; file -1 until it is found */
  uint32_t slot_rank;             /* the rank the slots are named for */
  bool slots_open;
  uint64_t saves;
  int64_t save_ns_total, wait_ns_total;
  keel_store *store; /* opened at the first fetch from a peer */
  /* Profiling the step's timeline (Gemini §5.4): this step's collectives (offsets from its
   * begin), and the sums over the steps seen so far with the same number of collectives. */
  bool observing, profiled;
  int64_t step_begin_ns;
  uint32_t collectives, profile_collectives, profile_samples, steps_seen;
  int64_t begin_ns[KEEL__CKPT_MAX_WINDOWS - 1], end_ns[KEEL__CKPT_MAX_WINDOWS - 1];
  /* The last PROFILE_SAMPLES typical steps (a ring): their median is the profile, so that
   * a slow first step or an outlier does not move the windows. */
  int64_t begin_samples_ns[KEEL__CKPT_MAX_WINDOWS - 1][PROFILE_SAMPLES];
  int64_t end_samples_ns[KEEL__CKPT_MAX_WINDOWS - 1][PROFILE_SAMPLES];
};

/* KEEL_CKPT lists the policies: "mem" is this one's. */
static bool policy_wanted(void) {
  const char *text = getenv("KEEL_CKPT");
  if (text == NULL) return false;
  char copy[256];
  snprintf(copy, sizeof copy, "%s", text);
  char *cursor = copy, *policy;
  while ((policy = strsep(&cursor, ",")) != NULL)
    if (strcmp(policy, "mem") == 0) return true;
  return false;
}

/* ---- the snapshot */

static void slots_close(keel_ckpt_mem *mem) {
  if (!mem->slots_open) return;
  for (int i = 0; i < KEEL__CKPT_OWN_SLOTS; i++) keel__ckpt_slot_close(&mem->slots[i]);
  keel__ckpt_slot_close(&mem->control_slot);
  mem->slots_open = false;
  if (mem->heartbeat_slot.file >= 0) keel__ckpt_slot_close(&mem->heartbeat_slot);
}

/* The rank's slots and control page, made at the first step or save (the registry's size is
 * known by then) and again when the rank changes (a spare that took one). */
static keel_status slots_open(keel_ckpt_mem *mem, uint32_t rank) {
  if (mem->slots_open && mem->slot_rank == rank) return KEEL_OK;
  slots_close(mem);
  size_t bytes = 0;
  keel_status status =
      keel_ckpt_memory_bytes(keel_state(mem->ctx), mem->config.chunk_bytes, &bytes);
  char name[64];
  for (int i = 0; status == KEEL_OK && i < KEEL__CKPT_OWN_SLOTS; i++) {
    snprintf(name, sizeof name, "rank-%" PRIu32 ".slot-%d", rank, i);
    mem->slots[i].file = -1;
    status = keel__ckpt_slot_open(mem->directory, name, bytes, &mem->slots[i]);
  }
  snprintf(name, sizeof name, "rank-%" PRIu32 ".control", rank);
  mem->control_slot.file = -1;
  if (status == KEEL_OK)
    status =
        keel__ckpt_slot_open(mem->directory, name, sizeof(keel__ckpt_control), &mem->control_slot);
  if (status != KEEL_OK) {
    KEEL_LOG_E(MODULE, "cannot make the snapshot slots of rank %" PRIu32 " in %s: %s", rank,
               mem->directory, keel_strerror(status));
    for (int i = 0; i < KEEL__CKPT_OWN_SLOTS; i++)
      if (mem->slots[i].region.base != NULL) keel__ckpt_slot_close(&mem->slots[i]);
    return status;
  }
  keel__ckpt_control *control = mem->control_slot.region.base;
  control->magic = KEEL__CKPT_CONTROL_MAGIC;
  control->version = 1;
  mem->slots_open = true;
  mem->slot_rank = rank;
  return KEEL_OK;
}

/* Whether the node's agent moved its heartbeat lately (its page is mapped when first seen). */
static bool agent_looking(keel_ckpt_mem *mem) {
  if (mem->heartbeat_slot.file < 0 &&
      keel__ckpt_slot_open(mem->directory, KEEL__CKPT_HEARTBEAT_NAME, 0, &mem->heartbeat_slot) !=
          KEEL_OK) {
    mem->heartbeat_slot.file = -1;
    return false;
  }
  if (mem->heartbeat_slot.region.bytes < sizeof(keel__ckpt_heartbeat)) return false;
  const keel__ckpt_heartbeat *heartbeat = mem->heartbeat_slot.region.base;
  int64_t seen = atomic_load_explicit(&heartbeat->agent_ns, memory_order_acquire);
  return seen != 0 && keel_now_ns() - seen < AGENT_SILENT_NS;
}

/* Tells the agent a snapshot was sealed (it sleeps until then). */
static void doorbell_ring(keel_ckpt_mem *mem) {
  if (!agent_looking(mem)) return;
  keel__ckpt_heartbeat *heartbeat = mem->heartbeat_slot.region.base;
  keel__ckpt_futex_ring(&heartbeat->doorbell);
}

/* Whether every peer holds what slot i holds (or the slot holds nothing yet). */
static bool slot_replicated(const keel_ckpt_mem *mem, int i) {
  const keel__ckpt_control *control = mem->control_slot.region.base;
  uint64_t seal = keel__ckpt_region_seal(&mem->slots[i].region);
  return seal == 0 || seal % 2 != 0 ||
         atomic_load_explicit(&control->replicated[i], memory_order_acquire) == seal;
}

/* Waits until slot i's snapshot is on every peer, while the agent is looking, at most the
 * job's collective deadline: the iteration's end, when the idle windows were too short. */
static void replicas_wait(keel_ckpt_mem *mem, int i) {
  if (mem->config.replicas <= 1) return;
  int64_t timeout = keel_comm_timeout(keel_world(mem->ctx));
  int64_t deadline = keel_deadline_after_ns(timeout > 0 ? timeout : 30 * SECOND_NS);
  keel__ckpt_control *control = mem->control_slot.region.base;
  for (;;) {
    uint32_t seen = atomic_load_explicit(&control->replicated_sequence, memory_order_acquire);
    if (slot_replicated(mem, i) || !agent_looking(mem)) return;
    if (keel_now_ns() >= deadline) {
      KEEL_LOG_W(MODULE, "slot %d of rank %" PRIu32 " was not replicated in time: reused", i,
                 mem->slot_rank);
      return;
    }
    /* Woken when the agent marks a copy done; the timeout looks at its heartbeat again. */
    keel__ckpt_futex_wait(&control->replicated_sequence, seen, 100 * 1000 * 1000);
  }
}

/* KEEL_FAULT point=mem_copy: after the first buffer is copied, the slot unsealed (a kill
 * there leaves a torn slot that no restore may use). */
static void copy_point(void *context, size_t buffer) {
  keel_ckpt_mem *mem = context;
  if (buffer == 0) keel_fault_point(mem->ctx, "mem_copy");
}

/* KEEL_FAULT corrupt@...,point=mem_saved: one byte of the last buffer flipped behind the
 * seal, so that only the chunk checksums can tell. */
static void slot_corrupt(keel_ckpt_mem *mem, int i) {
  keel_ckpt_region *region = &mem->slots[i].region;
  uint8_t *last = (uint8_t *)region->base + region->bytes - 1;
  *last ^= 0x5a;
  KEEL_LOG_W(MODULE, "injected fault: corrupted slot %d of rank %" PRIu32, i, mem->slot_rank);
}

static void save_report(keel_ckpt_mem *mem, uint64_t step, int64_t save_ns, int64_t wait_ns) {
  mem->saves++;
  mem->save_ns_total += save_ns;
  mem->wait_ns_total += wait_ns;
  if (mem->saves != 1 && mem->saves % SAVE_EVENT_EVERY != 0) return;
  char fields[320];
  snprintf(fields, sizeof fields,
           "\"step\":%" PRIu64 ",\"bytes\":%" PRIu64
           ",\"save_ms\":%.3f,\"wait_ms\":%.3f,"
           "\"saves\":%" PRIu64 ",\"mean_save_ms\":%.3f,\"mean_wait_ms\":%.3f",
           step, keel_registry_bytes(keel_state(mem->ctx)), (double)save_ns / 1e6,
           (double)wait_ns / 1e6, mem->saves, (double)mem->save_ns_total / 1e6 / (double)mem->saves,
           (double)mem->wait_ns_total / 1e6 / (double)mem->saves);
  keel_report_event(mem->ctx, "mem_save", fields);
}

/* ---- the step's timeline, for the agent's schedule (Gemini §5.4) */

/* Adds the step just observed to the profile, if it had the profile's collectives. */
static void profile_add(keel_ckpt_mem *mem) {
  uint32_t count = mem->collectives;
  if (count == 0 || count > KEEL__CKPT_MAX_WINDOWS - 1) return;
  if (mem->profile_samples == 0) mem->profile_collectives = count;
  if (count != mem->profile_collectives) return; /* a redone step: not typical */
  uint32_t at = mem->profile_samples % PROFILE_SAMPLES;
  for (uint32_t i = 0; i < count; i++) {
    mem->begin_samples_ns[i][at] = mem->begin_ns[i];
    mem->end_samples_ns[i][at] = mem->end_ns[i];
  }
  mem->profile_samples++;
}

static int time_compare(const void *left, const void *right) {
  int64_t a = *(const int64_t *)left, b = *(const int64_t *)right;
  return (a > b) - (a < b);
}

/* The median of the first count samples (sorted in place). */
static int64_t samples_median(int64_t *samples, uint32_t count) {
  qsort(samples, count, sizeof *samples, time_compare);
  return samples[count / 2];
}

/* The idle windows from the mean timeline: before the first collective, between each two,
 * and after the last (until the step ends: unbounded), published for the agent. */
static void profile_publish(keel_ckpt_mem *mem) {
  keel__ckpt_control *control = mem->control_slot.region.base;
  uint32_t count = mem->profile_collectives, samples = mem->profile_samples;
  uint32_t kept = samples < PROFILE_SAMPLES ? samples : PROFILE_SAMPLES;
  int64_t previous_end = 0;
  for (uint32_t i = 0; i < count; i++) {
    int64_t begin = samples_median(mem->begin_samples_ns[i], kept);
    int64_t end = samples_median(mem->end_samples_ns[i], kept);
    control->window_start_ns[i] = previous_end;
    control->window_length_ns[i] = begin > previous_end ? begin - previous_end : 0;
    previous_end = end;
  }
  control->window_start_ns[count] = previous_end;
  control->window_length_ns[count] = INT64_MAX;
  atomic_store_explicit(&control->window_count, count + 1, memory_order_release);
  mem->profiled = true;
  char fields[160 + 48 * KEEL__CKPT_MAX_WINDOWS];
  int used = snprintf(fields, sizeof fields,
                      "\"steps\":%" PRIu32 ",\"collectives\":%" PRIu32
                      ",\"first_window_ms\":%.3f,\"last_window_start_ms\":%.3f,\"windows_ms\":[",
                      samples, count, (double)control->window_length_ns[0] / 1e6,
                      (double)previous_end / 1e6);
  /* Every window as [start, length], the last (unbounded) as [start]; the buffer holds
   * KEEL__CKPT_MAX_WINDOWS of them at 48 characters each. */
  for (uint32_t i = 0; i <= count && (size_t)used < sizeof fields; i++) {
    double start_ms = (double)control->window_start_ns[i] / 1e6;
    used += i < count ? snprintf(fields + used, sizeof fields - (size_t)used, "[%.3f,%.3f],",
                                 start_ms, (double)control->window_length_ns[i] / 1e6)
                      : snprintf(fields + used, sizeof fields - (size_t)used, "[%.3f]]", start_ms);
  }
  keel_report_event(mem->ctx, "mem_profile", fields);
}

static void mem_on_step_mark(void *arg, keel_step_mark mark, uint64_t step, uint32_t index,
                             int64_t now_ns) {
  keel_ckpt_mem *mem = arg;
  if (mark == KEEL_STEP_BEGIN) {
    int rank = keel_comm_rank(keel_world(mem->ctx));
    if (rank < 0 || slots_open(mem, (uint32_t)rank) != KEEL_OK) return;
    keel__ckpt_control *control = mem->control_slot.region.base;
    atomic_store_explicit(&control->step_begin_ns, now_ns, memory_order_relaxed);
    atomic_store_explicit(&control->step, step, memory_order_release);
    if (!mem->profiled && mem->config.profile_steps > 0) {
      if (mem->observing && mem->steps_seen++ >= PROFILE_SKIPPED_STEPS) profile_add(mem);
      if (mem->profile_samples >= mem->config.profile_steps) profile_publish(mem);
    }
    mem->observing = !mem->profiled && mem->config.profile_steps > 0;
    mem->step_begin_ns = now_ns;
    mem->collectives = 0;
    return;
  }
  if (!mem->observing || index >= KEEL__CKPT_MAX_WINDOWS - 1) {
    mem->observing = false; /* more collectives than windows: not profiled */
    return;
  }
  if (mark == KEEL_STEP_COLLECTIVE_BEGIN) {
    mem->begin_ns[index] = now_ns - mem->step_begin_ns;
  } else {
    mem->end_ns[index] = now_ns - mem->step_begin_ns;
    mem->collectives = index + 1;
  }
}

/* The commit of step s leaves the state at the start of step s + 1: saved under that name,
 * into slot (s + 1) / every % 3, once the snapshot before it is on every peer (the idle
 * windows of the step did not suffice when this waits: the iteration's end). */
static keel_status mem_on_commit(void *arg, uint64_t step) {
  keel_ckpt_mem *mem = arg;
  uint64_t next = step + 1;
  if (next % mem->config.every_steps != 0) return KEEL_OK;
  keel_ckpt_identity identity = keel__ckpt_identity_now(mem->ctx, next);
  keel_status status = slots_open(mem, identity.rank);
  if (status != KEEL_OK) return status;
  uint64_t turn = next / mem->config.every_steps;
  int slot = (int)(turn % KEEL__CKPT_OWN_SLOTS);
  int previous = (int)((turn + KEEL__CKPT_OWN_SLOTS - 1) % KEEL__CKPT_OWN_SLOTS);
  int64_t started = keel_now_ns();
  replicas_wait(mem, previous);
  int64_t copy_started = keel_now_ns();
  keel_fault_point(mem->ctx, "mem_save");
  status = keel__ckpt_memory_save_with(keel_state(mem->ctx), &identity, mem->config.chunk_bytes,
                                       &mem->slots[slot].region, copy_point, mem);
  if (status != KEEL_OK) return status;
  if (keel_fault_point(mem->ctx, "mem_saved")) slot_corrupt(mem, slot);
  doorbell_ring(mem);
  int64_t wait_ns = copy_started - started;
  int64_t save_ns = keel_now_ns() - copy_started;
  if (mem->config.blocking) {
    int64_t blocked = keel_now_ns();
    replicas_wait(mem, slot);
    wait_ns += keel_now_ns() - blocked;
  }
  save_report(mem, next, save_ns, wait_ns);
  return KEEL_OK;
}

/* ---- restore: the node's own slots, then the peers */

static void restore_report(keel_ckpt_mem *mem, const keel_ckpt_identity *used, const char *from,
                           int64_t elapsed_ns) {
  char fields[256];
  snprintf(fields, sizeof fields,
           "\"step\":%" PRIu64 ",\"shard\":%" PRIu32 ",\"from\":\"%s\",\"bytes\":%" PRIu64
           ",\"restore_ms\":%.3f",
           used->step, used->shard_index, from, keel_registry_bytes(keel_state(mem->ctx)),
           (double)elapsed_ns / 1e6);
  keel_report_event(mem->ctx, "mem_restore", fields);
  KEEL_LOG_I(MODULE, "shard %" PRIu32 " of step %" PRIu64 " restored from %s", used->shard_index,
             used->step, from);
}

/* The node's slots whose names start with prefix. Workers' own slots ("rank-") are read in
 * place: only their rank writes them, and it is in this recovery. Peers' copies ("peer-")
 * are staged first: the agent may be receiving a newer copy into one of them. */
static keel_status restore_slots(keel_ckpt_mem *mem, keel_registry *registry, const char *prefix,
                                 const keel_ckpt_selector *selector, keel_ckpt_identity *used) {
  keel__ckpt_slot *slots = NULL;
  size_t count = 0;
  keel_status status = keel__ckpt_slots_list(mem->directory, prefix, &slots, &count);
  if (status != KEEL_OK) return status;
  keel_ckpt_region *regions = calloc(count > 0 ? count : 1, sizeof *regions);
  if (regions == NULL) {
    keel__ckpt_slots_close(slots, count);
    return KEEL_ENOMEM;
  }
  for (size_t i = 0; i < count; i++) regions[i] = slots[i].region;
  status = strcmp(prefix, "rank-") == 0
               ? keel__ckpt_memory_restore_in_place(registry, regions, count, selector, used)
               : keel_ckpt_memory_restore(registry, regions, count, selector, used);
  free(regions);
  keel__ckpt_slots_close(slots, count);
  return status;
}

static keel_status restore_local(keel_ckpt_mem *mem, keel_registry *registry,
                                 const keel_ckpt_selector *selector, keel_ckpt_identity *used) {
  keel_status status = restore_slots(mem, registry, "rank-", selector, used);
  if (status != KEEL_OK) status = restore_slots(mem, registry, "peer-", selector, used);
  return status;
}

/* Receives a fetched region into memory of its own (it is checked by the restore). */
static keel_status fetch_receive(keel_link *link, uint64_t region_bytes, int64_t deadline,
                                 keel_ckpt_region *region) {
  uint8_t *base = aligned_alloc(64, (size_t)((region_bytes + 63) / 64 * 64));
  if (base == NULL) return KEEL_ENOMEM;
  uint64_t received = 0;
  keel_status status = KEEL_OK;
  while (status == KEEL_OK && received < region_bytes) {
    keel_frame frame;
    void *payload = NULL;
    status = keel_link_recv(link, &frame, &payload, deadline);
    if (status != KEEL_OK) break;
    if (frame.type != KEEL_FRAME_CKPT_DATA || frame.tag != received ||
        frame.length > region_bytes - received) {
      status = KEEL_EPROTO;
    } else {
      memcpy(base + received, payload, (size_t)frame.length);
      received += frame.length;
    }
    free(payload);
  }
  if (status == KEEL_OK) status = keel__ckpt_await_reply(link, KEEL__CKPT_FETCH, NULL, deadline);
  if (status != KEEL_OK) {
    free(base);
    return status;
  }
  *region = (keel_ckpt_region){.base = base, .bytes = (size_t)region_bytes};
  return KEEL_OK;
}

/* One call to a peer's service: a PROBE (the newest step there, in *step_p) or a FETCH (the
 * snapshot, restored into registry if it passes every check). */
static keel_status peer_call(const char *address, const keel__ckpt_request *request,
                             keel_registry *registry, const keel_ckpt_selector *selector,
                             keel_ckpt_identity *used, uint64_t *step_p) {
  keel_auth auth;
  keel_status status = keel_auth_from_env(&auth);
  if (status != KEEL_OK) return status;
  int64_t deadline = keel_deadline_after_ns(FETCH_DEADLINE_NS);
  keel_link *link = NULL;
  status = keel__ckpt_connect(address, &auth, keel_deadline_after_ns(SECOND_NS), &link);
  if (status != KEEL_OK) return status;
  uint64_t value = 0;
  status = keel__ckpt_send_request(link, request, deadline);
  if (status == KEEL_OK) status = keel__ckpt_await_reply(link, request->op, &value, deadline);
  if (request->op == KEEL__CKPT_PROBE) {
    keel_link_close(link);
    if (status == KEEL_OK) *step_p = value;
    return status;
  }
  if (status == KEEL_OK &&
      (value <= KEEL__CKPT_HEADER_BYTES || value > KEEL__CKPT_MAX_REGION_BYTES))
    status = KEEL_EPROTO;
  keel_ckpt_region region = {0};
  if (status == KEEL_OK) status = fetch_receive(link, value, deadline, &region);
  keel_link_close(link);
  if (status != KEEL_OK) return status;
  /* A private copy: nobody rewrites it. */
  status = keel__ckpt_memory_restore_in_place(registry, &region, 1, selector, used);
  free(region.base);
  return status;
}

static keel_status store_open(keel_ckpt_mem *mem) {
  if (mem->store != NULL) return KEEL_OK;
  keel_auth auth;
  keel_status status = keel_auth_from_env(&auth);
  const char *endpoint = getenv("KEEL_STORE");
  if (status == KEEL_OK && endpoint == NULL) status = KEEL_ENOTFOUND;
  if (status == KEEL_OK)
    status =
        keel_store_connect(endpoint, &auth, keel_deadline_after_ns(5 * SECOND_NS), &mem->store);
  if (status != KEEL_OK)
    KEEL_LOG_W(MODULE, "cannot ask the job's store where the peers are: %s", keel_strerror(status));
  return status;
}

/* Asks every other node's service in turn (node/<i> says where it listens): a FETCH stops at
 * the first that restores, a PROBE asks all and keeps the newest step. */
static keel_status peers_ask(keel_ckpt_mem *mem, const keel__ckpt_request *request,
                             keel_registry *registry, const keel_ckpt_selector *selector,
                             keel_ckpt_identity *used, uint64_t *step_p, char *from,
                             size_t from_bytes) {
  keel_status status = store_open(mem);
  if (status != KEEL_OK) return status;
  keel_store_entry *entries = NULL;
  size_t count = 0;
  status = keel_store_list(mem->store, "node/", &entries, &count, NULL);
  if (status != KEEL_OK) return status;
  status = KEEL_ENOTFOUND;
  bool fetch = request->op == KEEL__CKPT_FETCH;
  for (size_t i = 0; i < count && !(fetch && status == KEEL_OK); i++) {
    char address[128];
    int node = -1;
    if (sscanf(entries[i].key, "node/%d", &node) != 1 || node == mem->node) continue;
    if (!keel__ckpt_agent_address_parse((const char *)entries[i].value, entries[i].value_length,
                                        address, sizeof address))
      continue;
    uint64_t step = 0;
    keel_status answer = peer_call(address, request, registry, selector, used, &step);
    if (answer == KEEL_OK) {
      if (!fetch && (status != KEEL_OK || step > *step_p)) *step_p = step;
      if (fetch) snprintf(from, from_bytes, "node-%d", node);
      status = KEEL_OK;
    } else if (answer != KEEL_ENOTFOUND) {
      KEEL_LOG_W(MODULE, "asking node %d for shard %" PRIu32 ": %s", node, request->shard_index,
                 keel_strerror(answer));
    }
  }
  keel_store_entries_free(entries, count);
  return status;
}

static keel_status mem_restore(void *context, keel_registry *registry, uint32_t index,
                               uint32_t count, uint64_t step) {
  keel_ckpt_mem *mem = context;
  keel_ckpt_selector selector =
      keel__ckpt_selector_exact(keel_job_id(mem->ctx), index, count, step);
  keel_ckpt_identity used;
  int64_t started = keel_now_ns();
  keel_status status = restore_local(mem, registry, &selector, &used);
  if (status == KEEL_OK) {
    restore_report(mem, &used, "local", keel_now_ns() - started);
    return KEEL_OK;
  }
  char from[32];
  keel__ckpt_request fetch = {
      .op = KEEL__CKPT_FETCH, .shard_index = index, .shard_count = count, .step = step};
  status = peers_ask(mem, &fetch, registry, &selector, &used, NULL, from, sizeof from);
  if (status == KEEL_OK) restore_report(mem, &used, from, keel_now_ns() - started);
  return status == KEEL_OK ? KEEL_OK : KEEL_ENOTFOUND;
}

/* The newest step at or below max_step of the shard here (the node's slots) or on a peer. */
static keel_status mem_newest(void *context, uint32_t index, uint32_t count, uint64_t max_step,
                              uint64_t *step_p) {
  keel_ckpt_mem *mem = context;
  keel__ckpt_slot *slots = NULL;
  size_t slot_count = 0;
  bool found = false;
  if (keel__ckpt_slots_list(mem->directory, "", &slots, &slot_count) == KEEL_OK) {
    for (size_t i = 0; i < slot_count; i++) {
      keel_ckpt_identity identity;
      uint64_t seal = 0;
      if (keel__ckpt_region_identity(&slots[i].region, &identity, &seal) != KEEL_OK ||
          identity.job_id != keel_job_id(mem->ctx) || identity.shard_index != index ||
          identity.shard_count != count || identity.step > max_step)
        continue;
      if (!found || identity.step > *step_p) *step_p = identity.step;
      found = true;
    }
    keel__ckpt_slots_close(slots, slot_count);
  }
  keel__ckpt_request probe = {
      .op = KEEL__CKPT_PROBE, .shard_index = index, .shard_count = count, .step = max_step};
  uint64_t remote = 0;
  if (peers_ask(mem, &probe, NULL, NULL, NULL, &remote, NULL, 0) == KEEL_OK &&
      (!found || remote > *step_p)) {
    *step_p = remote;
    found = true;
  }
  return found ? KEEL_OK : KEEL_ENOTFOUND;
}

static const keel_state_source_ops mem_source = {
    .name = "memory",
    .restore = mem_restore,
    .newest = mem_newest,
};

/* ---- the persistent tier the agents write: when no copy in memory has a shard */

static keel_status persisted_restore(void *context, keel_registry *registry, uint32_t index,
                                     uint32_t count, uint64_t step) {
  keel_ckpt_mem *mem = context;
  keel_ckpt_selector selector =
      keel__ckpt_selector_exact(keel_job_id(mem->ctx), index, count, step);
  keel_ckpt_identity used;
  int64_t started = keel_now_ns();
  keel_status status =
      keel_ckpt_persistent_restore(registry, mem->persist_directory, &selector, &used);
  if (status != KEEL_OK) return KEEL_ENOTFOUND;
  KEEL_LOG_W(MODULE,
             "the job went back to step %" PRIu64
             " of the persistent tier (%s): no copy in memory had every shard",
             step, mem->persist_directory);
  restore_report(mem, &used, "persistent", keel_now_ns() - started);
  return KEEL_OK;
}

static keel_status persisted_newest(void *context, uint32_t index, uint32_t count,
                                    uint64_t max_step, uint64_t *step_p) {
  keel_ckpt_mem *mem = context;
  keel_ckpt_selector selector = {.job_id = keel_job_id(mem->ctx),
                                 .shard_index = index,
                                 .shard_count = count,
                                 .max_step = max_step};
  return keel_ckpt_persistent_newest(mem->persist_directory, &selector, step_p);
}

static const keel_state_source_ops persisted_source = {
    .name = "persistent",
    .restore = persisted_restore,
    .newest = persisted_newest,
};

/* ---- the public face */

static keel_status mem_configure(keel_ckpt_mem *mem) {
  char error[256];
  keel_status status = keel_ckpt_mem_config_parse(
      getenv("KEEL_CKPT_MEM") ? getenv("KEEL_CKPT_MEM") : "", &mem->config, error, sizeof error);
  if (status != KEEL_OK) {
    KEEL_LOG_E(MODULE, "KEEL_CKPT_MEM: %s", error);
    return status;
  }
  const char *directory = getenv("KEEL_CKPT_MEM_DIR");
  if (directory == NULL || *directory == '\0' || strlen(directory) >= sizeof mem->directory) {
    KEEL_LOG_E(MODULE, "in-memory checkpoints need the node's folder (KEEL_CKPT_MEM_DIR)");
    return KEEL_EINVAL;
  }
  snprintf(mem->directory, sizeof mem->directory, "%s", directory);
  const char *node = getenv("KEEL_NODE");
  int64_t value = 0;
  if (node != NULL && keel_parse_int(node, 0, 1 << 20, &value) != KEEL_OK) return KEEL_EINVAL;
  mem->node = (int)value;
  /* KEEL_CKPT_PERSIST: the agents keep a persistent tier in KEEL_CKPT_DIR. */
  const char *persist = getenv("KEEL_CKPT_DIR");
  if (getenv("KEEL_CKPT_PERSIST") != NULL && persist != NULL &&
      strlen(persist) < sizeof mem->persist_directory)
    snprintf(mem->persist_directory, sizeof mem->persist_directory, "%s", persist);
  status = keel_directory_make(mem->directory, 0700);
  if (status != KEEL_OK)
    KEEL_LOG_E(MODULE, "cannot make %s: %s", mem->directory, keel_strerror(status));
  return status;
}

keel_status keel_ckpt_mem_enable(keel_ctx *ctx, keel_ckpt_mem **mem_p) {
  if (ctx == NULL || mem_p == NULL) return KEEL_EINVAL;
  keel_ckpt_mem *mem = calloc(1, sizeof *mem);
  if (mem == NULL) return KEEL_ENOMEM;
  mem->ctx = ctx;
  for (int i = 0; i < KEEL__CKPT_OWN_SLOTS; i++) mem->slots[i].file = -1;
  mem->control_slot.file = -1;
  mem->heartbeat_slot.file = -1;
  if (!policy_wanted()) {
    *mem_p = mem;
    return KEEL_OK;
  }
  mem->enabled = true;
  keel_status status = mem_configure(mem);
  if (status == KEEL_OK) status = keel_on_commit(ctx, mem_on_commit, mem);
  if (status == KEEL_OK) status = keel_on_step_mark(ctx, mem_on_step_mark, mem);
  if (status == KEEL_OK) status = keel_state_source_add(ctx, &mem_source, mem);
  if (status == KEEL_OK && mem->persist_directory[0] != '\0')
    status = keel_state_source_add(ctx, &persisted_source, mem);
  if (status != KEEL_OK) {
    free(mem);
    return status;
  }
  *mem_p = mem;
  return KEEL_OK;
}

uint64_t keel_ckpt_mem_saves(const keel_ckpt_mem *mem) { return mem == NULL ? 0 : mem->saves; }

void keel_ckpt_mem_destroy(keel_ckpt_mem *mem) {
  if (mem == NULL) return;
  slots_close(mem);
  keel_store_close(mem->store);
  free(mem);
}
