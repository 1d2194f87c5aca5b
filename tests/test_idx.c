/* IDX parsing and loading, datasets, class selection, batcher determinism, Fashion-MNIST. */
#include <criterion/criterion.h>
#include <stdint.h>
#include <sys/stat.h>
#include <zlib.h>

#include "specmoe/io/data.h"
#include "testutil.h"

/* An IDX buffer with the given type byte and dims; data byte i is (i * 7 + 3) & 0xff, or label i % 10
 * when `labels`. Returns a malloc'd buffer of exactly *size bytes. */
static uint8_t *make_idx(int type, int ndim, const uint32_t *dims, int labels, size_t *size) {
    size_t count = 1;
    for (int i = 0; i < ndim; i++) count *= dims[i];
    if (ndim == 0) count = 0;
    size_t h = 4 + 4 * (size_t)ndim;
    *size = h + count;
    uint8_t *b = malloc(*size);
    b[0] = 0;
    b[1] = 0;
    b[2] = (uint8_t)type;
    b[3] = (uint8_t)ndim;
    for (int i = 0; i < ndim; i++) {
        b[4 + 4 * i] = (uint8_t)(dims[i] >> 24);
        b[5 + 4 * i] = (uint8_t)(dims[i] >> 16);
        b[6 + 4 * i] = (uint8_t)(dims[i] >> 8);
        b[7 + 4 * i] = (uint8_t)dims[i];
    }
    for (size_t i = 0; i < count; i++) b[h + i] = labels ? (uint8_t)(i % 10) : (uint8_t)((i * 7 + 3) & 0xff);
    return b;
}

static void expect_idx_refused(const uint8_t *b, size_t size, const char *needle) {
    sm_idx x;
    sm_error err = {0};
    cr_expect_eq(sm_idx_parse(&x, b, size, "bad.idx", &err), SM_ERR_FORMAT, "accepted (%s)", needle);
    cr_expect(strstr(err.msg, "bad.idx") != NULL, "message does not name the file: %s", err.msg);
    cr_expect(strstr(err.msg, needle) != NULL, "message '%s' lacks '%s'", err.msg, needle);
    cr_expect_null(x.data);
}

static int write_gz(const char *path, const void *data, size_t n) {
    gzFile g = gzopen(path, "wb");
    if (!g) return -1;
    int w = gzwrite(g, data, (unsigned)n);
    return (gzclose(g) == Z_OK && (size_t)w == n) ? 0 : -1;
}

Test(idx, parse_images_and_labels) {
    uint32_t dims[3] = {2, 3, 4};
    size_t size;
    uint8_t *b = make_idx(0x08, 3, dims, 0, &size);
    sm_idx x;
    sm_error err = {0};
    cr_assert_eq(sm_idx_parse(&x, b, size, "img.idx", &err), SM_OK, "%s", err.msg);
    cr_expect_eq(x.ndim, 3);
    cr_expect_eq(x.dims[0], 2);
    cr_expect_eq(x.dims[1], 3);
    cr_expect_eq(x.dims[2], 4);
    cr_expect_eq(x.count, 24);
    cr_expect(memcmp(x.data, b + 16, 24) == 0);
    sm_idx_free(&x);
    cr_expect_null(x.data);
    free(b);

    uint32_t ld[1] = {5};
    b = make_idx(0x08, 1, ld, 1, &size);
    cr_assert_eq(sm_idx_parse(&x, b, size, "lab.idx", &err), SM_OK, "%s", err.msg);
    cr_expect_eq(x.ndim, 1);
    cr_expect_eq(x.count, 5);
    cr_expect_eq(x.data[4], 4);
    sm_idx_free(&x);
    free(b);

    /* rank 4 is the largest accepted */
    uint32_t d4[4] = {1, 2, 1, 3};
    b = make_idx(0x08, 4, d4, 0, &size);
    cr_expect_eq(sm_idx_parse(&x, b, size, "r4.idx", &err), SM_OK, "%s", err.msg);
    sm_idx_free(&x);
    free(b);
}

