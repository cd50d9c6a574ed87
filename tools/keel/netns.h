/* Simulated hosts for `keel run --netns`: each node of a job is a network namespace with its
 * own address in 198.18.0.0/15, wired to the launcher through a bridge; each node's link can
 * be shaped to a rate, and a node can be cut off from everyone and healed. Root only; the
 * kernel is driven through ip(8) and tc(8) of iproute2, never through a shell. */
#ifndef KEEL_NETNS_H
#define KEEL_NETNS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "keel/core.h"

/* A /24 per job: the bridge holds .1 and node i holds .(i + 2). */
#define KEEL__NETNS_MAX_NODES 253
/* Room for a one-line reason from keel__netns_create. */
#define KEEL__NETNS_REASON_BYTES 512
/* The name of each node's interface inside its namespace. */
#define KEEL__NETNS_NODE_DEVICE "eth0"
/* The bridge's alias records its owner's start time (ticks since boot, /proc/<pid>/stat
 * field 22), so that a live process that merely reused a dead owner's pid is told apart. */
#define KEEL__NETNS_OWNER_STAMP "keel-owner-start="

/* Names carry the owner's pid (kernel names are global, so a process has one network at a
 * time): namespace "keel-<pid>-<node>", bridge "kb<pid>", the bridge-side veth of a node
 * "kv<pid>n<node>" (at most 13 characters: pids have at most 7 digits, under IFNAMSIZ). */
typedef struct keel__netns keel__netns;

/* Parses a rate as tc does: a number (fractions allowed) with a unit, case-insensitive:
 * bit, kbit, mbit, gbit, tbit (powers of 1000), kibit, mibit, gibit, tibit (powers of 1024),
 * or bytes per second with bps, kbps, mbps, gbps, tbps (and kibps...); a bare number is
 * bits. "10gbit", "500mbit", "1.5gbit". KEEL_EINVAL (nothing written) for anything else or
 * a rate outside [1mbit, 1tbit]. */
keel_status keel__netns_rate_parse(const char *text, uint64_t *bits_per_second_p);

/* Makes node_count simulated hosts (0..KEEL__NETNS_MAX_NODES) for this process: a bridge
 * with the job's first address, and for each node a namespace, a veth pair (one end on the
 * bridge, the other inside as KEEL__NETNS_NODE_DEVICE), loopback up, the node's address and
 * no route beyond the job's /24. The /24 is one of 198.18.0.0/15 that no address or route
 * of the host touches (chosen under a lock, so two jobs starting at once differ). With
 * rate_bits_per_second > 0 both ends of each node's link are shaped to it; 0 leaves them
 * unshaped. Removes first what dead owners left behind (keel__netns_cleanup_stale).
 * Runs ip and tc many times: may block for seconds. On failure nothing it made is left and
 * reason holds one line for the user: KEEL_ENOTSUP when not root or ip/tc are missing
 * ("--netns needs root: ..."), KEEL_EEXIST when this process has a network already,
 * KEEL_ENOSPC when no /24 is free, KEEL_EIO or KEEL_ETIMEDOUT when a command failed.
 * The caller destroys *net_p. */
keel_status keel__netns_create(size_t node_count, uint64_t rate_bits_per_second,
                               keel__netns **net_p, char *reason, size_t reason_capacity);
/* A network of no nodes is a bridge that holds an address of its own /24 on this host: a
 * service listening there (the etcd cluster of `keel chaos --etcd`) is reachable from the
 * nodes of other networks that are given a route to it: */
/* A host route in every node to address, through the bridge: an address of this host in
 * 198.18.0.0/15 outside the job's /24 (another network's bridge address). KEEL_EINVAL, with
 * the reason, for any other address: the nodes reach nothing else. */
keel_status keel__netns_route_add(keel__netns *net, const char *address, char *reason,
                                  size_t reason_capacity);

/* Removes every namespace, veth and the bridge the network made (processes still inside a
 * namespace keep it alive, unnamed, until they exit) and frees it. NULL allowed. */
void keel__netns_destroy(keel__netns *net);

size_t keel__netns_node_count(const keel__netns *net);
/* "198.18.x.1": the launcher's address, reachable from every node (serve the store on it). */
const char *keel__netns_bridge_address(const keel__netns *net);
/* "198.18.x.(node + 2)". */
const char *keel__netns_node_address(const keel__netns *net, size_t node);
/* "keel-<pid>-<node>": for `ip -n` and `ip netns exec`. */
const char *keel__netns_node_namespace(const keel__netns *net, size_t node);
/* "kv<pid>n<node>": the node's link as the bridge (and `tc ... dev`) sees it. */
const char *keel__netns_node_link(const keel__netns *net, size_t node);

/* Moves the calling process (a child between fork and exec: async-signal-safe, one setns on
 * a descriptor opened at creation, close-on-exec) into node's namespace. errno says why on
 * failure. The launcher's other threads are not in the child, so no thread is left behind. */
keel_status keel__netns_enter(const keel__netns *net, size_t node);

/* Cuts node off from everyone (the other nodes and the bridge address): every frame but
 * ARP is dropped silently both ways, so peers see no reset and no ICMP error, only silence;
 * TCP connections survive a heal as long as their own timeouts have not run out.
 * Idempotent; blocks while tc runs. Logs and returns the failure. */
keel_status keel__netns_partition(keel__netns *net, size_t node);
/* Lets node's traffic through again. Idempotent. */
keel_status keel__netns_heal(keel__netns *net, size_t node);
/* The same two on the link of node of the network that process owner made (keel inject,
 * from another process): its name (false when it does not fit), then the cut and the heal. */
bool keel__netns_link_name(pid_t owner, size_t node, char *name, size_t capacity);
keel_status keel__netns_link_partition(const char *link);
keel_status keel__netns_link_heal(const char *link);
/* Whether traffic of node is being dropped, as the kernel says (tc), so a partition made by
 * another process shows too. */
keel_status keel__netns_partitioned(const keel__netns *net, size_t node, bool *partitioned_p);

/* Removes every keel namespace, veth and bridge whose owner is gone: its pid is not alive,
 * or the live process with that pid started after the bridge was stamped. How many it
 * removed goes to *removed_p (may be NULL). Failures are logged and skipped; returns the
 * first. */
keel_status keel__netns_cleanup_stale(size_t *removed_p);
/* How many namespaces, veths and bridges named after owner exist now (what a job whose
 * launcher was owner left behind); the first one's kind and name in first. */
size_t keel__netns_owned_count(pid_t owner, char *first, size_t capacity);

/* Runs argv (argv[0] "ip" or "tc", found in PATH or the sbin folders a root PATH may lack)
 * with posix_spawn, never a shell, and kills it by pid once timeout_ns (> 0) has passed
 * (the module's own commands get 10 s). Its stdout replaces output's content (NULL: dropped;
 * KEEL_ERANGE past the buffer's maximum). On failure error (may be NULL) holds
 * "`ip link add ...`: <its first line of stderr>". KEEL_EIO for a non-zero exit,
 * KEEL_ETIMEDOUT when it had to be killed, KEEL_ENOTFOUND when the program is missing.
 * Call it from the thread that reaps children: it waits for its own child by pid. */
keel_status keel__netns_command_run(const char *const argv[], int64_t timeout_ns,
                                    keel_buffer *output, char *error, size_t error_capacity);

#endif
