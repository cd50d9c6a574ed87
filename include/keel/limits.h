/* keel limits: the bounds every layer and the launcher check against, in one place, so that
 * `keel run` refuses at once what the library would refuse later. Part of core (core.h
 * includes it); plain numbers, no code. */
#ifndef KEEL_LIMITS_H
#define KEEL_LIMITS_H

/* Ranks of one communicator (and workers of one job at any moment, spares not counted). */
#define KEEL_MAX_WORLD 1024
/* Idle spares a job may keep waiting at once. */
#define KEEL_MAX_SPARES 256
/* Processes over a job's whole life: a uid is never reused, so respawned spares, joiners
 * and every restart's new workers each take one. */
#define KEEL_MAX_UIDS (1 << 20)
/* Buffers of registered training state, and the bytes of one buffer's name (no NUL). */
#define KEEL_MAX_STATE_BUFFERS 256
#define KEEL_STATE_NAME_MAX 63
/* Hooks a process may add for failures and for step commits (checkpoint policies). */
#define KEEL_MAX_HOOKS 8
/* State sources (checkpoint tiers) a process may add. */
#define KEEL_MAX_STATE_SOURCES 4
/* KEEL_FAULT rules of one process. */
#define KEEL_MAX_FAULT_RULES 8
/* Bytes of the note a member attaches to its vote in an agreement (what state it holds). */
#define KEEL_NOTE_MAX 64

#endif
