/* libFuzzer target over the job file parser (tools/keel/job_file.c), which `keel inject`,
 * `ps`, `join` and `chaos` run on files in /tmp/keel-<uid>/ that a crashed launcher, another
 * version or a hand may have left: any input must be refused without writing, or parsed
 * into fields that the launcher's own format writes back and parses to the same fields. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_seed.h"
#include "tool.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
size_t keel_fuzz_seed(int index, uint8_t *buffer, size_t capacity);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  keel__job_info info;
  memset(&info, 0xa5, sizeof info);
  keel__job_info before = info;
  keel_status status = keel__job_file_parse((const char *)data, size, &info);
  if (status != KEEL_OK) {
    if (status != KEEL_ECORRUPT || memcmp(&before, &info, sizeof info) != 0) abort();
    return 0;
  }
  if (info.auth.job_id == 0 || info.launcher_pid < 1) abort();
  if (memchr(info.store, '\0', sizeof info.store) == NULL) abort();
  /* The launcher's format (keel__job_file_write) of what was read reads back the same. */
  char token[2 * KEEL_TOKEN_BYTES + 1], text[1024];
  keel_hex_encode(info.auth.token, KEEL_TOKEN_BYTES, token);
  int length = snprintf(text, sizeof text, "store=%s\njob_id=%llu\ntoken=%s\npid=%ld\n", info.store,
                        (unsigned long long)info.auth.job_id, token, (long)info.launcher_pid);
  keel__job_info again;
  if (keel__job_file_parse(text, (size_t)length, &again) != KEEL_OK) abort();
  if (strcmp(again.store, info.store) != 0 || again.auth.job_id != info.auth.job_id ||
      memcmp(again.auth.token, info.auth.token, KEEL_TOKEN_BYTES) != 0 ||
      again.launcher_pid != info.launcher_pid)
    abort();
  return 0;
}

size_t keel_fuzz_seed(int index, uint8_t *buffer, size_t capacity) {
  static const char *const seeds[] = {
      "store=127.0.0.1:40123\njob_id=15980974203152117271\ntoken="
      "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff\npid=4242\n",
      "pid=1\ntoken=ffeeddccbbaa99887766554433221100ffeeddccbbaa99887766554433221100\n"
      "job_id=7\nstore=etcd://198.18.0.1:2379,198.18.0.2:2379\nextra=ignored\n",
  };
  return keel_fuzz_text_seed(seeds, sizeof seeds / sizeof seeds[0], index, buffer, capacity);
}
