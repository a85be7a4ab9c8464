/*
 * fleet.h - the etcd flags that ctl-storage-unit and ctl-storage share
 * (docs/OPERATIONS.md, "Running a fleet"):
 *
 *   --etcd URL[,URL...]  (default $CTLRPC_ETCD)   --namespace NS
 *   --service NAME       --etcd-cacert FILE       --etcd-cert FILE
 *   --etcd-key FILE      --etcd-user NAME (password from $CTLRPC_ETCD_PASSWORD)
 *
 * Each program adds its own getopt entries for these (FLEET_OPTIONS) and
 * hands the option's code and value to fleet_take().
 */
#ifndef CTL_STORAGE_FLEET_H
#define CTL_STORAGE_FLEET_H

#include <stdbool.h>
#include <stdio.h>

/* getopt_long codes: above any character. */
enum {
    FLEET_ETCD = 1000,
    FLEET_SERVICE,
    FLEET_NAMESPACE,
    FLEET_CACERT,
    FLEET_CERT,
    FLEET_KEY,
    FLEET_USER,
};

#define FLEET_OPTIONS                                                  \
    {"etcd", required_argument, NULL, FLEET_ETCD},                     \
        {"service", required_argument, NULL, FLEET_SERVICE},           \
        {"namespace", required_argument, NULL, FLEET_NAMESPACE},       \
        {"etcd-cacert", required_argument, NULL, FLEET_CACERT},        \
        {"etcd-cert", required_argument, NULL, FLEET_CERT},            \
        {"etcd-key", required_argument, NULL, FLEET_KEY},              \
        {"etcd-user", required_argument, NULL, FLEET_USER}

typedef struct fleet_flags {
    const char *etcd; /* as given, or $CTLRPC_ETCD */
    const char *service, *ns;
    const char *cacert, *cert, *key, *user;
    bool given;       /* any of the flags above was given */
} fleet_flags;

/* Take option `code` with `value`: true when it was one of ours. */
bool fleet_take(fleet_flags *f, int code, const char *value);

/* After parsing: fill etcd from $CTLRPC_ETCD when not given. Returns
 * whether an etcd endpoint is set. */
bool fleet_resolve(fleet_flags *f);

/* The help text of these flags. */
void fleet_usage(FILE *out);

#endif
