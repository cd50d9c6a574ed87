/* The --wrap allocation functions behind test_alloc.h: each decides whether to fail, calls
 * the real function (libc's, or the sanitizer's that intercepts it) and keeps the counts.
 * Only an executable linked with the matching --wrap options (CMakeLists.txt) may link it. */
#include "test_alloc.h"

#include <errno.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

void *__real_malloc(size_t size);
void *__real_calloc(size_t count, size_t size);
void *__real_realloc(void *block, size_t size);
void __real_free(void *block);
void *__real_aligned_alloc(size_t alignment, size_t size);
int __real_posix_memalign(void **block_p, size_t alignment, size_t size);

void *__wrap_malloc(size_t size);
void *__wrap_calloc(size_t count, size_t size);
void *__wrap_realloc(void *block, size_t size);
void __wrap_free(void *block);
void *__wrap_aligned_alloc(size_t alignment, size_t size);
int __wrap_posix_memalign(void **block_p, size_t alignment, size_t size);
char *__wrap_strdup(const char *text);
char *__wrap_strndup(const char *text, size_t length);

static atomic_bool armed;
static atomic_long fail_at;
static atomic_long counted;
static atomic_bool failed;
static atomic_long live;

void keel_test_alloc_fail_at(long n) {
  atomic_store(&failed, false);
  atomic_store(&counted, 0);
  atomic_store(&fail_at, n);
}

void keel_test_alloc_arm(void) { atomic_store(&armed, true); }

void keel_test_alloc_disarm(void) { atomic_store(&armed, false); }

long keel_test_alloc_count(void) { return atomic_load(&counted); }

bool keel_test_alloc_failed(void) { return atomic_load(&failed); }

long keel_test_alloc_live(void) { return atomic_load(&live); }

void keel_test_alloc_reset(void) {
  keel_test_alloc_disarm();
  keel_test_alloc_fail_at(0);
}

/* Counts one allocation attempt; true when it is the one to refuse. The fetch-and-add
 * gives every attempt its own number, so exactly one fails even when threads race. */
static bool alloc_refused(void) {
  if (!atomic_load(&armed)) return false;
  long number = atomic_fetch_add(&counted, 1) + 1;
  if (number != atomic_load(&fail_at)) return false;
  atomic_store(&failed, true);
  errno = ENOMEM;
  return true;
}

static void *alloc_counted(void *block) {
  if (block != NULL) atomic_fetch_add(&live, 1);
  return block;
}

void *__wrap_malloc(size_t size) {
  if (alloc_refused()) return NULL;
  return alloc_counted(__real_malloc(size));
}

void *__wrap_calloc(size_t count, size_t size) {
  if (alloc_refused()) return NULL;
  return alloc_counted(__real_calloc(count, size));
}

void *__wrap_realloc(void *block, size_t size) {
  if (block == NULL) return __wrap_malloc(size);
  if (size == 0) {
    /* glibc frees the block and returns NULL: a free, not an allocation. */
    void *result = __real_realloc(block, 0);
    if (result == NULL) atomic_fetch_sub(&live, 1);
    return result;
  }
  /* A refused realloc leaves the block as it was, as a real failure does. */
  if (alloc_refused()) return NULL;
  return __real_realloc(block, size);
}

void __wrap_free(void *block) {
  if (block != NULL) atomic_fetch_sub(&live, 1);
  __real_free(block);
}

void *__wrap_aligned_alloc(size_t alignment, size_t size) {
  if (alloc_refused()) return NULL;
  return alloc_counted(__real_aligned_alloc(alignment, size));
}

int __wrap_posix_memalign(void **block_p, size_t alignment, size_t size) {
  if (alloc_refused()) return ENOMEM;
  int error = __real_posix_memalign(block_p, alignment, size);
  if (error == 0) alloc_counted(*block_p);
  return error;
}

/* libc's own strdup would allocate behind the wrappers and leave the live count short by
 * one when the copy is freed here; these allocate through __wrap_malloc instead. */
char *__wrap_strdup(const char *text) { return __wrap_strndup(text, strlen(text)); }

char *__wrap_strndup(const char *text, size_t length) {
  size_t used = strnlen(text, length);
  char *copy = __wrap_malloc(used + 1);
  if (copy == NULL) return NULL;
  memcpy(copy, text, used);
  copy[used] = '\0';
  return copy;
}
