/* keel core: status codes, logging, the monotonic clock, crc32c, flag/env parsing,
 * bounded buffers and the deterministic random stream. Every other layer builds on
 * this one; it depends on nothing but libc and ISA-L. */
#ifndef KEEL_CORE_H
#define KEEL_CORE_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "keel/limits.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One table makes the enum, keel_strerror and keel_status_name (libuv's habit). */
#define KEEL_STATUS_TABLE(X)                                                                      \
  X(OK, 0, "success")                                                                             \
  X(EINVAL, -1, "invalid argument")                                                               \
  X(ENOMEM, -2, "out of memory")                                                                  \
  X(ECLOSED, -3, "closed")                                                                        \
  X(ETIMEDOUT, -4, "deadline passed")                                                             \
  X(EPROCFAILED, -5, "a member of the communicator failed")                                       \
  X(EREVOKED, -6, "the communicator was revoked")                                                 \
  X(EAUTH, -7, "authentication failed (wrong job token?)")                                        \
  X(ECORRUPT, -8, "data failed its checksum or is malformed")                                     \
  X(EPROTO, -9, "protocol error (unexpected frame)")                                              \
  X(EIO, -10, "input/output error")                                                               \
  X(ENOTFOUND, -11, "not found")                                                                  \
  X(EEXIST, -12, "already exists")                                                                \
  X(EAGAIN, -13, "try again (would block)")                                                       \
  X(ECONNREFUSED, -14, "connection refused")                                                      \
  X(ERANGE, -15, "value out of range or too large")                                               \
  X(ENOSPC, -16, "no space left on device")                                                       \
  X(ECONFLICT, -17, "compare-and-swap lost: the value changed")                                   \
  X(EEXCLUDED, -18, "this process was excluded from the job")                                     \
  X(ENOTSUP, -19, "not supported")                                                                \
  X(ECANCELED, -20, "canceled")                                                                   \
  X(EJOBDONE, -21, "the job finished")                                                            \
  X(ERESTART, -22, "the job restarts its processes: save done, exit with KEEL_EXIT_RESTART")      \
  X(EREDO, -23, "a failure was recovered: begin the step again from the registered state")        \
  X(ESTOPPED, -24, "the job is stopping (keel run was interrupted): exit with KEEL_EXIT_STOPPED") \
  X(EORPHANED, -25, "the launcher is gone: exit with KEEL_EXIT_ORPHANED")                         \
  X(EDATALOST, -26, "data lost: more of it failed than its parity can rebuild")                   \
  X(EACCES, -27, "permission denied or read-only file system")                                    \
  X(EPEERLOST, -28, "a server it called on was lost meanwhile: ask again")

typedef enum keel_status {
#define KEEL_STATUS_ENUM(name, value, text) KEEL_##name = (value),
  KEEL_STATUS_TABLE(KEEL_STATUS_ENUM)
#undef KEEL_STATUS_ENUM
} keel_status;

/* Stable text for a status ("deadline passed"); never NULL, unknown values included. */
const char *keel_strerror(keel_status status);
/* The status's name ("KEEL_ETIMEDOUT"); never NULL. */
const char *keel_status_name(keel_status status);
/* Whether value is one of the statuses above: what a decoder of a peer's status checks. */
bool keel_status_known(int64_t value);
/* Converts an errno value once, at the syscall that set it. */
keel_status keel_status_from_errno(int error_number);

/* ---- logging: to stderr only, never stdout. Level from KEEL_LOG (error, warn, info,
 * debug, or off for nothing); default warn. Thread-safe: one write per line. */
typedef enum keel_log_level {
  KEEL_LOG_ERROR = 0,
  KEEL_LOG_WARN = 1,
  KEEL_LOG_INFO = 2,
  KEEL_LOG_DEBUG = 3,
} keel_log_level;

void keel_log(keel_log_level level, const char *module, const char *format, ...)
    __attribute__((format(printf, 3, 4)));
