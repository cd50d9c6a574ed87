/* libFuzzer target over the readers of events files, which hold lines that workers wrote
 * about themselves (an application's own `keel_report_event` fields among them) and that a
 * crash may have cut short: `keel report` as text, as --json and as an SVG drawing, and the
 * reader `keel chaos` runs while a job writes. Any input must be read or skipped line by
 * line, never crash, and never leave a report half-written as if whole. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "chaos.h"
#include "fuzz_seed.h"
#include "tool.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
size_t keel_fuzz_seed(int index, uint8_t *buffer, size_t capacity);

/* keel report on the input as a file; its output goes to /dev/null. */
static void report_run(const char *path, const char *flag, const char *svg) {
  char *argv[6] = {"report"};
  int argc = 1;
  if (flag != NULL) argv[argc++] = (char *)flag;
  if (svg != NULL) argv[argc++] = (char *)svg;
  argv[argc++] = (char *)path;
  argv[argc] = NULL;
  int code = keel__command_report(argc, argv);
  /* 0: reported; 1: nothing to report or the drawing could not be written; 2: refused. */
  if (code < 0 || code > 2) abort();
}

static void chaos_read(const uint8_t *data, size_t size) {
  static keel__chaos_run *run;
  if (run == NULL && (run = calloc(1, sizeof *run)) == NULL) abort();
  keel__chaos_run_clear(run);
  memset(run, 0, sizeof *run);
  keel__chaos_failure failures[4];
  for (uint32_t i = 0; i < 4; i++)
    failures[i] = (keel__chaos_failure){.kind = KEEL__CHAOS_KILL,
                                        .injected = i < 3,
                                        .injected_ns = 1000 * (int64_t)i,
                                        .victims = {i, i + 8},
                                        .victim_count = 2,
                                        .detect_ns = -1,
                                        .recover_ns = -1};
  /* A partition of node 1, healed: what a node's fence is matched with. */
  failures[2].kind = KEEL__CHAOS_PARTITION;
  failures[2].node = 1;
  failures[2].hold_ns = 1500;
  failures[2].healed_ns = 3500;
  run->events = fmemopen((void *)data, size, "r");
  if (run->events == NULL) return; /* fmemopen refuses an empty buffer on some libcs */
  keel__chaos_events_read(run, failures, 4);
  fclose(run->events);
  run->events = NULL;
  if (run->process_count > KEEL__CHAOS_MAX_PROCESSES) abort();
  if (run->finish_count > KEEL__CHAOS_MAX_FINISHES) abort();
  for (size_t i = 0; i < 4; i++)
    if (failures[i].recover_ns >= 0 && !failures[i].injected) abort();
  keel__chaos_steps steps;
  keel__chaos_steps_count(run, &steps);
  if (steps.known && (steps.redone < 0 || steps.skipped > steps.last - steps.first + 1)) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static bool quiet;
  if (!quiet) {
    /* The reports go nowhere: only what reading does to the process matters here. */
    if (freopen("/dev/null", "w", stdout) == NULL) abort();
    setenv("KEEL_LOG", "off", 1);
    quiet = true;
  }
  int fd = memfd_create("fuzz-events", MFD_CLOEXEC);
  if (fd < 0) abort();
  if (size > 0 && write(fd, data, size) != (ssize_t)size) abort();
  char path[64];
  snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  /* A report costs milliseconds (it allocates room for a whole job's records): the first
   * byte picks one of its three forms, or none, for each input. */
  static char svg[64];
  if (svg[0] == '\0') snprintf(svg, sizeof svg, "/tmp/keel-fuzz-%ld.svg", (long)getpid());
  int form = size > 0 ? data[0] % 4 : 0;
  if (form == 0) report_run(path, NULL, NULL);
  if (form == 1) report_run(path, "--json", NULL);
  if (form == 2) report_run(path, "--svg", svg);
  unlink(svg);
  close(fd);
  chaos_read(data, size);
  return 0;
}

