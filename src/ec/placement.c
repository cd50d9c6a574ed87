/* Rotating parity placement (ECRec §3.2, RAID-5's symmetric layout when k + r = S):
 * member m of group g on server (g + m) mod S; the layout is described in keel/ec.h. Pure
 * arithmetic: nothing here allocates, blocks or keeps state. */
#include "ec/ec_internal.h"

/* S is kept to what int arithmetic on 2 * S can hold (KEEL__EC_SERVERS_LIMIT). */

/* A server's data rows (or parity rows) sit in the groups g whose residue g mod S lies in a
 * cyclic interval of residues {start, start + 1, ..., start + length - 1} mod S: data for
 * the k residues ending at s, parity for the r before those. Within a period of S groups, a
 * server keeps its blocks in ascending order of residue; the values of the interval that
 * wrapped past S - 1 are the smallest. */
typedef struct interval {
  int start;
  int length;
  int wrapped; /* values 0 .. wrapped - 1 are the wrapped part */
} interval;

static interval interval_of(const keel_ec_layout *layout, int server, keel_ec_role role) {
  int servers = layout->servers, k = layout->data_blocks;
  int n = layout->data_blocks + layout->parity_blocks;
  interval result;
  /* Member m of group g is on s = g + m (mod S): data (m < k) for g = s - k + 1 .. s,
   * parity (k <= m < n) for g = s - n + 1 .. s - k. */
  if (role == KEEL_EC_DATA) {
    result.start = (server - k + 1 + servers) % servers;
    result.length = k;
  } else {
    result.start = (server - n + 1 + servers) % servers;
    result.length = layout->parity_blocks;
  }
  int past_end = result.start + result.length - servers;
  result.wrapped = past_end > 0 ? past_end : 0;
  return result;
}

/* The rank of residue (a value of the interval) in ascending order of value. */
static int interval_rank(const interval *range, int servers, int residue) {
  int offset = (residue - range->start + servers) % servers;
  int value = range->start + offset;
  return value >= servers ? value - servers : range->wrapped + offset;
}

static int interval_value(const interval *range, int rank) {
  return rank < range->wrapped ? rank : range->start + rank - range->wrapped;
}

/* How many values of the interval are below limit (0 <= limit <= S). */
static int interval_count_below(const interval *range, int servers, int limit) {
  int end = range->start + range->length < servers ? range->start + range->length : servers;
  int wrapped_below = range->wrapped < limit ? range->wrapped : limit;
  int top = end < limit ? end : limit;
  return wrapped_below + (top > range->start ? top - range->start : 0);
}

keel_status keel_ec_layout_init(int servers, int data_blocks, int parity_blocks,
                                keel_ec_layout *layout_p) {
  if (layout_p == NULL) return keel__ec_invalid("keel_ec_layout_init: no output pointer");
  if (data_blocks < 1 || parity_blocks < 1 || data_blocks > KEEL_EC_MAX_BLOCKS - parity_blocks ||
      servers > KEEL__EC_SERVERS_LIMIT || data_blocks + parity_blocks > servers) {
    KEEL_LOG_E(KEEL__EC_MODULE,
               "ec layout of %d servers, k=%d r=%d: need k >= 1, r >= 1, k + r <= %d and "
               "k + r <= servers <= %d",
               servers, data_blocks, parity_blocks, KEEL_EC_MAX_BLOCKS, KEEL__EC_SERVERS_LIMIT);
    return KEEL_EINVAL;
  }
  *layout_p = (keel_ec_layout){
      .servers = servers, .data_blocks = data_blocks, .parity_blocks = parity_blocks};
  return KEEL_OK;
}

keel_status keel_ec_layout_locate(const keel_ec_layout *layout, uint64_t group, int member,
                                  keel_ec_location *location_p) {
  if (layout == NULL || location_p == NULL) {
    return keel__ec_invalid("keel_ec_layout_locate: NULL argument");
  }
  if (member < 0 || member >= layout->data_blocks + layout->parity_blocks) {
    KEEL_LOG_E(KEEL__EC_MODULE, "ec layout: member %d of a group of %d", member,
               layout->data_blocks + layout->parity_blocks);
    return KEEL_EINVAL;
  }
  uint64_t servers = (uint64_t)layout->servers;
  int residue = (int)(group % servers);
  int server = (residue + member) % layout->servers;
  keel_ec_role role = member < layout->data_blocks ? KEEL_EC_DATA : KEEL_EC_PARITY;
  interval range = interval_of(layout, server, role);
  /* No overflow: rank <= residue and length <= S, so the slot is at most the group. */
  *location_p = (keel_ec_location){
      .group = group,
      .member = member,
      .server = server,
      .slot = group / servers * (uint64_t)range.length +
              (uint64_t)interval_rank(&range, layout->servers, residue),
  };
  return KEEL_OK;
}

keel_status keel_ec_layout_locate_row(const keel_ec_layout *layout, uint64_t row,
                                      keel_ec_location *location_p) {
  if (layout == NULL) return keel__ec_invalid("keel_ec_layout_locate_row: NULL layout");
  uint64_t k = (uint64_t)layout->data_blocks;
  return keel_ec_layout_locate(layout, row / k, (int)(row % k), location_p);
}

keel_status keel_ec_layout_locate_slot(const keel_ec_layout *layout, int server, keel_ec_role role,
                                       uint64_t slot, keel_ec_location *location_p) {
  if (layout == NULL || location_p == NULL) {
    return keel__ec_invalid("keel_ec_layout_locate_slot: NULL argument");
  }
  if (server < 0 || server >= layout->servers || (role != KEEL_EC_DATA && role != KEEL_EC_PARITY)) {
    KEEL_LOG_E(KEEL__EC_MODULE, "ec layout: server %d of %d, role %d", server, layout->servers,
               (int)role);
    return KEEL_EINVAL;
  }
  interval range = interval_of(layout, server, role);
  uint64_t period = slot / (uint64_t)range.length;
  int residue = interval_value(&range, (int)(slot % (uint64_t)range.length));
  uint64_t servers = (uint64_t)layout->servers;
  if (period > (UINT64_MAX - (uint64_t)residue) / servers) return KEEL_ERANGE;
  *location_p = (keel_ec_location){
      .group = period * servers + (uint64_t)residue,
      .member = (server - residue + layout->servers) % layout->servers,
      .server = server,
      .slot = slot,
  };
  return KEEL_OK;
}

keel_status keel_ec_layout_count(const keel_ec_layout *layout, int server, uint64_t groups,
                                 uint64_t *data_rows_p, uint64_t *parity_rows_p) {
  if (layout == NULL || data_rows_p == NULL || parity_rows_p == NULL) {
    return keel__ec_invalid("keel_ec_layout_count: NULL argument");
  }
  if (server < 0 || server >= layout->servers) {
    KEEL_LOG_E(KEEL__EC_MODULE, "ec layout: server %d of %d", server, layout->servers);
    return KEEL_EINVAL;
  }
  uint64_t servers = (uint64_t)layout->servers;
  uint64_t periods = groups / servers;
  int rest = (int)(groups % servers);
  interval data = interval_of(layout, server, KEEL_EC_DATA);
  interval parity = interval_of(layout, server, KEEL_EC_PARITY);
  *data_rows_p = periods * (uint64_t)data.length +
                 (uint64_t)interval_count_below(&data, layout->servers, rest);
  *parity_rows_p = periods * (uint64_t)parity.length +
                   (uint64_t)interval_count_below(&parity, layout->servers, rest);
  return KEEL_OK;
}
