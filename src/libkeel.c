/* The one source of libkeel.so's own: every layer's archive goes into the shared object
 * whole (CMakeLists.txt), and this says which binary interface they make, for the bindings
 * that load it at run time. */
#include "keel/keel.h"

int keel_abi_version(void) { return KEEL_ABI_VERSION; }
