/* Snapshot benchmark of the in-memory checkpoint tier (keel/ckpt.h, "the in-memory tier"):
 * keel_ckpt_memory_save of a model-like registry (params 1/4, Adam m 3/8, Adam v 3/8 of the
 * bytes, and an 8-byte step) into a pre-faulted slot in /dev/shm, as a worker does at each
 * commit, and the restore back into the registry (every chunk's crc32c checked) two ways:
 * in place, as `--ckpt mem` restores a rank's own slot, and staged, as the public
 * keel_ckpt_memory_restore does; beside memcpy of the same bytes into the same kind of
 * mapping (the goal: >= 0.8 of it). To show where the time goes: crc32c of the bytes alone,
 * memcpy into freshly allocated memory (the staging copy), and copy_crc (the save's loop
 * alone: keel_crc32c_copy, a streaming copy that checksums the same loads). The peer is torch.save
 * of float32 tensors of the same sizes to /dev/shm by /usr/bin/python3. Single thread. Each round
 * runs every operation once, so that a noisy neighbour slows them alike; one untimed round first,
 * then --repeat timed rounds: best and median, in GB/s (10^9 bytes) of the registered bytes. The
 * state is checked after every restore. Usage: mem_snapshot [--bytes SIZE] [--repeat R] [--chunk
 * SIZE] [--json] */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench_stats.h"
#include "ckpt/mem_internal.h"

#include "keel/ckpt.h"
#include "keel/core.h"

#define MAX_REPEAT 101
#define MIN_BYTES 64
/* The largest region a peer agent accepts (KEEL__CKPT_MAX_REGION_BYTES): one snapshot. */
#define MAX_BYTES ((uint64_t)64 << 30)
#define BUFFER_COUNT 4
#define PYTHON "/usr/bin/python3"
#define GIB 1073741824.0

extern char **environ;

typedef struct options {
  uint64_t bytes; /* of the three float tensors together (the step comes on top) */
  int64_t repeat;
  uint64_t chunk_bytes;
  bool json;
} options;

typedef enum operation {
  OPERATION_MEMCPY,
  OPERATION_SAVE,
  OPERATION_RESTORE,
  OPERATION_RESTORE_IN_PLACE,
  OPERATION_CRC,
  OPERATION_COPY_CRC,
  OPERATION_MEMCPY_FRESH,
  OPERATION_COUNT,
} operation;

typedef struct operation_info {
  const char *name;    /* table and --json key */
  const char *meaning; /* the table's legend */
} operation_info;

static const operation_info operations[OPERATION_COUNT] = {
    {"memcpy", "memcpy of every buffer into a pre-faulted /dev/shm mapping (the baseline)"},
    {"keel_save", "keel_ckpt_memory_save into a pre-faulted /dev/shm slot (what a commit does)"},
    {"keel_restore", "keel_ckpt_memory_restore from that slot (stage, check every crc, copy)"},
    {"keel_restore_in_place",
     "what --ckpt mem does with a rank's own slot: every crc checked in place, one copy"},
    {"crc32c", "keel_crc32c of every chunk, alone"},
    {"copy_crc", "keel_crc32c_copy of every chunk alone (the save's inner loop)"},
    {"memcpy_fresh", "malloc + memcpy into it + free (the restore's staging copy)"},
};

/* The registered state, as a model's (params, Adam's two moments, the step). */
static const char *const buffer_names[BUFFER_COUNT] = {"params", "adam_m", "adam_v", "step"};

typedef struct bench {
  const options *opts;
  keel_registry *registry;
  uint8_t *buffers[BUFFER_COUNT];
  size_t sizes[BUFFER_COUNT];
  uint64_t total; /* registered bytes */
  uint32_t reference_crc;
  uint32_t crc_folded, copy_crc_folded; /* the two crc operations' results: equal */
  char directory[PATH_MAX];             /* a temporary folder in /dev/shm */
  keel__ckpt_slot slot;                 /* keel's snapshot */
  keel__ckpt_slot target;               /* memcpy's */
  keel_ckpt_identity identity;
  double times_ns[OPERATION_COUNT][MAX_REPEAT];
} bench;