Test(idx, rejects_malformed) {
    uint32_t dims[3] = {2, 3, 4};
    size_t size;
    uint8_t *b = make_idx(0x08, 3, dims, 0, &size);

    b[0] = 1;
    expect_idx_refused(b, size, "bad IDX magic");
    b[0] = 0;
    b[1] = 8;
    expect_idx_refused(b, size, "bad IDX magic");
    b[1] = 0;

    b[2] = 0x0D;
    expect_idx_refused(b, size, "type 0x0d (f32)");
    b[2] = 0x42;
    expect_idx_refused(b, size, "only u8");
    b[2] = 0x08;

    /* truncated / trailing */
    expect_idx_refused(b, size - 1, "truncated: expected 40 bytes, got 39");
    uint8_t *big = malloc(size + 3);
    memcpy(big, b, size);
    memset(big + size, 0, 3);
    expect_idx_refused(big, size + 3, "3 trailing bytes");
    free(big);

    /* zero dimension */
    b[8] = b[9] = b[10] = b[11] = 0; /* dims[1]: 3 -> 0 */
    expect_idx_refused(b, 16, "dimension 1 (offset 8) is zero");
    free(b);

    /* rank 0 and 5 */
    uint8_t r0[4] = {0, 0, 8, 0};
    expect_idx_refused(r0, 4, "rank 0");
    uint32_t d5[5] = {1, 1, 1, 1, 1};
    b = make_idx(0x08, 5, d5, 0, &size);
    expect_idx_refused(b, size, "rank 5");
    free(b);

    /* dims whose product overflows size_t */
    uint8_t hb[20] = {0, 0, 8, 4};
    for (int i = 0; i < 4; i++) memset(hb + 4 + 4 * i, 0xff, 4);
    expect_idx_refused(hb, 20, "overflow");

    /* a header that does not fit */
    uint8_t sh[6] = {0, 0, 8, 2, 0, 0};
    expect_idx_refused(sh, 6, "truncated: expected 12 header bytes, got 6");
}

Test(idx, every_prefix_refused) {
    uint32_t dims[3] = {3, 2, 2};
    size_t size;
    uint8_t *b = make_idx(0x08, 3, dims, 0, &size);
    for (size_t len = 0; len < size; len++) {
        uint8_t *p = malloc(len ? len : 1);
        memcpy(p, b, len);
        sm_idx x;
        sm_error err = {0};
        cr_expect_eq(sm_idx_parse(&x, p, len, "prefix.idx", &err), SM_ERR_FORMAT, "prefix %zu accepted", len);
        cr_expect(strstr(err.msg, "truncated") != NULL, "len %zu: %s", len, err.msg);
        free(p);
    }
    free(b);
}

Test(idx, load_gz_and_plain) {
    const char *dir = tu_tmpdir();
    uint32_t dims[3] = {4, 3, 3};
    size_t size;
    uint8_t *b = make_idx(0x08, 3, dims, 0, &size);
    char gz[256], plain[256], trunc[256];
    snprintf(gz, sizeof gz, "%s/img.idx.gz", dir);
    snprintf(plain, sizeof plain, "%s/img.idx", dir);
    snprintf(trunc, sizeof trunc, "%s/trunc.idx.gz", dir);
    cr_assert_eq(write_gz(gz, b, size), 0);
    cr_assert_eq(tu_write_file(plain, b, size), 0);

    sm_idx x;
    sm_error err = {0};
    cr_assert_eq(sm_idx_load(&x, gz, 1 << 20, &err), SM_OK, "%s", err.msg);
    cr_expect_eq(x.count, 36);
    cr_expect(memcmp(x.data, b + 16, 36) == 0);
    sm_idx_free(&x);

    cr_assert_eq(sm_idx_load(&x, plain, 1 << 20, &err), SM_OK, "%s", err.msg);
    cr_expect(memcmp(x.data, b + 16, 36) == 0);
    sm_idx_free(&x);

    /* decompressed size above the bound */
    cr_expect_eq(sm_idx_load(&x, gz, size - 1, &err), SM_ERR_FORMAT);
    cr_expect(strstr(err.msg, gz) && strstr(err.msg, "limit"), "%s", err.msg);
    cr_expect_eq(sm_idx_load(&x, gz, size, &err), SM_OK, "%s", err.msg); /* exactly at the bound */
    sm_idx_free(&x);

    /* a truncated gzip stream is reported, not silently accepted */
    size_t gn;
    unsigned char *g = tu_read_file(gz, &gn);
    cr_assert_not_null(g);
    cr_assert_eq(tu_write_file(trunc, g, gn / 2), 0);
    free(g);
    cr_expect_neq(sm_idx_load(&x, trunc, 1 << 20, &err), SM_OK);
    cr_expect(strstr(err.msg, trunc) != NULL, "%s", err.msg);
    cr_expect_null(x.data);

    /* missing file */
    char missing[256];
    snprintf(missing, sizeof missing, "%s/none.gz", dir);
    cr_expect_eq(sm_idx_load(&x, missing, 1 << 20, &err), SM_ERR_IO);
    cr_expect(strstr(err.msg, missing) != NULL, "%s", err.msg);
    free(b);
}

