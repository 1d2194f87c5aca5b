/* Datasets: IDX parsing (plain or gzip), Fashion-MNIST loading, class subsets, seeded minibatches.
 *
 * Letters: N examples, D = rows * cols features, C classes.
 *
 * IDX (LeCun's MNIST format): big-endian u32 magic 0x0000 | type << 8 | ndim, ndim big-endian u32 dims,
 * then prod(dims) elements. Only type 0x08 (u8) is accepted: it is what MNIST and Fashion-MNIST use,
 * and refusing the rest keeps the element size out of the bounds arithmetic.
 */
#define _POSIX_C_SOURCE 200809L
#include "specmoe/io/data.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <zlib.h>

/* Decompressed-size bound used by sm_dataset_load_idx: Fashion-MNIST train images are 47 MB; 2 GiB
 * leaves room for larger IDX sets while still refusing a gzip bomb before it exhausts memory. */
#define IDX_MAX_BYTES ((size_t)1 << 31)
#define N_CLASSES 10

/* ---------------------------------------------------------------------------------------------- */
/* IDX */

static uint32_t rd_u32be(const uint8_t *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | (uint32_t)p[3];
}

static const char *idx_type_name(unsigned t) {
    switch (t) {
    case 0x08: return "u8";
    case 0x09: return "i8";
    case 0x0B: return "i16";
    case 0x0C: return "i32";
    case 0x0D: return "f32";
    case 0x0E: return "f64";
    }
    return "unknown";
}

/* Validates the IDX header of buf[0..size) and that size is exactly header + data. Fills ndim, dims,
 * count and *hdr (header length = offset of the data). */
static sm_status idx_check(sm_idx *out, size_t *hdr, const uint8_t *buf, size_t size, const char *what,
                           sm_error *err) {
    if (size < 4)
        return sm_fail(err, SM_ERR_FORMAT, "%s: truncated: expected at least 4 bytes of IDX magic, got %zu",
                       what, size);
    if (buf[0] != 0 || buf[1] != 0)
        return sm_fail(err, SM_ERR_FORMAT,
                       "%s: bad IDX magic 0x%02x%02x%02x%02x at offset 0 (must start with two zero bytes)", what,
                       buf[0], buf[1], buf[2], buf[3]);
    if (buf[2] != 0x08)
        return sm_fail(err, SM_ERR_FORMAT,
                       "%s: IDX element type 0x%02x (%s) at offset 2 is not supported; only u8 (0x08)", what,
                       buf[2], idx_type_name(buf[2]));
    int ndim = buf[3];
    if (ndim < 1 || ndim > 4)
        return sm_fail(err, SM_ERR_FORMAT, "%s: IDX rank %d at offset 3 outside 1..4", what, ndim);
    size_t h = 4 + 4 * (size_t)ndim;
    if (size < h)
        return sm_fail(err, SM_ERR_FORMAT, "%s: truncated: expected %zu header bytes, got %zu", what, h, size);
    size_t count = 1;
    for (int i = 0; i < ndim; i++) {
        uint32_t d = rd_u32be(buf + 4 + 4 * i);
        if (d == 0)
            return sm_fail(err, SM_ERR_FORMAT, "%s: IDX dimension %d (offset %zu) is zero", what, i,
                           (size_t)(4 + 4 * i));
        if (count > SIZE_MAX / d)
            return sm_fail(err, SM_ERR_FORMAT, "%s: IDX dimensions overflow the addressable size", what);
        count *= d;
        out->dims[i] = d;
    }
    if (count > SIZE_MAX - h)
        return sm_fail(err, SM_ERR_FORMAT, "%s: IDX dimensions overflow the addressable size", what);
    size_t expected = h + count;
    if (size < expected)
        return sm_fail(err, SM_ERR_FORMAT, "%s: truncated: expected %zu bytes, got %zu", what, expected, size);
    if (size > expected)
        return sm_fail(err, SM_ERR_FORMAT, "%s: %zu trailing bytes after the expected %zu (offset %zu)", what,
                       size - expected, expected, expected);
    out->ndim = ndim;
    out->count = count;
    *hdr = h;
    return SM_OK;
}