bool keel_log_enabled(keel_log_level level);
/* Sets the prefix printed before each line of this process ("rank 3"); copied. */
void keel_log_set_identity(const char *identity);

#define KEEL_LOG_E(module, ...) keel_log(KEEL_LOG_ERROR, module, __VA_ARGS__)
#define KEEL_LOG_W(module, ...) keel_log(KEEL_LOG_WARN, module, __VA_ARGS__)
#define KEEL_LOG_I(module, ...) keel_log(KEEL_LOG_INFO, module, __VA_ARGS__)
#define KEEL_LOG_D(module, ...)                                                          \
  do {                                                                                   \
    if (keel_log_enabled(KEEL_LOG_DEBUG)) keel_log(KEEL_LOG_DEBUG, module, __VA_ARGS__); \
  } while (0)

/* ---- clock: CLOCK_MONOTONIC in nanoseconds; system-wide on Linux, so figures taken in
 * two processes of one host can be subtracted. A deadline is an absolute time on this
 * clock; KEEL_NO_DEADLINE means wait forever. */
#define KEEL_NO_DEADLINE INT64_MAX
int64_t keel_now_ns(void);
/* Realtime clock in nanoseconds since the epoch, for event logs read by people. */
int64_t keel_wall_ns(void);
/* now + duration, saturating at KEEL_NO_DEADLINE; a negative duration means no deadline. */
int64_t keel_deadline_after_ns(int64_t duration_ns);
/* Milliseconds left until deadline, clamped to [0, INT32_MAX], for poll(). */
int keel_poll_timeout_ms(int64_t deadline_ns);

/* ---- waits that ended past their deadline. Each bounded wait that can hold up a job (a
 * collective, an agreement round, a store request, a call to a parameter server) says when it
 * ends, with the deadline it
 * kept to; one that ended more than KEEL_WAIT_LATE_NS after it (far more than a wake-up's
 * delay: a wait that ignored its deadline) is counted, by kind, for the whole process. The
 * runtime and keel run report the counts in `wait_late` events, which keel chaos's
 * deadlines-kept check reads (docs/CHAOS.md). */
#define KEEL_WAIT_LATE_NS ((int64_t)1000 * 1000 * 1000)
typedef enum keel_wait_kind {
  KEEL_WAIT_COLLECTIVE,
  KEEL_WAIT_AGREEMENT,
  KEEL_WAIT_STORE,
  KEEL_WAIT_SERVER,
  KEEL_WAIT_KIND_COUNT
} keel_wait_kind;
typedef struct keel_waits_late {
  uint64_t count[KEEL_WAIT_KIND_COUNT];
  int64_t worst_ns[KEEL_WAIT_KIND_COUNT]; /* the longest past its deadline, of those counted */
} keel_waits_late;
/* "collective", "agreement", "store", "server". */
const char *keel_wait_kind_name(keel_wait_kind kind);
/* Called as a wait ends; counts it if it is late. */
void keel_wait_ended(keel_wait_kind kind, int64_t deadline_ns);
/* Moves the counts since the last take into *late; false (and *late zero) if there were none.
 * Cheap when there were none: one atomic load. */
bool keel_waits_late_take(keel_waits_late *late);
/* The counts as JSON fields for an event line ("collective":N,...,"server":N,"worst_ms":W,
 * "worst_kind":K);
 * the text is cut to capacity. */
void keel_waits_late_format(const keel_waits_late *late, char *text, size_t capacity);

/* ---- crc32c (Castagnoli). keel_crc32c uses ISA-L's crc32_iscsi; the reference is the
 * plain bitwise version the tests compare it with. Chained: pass the previous result as
 * crc (0 to start). */
uint32_t keel_crc32c(uint32_t crc, const void *data, size_t length);
uint32_t keel_crc32c_reference(uint32_t crc, const void *data, size_t length);
/* Copies length bytes from source to destination (not overlapping) and returns the crc32c
 * of them chained on crc, in one pass: the destination is written with non-temporal stores
 * (it is not read back soon: a snapshot, a restored state) and the crc is computed from the
 * same loads. */