/* Writes images (n, 2, 2) and labels (n_lab) with labels[i] = lab(i) into dir; returns paths. */
static void write_pair(const char *dir, uint32_t n_img, uint32_t n_lab, int bad_label_at, char *ip, char *lp) {
    uint32_t id[3] = {n_img, 2, 2}, ld[1] = {n_lab};
    size_t is, ls;
    uint8_t *ib = make_idx(0x08, 3, id, 0, &is);
    uint8_t *lb = make_idx(0x08, 1, ld, 1, &ls);
    if (bad_label_at >= 0) lb[8 + bad_label_at] = 10;
    sprintf(ip, "%s/images-idx3-ubyte.gz", dir);
    sprintf(lp, "%s/labels-idx1-ubyte.gz", dir);
    cr_assert_eq(write_gz(ip, ib, is), 0);
    cr_assert_eq(write_gz(lp, lb, ls), 0);
    free(ib);
    free(lb);
}

Test(dataset, load_idx_pair) {
    char ip[256], lp[256];
    write_pair(tu_tmpdir(), 6, 6, -1, ip, lp);
    sm_dataset ds;
    sm_error err = {0};
    cr_assert_eq(sm_dataset_load_idx(&ds, ip, lp, &err), SM_OK, "%s", err.msg);
    cr_expect_eq(ds.n, 6);
    cr_expect_eq(ds.dim, 4);
    cr_expect_eq(ds.n_classes, 10);
    for (int i = 0; i < 24; i++) cr_expect_eq(ds.x[i], (float)((i * 7 + 3) & 0xff) / 255.0f);
    for (int i = 0; i < 6; i++) cr_expect_eq(ds.y[i], i % 10);
    sm_dataset_free(&ds);
    cr_expect_null(ds.x);
}

Test(dataset, load_idx_refusals) {
    char ip[256], lp[256];
    sm_dataset ds;
    sm_error err = {0};

    write_pair(tu_tmpdir(), 6, 5, -1, ip, lp);
    cr_expect_neq(sm_dataset_load_idx(&ds, ip, lp, &err), SM_OK);
    cr_expect(strstr(err.msg, "6 images") && strstr(err.msg, "5 labels"), "%s", err.msg);
    cr_expect_null(ds.x);

    write_pair(tu_tmpdir(), 6, 6, 3, ip, lp);
    cr_expect_eq(sm_dataset_load_idx(&ds, ip, lp, &err), SM_ERR_FORMAT);
    cr_expect(strstr(err.msg, "label 10 of example 3") && strstr(err.msg, lp), "%s", err.msg);

    /* swapped files: labels where images are expected */
    write_pair(tu_tmpdir(), 6, 6, -1, ip, lp);
    cr_expect_eq(sm_dataset_load_idx(&ds, lp, ip, &err), SM_ERR_FORMAT);
    cr_expect(strstr(err.msg, "3-D") != NULL, "%s", err.msg);
}

