/*
 * A handler declared with its generated function type, then defined. As
 * is, it matches storage's op put and compiles. With
 * -DCTL_WRONG_RESULT its result is a uint32_t, not put's uint64_t: the
 * definition then conflicts with the declaration, which is a compile error
 * even with every warning off (-w), so a mistyped handler cannot slip
 * through as a mere incompatible-pointer warning where the table is
 * filled.
 */
#include "storage.ctl.h"

#ifdef CTL_WRONG_RESULT
typedef uint32_t put_result;
#else
typedef uint64_t put_result;
#endif

static storage_put_handler on_put;

static int on_put(void *ctx, const storage_put_args *args, put_result *result, ctl_req *req)
{
    (void)ctx;
    (void)req;
    *result = (put_result)args->data.len;
    return 0;
}

const storage_handlers *handler_type_check(void);

const storage_handlers *handler_type_check(void)
{
    static const storage_handlers h = {.on_put = on_put};
    return &h;
}
