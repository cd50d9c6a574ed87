/* Status codes: the text and the name of every keel_status, generated from the one table
 * in core.h, and the single place where errno values become keel statuses. */
#include <errno.h>

#include "keel/core.h"

const char *keel_strerror(keel_status status) {
  switch (status) {
#define KEEL_STATUS_TEXT(name, value, text) \
  case KEEL_##name:                         \
    return text;
    KEEL_STATUS_TABLE(KEEL_STATUS_TEXT)
#undef KEEL_STATUS_TEXT
  }
  return "unknown status";
}

const char *keel_status_name(keel_status status) {
  switch (status) {
#define KEEL_STATUS_NAME(name, value, text) \
  case KEEL_##name:                         \
    return "KEEL_" #name;
    KEEL_STATUS_TABLE(KEEL_STATUS_NAME)
#undef KEEL_STATUS_NAME
  }
  return "KEEL_UNKNOWN";
}

keel_status keel_status_from_errno(int error_number) {
  switch (error_number) {
    case 0:
      return KEEL_OK;
    case ENOMEM:
      return KEEL_ENOMEM;
    case EAGAIN:
#if EWOULDBLOCK != EAGAIN
    case EWOULDBLOCK:
#endif
    case EINTR:
    case EINPROGRESS:
      return KEEL_EAGAIN;
    case ETIMEDOUT:
      return KEEL_ETIMEDOUT;
    case ECONNREFUSED:
      return KEEL_ECONNREFUSED;
    case EPIPE:
    case ECONNRESET:
    case ECONNABORTED:
    case ENOTCONN:
    case ESHUTDOWN:
      return KEEL_ECLOSED;
    case ENOENT:
      return KEEL_ENOTFOUND;
    case EEXIST:
      return KEEL_EEXIST;
    case ENOSPC:
    case EDQUOT:
      return KEEL_ENOSPC;
    case EROFS:
    case EACCES:
      return KEEL_EACCES;
    case EINVAL:
    case EBADF:
      return KEEL_EINVAL;
    case ERANGE:
    case EOVERFLOW:
    case EMSGSIZE:
      return KEEL_ERANGE;
    case ENOTSUP:
      return KEEL_ENOTSUP;
    case ECANCELED:
      return KEEL_ECANCELED;
    default:
      return KEEL_EIO;
  }
}

bool keel_status_known(int64_t value) {
  switch (value) {
#define KEEL_STATUS_CASE(name, number, text) case number:
    KEEL_STATUS_TABLE(KEEL_STATUS_CASE)
#undef KEEL_STATUS_CASE
    return true;
  }
  return false;
}