/* Best and median of one operation, in GB/s. */
typedef struct figure {
  double best_gbps, median_gbps;
} figure;

typedef struct huge_pages {
  char shmem_enabled[64], anon_enabled[64]; /* the kernel's choice, "never" ... */
  long shmem_pmd_kb, anon_huge_kb;          /* this process's, with the slots mapped */
} huge_pages;

typedef struct torch_result {
  bool ok;
  char why[256];    /* when not ok */
  char version[64]; /* torch.__version__ */
  figure save;      /* GB/s of the same registered bytes */
} torch_result;

/* ======================================================================== the state */

/* crc32c of every buffer back to back: what a restore must bring back. */
static uint32_t state_crc(const bench *b) {
  uint32_t crc = 0;
  for (int i = 0; i < BUFFER_COUNT; i++) crc = keel_crc32c(crc, b->buffers[i], b->sizes[i]);
  return crc;
}

/* The three tensors' float counts, and the step's 8 bytes; torch's peer gets the same. */
static void state_sizes(uint64_t bytes, size_t sizes[BUFFER_COUNT]) {
  uint64_t floats = bytes / 4;
  sizes[0] = (size_t)(floats / 4) * 4;
  sizes[1] = (size_t)(floats * 3 / 8) * 4;
  sizes[2] = (size_t)(floats - floats / 4 - floats * 3 / 8) * 4;
  sizes[3] = 8;
}

/* Random words: a crc or a copy of zeroes (or of one repeated value) proves nothing. */
static void fill_random(keel_random *random, uint8_t *data, size_t bytes) {
  size_t i = 0;
  for (; i + 8 <= bytes; i += 8) {
    uint64_t value = keel_random_next(random);
    memcpy(data + i, &value, 8);
  }
  for (; i < bytes; i++) data[i] = (uint8_t)keel_random_next(random);
}

static keel_status state_make(bench *b) {
  state_sizes(b->opts->bytes, b->sizes);
  keel_status status = keel_registry_create(&b->registry);
  keel_random random;
  keel_random_seed(&random, 0x5AFE5AFE);
  for (int i = 0; status == KEEL_OK && i < BUFFER_COUNT; i++) {
    b->buffers[i] = aligned_alloc(64, (b->sizes[i] + 63) / 64 * 64);
    if (b->buffers[i] == NULL) return KEEL_ENOMEM;
    fill_random(&random, b->buffers[i], b->sizes[i]);
    status = keel_registry_add(b->registry, buffer_names[i], b->buffers[i], b->sizes[i]);
    b->total += b->sizes[i];
  }
  b->reference_crc = state_crc(b);
  return status;
}

/* The slots, as a worker's (keel__ckpt_slot_open: MAP_SHARED | MAP_POPULATE, MADV_HUGEPAGE),
 * in a folder of our own. */
static keel_status slots_open(bench *b) {
  snprintf(b->directory, sizeof b->directory, "/dev/shm/keel-mem-snapshot.XXXXXX");
  if (mkdtemp(b->directory) == NULL) {
    b->directory[0] = '\0';
    return keel_status_from_errno(errno);
  }
  size_t bytes = 0;
  keel_status status = keel_ckpt_memory_bytes(b->registry, b->opts->chunk_bytes, &bytes);
  if (status == KEEL_OK)
    status = keel__ckpt_slot_open(b->directory, "rank-0.slot-0", bytes, &b->slot);
  if (status == KEEL_OK)
    status = keel__ckpt_slot_open(b->directory, "memcpy.slot", (size_t)b->total, &b->target);
  return status;
}

static void slot_remove(bench *b, keel__ckpt_slot *slot, const char *name) {
  char path[PATH_MAX + 32];
  if (slot->file >= 0) keel__ckpt_slot_close(slot);
  snprintf(path, sizeof path, "%s/%s", b->directory, name);
  (void)unlink(path); /* may never have been made */
}

/* Unmaps and removes the slots (the folder stays until bench_free: torch writes there). */
static void slots_close(bench *b) {
  if (b->directory[0] == '\0') return;
  slot_remove(b, &b->slot, "rank-0.slot-0");
  slot_remove(b, &b->target, "memcpy.slot");
}

