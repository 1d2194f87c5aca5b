/* sm_carve (params.h): one zero-filled block per element type, carved into named arrays from a table
 * of sizes, in table order; out of memory (here: a total that overflows) is SM_ERR_NOMEM with the
 * owner and the size in MiB in the message, and the pointers are left alone.
 *
 * Run from the repo root: make build/tests/test_carve && build/tests/test_carve
 */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "specmoe/core/params.h"

Test(carve, arrays_follow_each_other_in_table_order_zero_filled) {
    sm_real *a = NULL, *b = NULL, *c = NULL;
    size_t sizes[] = {6, 0, 5};
    sm_real **ptrs[] = {&a, &b, &c};
    sm_error err = {0};
    sm_real *block = sm_carve(ptrs, sizes, SM_LEN(sizes), &err, "test %d", 1);
    cr_assert(block, "%s", err.msg);
    cr_expect_eq(a, block);
    cr_expect_eq(b, block + 6);
    cr_expect_eq(c, block + 6);
    for (int i = 0; i < 11; i++) cr_expect_eq(block[i], 0);
    free(block);

    int *ci = NULL, *li = NULL;
    size_t isz[] = {3, 4};
    int **ip[] = {&ci, &li};
    int *iblock = sm_carve_int(ip, isz, SM_LEN(isz), &err, "test");
    cr_assert(iblock, "%s", err.msg);
    cr_expect(ci == iblock && li == iblock + 3 && li[3] == 0);
    free(iblock);

    double *f = NULL;
    size_t dsz[] = {7};
    double **dp[] = {&f};
    double *dblock = sm_carve_double(dp, dsz, SM_LEN(dsz), &err, "test");
    cr_assert(dblock, "%s", err.msg);
    cr_expect(f == dblock && f[6] == 0);
    free(dblock);
}

Test(carve, a_total_that_overflows_is_out_of_memory_naming_the_owner) {
    sm_real *a = NULL, *b = NULL;
    size_t sizes[] = {SIZE_MAX / 2, SIZE_MAX / 2};
    sm_real **ptrs[] = {&a, &b};
    sm_error err = {0};
    cr_expect_null(sm_carve(ptrs, sizes, SM_LEN(sizes), &err, "router %s (scratch for %d tokens)", "topk", 7));
    cr_expect_eq(err.code, SM_ERR_NOMEM);
    cr_expect(strstr(err.msg, "router topk (scratch for 7 tokens): out of memory") && strstr(err.msg, " MiB)"), "%s",
              err.msg);
    cr_expect(a == NULL && b == NULL);
}
