/* The node's folder of snapshot slots: files in shared memory (/dev/shm), each mapped shared
 * by the worker that writes it and by the agent that sends it, so a snapshot outlives the
 * worker that took it. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "ckpt/mem_internal.h"

keel_status keel__ckpt_slot_open(const char *directory, const char *name, size_t bytes,
                                 keel__ckpt_slot *slot) {
  char path[4096];
  if (snprintf(path, sizeof path, "%s/%s", directory, name) >= (int)sizeof path) return KEEL_ERANGE;
  int file = open(path, bytes > 0 ? O_RDWR | O_CREAT | O_CLOEXEC : O_RDWR | O_CLOEXEC, 0600);
  if (file < 0) return errno == ENOENT ? KEEL_ENOTFOUND : keel_status_from_errno(errno);
  keel_status status = KEEL_OK;
  struct stat info;
  if (fstat(file, &info) != 0) {
    status = keel_status_from_errno(errno);
    goto fail_close_file;
  }
  if (bytes > 0 && (size_t)info.st_size != bytes && ftruncate(file, (off_t)bytes) != 0) {
    status = keel_status_from_errno(errno);
    goto fail_close_file;
  }
  size_t mapped = bytes > 0 ? bytes : (size_t)info.st_size;
  if (mapped < KEEL__CKPT_HEADER_BYTES) {
    status = KEEL_ENOTFOUND; /* being made by its writer */
    goto fail_close_file;
  }
  int flags = MAP_SHARED | (bytes > 0 ? MAP_POPULATE : 0);
  void *base = mmap(NULL, mapped, PROT_READ | PROT_WRITE, flags, file, 0);
  if (base == MAP_FAILED) {
    status = keel_status_from_errno(errno);
    goto fail_close_file;
  }
  /* Huge pages for shmem depend on the kernel's shmem_enabled; where it says no this fails
   * and the pages stay small. */
  if (bytes > 0) (void)madvise(base, mapped, MADV_HUGEPAGE);
  slot->file = file;
  slot->region = (keel_ckpt_region){.base = base, .bytes = mapped};
  return KEEL_OK;

fail_close_file:
  close(file);
  return status;
}

void keel__ckpt_slot_close(keel__ckpt_slot *slot) {
  if (slot->region.base != NULL) munmap(slot->region.base, slot->region.bytes);
  if (slot->file >= 0) close(slot->file);
  slot->region = (keel_ckpt_region){0};
  slot->file = -1;
}

static bool is_slot_name(const char *name, const char *prefix) {
  if (strncmp(name, prefix, strlen(prefix)) != 0) return false;
  const char *dot = strrchr(name, '.');
  return dot != NULL && strncmp(dot, ".slot-", 6) == 0 && dot[6] >= '0' &&
         dot[6] < '0' + KEEL__CKPT_OWN_SLOTS && dot[7] == '\0';
}

keel_status keel__ckpt_slots_list(const char *directory, const char *prefix,
                                  keel__ckpt_slot **slots_p, size_t *count_p) {
  *slots_p = NULL;
  *count_p = 0;
  DIR *folder = opendir(directory);
  if (folder == NULL) return errno == ENOENT ? KEEL_OK : keel_status_from_errno(errno);
  keel__ckpt_slot *slots = NULL;
  size_t count = 0, capacity = 0;
  keel_status status = KEEL_OK;
  struct dirent *entry;
  while (status == KEEL_OK && (entry = readdir(folder)) != NULL) {
    if (!is_slot_name(entry->d_name, prefix)) continue;
    if (count == capacity) {
      size_t grown = capacity == 0 ? 8 : capacity * 2;
      keel__ckpt_slot *larger = realloc(slots, grown * sizeof *larger);
      if (larger == NULL) {
        status = KEEL_ENOMEM;
        break;
      }
      slots = larger;
      capacity = grown;
    }
    keel_status opened = keel__ckpt_slot_open(directory, entry->d_name, 0, &slots[count]);
    if (opened == KEEL_OK) count++;
  }
  closedir(folder);
  if (status != KEEL_OK) {
    keel__ckpt_slots_close(slots, count);
    return status;
  }
  *slots_p = slots;
  *count_p = count;
  return KEEL_OK;
}

void keel__ckpt_slots_close(keel__ckpt_slot *slots, size_t count) {
  for (size_t i = 0; i < count; i++) keel__ckpt_slot_close(&slots[i]);
  free(slots);
}

void keel__ckpt_futex_wait(_Atomic uint32_t *word, uint32_t expected, int64_t timeout_ns) {
  struct timespec timeout = {.tv_sec = (time_t)(timeout_ns / 1000000000),
                             .tv_nsec = (long)(timeout_ns % 1000000000)};
  (void)syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT, expected, &timeout, NULL, 0);
}

void keel__ckpt_futex_wake(_Atomic uint32_t *word) {
  (void)syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE, INT32_MAX, NULL, NULL, 0);
}

void keel__ckpt_futex_ring(_Atomic uint32_t *word) {
  atomic_fetch_add_explicit(word, 1, memory_order_release);
  keel__ckpt_futex_wake(word);
}