sm_status sm_idx_parse(sm_idx *out, const uint8_t *buf, size_t size, const char *what, sm_error *err) {
    if (!what) what = "<memory>";
    if (!out) return sm_fail(err, SM_ERR_ARG, "%s: no output struct", what);
    memset(out, 0, sizeof *out);
    if (!buf && size) return sm_fail(err, SM_ERR_ARG, "%s: NULL buffer of %zu bytes", what, size);
    size_t h;
    sm_status rc = idx_check(out, &h, buf, size, what, err);
    if (rc != SM_OK) {
        memset(out, 0, sizeof *out);
        return rc;
    }
    out->data = malloc(out->count);
    if (!out->data) {
        size_t c = out->count;
        memset(out, 0, sizeof *out);
        return sm_fail(err, SM_ERR_NOMEM, "%s: out of memory for %zu bytes", what, c);
    }
    memcpy(out->data, buf + h, out->count);
    return SM_OK;
}

sm_status sm_idx_load(sm_idx *out, const char *path, size_t max_bytes, sm_error *err) {
    if (!out || !path) return sm_fail(err, SM_ERR_ARG, "sm_idx_load: NULL argument");
    memset(out, 0, sizeof *out);
    errno = 0;
    gzFile g = gzopen(path, "rb"); /* reads gzip and, transparently, plain files */
    if (!g)
        return sm_fail(err, SM_ERR_IO, "%s: cannot open: %s", path, errno ? strerror(errno) : "out of memory");
    gzbuffer(g, 1u << 17);

    /* read at most max_bytes + 1 bytes: one byte more than allowed proves the file is too big */
    size_t limit = max_bytes < SIZE_MAX ? max_bytes + 1 : max_bytes;
    size_t len = 0, cap = 0;
    uint8_t *buf = NULL;
    sm_status rc = SM_OK;
    for (;;) {
        if (len == cap) {
            if (cap >= limit) break;
            size_t nc = cap ? cap * 2 : (size_t)1 << 16;
            if (nc > limit || nc < cap) nc = limit;
            uint8_t *p = realloc(buf, nc);
            if (!p) {
                rc = sm_fail(err, SM_ERR_NOMEM, "%s: out of memory after %zu decompressed bytes", path, len);
                goto fail;
            }
            buf = p;
            cap = nc;
        }
        size_t want = cap - len;
        if (want > (size_t)INT_MAX) want = (size_t)INT_MAX; /* gzread returns int */
        int r = gzread(g, buf + len, (unsigned)want);
        if (r < 0) {
            int zerr;
            const char *m = gzerror(g, &zerr);
            rc = sm_fail(err, zerr == Z_ERRNO ? SM_ERR_IO : SM_ERR_FORMAT, "%s: read failed after %zu bytes: %s",
                         path, len, zerr == Z_ERRNO ? strerror(errno) : m);
            goto fail;
        }
        if (r == 0) break;
        len += (size_t)r;
    }
    if (len > max_bytes) {
        rc = sm_fail(err, SM_ERR_FORMAT, "%s: decompressed data exceeds the %zu-byte limit", path, max_bytes);
        goto fail;
    }
    /* a truncated gzip stream is not an error for gzread: it stops and records Z_BUF_ERROR */
    int zerr;
    const char *m = gzerror(g, &zerr);
    if (zerr != Z_OK) {
        rc = sm_fail(err, SM_ERR_FORMAT, "%s: gzip error after %zu bytes: %s", path, len, m);
        goto fail;
    }
    int cr = gzclose(g);
    g = NULL;
    if (cr != Z_OK) {
        rc = sm_fail(err, SM_ERR_FORMAT, "%s: gzip stream did not end cleanly (zlib error %d)", path, cr);
        goto fail;
    }

    size_t h;
    rc = idx_check(out, &h, buf, len, path, err);
    if (rc != SM_OK) goto fail;
    /* keep the decompression buffer: slide the data to its front and trim */
    memmove(buf, buf + h, out->count);
    uint8_t *p = realloc(buf, out->count);
    out->data = p ? p : buf;
    return SM_OK;

fail:
    if (g) gzclose(g);
    free(buf);
    memset(out, 0, sizeof *out);
    return rc;
}

