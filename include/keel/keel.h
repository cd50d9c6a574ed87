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

#endif