static void bench_free(bench *b) {
  slots_close(b);
  if (b->directory[0] != '\0') {
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/torch.pt", b->directory);
    (void)unlink(path); /* left only by a peer that died mid-save */
    (void)rmdir(b->directory);
  }
  for (int i = 0; i < BUFFER_COUNT; i++) free(b->buffers[i]);
  keel_registry_destroy(b->registry);
}

/* ======================================================================== the operations */

static void copy_state(const bench *b, uint8_t *out) {
  for (int i = 0; i < BUFFER_COUNT; i++) {
    memcpy(out, b->buffers[i], b->sizes[i]);
    out += b->sizes[i];
  }
}

/* The crc of every chunk of every buffer, as keel_ckpt_manifest_build computes them. */
static uint32_t crc_chunks(const bench *b) {
  uint32_t folded = 0;
  for (int i = 0; i < BUFFER_COUNT; i++) {
    for (size_t start = 0; start < b->sizes[i]; start += b->opts->chunk_bytes) {
      size_t left = b->sizes[i] - start;
      size_t length = left < b->opts->chunk_bytes ? left : (size_t)b->opts->chunk_bytes;
      folded ^= keel_crc32c(0, b->buffers[i] + start, length);
    }
  }
  return folded;
}

/* The save's inner loop alone: keel_crc32c_copy of each chunk (a streaming copy that
 * computes the crc from the same loads, three crc chains at once). */
static uint32_t copy_crc_pieces(const bench *b, uint8_t *out) {
  uint32_t folded = 0;
  for (int i = 0; i < BUFFER_COUNT; i++) {
    for (size_t start = 0; start < b->sizes[i]; start += b->opts->chunk_bytes) {
      size_t left = b->sizes[i] - start;
      size_t length = left < b->opts->chunk_bytes ? left : (size_t)b->opts->chunk_bytes;
      folded ^= keel_crc32c_copy(0, out + start, b->buffers[i] + start, length);
    }
    out += b->sizes[i];
  }
  return folded;
}

static keel_status copy_fresh(const bench *b) {
  uint8_t *staging = malloc((size_t)b->total);
  if (staging == NULL) return KEEL_ENOMEM;
  copy_state(b, staging);
  /* The compiler may not see that nothing reads the copy: it must happen before the free. */
  __asm__ volatile("" : : "r"(staging) : "memory");
  free(staging);
  return KEEL_OK;
}

static keel_status restore(bench *b, bool in_place) {
  keel_ckpt_selector selector = {
      .job_id = b->identity.job_id, .shard_count = 1, .max_step = UINT64_MAX};
  keel_ckpt_identity used;
  if (in_place)
    return keel__ckpt_memory_restore_in_place(b->registry, &b->slot.region, 1, &selector, &used);
  return keel_ckpt_memory_restore(b->registry, &b->slot.region, 1, &selector, &used);
}

static bool is_restore(operation op) {
  return op == OPERATION_RESTORE || op == OPERATION_RESTORE_IN_PLACE;
}

static keel_status run_once(bench *b, operation op) {
  switch (op) {
    case OPERATION_MEMCPY:
      copy_state(b, b->target.region.base);
      return KEEL_OK;
    case OPERATION_SAVE:
      return keel_ckpt_memory_save(b->registry, &b->identity, b->opts->chunk_bytes,
                                   &b->slot.region);
    case OPERATION_RESTORE:
    case OPERATION_RESTORE_IN_PLACE:
      return restore(b, op == OPERATION_RESTORE_IN_PLACE);
    case OPERATION_CRC:
      b->crc_folded = crc_chunks(b); /* kept: the work cannot be dropped */
      return KEEL_OK;
    case OPERATION_COPY_CRC:
      b->copy_crc_folded = copy_crc_pieces(b, b->target.region.base);
      return KEEL_OK;
    case OPERATION_MEMCPY_FRESH:
    case OPERATION_COUNT:
      break;
  }
  return copy_fresh(b);
}

/* A restore that writes nothing would look fast: the state is zeroed first (untimed) and
 * must come back whole. */
static void restore_prepare(bench *b) {
  for (int i = 0; i < BUFFER_COUNT; i++) memset(b->buffers[i], 0, b->sizes[i]);
}