void sm_idx_free(sm_idx *x) {
    if (!x) return;
    free(x->data);
    memset(x, 0, sizeof *x);
}

/* ---------------------------------------------------------------------------------------------- */
/* datasets */

void sm_dataset_free(sm_dataset *ds) {
    if (!ds) return;
    free(ds->x);
    free(ds->y);
    memset(ds, 0, sizeof *ds);
}

sm_status sm_dataset_load_idx(sm_dataset *ds, const char *images_path, const char *labels_path,
                              sm_error *err) {
    if (!ds || !images_path || !labels_path) return sm_fail(err, SM_ERR_ARG, "sm_dataset_load_idx: NULL argument");
    memset(ds, 0, sizeof *ds);
    sm_idx im, lb;
    memset(&lb, 0, sizeof lb);
    sm_status rc = sm_idx_load(&im, images_path, IDX_MAX_BYTES, err);
    if (rc != SM_OK) return rc;
    rc = sm_idx_load(&lb, labels_path, IDX_MAX_BYTES, err);
    if (rc != SM_OK) goto done;

    if (im.ndim != 3) {
        rc = sm_fail(err, SM_ERR_FORMAT, "%s: images must be 3-D (N, rows, cols), got %d-D", images_path, im.ndim);
        goto done;
    }
    if (lb.ndim != 1) {
        rc = sm_fail(err, SM_ERR_FORMAT, "%s: labels must be 1-D (N), got %d-D", labels_path, lb.ndim);
        goto done;
    }
    if (im.dims[0] != lb.dims[0]) {
        rc = sm_fail(err, SM_ERR_MISMATCH, "%s holds %u images but %s holds %u labels", images_path, im.dims[0],
                     labels_path, lb.dims[0]);
        goto done;
    }
    /* n and D index int arrays downstream */
    uint64_t n = im.dims[0], d = (uint64_t)im.dims[1] * im.dims[2];
    if (n > INT_MAX || d > INT_MAX) {
        rc = sm_fail(err, SM_ERR_FORMAT, "%s: %llu images of %llu pixels exceed the supported int range",
                     images_path, (unsigned long long)n, (unsigned long long)d);
        goto done;
    }
    for (size_t i = 0; i < lb.count; i++) {
        if (lb.data[i] >= N_CLASSES) {
            rc = sm_fail(err, SM_ERR_FORMAT, "%s: label %u of example %zu (byte offset %zu) outside 0..%d",
                         labels_path, lb.data[i], i, 8 + i, N_CLASSES - 1);
            goto done;
        }
    }
    if (im.count > SIZE_MAX / sizeof(float)) {
        rc = sm_fail(err, SM_ERR_NOMEM, "%s: too many pixels", images_path);
        goto done;
    }
    ds->x = malloc(im.count * sizeof *ds->x);
    ds->y = malloc((size_t)n * sizeof *ds->y);
    if (!ds->x || !ds->y) {
        rc = sm_fail(err, SM_ERR_NOMEM, "%s: out of memory for %llu examples", images_path, (unsigned long long)n);
        goto done;
    }
    for (size_t i = 0; i < im.count; i++) ds->x[i] = (float)im.data[i] / 255.0f;
    for (size_t i = 0; i < (size_t)n; i++) ds->y[i] = lb.data[i];
    ds->n = (int)n;
    ds->dim = (int)d;
    ds->n_classes = N_CLASSES;

done:
    sm_idx_free(&im);
    sm_idx_free(&lb);
    if (rc != SM_OK) sm_dataset_free(ds);
    return rc;
}

