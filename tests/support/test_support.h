/* Helpers shared by keel's tests: spawning real processes with a deadline, reaping and
 * killing them by pid (never by name), finding the built programs, temporary folders. */
#ifndef KEEL_TEST_SUPPORT_H
#define KEEL_TEST_SUPPORT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* Path of a built program: "$KEEL_BIN/<name>" for bin/ programs (keel, fashion_mnist),
 * "<build>/tests/programs/<name>" for test programs. Static storage, valid until the
 * next call from the same thread. */
const char *keel_test_bin(const char *name);
const char *keel_test_program(const char *name);

/* Starts argv[0] with the current environment plus extra_env ("NAME=value" strings,
 * NULL-terminated, may be NULL). stdout/stderr go to output_path when not NULL (appended).
 * The child is in its own process group and is remembered for keel_test_kill_all. */
pid_t keel_test_spawn(char *const argv[], char *const extra_env[], const char *output_path);
/* How many times slower than a plain build this run is (KEEL_TEST_SLOWDOWN, set by the
 * build for sanitizer runs; 1 by default). Every wait of these helpers stretches by it. */
int keel_test_slowdown(void);
/* A duration flag of seconds stretched by keel_test_slowdown() ("2s", "8s" under the
 * sanitizers), written into text (capacity bytes); returns text. */
const char *keel_test_seconds_flag(int seconds, char *text, size_t capacity);
/* Waits for pid up to timeout_ms (times keel_test_slowdown()). Returns true with *status_p (waitpid
 * status) when it ended; false (the process is still running) on timeout. */
bool keel_test_wait(pid_t pid, int timeout_ms, int *status_p);
/* SIGKILLs every process group spawned by keel_test_spawn that is still running and reaps
 * them. Registered with atexit by the first spawn. */
void keel_test_kill_all(void);
/* Runs a command to completion with a timeout; returns its exit code, 128+signal if
 * killed by a signal, or -1 on timeout (then it is killed). */
int keel_test_run(char *const argv[], char *const extra_env[], const char *output_path,
                  int timeout_ms);
/* Makes a fresh directory under $TMPDIR (or /tmp); returns its path (static storage). */
const char *keel_test_tempdir(const char *prefix);
/* The end of a test program: kills what it spawned and, when failures is 0 (and
 * KEEL_TEST_KEEP is not set), removes every folder keel_test_tempdir made; a failed run keeps
 * them for a look and says where. Returns failures. */
int keel_test_finish(int failures);
/* Reads a whole file into a malloc'ed NUL-terminated string; NULL if it cannot. */
char *keel_test_read_file(const char *path, size_t *length_p);
/* The last line of a file that starts with prefix, copied into line (capacity bytes);
 * false if none. */
bool keel_test_last_line_with(const char *path, const char *prefix, char *line, size_t capacity);
/* Copies the file at path to stderr under a "--- what (path):" line, when it has any text:
 * what a failing test shows of a job's output. */
void keel_test_print_file(const char *what, const char *path);
/* Whether a process with this pid is still there (a zombie counts): kill(pid, 0) does not
 * fail with ESRCH. */
bool keel_test_pid_exists(pid_t pid);
/* Makes directory path and mounts a tmpfs there (mount(2)'s flags, "size=64k"): a small or
 * read-only disk. False, after saying on stderr that `test` is skipped and why, where this
 * process may not mount (not root). keel_test_tmpfs_release, a teardown, takes back every
 * such mount, also when an assertion ended the test early. */
bool keel_test_tmpfs_mount(const char *test, const char *path, unsigned long flags,
                           const char *options);
int keel_test_tmpfs_release(void **state);

#endif