static keel_status restore_check(const bench *b) {
  if (state_crc(b) == b->reference_crc) return KEEL_OK;
  fprintf(stderr, "mem_snapshot: the restored state differs from the saved one\n");
  return KEEL_ECORRUPT;
}

/* One round: every operation once; round < 0 is the untimed one. */
static keel_status run_round(bench *b, int64_t round) {
  for (int op = 0; op < OPERATION_COUNT; op++) {
    if (is_restore((operation)op)) restore_prepare(b);
    int64_t start = keel_now_ns();
    keel_status status = run_once(b, (operation)op);
    int64_t elapsed = keel_now_ns() - start;
    if (status == KEEL_OK && is_restore((operation)op)) status = restore_check(b);
    if (status != KEEL_OK) {
      fprintf(stderr, "mem_snapshot: %s: %s\n", operations[op].name, keel_strerror(status));
      return status;
    }
    if (round >= 0) b->times_ns[op][round] = (double)elapsed;
  }
  return KEEL_OK;
}

static figure figure_of(double *times_ns, int64_t count, uint64_t bytes) {
  qsort(times_ns, (size_t)count, sizeof *times_ns, bench_compare_doubles);
  return (figure){.best_gbps = (double)bytes / times_ns[0],
                  .median_gbps = (double)bytes / bench_median_sorted(times_ns, count)};
}

/* ======================================================================== huge pages */

static void read_word(const char *path, char *out, size_t capacity) {
  snprintf(out, capacity, "unknown");
  FILE *file = fopen(path, "r");
  if (file == NULL) return;
  char line[256];
  if (fgets(line, sizeof line, file) != NULL) {
    /* The kernel's choice is the bracketed word: "always within_size advise [never] ..." */
    char *open = strchr(line, '['), *close = open ? strchr(open, ']') : NULL;
    if (open != NULL && close != NULL)
      snprintf(out, capacity, "%.*s", (int)(close - open - 1), open + 1);
  }
  fclose(file);
}

/* Read while the slots are mapped: ShmemPmdMapped is the slots' huge pages (nothing else of
 * this process is shared memory), AnonHugePages the registered buffers'. */
static void huge_pages_read(huge_pages *pages) {
  read_word("/sys/kernel/mm/transparent_hugepage/shmem_enabled", pages->shmem_enabled,
            sizeof pages->shmem_enabled);
  read_word("/sys/kernel/mm/transparent_hugepage/enabled", pages->anon_enabled,
            sizeof pages->anon_enabled);
  pages->shmem_pmd_kb = pages->anon_huge_kb = -1;
  FILE *file = fopen("/proc/self/smaps_rollup", "r");
  if (file == NULL) return;
  char line[256];
  while (fgets(line, sizeof line, file) != NULL) {
    long kb;
    if (sscanf(line, "ShmemPmdMapped: %ld kB", &kb) == 1) pages->shmem_pmd_kb = kb;
    if (sscanf(line, "AnonHugePages: %ld kB", &kb) == 1) pages->anon_huge_kb = kb;
  }
  fclose(file);
}

/* ======================================================================== torch.save */

/* argv: params adam_m adam_v (float counts), repeat, path. Prints "skip <why>" or
 * "ok <version> <seconds per save>...", one untimed save first, as ours. */
static const char torch_script[] =
    "import os, sys, time\n"
    "try:\n"
    "    import torch\n"
    "except Exception as error:\n"
    "    print('skip cannot import torch:', error)\n"
    "    sys.exit(0)\n"
    "counts = [int(x) for x in sys.argv[1:4]]\n"
    "repeat, path = int(sys.argv[4]), sys.argv[5]\n"
    "generator = torch.Generator().manual_seed(0)\n"
    "state = {name: torch.rand(count, generator=generator)\n"
    "         for name, count in zip(('params', 'adam_m', 'adam_v'), counts)}\n"
    "state['step'] = torch.zeros(1, dtype=torch.int64)\n"
    "times = []\n"
    "for _ in range(repeat + 1):\n"
    "    start = time.perf_counter()\n"
    "    torch.save(state, path)\n"
    "    times.append(time.perf_counter() - start)\n"
    "    os.unlink(path)\n"
    "print('ok', torch.__version__, *times[1:])\n";

