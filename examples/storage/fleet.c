/*
 * fleet.c - the etcd flags shared by ctl-storage-unit and ctl-storage
 * (fleet.h).
 */
#include <stdlib.h>

#include "fleet.h"

bool fleet_take(fleet_flags *f, int code, const char *value)
{
    switch (code) {
    case FLEET_ETCD:
        f->etcd = value;
        break;
    case FLEET_SERVICE:
        f->service = value;
        break;
    case FLEET_NAMESPACE:
        f->ns = value;
        break;
    case FLEET_CACERT:
        f->cacert = value;
        break;
    case FLEET_CERT:
        f->cert = value;
        break;
    case FLEET_KEY:
        f->key = value;
        break;
    case FLEET_USER:
        f->user = value;
        break;
    default:
        return false;
    }
    f->given = true;
    return true;
}

bool fleet_resolve(fleet_flags *f)
{
    if (!f->etcd || !*f->etcd) {
        const char *env = getenv("CTLRPC_ETCD");
        f->etcd = env && *env ? env : NULL;
    }
    return f->etcd != NULL;
}

void fleet_usage(FILE *out)
{
#ifndef CTLRPC_WITH_ETCD
    fputs("  (this build has no etcd support, configured with CTLRPC_WITH_ETCD=OFF:\n"
          "  the flags below are refused)\n",
          out);
#endif
    fputs("  --etcd URL[,URL...]  etcd endpoints (http:// or https://), tried in\n"
          "                       order (default $CTLRPC_ETCD)\n"
          "  --service NAME       the service's name in etcd (default: the IDL's,\n"
          "                       storage)\n"
          "  --namespace NS       the fleet's namespace in etcd (default default)\n"
          "  --etcd-cacert FILE   check https endpoints against this CA\n"
          "  --etcd-cert FILE     client certificate for etcd (with --etcd-key)\n"
          "  --etcd-key FILE      its private key\n"
          "  --etcd-user NAME     etcd user; the password is read from\n"
          "                       $CTLRPC_ETCD_PASSWORD\n",
          out);
}
