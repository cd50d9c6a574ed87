/* crc32c (Castagnoli, the iSCSI polynomial) for frames and checkpoint chunks: ISA-L's
 * optimised kernel, and a plain bitwise twin that the tests hold it to. */
#include <isa-l/crc.h>

#include "keel/core.h"

uint32_t keel_crc32c(uint32_t crc, const void *data, size_t length) {
  /* ISA-L's crc32_iscsi keeps the register uninverted; invert around it so that the
   * value matches the standard crc32c (RFC 3720) and chains like the reference. Its
   * length is an int, so feed it at most 1 GiB at a time. */
  const uint8_t *bytes = data;
  uint32_t state = ~crc;
  while (length > 0) {
    size_t piece = length < ((size_t)1 << 30) ? length : ((size_t)1 << 30);
    state = crc32_iscsi((unsigned char *)bytes, (int)piece, state);
    bytes += piece;
    length -= piece;
  }
  return ~state;
}

uint32_t keel_crc32c_reference(uint32_t crc, const void *data, size_t length) {
  const uint8_t *bytes = data;
  crc = ~crc;
  for (size_t i = 0; i < length; i++) {
    crc ^= bytes[i];
    for (int bit = 0; bit < 8; bit++) crc = (crc >> 1) ^ (0x82F63B78u & (0u - (crc & 1u)));
  }
  return ~crc;
}