Test(dataset, fashion_missing_dir_hint) {
    sm_dataset ds;
    sm_error err = {0};
    cr_expect_eq(sm_dataset_load_fashion(&ds, "/nonexistent-specmoe-data", "train", &err), SM_ERR_IO);
    cr_expect(strstr(err.msg, "apt-get install dataset-fashion-mnist") && strstr(err.msg, "--data DIR"), "%s",
              err.msg);
    cr_expect(strstr(err.msg, "/nonexistent-specmoe-data/train-images-idx3-ubyte.gz") != NULL, "%s", err.msg);
    cr_expect_eq(sm_dataset_load_fashion(&ds, NULL, "valid", &err), SM_ERR_ARG);
    cr_expect(strstr(err.msg, "valid") != NULL, "%s", err.msg);
}

/* n examples of dim 3, label i % 10, x row i = (i, i, i). */
static void synth(sm_dataset *ds, int n) {
    ds->n = n;
    ds->dim = 3;
    ds->n_classes = 10;
    ds->x = malloc(sizeof *ds->x * (size_t)n * 3);
    ds->y = malloc(sizeof *ds->y * (size_t)n);
    for (int i = 0; i < n; i++) {
        ds->y[i] = i % 10;
        for (int j = 0; j < 3; j++) ds->x[3 * i + j] = (float)i;
    }
}

Test(dataset, select_four_classes_1600_each) {
    sm_dataset ds;
    synth(&ds, 20000); /* 2000 per class */
    int classes[4] = {0, 2, 4, 6};
    sm_error err = {0};
    cr_assert_eq(sm_dataset_select(&ds, classes, 4, 1600, 0, &err), SM_OK, "%s", err.msg);
    cr_expect_eq(ds.n, 6400);
    cr_expect_eq(ds.n_classes, 10);
    int count[10] = {0};
    int prev = -1;
    for (int i = 0; i < ds.n; i++) {
        count[ds.y[i]]++;
        int orig = (int)ds.x[3 * i];
        cr_assert_eq(orig % 10, ds.y[i], "row %d carries the wrong features", i);
        cr_assert_gt(orig, prev, "file order not kept");
        prev = orig;
    }
    for (int c = 0; c < 10; c++) cr_expect_eq(count[c], (c % 2 == 0 && c < 8) ? 1600 : 0, "class %d", c);
    /* the first 1600 of each class in file order: the last kept example of class 6 is 10 * 1599 + 6 */
    cr_expect_eq((int)ds.x[3 * (ds.n - 1)], 15996);
    sm_dataset_free(&ds);
}

Test(dataset, select_relabel_and_all) {
    sm_dataset ds;
    synth(&ds, 100);
    int classes[3] = {7, 1, 3};
    sm_error err = {0};
    cr_assert_eq(sm_dataset_select(&ds, classes, 3, 0, 1, &err), SM_OK, "%s", err.msg);
    cr_expect_eq(ds.n, 30);
    cr_expect_eq(ds.n_classes, 3);
    for (int i = 0; i < ds.n; i++) {
        int orig = (int)ds.x[3 * i] % 10;
        cr_expect_eq(classes[ds.y[i]], orig);
    }
    sm_dataset_free(&ds);
}

Test(dataset, select_refusals_leave_dataset_intact) {
    sm_dataset ds;
    synth(&ds, 50);
    sm_error err = {0};
    int bad[2] = {1, 10}, dup[2] = {4, 4}, neg[1] = {-1};
    cr_expect_eq(sm_dataset_select(&ds, bad, 2, 0, 0, &err), SM_ERR_ARG);
    cr_expect(strstr(err.msg, "10") && strstr(err.msg, "out of range"), "%s", err.msg);
    cr_expect_eq(sm_dataset_select(&ds, dup, 2, 0, 0, &err), SM_ERR_ARG);
    cr_expect(strstr(err.msg, "twice"), "%s", err.msg);
    cr_expect_eq(sm_dataset_select(&ds, neg, 1, 0, 0, &err), SM_ERR_ARG);
    cr_expect_eq(sm_dataset_select(&ds, bad, 0, 0, 0, &err), SM_ERR_ARG);
    cr_expect_eq(ds.n, 50);
    /* a class with no examples: empty selection refused */
    ds.n = 5; /* labels 0..4 only */
    int nine[1] = {9};
    cr_expect_eq(sm_dataset_select(&ds, nine, 1, 0, 0, &err), SM_ERR_ARG);
    cr_expect_eq(ds.n, 5);
    sm_dataset_free(&ds);
}