/* Runs argv with its stdout into out (capacity bytes, NUL-terminated); *exit_code_p is its
 * exit status, or -1 when it died of a signal. */
static keel_status spawn_capture(char *const *argv, char *out, size_t capacity, int *exit_code_p) {
  int pipe_ends[2];
  if (pipe(pipe_ends) != 0) return keel_status_from_errno(errno);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, pipe_ends[1], STDOUT_FILENO);
  posix_spawn_file_actions_addclose(&actions, pipe_ends[0]);
  pid_t child;
  int error = posix_spawn(&child, argv[0], &actions, NULL, argv, environ);
  posix_spawn_file_actions_destroy(&actions);
  close(pipe_ends[1]);
  if (error != 0) {
    close(pipe_ends[0]);
    return keel_status_from_errno(error);
  }
  size_t length = 0;
  ssize_t got;
  while ((got = read(pipe_ends[0], out + length, capacity - 1 - length)) != 0) {
    if (got < 0 && errno == EINTR) continue;
    if (got < 0 || length + (size_t)got >= capacity - 1) break;
    length += (size_t)got;
  }
  out[length] = '\0';
  close(pipe_ends[0]);
  int wait_status;
  while (waitpid(child, &wait_status, 0) < 0 && errno == EINTR) continue;
  *exit_code_p = WIFEXITED(wait_status) ? WEXITSTATUS(wait_status) : -1;
  return KEEL_OK;
}

/* "ok <version> <s> <s> ...": the save times of the peer. */
static bool torch_parse(const char *output, const bench *b, torch_result *result) {
  const char *line = strstr(output, "ok ");
  if (line == NULL) return false;
  line += 3;
  int used = 0;
  if (sscanf(line, "%63s%n", result->version, &used) != 1) return false;
  line += used;
  double times_ns[MAX_REPEAT];
  int64_t count = 0;
  double seconds;
  while (count < b->opts->repeat && sscanf(line, "%lf%n", &seconds, &used) == 1) {
    times_ns[count++] = seconds * 1e9;
    line += used;
  }
  if (count != b->opts->repeat) return false;
  result->save = figure_of(times_ns, count, b->total);
  return true;
}

static void torch_run(const bench *b, torch_result *result) {
  *result = (torch_result){0};
  if (access(PYTHON, X_OK) != 0) {
    snprintf(result->why, sizeof result->why, "no %s", PYTHON);
    return;
  }
  char counts[3][32], repeat[32], path[PATH_MAX + 32];
  for (int i = 0; i < 3; i++) snprintf(counts[i], sizeof counts[i], "%zu", b->sizes[i] / 4);
  snprintf(repeat, sizeof repeat, "%lld", (long long)b->opts->repeat);
  snprintf(path, sizeof path, "%s/torch.pt", b->directory);
  char *argv[] = {PYTHON, "-c", (char *)torch_script, counts[0], counts[1], counts[2], repeat,
                  path,   NULL};
  char output[8192];
  int exit_code = 0;
  keel_status status = spawn_capture(argv, output, sizeof output, &exit_code);
  if (status != KEEL_OK) {
    snprintf(result->why, sizeof result->why, "cannot start %s: %s", PYTHON, keel_strerror(status));
  } else if (strncmp(output, "skip ", 5) == 0) {
    snprintf(result->why, sizeof result->why, "%s: %.*s", PYTHON, (int)strcspn(output + 5, "\n"),
             output + 5);
  } else if (exit_code != 0) {
    snprintf(result->why, sizeof result->why, "%s exited with %d", PYTHON, exit_code);
  } else if (!torch_parse(output, b, result)) {
    snprintf(result->why, sizeof result->why, "%s printed no times", PYTHON);
  } else {
    result->ok = true;
  }
}

/* ======================================================================== output */

static double ratio(double numerator, double denominator) {
  return denominator > 0 ? numerator / denominator : 0;
}

/* The save is two passes over the source (crc, then copy): their times add up. */
static double serial_gbps(double first_gbps, double second_gbps) {
  return 1 / (1 / first_gbps + 1 / second_gbps);
}