sm_status sm_dataset_load_fashion(sm_dataset *ds, const char *dir, const char *split, sm_error *err) {
    if (!ds) return sm_fail(err, SM_ERR_ARG, "sm_dataset_load_fashion: NULL dataset");
    memset(ds, 0, sizeof *ds);
    if (!dir) dir = SM_FASHION_MNIST_DIR;
    const char *prefix;
    if (split && strcmp(split, "train") == 0) prefix = "train";
    else if (split && strcmp(split, "test") == 0) prefix = "t10k";
    else return sm_fail(err, SM_ERR_ARG, "unknown split '%s' (expected train or test)", split ? split : "(null)");

    char ip[4096], lp[4096];
    int a = snprintf(ip, sizeof ip, "%s/%s-images-idx3-ubyte.gz", dir, prefix);
    int b = snprintf(lp, sizeof lp, "%s/%s-labels-idx1-ubyte.gz", dir, prefix);
    if (a < 0 || b < 0 || (size_t)a >= sizeof ip || (size_t)b >= sizeof lp)
        return sm_fail(err, SM_ERR_ARG, "%s: directory path too long", dir);
    /* a missing file is the common case (package not installed): say how to get it */
    const char *paths[2] = {ip, lp};
    for (int i = 0; i < 2; i++) {
        struct stat sb;
        if (stat(paths[i], &sb) != 0)
            return sm_fail(err, SM_ERR_IO,
                           "%s: %s; install Fashion-MNIST with `apt-get install dataset-fashion-mnist` "
                           "or pass --data DIR pointing at the IDX .gz files",
                           paths[i], strerror(errno));
    }
    return sm_dataset_load_idx(ds, ip, lp, err);
}

sm_status sm_dataset_select(sm_dataset *ds, const int *classes, int n_sel, int per_class, int relabel,
                            sm_error *err) {
    if (!ds || (n_sel > 0 && !classes)) return sm_fail(err, SM_ERR_ARG, "sm_dataset_select: NULL argument");
    if (n_sel < 1 || n_sel > ds->n_classes)
        return sm_fail(err, SM_ERR_ARG, "class selection of %d classes outside 1..%d", n_sel, ds->n_classes);
    /* map: original label -> position in classes, or -1 when not selected; validated before ds changes */
    int *pos = malloc(sizeof *pos * (size_t)ds->n_classes);
    int *kept = calloc((size_t)n_sel, sizeof *kept);
    if (!pos || !kept) {
        free(pos);
        free(kept);
        return sm_fail(err, SM_ERR_NOMEM, "class selection: out of memory");
    }
    for (int c = 0; c < ds->n_classes; c++) pos[c] = -1;
    for (int i = 0; i < n_sel; i++) {
        int c = classes[i];
        if (c < 0 || c >= ds->n_classes || pos[c] >= 0) {
            sm_status rc = sm_fail(err, SM_ERR_ARG, "class %d %s", c,
                                   (c < 0 || c >= ds->n_classes) ? "out of range" : "selected twice");
            free(pos);
            free(kept);
            return rc;
        }
        pos[c] = i;
    }
    /* count first so an empty selection is refused with ds untouched */
    int total = 0;
    for (int r = 0; r < ds->n; r++) {
        int c = ds->y[r];
        int p = (c >= 0 && c < ds->n_classes) ? pos[c] : -1;
        if (p < 0 || (per_class > 0 && kept[p] >= per_class)) continue;
        kept[p]++;
        total++;
    }
    if (total == 0) {
        free(pos);
        free(kept);
        return sm_fail(err, SM_ERR_ARG, "class selection: the dataset has no example of the selected classes");
    }
    memset(kept, 0, sizeof *kept * (size_t)n_sel);
    /* compact in place, keeping file order; row w <= row r, so rows never overlap */
    int w = 0;
    for (int r = 0; r < ds->n; r++) {
        int c = ds->y[r];
        int p = (c >= 0 && c < ds->n_classes) ? pos[c] : -1;
        if (p < 0 || (per_class > 0 && kept[p] >= per_class)) continue;
        kept[p]++;
        if (w != r && ds->dim > 0)
            memcpy(ds->x + (size_t)w * ds->dim, ds->x + (size_t)r * ds->dim, sizeof *ds->x * ds->dim);
        ds->y[w] = relabel ? p : c;
        w++;
    }
    ds->n = w; /* == total */
    /* relabelled ids are 0..n_sel-1, so the class count shrinks with them */
    if (relabel) ds->n_classes = n_sel;
    /* release the tail; a failed shrink leaves the larger (still valid) block */
    float *x = realloc(ds->x, sizeof *x * (size_t)w * (size_t)(ds->dim > 0 ? ds->dim : 1));
    int *y = realloc(ds->y, sizeof *y * (size_t)w);
    if (x) ds->x = x;
    if (y) ds->y = y;
    free(pos);
    free(kept);
    return SM_OK;
}

