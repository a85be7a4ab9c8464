/*
 * handlers.h - the storage service's handlers (idl/storage.idl) over a
 * store: what ctl-storage-unit serves, and what the benchmarks serve
 * in-process.
 */
#ifndef CTL_STORAGE_HANDLERS_H
#define CTL_STORAGE_HANDLERS_H

#include <pthread.h>

#include "storage.ctl.h"
#include "store.h"

typedef struct storage_unit {
    store *store;
    ctl_server *server; /* for stats; set under `lock` before serving */
    pthread_mutex_t lock; /* the unit's lock: handlers run under it */
} storage_unit;

/* Fill `h` with the handlers, their context being `u`. */
void storage_unit_handlers(storage_unit *u, storage_handlers *h);

#endif /* CTL_STORAGE_HANDLERS_H */