static void table_print(const bench *b, const figure *figures, const torch_result *torch,
                        const huge_pages *pages) {
  const options *opts = b->opts;
  printf("# in-memory checkpoint tier: %" PRIu64 " bytes (params %zu, adam_m %zu, adam_v %zu, ",
         b->total, b->sizes[0], b->sizes[1], b->sizes[2]);
  printf("step 8), chunk %" PRIu64 ", %lld rounds after one untimed, one thread\n",
         opts->chunk_bytes, (long long)opts->repeat);
  printf("%-21s %10s %12s %8s %15s\n", "op", "best_GB/s", "median_GB/s", "s/GiB", "median/memcpy");
  double memcpy_gbps = figures[OPERATION_MEMCPY].median_gbps;
  for (int op = 0; op < OPERATION_COUNT; op++) {
    const figure *f = &figures[op];
    printf("%-21s %10.2f %12.2f %8.3f %15.2f\n", operations[op].name, f->best_gbps, f->median_gbps,
           GIB / 1e9 / f->median_gbps, ratio(f->median_gbps, memcpy_gbps));
  }
  if (torch->ok) {
    printf("%-21s %10.2f %12.2f %8.3f %15.2f\n", "torch.save", torch->save.best_gbps,
           torch->save.median_gbps, GIB / 1e9 / torch->save.median_gbps,
           ratio(torch->save.median_gbps, memcpy_gbps));
    printf("# keel_save / torch.save (torch %s, %s, to /dev/shm): %.2fx (median), %.2fx (best)\n",
           torch->version, PYTHON,
           ratio(figures[OPERATION_SAVE].median_gbps, torch->save.median_gbps),
           ratio(figures[OPERATION_SAVE].best_gbps, torch->save.best_gbps));
  } else {
    printf("%-21s MISSING: %s\n", "torch.save", torch->why);
  }
  printf(
      "# save and the in-place restore are one pass (keel_crc32c_copy: a streaming copy "
      "that checksums the same loads); copy_crc is that loop alone\n");
  printf(
      "# the staged restore (public keel_ckpt_memory_restore) pays a fresh staging copy: "
      "memcpy_fresh + crc32c + memcpy = %.2f GB/s expected, %.2f measured\n",
      serial_gbps(serial_gbps(figures[OPERATION_MEMCPY_FRESH].median_gbps,
                              figures[OPERATION_CRC].median_gbps),
                  memcpy_gbps),
      figures[OPERATION_RESTORE].median_gbps);
  printf(
      "# huge pages: shmem_enabled [%s], enabled [%s]; mapped now: ShmemPmdMapped %ld kB,"
      " AnonHugePages %ld kB\n",
      pages->shmem_enabled, pages->anon_enabled, pages->shmem_pmd_kb, pages->anon_huge_kb);
  for (int op = 0; op < OPERATION_COUNT; op++)
    printf("#   %-21s %s\n", operations[op].name, operations[op].meaning);
  printf("#   %-21s torch.save of float32 tensors of the same sizes, a dict, to /dev/shm\n",
         "torch.save");
}

static void figure_json(const char *name, const figure *f, double memcpy_gbps) {
  printf(",\"%s\":{\"best_gbps\":%.3f,\"median_gbps\":%.3f,\"ratio_memcpy\":%.3f}", name,
         f->best_gbps, f->median_gbps, ratio(f->median_gbps, memcpy_gbps));
}

static void json_print(const bench *b, const figure *figures, const torch_result *torch,
                       const huge_pages *pages) {
  const options *opts = b->opts;
  printf("{\"bench\":\"mem_snapshot\",\"bytes\":%" PRIu64 ",\"buffers\":%d,\"chunk_bytes\":%" PRIu64
         ",\"repeat\":%lld",
         b->total, BUFFER_COUNT, opts->chunk_bytes, (long long)opts->repeat);
  double memcpy_gbps = figures[OPERATION_MEMCPY].median_gbps;
  for (int op = 0; op < OPERATION_COUNT; op++)
    figure_json(operations[op].name, &figures[op], memcpy_gbps);
  if (torch->ok) {
    figure_json("torch_save", &torch->save, memcpy_gbps);
    printf(",\"torch_version\":\"%s\",\"save_over_torch\":%.3f", torch->version,
           ratio(figures[OPERATION_SAVE].median_gbps, torch->save.median_gbps));
  } else {
    /* The reason is our own text, but it quotes python's: keep it to safe characters. */
    char why[sizeof torch->why];
    snprintf(why, sizeof why, "%s", torch->why);
    for (char *c = why; *c; c++)
      if (*c == '"' || *c == '\\' || (unsigned char)*c < 0x20) *c = '\'';
    printf(",\"torch_save\":{\"missing\":\"%s\"}", why);
  }
  printf(
      ",\"hugepages\":{\"shmem_enabled\":\"%s\",\"enabled\":\"%s\",\"shmem_pmd_mapped_kb\":%ld,"
      "\"anon_huge_kb\":%ld}}\n",
      pages->shmem_enabled, pages->anon_enabled, pages->shmem_pmd_kb, pages->anon_huge_kb);
}

