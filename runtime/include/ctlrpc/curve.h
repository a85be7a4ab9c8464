/*
 * ctlrpc/curve.h - CURVE keys: encryption and authentication of the
 * control plane.
 *
 * ZeroMQ's CURVE mechanism encrypts every frame and authenticates the unit
 * to its clients: a unit started with a secret key (ctl_server_options.
 * curve_secret_key) serves only clients that know its public key
 * (ctl_client_options.curve_server_key); others never complete the
 * handshake: their calls fail with CTL_CAUSE_AUTH within a few hundred
 * milliseconds, and the unit sees nothing of them. Given an allowlist of
 * client public keys (curve_allow), the unit also authenticates its
 * clients, through a ZAP handler it runs on its own thread: a client whose
 * key is not listed is refused during the handshake, counted
 * (ctl_server_stats.auth_denied) and logged (one line on standard error).
 *
 * Keys are 40-character Z85 strings (32 bytes). Key files hold one key as
 * text, under a header line that says which half of a pair it is
 * ("# ctlrpc CURVE secret key: keep private", "# ctlrpc CURVE public key").
 * Key files and allowlists are read as ssh reads its own files: refused,
 * with a message naming the file and the mistake, when someone else could
 * have written them (a symbolic link, a file writable by others, a file in
 * a directory others can write unless it is sticky and the file is the
 * user's or root's), when they hold a NUL byte, when a secret key file is
 * readable by its group or others, or when the header names the other half
 * of the pair ("this is a public key; pass the .key file", and the reverse).
 * ctlrpc.curve (the Python runtime) applies the same rules with the same
 * words.
 *
 * Threading: reentrant; no shared state.
 */
#ifndef CTLRPC_CURVE_H
#define CTLRPC_CURVE_H

#include <stdbool.h>
#include <stddef.h>

#include "ctlrpc/error.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Z85 length of a key, and the size of a buffer holding one. */
#define CTL_CURVE_KEY_LEN 40
#define CTL_CURVE_KEY_BUF 41

/* Whether the libzmq in use was built with CURVE (libsodium). */
CTL_API bool ctl_curve_available(void);

/* Whether `key` is a well-formed Z85 key (40 characters that decode). */
CTL_API bool ctl_curve_key_valid(const char *key);

/* A new key pair, NUL-terminated Z85. 0 or CTL_INVALID (no CURVE). */
CTL_API int ctl_curve_keypair(char public_key[CTL_CURVE_KEY_BUF],
                      char secret_key[CTL_CURVE_KEY_BUF], ctl_error *err);

/* The public key of `secret_key`. 0 or CTL_INVALID. */
CTL_API int ctl_curve_public_of(const char *secret_key,
                        char public_key[CTL_CURVE_KEY_BUF], ctl_error *err);

/*
 * Read one key from the file at `path` (surrounding whitespace and lines
 * starting with '#' are ignored) with the rules above. With `secret`, the
 * file must hold a secret key (not a public key's header) that its group
 * and others cannot read; without, it must not be a secret key file. 0, or
 * CTL_INVALID with a message naming the file and what is wrong with it.
 */
CTL_API int ctl_curve_read_key(const char *path, bool secret,
                       char key[CTL_CURVE_KEY_BUF], ctl_error *err);

/*
 * Read an allowlist: one public key per line ('#' comments and blank lines
 * ignored), with the file rules above; a key listed twice and a secret key
 * file pasted in (its header line) are refused too. On success *keys is a
 * malloc'd array of *count keys (caller frees it with free()). CTL_INVALID
 * naming the file and line otherwise.
 */
CTL_API int ctl_curve_read_allowlist(const char *path, char (**keys)[CTL_CURVE_KEY_BUF],
                             size_t *count, ctl_error *err);

/*
 * Generate a key pair and write it as PREFIX.key (the secret key, mode
 * 0600, created exclusively: an existing file is an error, never
 * overwritten) and PREFIX.pub (the public key, mode 0644). 0 or
 * CTL_INVALID naming the file; a prefix that names no file (NULL, empty,
 * or ending in '/') is CTL_INVALID too.
 */
CTL_API int ctl_curve_write_keypair(const char *prefix, ctl_error *err);

#ifdef __cplusplus
}
#endif

#endif /* CTLRPC_CURVE_H */
