/* Runs a libFuzzer-style target without libFuzzer: on files or folders of files (a corpus)
 * named on the command line, or on --random N inputs made from a fixed seed (random bytes,
 * and mutations of the seeds the target offers through keel_fuzz_seed), so ctest exercises
 * every fuzz target on each run; --seeds DIR writes those seeds as files. */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "keel/core.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
/* Optional: the target fills buffer with a valid input number index; returns its length,
 * or 0 when it has no more seeds. */
size_t keel_fuzz_seed(int index, uint8_t *buffer, size_t capacity) __attribute__((weak));

static int replay_file(const char *path) {
  FILE *file = fopen(path, "rb");
  if (file == NULL) {
    fprintf(stderr, "cannot open %s\n", path);
    return 1;
  }
  static uint8_t data[1 << 20];
  size_t size = fread(data, 1, sizeof data, file);
  fclose(file);
  LLVMFuzzerTestOneInput(data, size);
  return 0;
}

/* A file, or every file of a folder (a corpus, in name order so that runs repeat). */
static int replay_path(const char *path, size_t *replayed_p) {
  struct stat info;
  if (stat(path, &info) != 0) {
    fprintf(stderr, "cannot open %s\n", path);
    return 1;
  }
  if (!S_ISDIR(info.st_mode)) {
    (*replayed_p)++;
    return replay_file(path);
  }
  struct dirent **entries = NULL;
  int count = scandir(path, &entries, NULL, alphasort);
  if (count < 0) {
    fprintf(stderr, "cannot list %s\n", path);
    return 1;
  }
  int status = 0;
  for (int i = 0; i < count; i++) {
    char file[4096];
    snprintf(file, sizeof file, "%s/%s", path, entries[i]->d_name);
    if (status == 0 && entries[i]->d_name[0] != '.') status = replay_path(file, replayed_p);
    free(entries[i]);
  }
  free(entries);
  return status;
}

/* Writes the target's seeds into folder as seed-<i> files: libFuzzer starts from them
 * (the committed corpus holds them), where random bytes seldom reach past a format's
 * first checks. */
static int seeds_write(const char *folder) {
  static uint8_t seed[4096];
  int count = 0;
  for (; keel_fuzz_seed != NULL; count++) {
    size_t length = keel_fuzz_seed(count, seed, sizeof seed);
    if (length == 0) break;
    char path[4096];
    snprintf(path, sizeof path, "%s/seed-%d", folder, count);
    FILE *file = fopen(path, "wb");
    if (file == NULL || fwrite(seed, 1, length, file) != length) {
      fprintf(stderr, "cannot write %s\n", path);
      if (file != NULL) fclose(file);
      return 1;
    }
    fclose(file);
  }
  fprintf(stderr, "fuzz replay: %d seeds written to %s\n", count, folder);
  return 0;
}

int main(int argc, char **argv) {
  if (argc == 3 && strcmp(argv[1], "--seeds") == 0) return seeds_write(argv[2]);
  if (argc == 3 && strcmp(argv[1], "--random") == 0) {
    long count = strtol(argv[2], NULL, 10);
    keel_random random;
    keel_random_seed(&random, 20261122);
    static uint8_t seeds[16][4096];
    size_t seed_lengths[16] = {0};
    int seed_count = 0;
    while (keel_fuzz_seed && seed_count < 16) {
      size_t length = keel_fuzz_seed(seed_count, seeds[seed_count], sizeof seeds[0]);
      if (length == 0) break;
      seed_lengths[seed_count++] = length;
    }
    static uint8_t data[8192];
    for (long i = 0; i < count; i++) {
      size_t size;
      if (seed_count > 0 && i % 2 == 0) {
        int which = (int)keel_random_below(&random, (uint64_t)seed_count);
        size = seed_lengths[which];
        memcpy(data, seeds[which], size);
        int flips = 1 + (int)keel_random_below(&random, 4);
        for (int f = 0; f < flips && size > 0; f++)
          data[keel_random_below(&random, size)] ^= (uint8_t)(1u << keel_random_below(&random, 8));
        if (keel_random_below(&random, 4) == 0) size = keel_random_below(&random, size + 1);
      } else {
        size = keel_random_below(&random, 200);
        for (size_t b = 0; b < size; b++) data[b] = (uint8_t)keel_random_next(&random);
      }
      LLVMFuzzerTestOneInput(data, size);
    }
    printf("fuzz replay: %ld inputs, %d seeds, no crash\n", count, seed_count);
    return 0;
  }
  size_t replayed = 0;
  for (int i = 1; i < argc; i++) {
    if (replay_path(argv[i], &replayed) != 0) return 1;
  }
  printf("fuzz replay: %zu files, no crash\n", replayed);
  return 0;
}