/* Fashion-MNIST's class names, by label id (Xiao et al. 2017). */
static const char *const kFashionNames[10] = {"T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                                              "Sandal",      "Shirt",   "Sneaker",  "Bag",   "Ankle boot"};

const char *sm_fashion_class_name(int id) { return id >= 0 && id < 10 ? kFashionNames[id] : "?"; }

/* Rewrites a class list so that Fashion-MNIST names ("Bag", "ankle boot") become their ids; ids and
 * "all" pass through. Returns 0, or -1 with err naming the unknown name. */
static int resolve_class_names(const char *s, char *out, size_t n, sm_error *err) {
    size_t used = 0;
    int first = 1;
    out[0] = 0;
    const char *p = s;
    while (*p) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        const char *a = p, *b = p + len;
        while (a < b && *a == ' ') a++;
        while (b > a && b[-1] == ' ') b--;
        char tok[64];
        size_t tl = (size_t)(b - a);
        if (tl >= sizeof tok) {
            sm_fail(err, SM_ERR_ARG, "class list '%s': entry too long", s);
            return -1;
        }
        memcpy(tok, a, tl);
        tok[tl] = 0;
        if (tl > 0 && !(tok[0] >= '0' && tok[0] <= '9') && strcmp(tok, "all") != 0) {
            int id = -1;
            for (int i = 0; i < 10; i++)
                if (!strcasecmp(tok, kFashionNames[i])) id = i;
            if (id < 0) {
                sm_fail(err, SM_ERR_ARG,
                        "class list '%s': unknown class '%s' (ids 0-9 or Fashion-MNIST names: T-shirt/top, Trouser, "
                        "Pullover, Dress, Coat, Sandal, Shirt, Sneaker, Bag, Ankle boot)", s, tok);
                return -1;
            }
            snprintf(tok, sizeof tok, "%d", id);
        }
        /* empty entries are kept so the id parser below reports them */
        int w = snprintf(out + used, n - used, "%s%s", first ? "" : ",", tok);
        first = 0;
        if (w < 0 || (size_t)w >= n - used) {
            sm_fail(err, SM_ERR_ARG, "class list '%s': too long", s);
            return -1;
        }
        used += (size_t)w;
        p = e ? e + 1 : p + len;
        if (e && !*p) { /* trailing comma: keep it so the id parser reports it */
            if (used + 1 < n) strcat(out, ",");
        }
    }
    return 0;
}

int sm_parse_class_list(const char *s_in, int *classes, int max, int n_classes, sm_error *err) {
    char resolved[1024];
    if (s_in && resolve_class_names(s_in, resolved, sizeof resolved, err) != 0) return -1;
    const char *s = s_in ? resolved : NULL;
    if (!s || !classes || max < 1 || n_classes < 1) {
        sm_fail(err, SM_ERR_ARG, "sm_parse_class_list: bad argument");
        return -1;
    }
    const char *p = s;
    while (*p == ' ') p++;
    size_t tl = strlen(p);
    while (tl > 0 && p[tl - 1] == ' ') tl--;
    if (tl == 0) {
        sm_fail(err, SM_ERR_ARG, "empty class list");
        return -1;
    }
    if (tl == 3 && strncmp(p, "all", 3) == 0) {
        if (n_classes > max) {
            sm_fail(err, SM_ERR_ARG, "class list 'all': %d classes, room for %d", n_classes, max);
            return -1;
        }
        for (int i = 0; i < n_classes; i++) classes[i] = i;
        return n_classes;
    }
    int n = 0;
    for (;;) {
        while (*p == ' ') p++;
        if (*p < '0' || *p > '9') {
            sm_fail(err, SM_ERR_ARG, "class list '%s': expected a class id at position %d", s, (int)(p - s));
            return -1;
        }
        long v = 0;
        while (*p >= '0' && *p <= '9') {
            if (v <= n_classes) v = v * 10 + (*p - '0'); /* stop growing once out of range: no overflow */
            p++;
        }
        if (v >= n_classes) {
            sm_fail(err, SM_ERR_ARG, "class list '%s': class id out of range 0..%d", s, n_classes - 1);
            return -1;
        }
        for (int i = 0; i < n; i++) {
            if (classes[i] == (int)v) {
                sm_fail(err, SM_ERR_ARG, "class list '%s': class %ld listed twice", s, v);
                return -1;
            }
        }
        if (n == max) {
            sm_fail(err, SM_ERR_ARG, "class list '%s': more than %d classes", s, max);
            return -1;
        }
        classes[n++] = (int)v;
        while (*p == ' ') p++;
        if (*p == ',') {
            p++;
            continue;
        }
        if (*p == '\0') break;
        sm_fail(err, SM_ERR_ARG, "class list '%s': unexpected '%c' at position %d", s, *p, (int)(p - s));
        return -1;
    }
    return n;
}

