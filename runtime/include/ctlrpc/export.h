/*
 * export.h - what libctlrpc exports.
 *
 * The shared library is built with symbols hidden by default; CTL_API marks
 * each function and object of the public headers, and only those are
 * exported (a test compares the two lists). The internal layers' symbols
 * stay out of the library's ABI.
 */
#ifndef CTLRPC_EXPORT_H
#define CTLRPC_EXPORT_H

#if defined(__GNUC__) || defined(__clang__)
#define CTL_API __attribute__((visibility("default")))
#else
#define CTL_API
#endif

#endif
