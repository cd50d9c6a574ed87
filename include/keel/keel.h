/* keel: the whole public API in one include. The layers, lowest first, each header including
 * the ones below it (docs/LAYERS.md): core (status, log, clock, limits, fault plans), net
 * (framed, authenticated links), store (the job's key-value store), comm (endpoint,
 * communicators, collectives, ULFM), runtime (the process in the job: state registry, step
 * transactions, recovery), ckpt (checkpoints), ec (erasure codes and parity placement for
 * parameter servers), model (the analytic models). */
#ifndef KEEL_KEEL_H
#define KEEL_KEEL_H

#include "keel/core.h"
#include "keel/net.h"
#include "keel/store.h"
#include "keel/comm.h"
#include "keel/runtime.h"
#include "keel/ckpt.h"
#include "keel/ec.h"
#include "keel/model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The version of the binary interface of libkeel.so: a binding loaded at run time (python/keel)
 * refuses a library whose version differs from the one it was written for. It grows with
 * every change of a signature or structure a binding uses. */
#define KEEL_ABI_VERSION 2
int keel_abi_version(void);

#ifdef __cplusplus
}
#endif
#endif
