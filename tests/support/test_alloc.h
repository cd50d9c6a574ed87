/* A fail-after-N allocator for test executables (SQLite's test_malloc.c habit): linked with
 * -Wl,--wrap=malloc,... so every allocation the test and the statically linked keel code make
 * goes through counters here, and the N-th one can be refused, with no change to keel. */
#ifndef KEEL_TEST_ALLOC_H
#define KEEL_TEST_ALLOC_H

#include <stdbool.h>

/* Wrapped (the link options of the executable must name each): malloc, calloc, realloc,
 * free, aligned_alloc, posix_memalign, strdup, strndup. Memory that libc or another shared
 * library allocates for itself (stdio buffers, threads, getaddrinfo) is not seen; memory a
 * shared library allocates and hands over for the caller to free() (getline, asprintf,
 * realpath(NULL)) would unbalance the live count, and keel calls none of those.
 *
 * Counting and failing apply only while armed, so that the counts are of the operation
 * under test; the live count covers every block, armed or not. All of it is atomic:
 * allocations may come from any thread, and while armed every thread's count. */

/* The n-th allocation counted from now (the count restarts at 0) fails with NULL and
 * ENOMEM, every other one succeeds; n 0: none fails. */
void keel_test_alloc_fail_at(long n);
/* Counting (and the planned failure) on and off. */
void keel_test_alloc_arm(void);
void keel_test_alloc_disarm(void);
/* Allocations attempted while armed since the last reset or fail_at, the failed one
 * included. A realloc that moves or resizes a block counts as one. */
long keel_test_alloc_count(void);
/* Whether the failure planned by keel_test_alloc_fail_at happened. */
bool keel_test_alloc_failed(void);
/* Blocks allocated through the wrappers and not freed yet, in all: compare it before and
 * after an operation to find a leak (independent of LeakSanitizer). */
long keel_test_alloc_live(void);
/* Disarmed, count 0, no failure planned; the live count is kept. */
void keel_test_alloc_reset(void);

#endif