uint32_t keel_crc32c_copy(uint32_t crc, void *destination, const void *source, size_t length);

/* ---- parsing of flags and KEEL_* environment values. Each returns KEEL_EINVAL with no
 * output written when the text is not a valid value. */
/* "250ms", "2s", "1.5s", "100us", "3m", bare numbers are seconds. */
keel_status keel_parse_duration_ns(const char *text, int64_t *duration_ns_p);
/* "4096", "64KiB", "1MiB", "2GiB", "1k" (=1000), "1M" (=10^6). */
keel_status keel_parse_size(const char *text, uint64_t *size_p);
/* Decimal integer in [minimum, maximum], whole string. */
keel_status keel_parse_int(const char *text, int64_t minimum, int64_t maximum, int64_t *value_p);
/* Reads an environment variable with one of the parsers above; a missing variable leaves
 * *value_p untouched and returns KEEL_OK; a malformed one logs and returns KEEL_EINVAL. */
keel_status keel_env_duration_ns(const char *name, int64_t *duration_ns_p);
keel_status keel_env_int(const char *name, int64_t minimum, int64_t maximum, int64_t *value_p);

/* ---- bounded growable buffer (curl's dynbuf habit): every buffer has a hard maximum. */
typedef struct keel_buffer {
  uint8_t *data;
  size_t length;
  size_t capacity;
  size_t maximum;
} keel_buffer;

void keel_buffer_init(keel_buffer *buffer, size_t maximum);
/* Appends; KEEL_ERANGE past the maximum, KEEL_ENOMEM if allocation fails; the buffer is
 * unchanged on error. */
keel_status keel_buffer_append(keel_buffer *buffer, const void *data, size_t length);
keel_status keel_buffer_appendf(keel_buffer *buffer, const char *format, ...)
    __attribute__((format(printf, 2, 3)));
keel_status keel_buffer_reserve(keel_buffer *buffer, size_t capacity);
void keel_buffer_reset(keel_buffer *buffer);
void keel_buffer_free(keel_buffer *buffer);

/* ---- deterministic random stream (splitmix64 seeding xoshiro256**): the same seed gives
 * the same stream on every machine; the data shard and dropout of a rank at a step are
 * functions of (seed, step, rank) through keel_random_seed_for. */
typedef struct keel_random {
  uint64_t state[4];
} keel_random;

void keel_random_seed(keel_random *random, uint64_t seed);
uint64_t keel_random_seed_for(uint64_t seed, uint64_t step, uint64_t rank);
uint64_t keel_random_next(keel_random *random);
/* Uniform in [0, bound); bound > 0. */
uint64_t keel_random_below(keel_random *random, uint64_t bound);
/* Uniform double in [0, 1). */
double keel_random_unit(keel_random *random);

/* ---- little-endian fields of keel's wire and file formats (frames, store requests,
 * checkpoint manifests): one definition for all of them. */
static inline void keel_put_le16(uint8_t *out, uint16_t value) {
  out[0] = (uint8_t)value;
  out[1] = (uint8_t)(value >> 8);
}
static inline void keel_put_le32(uint8_t *out, uint32_t value) {
  for (int i = 0; i < 4; i++) out[i] = (uint8_t)(value >> (8 * i));
}
static inline void keel_put_le64(uint8_t *out, uint64_t value) {
  for (int i = 0; i < 8; i++) out[i] = (uint8_t)(value >> (8 * i));
}
static inline uint16_t keel_get_le16(const uint8_t *in) { return (uint16_t)(in[0] | in[1] << 8); }
static inline uint32_t keel_get_le32(const uint8_t *in) {
  uint32_t value = 0;
  for (int i = 3; i >= 0; i--) value = value << 8 | in[i];
  return value;
}
static inline uint64_t keel_get_le64(const uint8_t *in) {
  uint64_t value = 0;
  for (int i = 7; i >= 0; i--) value = value << 8 | in[i];
  return value;
}