Test(dataset, parse_class_list) {
    int c[16];
    sm_error err = {0};
    cr_expect_eq(sm_parse_class_list("0,1,7", c, 16, 10, &err), 3);
    cr_expect(c[0] == 0 && c[1] == 1 && c[2] == 7);
    cr_expect_eq(sm_parse_class_list(" 3 , 5 ", c, 16, 10, &err), 2);
    cr_expect(c[0] == 3 && c[1] == 5);
    cr_expect_eq(sm_parse_class_list("all", c, 16, 10, &err), 10);
    for (int i = 0; i < 10; i++) cr_expect_eq(c[i], i);
    cr_expect_eq(sm_parse_class_list("9", c, 16, 10, &err), 1);

    const char *bad[] = {"", "   ", "1,,2", "1,", ",1", "a", "10", "-1", "1,1", "1x", "1 2", "99999999999999999999",
                         "all,1", "ALL", "0x3", "+1"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err.msg[0] = '\0';
        cr_expect_eq(sm_parse_class_list(bad[i], c, 16, 10, &err), -1, "accepted '%s'", bad[i]);
        cr_expect(err.msg[0] != '\0', "no message for '%s'", bad[i]);
    }
    cr_expect_eq(sm_parse_class_list("0,1,2", c, 2, 10, &err), -1); /* more than max */
    cr_expect_eq(sm_parse_class_list("all", c, 4, 10, &err), -1);
    cr_expect(strstr(err.msg, "out of range") == NULL);
    cr_expect_eq(sm_parse_class_list("10", c, 16, 10, &err), -1);
    cr_expect(strstr(err.msg, "out of range 0..9") != NULL, "%s", err.msg);
}

/* Reads one full epoch of example ids (x[0] carries the id) into ids; returns the count. */
static int read_epoch(sm_batcher *b, int *ids, int *batches) {
    float x[8 * 3];
    int y[8], n = 0, B;
    *batches = 0;
    while ((B = sm_batcher_next(b, x, y)) > 0) {
        for (int i = 0; i < B; i++) {
            ids[n + i] = (int)x[3 * i];
            cr_assert_eq(y[i], ids[n + i] % 10);
        }
        n += B;
        (*batches)++;
    }
    return n;
}