size_t keel_fuzz_seed(int index, uint8_t *buffer, size_t capacity) {
  static const char *const seeds[] = {
      "{\"event\":\"job_start\",\"t_ns\":1000000000,\"job_id\":\"78\",\"program\":\"/x/t\","
      "\"on_failure\":\"replace\",\"world\":2,\"spares\":1}\n"
      "{\"event\":\"spawn\",\"uid\":1,\"pid\":11,\"role\":\"worker\",\"node\":0,\"t_ns\":1100}\n"
      "{\"event\":\"progress\",\"uid\":0,\"rank\":0,\"epoch\":0,\"world\":2,\"step\":3,"
      "\"loss\":0.5,\"samples_per_s\":10.0,\"t_ns\":1500000000}\n"
      "{\"event\":\"exit\",\"uid\":1,\"pid\":11,\"role\":\"worker\",\"rank\":1,\"signal\":"
      "\"SIGKILL\",\"status\":\"SIGKILL\",\"t_ns\":2000000000}\n"
      "{\"event\":\"recovery\",\"uid\":0,\"rank\":0,\"old_epoch\":0,\"new_epoch\":1,"
      "\"old_world\":2,\"new_world\":2,\"policy\":\"replace\",\"failed\":[1],\"replaced\":1,"
      "\"transfers\":[{\"to\":2,\"from\":0,\"shard\":0}],\"redo_minibatches\":1,"
      "\"detect_ms\":1,\"total_ms\":9,\"t_detect_ns\":2001000000,\"t_ns\":2010000000}\n"
      "{\"event\":\"store\",\"when\":\"recovery\",\"keys\":12,\"bytes\":900,\"t_ns\":2011}\n"
      "{\"event\":\"finish\",\"uid\":2,\"rank\":1,\"world\":2,\"step\":40,\"shard\":0,"
      "\"state_crc32c\":\"0090559e\",\"t_ns\":3000000000}\n"
      "{\"event\":\"job_end\",\"t_ns\":3000000000,\"code\":0,\"seconds\":2.0}\n",
      "{\"event\":\"restart_begin\",\"restart\":1,\"failed_uid\":1,\"reason\":\"SIGKILL\","
      "\"t_ns\":2001000000}\n"
      "{\"event\":\"jit_save\",\"uid\":0,\"rank\":0,\"epoch\":0,\"step\":20,\"bytes\":4096,"
      "\"save_ms\":0.75,\"status\":\"ok\",\"t_failed_ns\":2002000000,\"t_ns\":2003000000}\n"
      "{\"event\":\"fence\",\"uid\":3,\"pid\":9,\"reason\":\"stopped for 667 ms\",\"t_ns\":5}\n"
      "{\"event\":\"resumed\",\"uid\":2,\"rank\":0,\"step\":20,\"kind\":\"restart\",\"t_ns\":7}\n"
      "not json\n{\"event\":\"node_lost\",\"node\":1,\"t_ns\":9",
      "{\"event\":\"agent_spawn\",\"node\":1,\"pid\":20,\"t_ns\":100}\n"
      "{\"event\":\"spawn\",\"uid\":2,\"pid\":21,\"role\":\"worker\",\"node\":1,\"t_ns\":200}\n"
      "{\"event\":\"collective_timeout\",\"uid\":0,\"timeout_ms\":1000.0,\"t_ns\":900}\n"
      "{\"event\":\"progress\",\"uid\":0,\"step\":3,\"t_ns\":1000}\n"
      "{\"event\":\"section_end\",\"uid\":1,\"elapsed_ms\":3.0,\"t_ns\":2500}\n"
      "{\"event\":\"node_fence\",\"node\":1,\"silent_ms\":0.0025,\"ttl_ms\":0.004,\"t_ns\":4000}\n"
      "{\"event\":\"progress\",\"uid\":0,\"step\":9,\"t_ns\":9000}\n",
  };
  return keel_fuzz_text_seed(seeds, sizeof seeds / sizeof seeds[0], index, buffer, capacity);
}