/* ---- processes. Reads the state letter (R, S, T for stopped, Z...) and the parent pid of
 * pid from /proc. KEEL_ENOTFOUND if there is no such process; outputs set only on success. */
keel_status keel_process_stat(int pid, char *state_p, int *parent_p);

/* ---- folders. Makes path and every missing folder above it (mkdir -p), new ones with
 * mode; folders that exist are fine. The launcher's job and checkpoint folders and the JIT
 * engine's checkpoint folder are made this way. KEEL_EINVAL for an empty or too long path,
 * otherwise the status of the mkdir that failed (KEEL_ENOSPC, ...). */
keel_status keel_directory_make(const char *path, unsigned mode);

/* ---- fault injection (KEEL_FAULT, docs/RUNTIME.md): rules such as
 * "kill@rank=2,step=5,point=allreduce,after=2" make a process die, hang, stall or exit at a
 * chosen point, so that tests and users can make the very failure they want to survive.
 * A plan belongs to one process; every layer fires its points through it. Not thread-safe:
 * points fire in the thread that drives training. */
typedef struct keel_fault_plan keel_fault_plan;
/* Called just before a rule fires (the process may die right after): for an event line. */
typedef void (*keel_fault_report_cb)(void *context, const char *action, const char *point,
                                     uint64_t step);

/* Parses rules separated by ';' (text NULL or empty: an empty plan) for the process whose
 * uid is given. KEEL_EINVAL with the bad rule logged; the caller frees *plan_p with
 * keel_fault_plan_destroy. */
keel_status keel_fault_plan_create(const char *text, uint32_t uid, keel_fault_plan **plan_p);
void keel_fault_plan_destroy(keel_fault_plan *plan);
void keel_fault_plan_set_reporter(keel_fault_plan *plan, keel_fault_report_cb report,
                                  void *context);
/* The node the process belongs to: rules with node=N fire only there (a node's agent and its
 * workers). */
void keel_fault_plan_set_node(keel_fault_plan *plan, int64_t node);
/* The step in progress: rules with step=N fire at or after it. */
void keel_fault_plan_set_step(keel_fault_plan *plan, uint64_t step);
/* Fires the rules due at point (counter: the point's own count, e.g. chunk sends of an
 * allreduce, compared with after=). kill and stop signal this process itself, delay sleeps,
 * exit ends the process with code= (the failure the user asked for), hang blocks the calling
 * thread for good while the process's other threads run on. Returns true when a `bitflip` or
 * `corrupt` rule fired: the caller damages what it has just written. NULL plan: false. */
bool keel_fault_plan_fire(keel_fault_plan *plan, const char *point, int64_t counter);
/* The same at the point's last count in one operation (an allreduce's last send): a rule
 * whose after= is above counter fires here too, so that it lands inside the operation
 * whichever algorithm (with however many sends) served it. */
bool keel_fault_plan_fire_last(keel_fault_plan *plan, const char *point, int64_t counter);
/* Any thread (`keel inject hang|bitflip`): the thread that fires the next "step" point takes
 * action there, "hang" (it blocks for good) or "bitflip" (that fire returns true: the runtime
 * flips one bit of the registered state), reported as a fault at that point. KEEL_EINVAL for
 * another action or a NULL plan. */
keel_status keel_fault_plan_request(keel_fault_plan *plan, const char *action);

/* ---- hex helpers for tokens. */
/* Writes 2*length hex digits and a NUL into text (capacity >= 2*length+1). */
void keel_hex_encode(const uint8_t *bytes, size_t length, char *text);
/* Decodes exactly length bytes from 2*length hex digits; KEEL_EINVAL otherwise. */
keel_status keel_hex_decode(const char *text, uint8_t *bytes, size_t length);

#ifdef __cplusplus
}
#endif
#endif