/* ======================================================================== main */

static int parse_options(int argc, char **argv, options *opts) {
  *opts = (options){
      .bytes = (uint64_t)1 << 30, .repeat = 5, .chunk_bytes = KEEL_CKPT_DEFAULT_CHUNK_BYTES};
  static const struct option long_options[] = {{"json", no_argument, 0, 'j'},
                                               {"bytes", required_argument, 0, 'b'},
                                               {"repeat", required_argument, 0, 'r'},
                                               {"chunk", required_argument, 0, 'c'},
                                               {0, 0, 0, 0}};
  int option;
  bool ok = true;
  while (ok && (option = getopt_long(argc, argv, "", long_options, NULL)) != -1) {
    ok = option == 'j';
    if (option == 'j') opts->json = true;
    if (option == 'b')
      ok = keel_parse_size(optarg, &opts->bytes) == KEEL_OK && opts->bytes >= MIN_BYTES &&
           opts->bytes <= MAX_BYTES;
    if (option == 'r') ok = keel_parse_int(optarg, 1, MAX_REPEAT, &opts->repeat) == KEEL_OK;
    if (option == 'c')
      ok = keel_parse_size(optarg, &opts->chunk_bytes) == KEEL_OK && opts->chunk_bytes > 0 &&
           opts->chunk_bytes <= KEEL_CKPT_MAX_CHUNK_BYTES;
  }
  if (!ok || optind < argc) {
    fprintf(stderr, "mem_snapshot: bad flag (see the file's header)\n");
    return -1;
  }
  return 0;
}

static keel_status measure(bench *b, figure *figures, huge_pages *pages) {
  keel_status status = state_make(b);
  if (status == KEEL_OK) status = slots_open(b);
  for (int64_t round = -1; status == KEEL_OK && round < b->opts->repeat; round++)
    status = run_round(b, round);
  if (status != KEEL_OK) return status;
  if (b->crc_folded != b->copy_crc_folded) {
    fprintf(stderr, "mem_snapshot: copy_crc and crc32c disagree\n");
    return KEEL_ECORRUPT;
  }
  huge_pages_read(pages);
  for (int op = 0; op < OPERATION_COUNT; op++)
    figures[op] = figure_of(b->times_ns[op], b->opts->repeat, b->total);
  return KEEL_OK;
}

int main(int argc, char **argv) {
  options opts;
  if (parse_options(argc, argv, &opts) != 0) return 2;
  bench *b = calloc(1, sizeof *b);
  if (b == NULL) return 1;
  b->opts = &opts;
  b->slot.file = b->target.file = -1;
  b->identity = (keel_ckpt_identity){.job_id = 1, .shard_count = 1, .step = 1};
  figure figures[OPERATION_COUNT];
  huge_pages pages;
  keel_status status = measure(b, figures, &pages);
  if (status == KEEL_OK) {
    /* The slots go before python starts: its tensors and file need the memory. */
    slots_close(b);
    torch_result torch;
    torch_run(b, &torch);
    if (opts.json) {
      json_print(b, figures, &torch, &pages);
    } else {
      table_print(b, figures, &torch, &pages);
    }
  } else {
    fprintf(stderr, "mem_snapshot: %s\n", keel_strerror(status));
  }
  bench_free(b);
  free(b);
  return status == KEEL_OK ? 0 : 1;
}