Test(batcher, determinism_epochs_and_seek) {
    sm_dataset ds;
    synth(&ds, 37);
    sm_error err = {0};
    sm_batcher a, b;
    cr_assert_eq(sm_batcher_init(&a, &ds, 8, 1234, 1, &err), SM_OK, "%s", err.msg);
    cr_assert_eq(sm_batcher_init(&b, &ds, 8, 1234, 1, &err), SM_OK, "%s", err.msg);
    int e0[37], e0b[37], e1[37], e2[37], nb;
    cr_assert_eq(read_epoch(&a, e0, &nb), 37);
    cr_expect_eq(nb, 5); /* 8+8+8+8+5: the last batch is short */
    cr_expect_eq(a.epoch, 1);
    cr_assert_eq(read_epoch(&b, e0b, &nb), 37);
    cr_expect(memcmp(e0, e0b, sizeof e0) == 0, "same seed, different order");

    /* each epoch is a permutation, and consecutive epochs differ */
    cr_assert_eq(read_epoch(&a, e1, &nb), 37);
    cr_assert_eq(read_epoch(&a, e2, &nb), 37);
    cr_expect(memcmp(e0, e1, sizeof e0) != 0, "epochs 0 and 1 share an order");
    cr_expect(memcmp(e1, e2, sizeof e1) != 0, "epochs 1 and 2 share an order");
    int seen[37] = {0};
    for (int i = 0; i < 37; i++) seen[e1[i]]++;
    for (int i = 0; i < 37; i++) cr_expect_eq(seen[i], 1);

    /* resume mid-epoch: seek(1, 16) continues exactly where the uninterrupted run was */
    sm_batcher_seek(&b, 1, 16);
    float x[8 * 3];
    int y[8];
    cr_assert_eq(sm_batcher_next(&b, x, y), 8);
    for (int i = 0; i < 8; i++) cr_expect_eq((int)x[3 * i], e1[16 + i]);
    sm_batcher_seek(&b, 2, 0);
    int r2[37];
    cr_assert_eq(read_epoch(&b, r2, &nb), 37);
    cr_expect(memcmp(r2, e2, sizeof e2) == 0, "seek(2, 0) does not reproduce epoch 2");

    /* a different seed gives a different order */
    sm_batcher c;
    cr_assert_eq(sm_batcher_init(&c, &ds, 8, 1235, 1, &err), SM_OK);
    int s0[37];
    cr_assert_eq(read_epoch(&c, s0, &nb), 37);
    cr_expect(memcmp(s0, e0, sizeof e0) != 0);
    sm_batcher_free(&a);
    sm_batcher_free(&b);
    sm_batcher_free(&c);
    sm_dataset_free(&ds);
}

Test(batcher, no_shuffle_is_identity) {
    sm_dataset ds;
    synth(&ds, 20);
    sm_error err = {0};
    sm_batcher b;
    cr_assert_eq(sm_batcher_init(&b, &ds, 6, 99, 0, &err), SM_OK);
    int ids[20], nb;
    for (int e = 0; e < 2; e++) {
        cr_assert_eq(read_epoch(&b, ids, &nb), 20);
        cr_expect_eq(nb, 4);
        for (int i = 0; i < 20; i++) cr_expect_eq(ids[i], i);
    }
    sm_batcher_free(&b);
    cr_expect_eq(sm_batcher_init(&b, &ds, 0, 99, 0, &err), SM_ERR_ARG);
    sm_dataset empty = {0};
    cr_expect_eq(sm_batcher_init(&b, &empty, 4, 99, 0, &err), SM_ERR_ARG);
    sm_dataset_free(&ds);
}

Test(fashion, real_data) {
    struct stat sb;
    if (stat(SM_FASHION_MNIST_DIR "/train-images-idx3-ubyte.gz", &sb) != 0)
        cr_skip_test("Fashion-MNIST not installed (apt-get install dataset-fashion-mnist)");
    sm_dataset tr, te;
    sm_error err = {0};
    cr_assert_eq(sm_dataset_load_fashion(&tr, NULL, "train", &err), SM_OK, "%s", err.msg);
    cr_expect_eq(tr.n, 60000);
    cr_expect_eq(tr.dim, 784);
    int count[10] = {0};
    for (int i = 0; i < tr.n; i++) count[tr.y[i]]++;
    for (int c = 0; c < 10; c++) cr_expect_eq(count[c], 6000, "class %d", c);
    float lo = 1, hi = 0;
    for (size_t i = 0; i < (size_t)tr.n * tr.dim; i++) {
        if (tr.x[i] < lo) lo = tr.x[i];
        if (tr.x[i] > hi) hi = tr.x[i];
    }
    cr_expect_eq(lo, 0.0f);
    cr_expect_eq(hi, 1.0f);
    int classes[4] = {0, 1, 2, 3};
    cr_assert_eq(sm_dataset_select(&tr, classes, 4, 1600, 1, &err), SM_OK, "%s", err.msg);
    cr_expect_eq(tr.n, 6400);
    sm_dataset_free(&tr);

    cr_assert_eq(sm_dataset_load_fashion(&te, NULL, "test", &err), SM_OK, "%s", err.msg);
    cr_expect_eq(te.n, 10000);
    cr_expect_eq(te.dim, 784);
    sm_dataset_free(&te);
}