/* ---------------------------------------------------------------------------------------------- */
/* batcher */

/* The order of epoch e depends on (seed, e) only, so a resumed run regenerates it exactly. The
 * golden-ratio multiple spreads consecutive epochs apart before sm_rng_seed's splitmix64 mixes. */
static void batcher_fill_order(sm_batcher *b) {
    int n = b->ds->n;
    for (int i = 0; i < n; i++) b->order[i] = i;
    if (!b->shuffle) return;
    sm_rng r;
    sm_rng_seed(&r, b->seed ^ ((uint64_t)(uint32_t)b->epoch * 0x9E3779B97F4A7C15ULL));
    sm_rng_shuffle(&r, b->order, n);
}

sm_status sm_batcher_init(sm_batcher *b, const sm_dataset *ds, int batch, uint64_t seed, int shuffle,
                          sm_error *err) {
    if (!b || !ds) return sm_fail(err, SM_ERR_ARG, "sm_batcher_init: NULL argument");
    memset(b, 0, sizeof *b);
    if (ds->n < 1 || !ds->y || (ds->dim > 0 && !ds->x))
        return sm_fail(err, SM_ERR_ARG, "batcher: dataset is empty");
    if (batch < 1) return sm_fail(err, SM_ERR_ARG, "batcher: batch size %d < 1", batch);
    b->order = malloc(sizeof *b->order * (size_t)ds->n);
    if (!b->order) return sm_fail(err, SM_ERR_NOMEM, "batcher: out of memory for %d indices", ds->n);
    b->ds = ds;
    b->batch = batch;
    b->seed = seed;
    b->shuffle = shuffle != 0;
    batcher_fill_order(b);
    return SM_OK;
}

void sm_batcher_seek(sm_batcher *b, int epoch, int pos) {
    if (!b || !b->order) return;
    b->epoch = epoch < 0 ? 0 : epoch;
    b->pos = pos < 0 ? 0 : (pos > b->ds->n ? b->ds->n : pos);
    batcher_fill_order(b);
}

int sm_batcher_next(sm_batcher *b, float *x, int *y) {
    if (!b || !b->order) return 0;
    const sm_dataset *ds = b->ds;
    if (b->pos >= ds->n) {
        b->epoch++;
        b->pos = 0;
        batcher_fill_order(b);
        return 0;
    }
    int B = ds->n - b->pos < b->batch ? ds->n - b->pos : b->batch;
    for (int i = 0; i < B; i++) {
        int r = b->order[b->pos + i];
        if (x && ds->dim > 0) memcpy(x + (size_t)i * ds->dim, ds->x + (size_t)r * ds->dim, sizeof *x * ds->dim);
        if (y) y[i] = ds->y[r];
    }
    b->pos += B;
    return B;
}

void sm_batcher_free(sm_batcher *b) {
    if (!b) return;
    free(b->order);
    memset(b, 0, sizeof *b);
}
