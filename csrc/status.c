/* status.c - human-readable names for the el_status codes of edgellama.h.
 * Static strings only: safe from any thread, never NULL. */
#include "edgellama.h"

const char *el_status_str(int status) {
    switch (status) {
    case EL_OK: return "ok";
    case EL_EINVAL: return "invalid argument";
    case EL_ENOMEM: return "out of memory";
    case EL_EUNSUPPORTED: return "not supported";
    case EL_ETHREAD: return "thread creation failed";
    case EL_ECTX: return "context full or position out of range";
    case EL_EBUSY: return "the pool is already in use by this thread";
    default: return "unknown status";
    }
}
