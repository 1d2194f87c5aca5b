/* Hugging Face MoE checkpoints (see include/specmoe/hf.h): config and index parsing, layout
 * detection and validation, streamed expert reads, SSMoE descriptors, routing statistics and
 * expert pruning.
 *
 * Everything read from the directory is outside data: config.json and the index are parsed
 * defensively (fuzz/fuzz_hf.c), shard headers by the safetensors reader, and every tensor the
 * config implies is checked for presence, dtype and shape before a byte of it is read.
 */
#define _POSIX_C_SOURCE 200809L
#include "specmoe/io/hf.h"

#include <cblas.h>
#include <cjson/cJSON.h>
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hf_internal.h"
#include "specmoe/methods/ssmoe/ssmoe.h"

#define HF_MAX_JSON ((size_t)256 << 20) /* config.json / index size limit */
#define HF_COPY_CHUNK ((size_t)16 << 20) /* streaming buffer of the pruner */

/* ---------------------------------------------------------------------------------------------- */
/* opening a model directory */

static char *pjoin(const char *dir, const char *name) {
    size_t a = strlen(dir), b = strlen(name);
    char *p = malloc(a + b + 2);
    if (!p) return NULL;
    memcpy(p, dir, a);
    p[a] = '/';
    memcpy(p + a + 1, name, b + 1);
    return p;
}

/* The expert number at r ("12.w1.weight" -> 12, *after -> ".w1.weight"): canonical decimal digits
 * followed by '.', below E; -1 otherwise ("01", "1x", "99" of 8 experts). */
static int expert_index(const char *r, int E, const char **after) {
    if (!isdigit((unsigned char)r[0]) || (r[0] == '0' && isdigit((unsigned char)r[1]))) return -1;
    long e = 0;
    const char *p = r;
    for (; isdigit((unsigned char)*p) && e <= E; p++) e = 10 * e + (*p - '0');
    if (*p != '.' || e >= E) return -1;
    if (after) *after = p;
    return (int)e;
}

/* Whole text file (at most HF_MAX_JSON bytes); *out is NUL-terminated and malloc'd. */
static sm_status read_text(const char *path, char **out, size_t *len, sm_error *err) {
    *out = NULL;
    size_t n;
    FILE *f = sm_open_regular(path, &n, err);
    if (!f) return SM_ERR_IO;
    if (n > HF_MAX_JSON) {
        fclose(f);
        return sm_fail(err, SM_ERR_FORMAT, "%s: %zu bytes, more than the %zu allowed", path, n, HF_MAX_JSON);
    }
    char *buf = malloc(n + 1);
    if (!buf) {
        fclose(f);
        return sm_fail(err, SM_ERR_NOMEM, "%s: out of memory", path);
    }
    size_t got = fread(buf, 1, n, f);
    fclose(f);
    if (got != n) {
        free(buf);
        return sm_fail(err, SM_ERR_IO, "%s: short read (%zu of %zu bytes)", path, got, n);
    }
    buf[n] = '\0';
    *out = buf;
    *len = n;
    return SM_OK;
}

static int file_exists(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0;
}

static int cmp_entry(const void *a, const void *b) {
    return strcmp(((const sm_hf_entry *)a)->name, ((const sm_hf_entry *)b)->name);
}

const sm_hf_entry *sm_hf_find(const sm_hf_model *m, const char *name) {
    if (!m || !name || m->n_entries == 0) return NULL;
    sm_hf_entry key = {.name = name};
    return bsearch(&key, m->entry, (size_t)m->n_entries, sizeof key, cmp_entry);
}

void sm_hf_close(sm_hf_model *m) {
    if (!m) return;
    for (int i = 0; i < m->n_shards; i++) {
        if (m->shard) sm_safetensors_free(&m->shard[i]);
        if (m->shard_file) free(m->shard_file[i]);
    }
    free(m->shard);
    free(m->shard_file);
    free(m->entry);
    free(m->moe);
    free(m->dir);
    sm_hf_config_free(&m->cfg);
    memset(m, 0, sizeof *m);
}

static int cmp_str_ptr(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Shard list and tensor table from the index (or the single model.safetensors). */
static sm_status open_shards(sm_hf_model *m, sm_error *err) {
    char *ipath = pjoin(m->dir, "model.safetensors.index.json");
    if (!ipath) return sm_fail(err, SM_ERR_NOMEM, "out of memory");
    char **names = NULL, **files = NULL;
    int count = 0;
    sm_status st = SM_OK;
    if (file_exists(ipath)) {
        m->indexed = 1;
        char *text;
        size_t len;
        st = read_text(ipath, &text, &len, err);
        if (st == SM_OK) {
            st = sm_hf_index_parse(text, len, ipath, &names, &files, &count, err);
            free(text);
        }
        if (st != SM_OK) goto done;
        /* distinct shard files, in name order (model-00001-of-0000N first) */
        char **uniq = malloc(sizeof(char *) * (size_t)count);
        if (!uniq) {
            st = sm_fail(err, SM_ERR_NOMEM, "out of memory");
            goto done;
        }
        memcpy(uniq, files, sizeof(char *) * (size_t)count);
        qsort(uniq, (size_t)count, sizeof *uniq, cmp_str_ptr);
        int nu = 0;
        for (int i = 0; i < count; i++)
            if (nu == 0 || strcmp(uniq[nu - 1], uniq[i]) != 0) uniq[nu++] = uniq[i];
        m->shard_file = calloc((size_t)nu, sizeof(char *));
        m->shard = calloc((size_t)nu, sizeof(sm_safetensors));
        if (!m->shard_file || !m->shard) {
            free(uniq);
            st = sm_fail(err, SM_ERR_NOMEM, "out of memory");
            goto done;
        }
        for (int i = 0; i < nu; i++) m->shard_file[i] = strdup(uniq[i]);
        m->n_shards = nu;
        free(uniq);
    } else {
        m->shard_file = calloc(1, sizeof(char *));
        m->shard = calloc(1, sizeof(sm_safetensors));
        if (!m->shard_file || !m->shard || !(m->shard_file[0] = strdup("model.safetensors"))) {
            st = sm_fail(err, SM_ERR_NOMEM, "out of memory");
            goto done;
        }
        m->n_shards = 1;
        char *single = pjoin(m->dir, "model.safetensors");
        int ok = single && file_exists(single);
        free(single);
        if (!ok) {
            st = sm_fail(err, SM_ERR_IO, "%s: neither model.safetensors.index.json nor model.safetensors is there", m->dir);
            goto done;
        }
    }
    size_t total = 0;
    for (int i = 0; i < m->n_shards; i++) {
        if (!m->shard_file[i]) {
            st = sm_fail(err, SM_ERR_NOMEM, "out of memory");
            goto done;
        }
        char *sp = pjoin(m->dir, m->shard_file[i]);
        sm_error e2;
        st = sp ? sm_safetensors_open(&m->shard[i], sp, &e2) : sm_fail(&e2, SM_ERR_NOMEM, "out of memory");
        free(sp);
        if (st != SM_OK) {
            if (m->indexed)
                st = sm_fail(err, st, "%s: the index points to shard '%s', which cannot be read: %s", ipath,
                             m->shard_file[i], e2.msg);
            else
                *err = e2;
            goto done;
        }
        total += (size_t)m->shard[i].n_tensors;
    }
    m->entry = malloc(sizeof(sm_hf_entry) * (total ? total : 1));
    if (!m->entry) {
        st = sm_fail(err, SM_ERR_NOMEM, "out of memory for %zu tensors", total);
        goto done;
    }
    for (int i = 0; i < m->n_shards; i++)
        for (int j = 0; j < m->shard[i].n_tensors; j++)
            m->entry[m->n_entries++] = (sm_hf_entry){m->shard[i].tensors[j].name, i, &m->shard[i].tensors[j]};
    qsort(m->entry, (size_t)m->n_entries, sizeof *m->entry, cmp_entry);
    for (int i = 1; i < m->n_entries; i++)
        if (strcmp(m->entry[i - 1].name, m->entry[i].name) == 0) {
            char b1[112];
            st = sm_fail(err, SM_ERR_FORMAT, "%s: tensor '%s' is in both %s and %s", m->dir, sm_hf_shown(b1, m->entry[i].name),
                         m->shard_file[m->entry[i - 1].shard], m->shard_file[m->entry[i].shard]);
            goto done;
        }
    if (m->indexed) { /* the index and the shards must agree, both ways */
        char b1[112];
        for (int j = 0; j < count; j++) {
            const sm_hf_entry *e = sm_hf_find(m, names[j]);
            if (!e) {
                st = sm_fail(err, SM_ERR_FORMAT, "%s: tensor '%s' is mapped to %s but no shard holds it", ipath,
                             sm_hf_shown(b1, names[j]), files[j]);
                goto done;
            }
            if (strcmp(m->shard_file[e->shard], files[j]) != 0) {
                st = sm_fail(err, SM_ERR_FORMAT, "%s: tensor '%s' is mapped to %s but sits in %s", ipath, sm_hf_shown(b1, names[j]),
                             files[j], m->shard_file[e->shard]);
                goto done;
            }
        }
        if (count != m->n_entries) { /* a tensor of a shard the index does not list (or a repeated key) */
            qsort(names, (size_t)count, sizeof *names, cmp_str_ptr);
            for (int i = 0; i < m->n_entries; i++) {
                const char *key = m->entry[i].name;
                if (!bsearch(&key, names, (size_t)count, sizeof *names, cmp_str_ptr)) {
                    st = sm_fail(err, SM_ERR_FORMAT, "%s: tensor '%s' in shard %s is not in the index", ipath,
                                 sm_hf_shown(b1, key), m->shard_file[m->entry[i].shard]);
                    goto done;
                }
            }
            st = sm_fail(err, SM_ERR_FORMAT, "%s: the index lists %d tensors, the shards hold %d", ipath, count,
                         m->n_entries);
            goto done;
        }
    }
done:
    sm_hf_index_free(names, files, count);
    free(ipath);
    return st;
}

/* Tensor `name` must exist, hold F32/F16/BF16 and have the given shape. */
static sm_status need(const sm_hf_model *m, const char *name, int ndim, const int64_t *shape, const char *why,
                      sm_error *err) {
    const sm_hf_entry *e = sm_hf_find(m, name);
    if (!e) return sm_fail(err, SM_ERR_FORMAT, "%s: tensor '%s' is missing (%s)", m->dir, name, why);
    const sm_st_tensor *t = e->t;
    int ok = t->ndim == ndim;
    for (int i = 0; ok && i < ndim; i++) ok = t->shape[i] == shape[i];
    if (!ok) {
        char a[96], b[96];
        sm_hf_shape_str(a, sizeof a, t->ndim, t->shape);
        sm_hf_shape_str(b, sizeof b, ndim, shape);
        return sm_fail(err, SM_ERR_FORMAT, "%s/%s: tensor '%s' has shape %s but config.json implies %s (%s)", m->dir,
                       m->shard_file[e->shard], name, a, b, why);
    }
    if (t->dtype != SM_DT_F32 && t->dtype != SM_DT_F16 && t->dtype != SM_DT_BF16)
        return sm_fail(err, SM_ERR_FORMAT, "%s/%s: tensor '%s' is %s; expert weights must be F32, F16 or BF16", m->dir,
                       m->shard_file[e->shard], name, sm_dtype_name(t->dtype));
    return SM_OK;
}

/* Finds layer L's MoE block and checks its tensors against the config. */
static sm_status check_layer(sm_hf_model *m, int L, sm_error *err) {
    const sm_hf_config *c = &m->cfg;
    const char *alt = strcmp(c->block, "mlp") == 0 ? "block_sparse_moe" : "mlp";
    const char *blocks[2] = {c->block, alt};
    char name[256], why[160];
    int found = -1;
    for (int b = 0; b < 2 && found < 0; b++) {
        snprintf(name, sizeof name, "model.layers.%d.%s.gate.weight", L, blocks[b]);
        if (sm_hf_find(m, name)) found = b;
    }
    if (!c->is_moe[L]) {
        if (found >= 0)
            return sm_fail(err, SM_ERR_FORMAT, "%s: config.json makes layer %d a dense layer, but the router '%s' exists",
                           m->dir, L, name);
        return SM_OK;
    }
    if (found < 0) {
        snprintf(name, sizeof name, "model.layers.%d.%s.gate.weight", L, c->block);
        snprintf(why, sizeof why, "config.json makes layer %d an MoE layer", L);
        return need(m, name, 2, (int64_t[]){c->E, c->d}, why, err);
    }
    sm_hf_moe *q = &m->moe[m->n_moe];
    memset(q, 0, sizeof *q);
    q->layer = L;
    snprintf(q->block, sizeof q->block, "model.layers.%d.%s", L, blocks[found]);
    snprintf(why, sizeof why, "layer %d: %s %d, hidden_size %d, %s experts of width %d", L, c->expert_key, c->E, c->d,
             c->model_type, c->inter);
    const int64_t E = c->E, d = c->d, nI = c->inter;
    sm_status st;
    snprintf(name, sizeof name, "%s.gate.weight", q->block);
    if ((st = need(m, name, 2, (int64_t[]){E, d}, why, err)) != SM_OK) return st;
    snprintf(name, sizeof name, "%s.gate.e_score_correction_bias", q->block);
    if (sm_hf_find(m, name)) {
        if ((st = need(m, name, 1, (int64_t[]){E}, why, err)) != SM_OK) return st;
        q->has_bias = 1;
    }
    snprintf(name, sizeof name, "%s.experts.gate_up_proj", q->block);
    const sm_hf_entry *gu = sm_hf_find(m, name);
    if (gu) { /* fused: the down_proj shape decides the orientation (it differs whenever d != I) */
        char dn[256];
        snprintf(dn, sizeof dn, "%s.experts.down_proj", q->block);
        const sm_hf_entry *de = sm_hf_find(m, dn);
        if (!de) return sm_fail(err, SM_ERR_FORMAT, "%s: tensor '%s' is missing (%s has fused experts)", m->dir, dn, name);
        int fused = d != nI ? de->t->ndim == 3 && de->t->shape[1] == d    /* down (E, d, I) */
                           : gu->t->ndim == 3 && gu->t->shape[1] == 2 * nI; /* gate_up (E, 2I, d) */
        q->storage = fused ? SM_HF_FUSED : SM_HF_FUSED_T;
        if (q->storage == SM_HF_FUSED) {
            if ((st = need(m, name, 3, (int64_t[]){E, 2 * nI, d}, why, err)) != SM_OK ||
                (st = need(m, dn, 3, (int64_t[]){E, d, nI}, why, err)) != SM_OK)
                return st;
        } else if ((st = need(m, name, 3, (int64_t[]){E, d, 2 * nI}, why, err)) != SM_OK ||
                   (st = need(m, dn, 3, (int64_t[]){E, nI, d}, why, err)) != SM_OK) {
            return st;
        }
    } else {
        q->storage = SM_HF_SPLIT;
        for (int e = 0; e < c->E; e++)
            for (int j = 0; j < 3; j++) {
                snprintf(name, sizeof name, "%s.experts.%d.%s.weight", q->block, e, c->w[j]);
                int64_t sh[2] = {j < 2 ? nI : d, j < 2 ? d : nI};
                if ((st = need(m, name, 2, sh, why, err)) != SM_OK) return st;
            }
    }
    /* numbered expert tensors must be the canonical 0..E-1: "experts.01" or "experts.8" of 8 would be
     * renamed onto a real expert by pruning */
    char pre[128];
    int pl = snprintf(pre, sizeof pre, "%s.experts.", q->block);
    for (int i = 0; i < m->n_entries; i++) {
        const char *nm = m->entry[i].name;
        if (strncmp(nm, pre, (size_t)pl) != 0 || !isdigit((unsigned char)nm[pl])) continue;
        if (expert_index(nm + pl, c->E, NULL) < 0 || q->storage != SM_HF_SPLIT) {
            char b1[112];
            return sm_fail(err, SM_ERR_FORMAT, "%s/%s: tensor '%s' is not one of experts 0..%d of the %s layout (%s)", m->dir,
                           m->shard_file[m->entry[i].shard], sm_hf_shown(b1, nm), c->E - 1,
                           q->storage == SM_HF_SPLIT ? "per-expert" : "fused", why);
        }
    }
    if (c->shared) {
        const int64_t S = c->n_shared_rows;
        for (int j = 0; j < 3; j++) {
            snprintf(name, sizeof name, "%s.%s.%s.weight", q->block, c->shared, c->w[j]);
            int64_t sh[2] = {j < 2 ? S : d, j < 2 ? d : S};
            snprintf(why, sizeof why, "layer %d: shared expert of width %lld", L, (long long)S);
            if ((st = need(m, name, 2, sh, why, err)) != SM_OK) return st;
        }
    }
    m->n_moe++;
    return SM_OK;
}

/* Every "model.layers.N.*" tensor must belong to a layer config.json declares (N < num_hidden_layers):
 * pruning renumbers the experts of the declared layers only, so a layer past them would be copied
 * with all its experts, into a config that says fewer. Names the first tensor of the lowest such N. */
static sm_status check_layer_range(const sm_hf_model *m, sm_error *err) {
    static const char pre[] = "model.layers.";
    const size_t pl = sizeof pre - 1;
    long first = -1;
    int at = -1;
    for (int i = 0; i < m->n_entries; i++) { /* entries are sorted by name: the first hit of a layer is its first tensor */
        const char *p = m->entry[i].name;
        if (strncmp(p, pre, pl) != 0 || !isdigit((unsigned char)p[pl])) continue;
        long L = 0;
        for (p += pl; isdigit((unsigned char)*p); p++) L = L < 100000000L ? 10 * L + (*p - '0') : L;
        if (*p == '.' && L >= m->cfg.n_layers && (at < 0 || L < first)) {
            first = L;
            at = i;
        }
    }
    if (at < 0) return SM_OK;
    char b1[112];
    return sm_fail(err, SM_ERR_FORMAT, "%s/%s: tensor '%s' belongs to layer %ld, but config.json has num_hidden_layers "
                   "%d: the checkpoint and its config disagree", m->dir, m->shard_file[m->entry[at].shard],
                   sm_hf_shown(b1, m->entry[at].name), first, m->cfg.n_layers);
}

sm_status sm_hf_open(sm_hf_model *m, const char *dir, sm_error *err) {
    if (!m || !dir) return sm_fail(err, SM_ERR_ARG, "sm_hf_open: NULL argument");
    memset(m, 0, sizeof *m);
    if (!(m->dir = strdup(dir))) return sm_fail(err, SM_ERR_NOMEM, "out of memory");
    char *cpath = pjoin(dir, "config.json"), *text = NULL;
    size_t len = 0;
    sm_status st = cpath ? read_text(cpath, &text, &len, err) : sm_fail(err, SM_ERR_NOMEM, "out of memory");
    if (st == SM_OK) st = sm_hf_config_parse(&m->cfg, text, len, cpath, err);
    free(text);
    free(cpath);
    if (st == SM_OK) st = open_shards(m, err);
    if (st == SM_OK) st = check_layer_range(m, err);
    if (st == SM_OK && !(m->moe = calloc((size_t)m->cfg.n_layers, sizeof *m->moe)))
        st = sm_fail(err, SM_ERR_NOMEM, "out of memory");
    for (int L = 0; st == SM_OK && L < m->cfg.n_layers; L++) st = check_layer(m, L, err);
    if (st == SM_OK && m->n_moe == 0) st = sm_fail(err, SM_ERR_FORMAT, "%s: config.json leaves no MoE layer", dir);
    if (st != SM_OK) sm_hf_close(m);
    return st;
}

/* ---------------------------------------------------------------------------------------------- */
/* reading expert weights */

static sm_status read_named(const sm_hf_model *m, const char *name, size_t first, size_t n, float *out, sm_error *err) {
    const sm_hf_entry *e = sm_hf_find(m, name);
    if (!e) return sm_fail(err, SM_ERR_FORMAT, "%s: tensor '%s' is missing", m->dir, name);
    return sm_st_read_f32(&m->shard[e->shard], e->t, first, n, out, err);
}

/* out (ncols, rows) = columns [col0, col0 + ncols) of the (rows, row_len) matrix starting at element
 * `first` of tensor `name`, transposed; read in blocks of rows so the staging buffer stays small. */
static sm_status read_transposed(const sm_hf_model *m, const char *name, size_t first, int rows, int row_len, int col0,
                                 int ncols, float *out, sm_error *err) {
    int block = (int)((size_t)(4 << 20) / (size_t)row_len); /* ~16 MiB of floats */
    if (block < 1) block = 1;
    if (block > rows) block = rows;
    float *buf = malloc(sizeof(float) * (size_t)block * row_len);
    if (!buf) return sm_fail(err, SM_ERR_NOMEM, "out of memory reading '%s'", name);
    sm_status st = SM_OK;
    for (int r0 = 0; r0 < rows && st == SM_OK; r0 += block) {
        int nr = rows - r0 < block ? rows - r0 : block;
        st = read_named(m, name, first + (size_t)r0 * row_len, (size_t)nr * row_len, buf, err);
        for (int r = 0; r < nr && st == SM_OK; r++)
            for (int c = 0; c < ncols; c++) out[(size_t)c * rows + r0 + r] = buf[(size_t)r * row_len + col0 + c];
    }
    free(buf);
    return st;
}

sm_status sm_hf_read_router(const sm_hf_model *m, int l, float *w, sm_error *err) {
    if (l < 0 || l >= m->n_moe) return sm_fail(err, SM_ERR_ARG, "MoE layer %d out of range", l);
    char name[160];
    snprintf(name, sizeof name, "%s.gate.weight", m->moe[l].block);
    size_t n = (size_t)m->cfg.E * m->cfg.d;
    sm_status st = read_named(m, name, 0, n, w, err);
    for (size_t i = 0; i < n && st == SM_OK; i++)
        if (!isfinite(w[i]))
            st = sm_fail(err, SM_ERR_FORMAT, "%s/%s: tensor '%s' holds a non-finite value at row %zu, column %zu", m->dir,
                         m->shard_file[sm_hf_find(m, name)->shard], name, i / (size_t)m->cfg.d, i % (size_t)m->cfg.d);
    return st;
}

sm_status sm_hf_read_expert(const sm_hf_model *m, int l, int e, int j, float *out, sm_error *err) {
    const sm_hf_config *c = &m->cfg;
    if (l < 0 || l >= m->n_moe || e < 0 || e >= c->E || j < 0 || j > 2)
        return sm_fail(err, SM_ERR_ARG, "expert matrix (layer %d, expert %d, matrix %d) out of range", l, e, j);
    const sm_hf_moe *q = &m->moe[l];
    const int d = c->d, nI = c->inter;
    char name[256];
    switch (q->storage) {
    case SM_HF_SPLIT:
        snprintf(name, sizeof name, "%s.experts.%d.%s.weight", q->block, e, c->w[j]);
        return j < 2 ? read_named(m, name, 0, (size_t)nI * d, out, err) /* (I, d) as stored */
                     : read_transposed(m, name, 0, d, nI, 0, nI, out, err); /* (d, I) -> (I, d) */
    case SM_HF_FUSED: /* gate_up (E, 2I, d): rows [0, I) gate, [I, 2I) up; down (E, d, I) */
        if (j < 2) {
            snprintf(name, sizeof name, "%s.experts.gate_up_proj", q->block);
            return read_named(m, name, ((size_t)e * 2 * nI + (size_t)j * nI) * d, (size_t)nI * d, out, err);
        }
        snprintf(name, sizeof name, "%s.experts.down_proj", q->block);
        return read_transposed(m, name, (size_t)e * d * nI, d, nI, 0, nI, out, err);
    case SM_HF_FUSED_T: /* gate_up (E, d, 2I): columns [0, I) gate, [I, 2I) up; down (E, I, d) */
        if (j < 2) {
            snprintf(name, sizeof name, "%s.experts.gate_up_proj", q->block);
            return read_transposed(m, name, (size_t)e * d * 2 * nI, d, 2 * nI, j * nI, nI, out, err);
        }
        snprintf(name, sizeof name, "%s.experts.down_proj", q->block);
        return read_named(m, name, (size_t)e * nI * d, (size_t)nI * d, out, err);
    }
    return sm_fail(err, SM_ERR_ARG, "unknown expert storage");
}

size_t sm_hf_layer_expert_bytes(const sm_hf_model *m, int l) {
    if (l < 0 || l >= m->n_moe) return 0;
    const sm_hf_moe *q = &m->moe[l];
    char name[256];
    size_t total = 0;
    if (q->storage != SM_HF_SPLIT) {
        const char *parts[2] = {"gate_up_proj", "down_proj"};
        for (int i = 0; i < 2; i++) {
            snprintf(name, sizeof name, "%s.experts.%s", q->block, parts[i]);
            const sm_hf_entry *e = sm_hf_find(m, name);
            if (e) total += e->t->end - e->t->begin;
        }
        return total;
    }
    for (int e = 0; e < m->cfg.E; e++)
        for (int j = 0; j < 3; j++) {
            snprintf(name, sizeof name, "%s.experts.%d.%s.weight", q->block, e, m->cfg.w[j]);
            const sm_hf_entry *x = sm_hf_find(m, name);
            if (x) total += x->t->end - x->t->begin;
        }
    return total;
}

/* ---------------------------------------------------------------------------------------------- */
/* SSMoE on a layer */

sm_status sm_hf_build_ev(const sm_hf_model *m, int l, int c, int avg, const float *router, float *ev, sm_error *err) {
    const int E = m->cfg.E, d = m->cfg.d, nI = m->cfg.inter;
    if (l < 0 || l >= m->n_moe || c < 1 || !router || !ev)
        return sm_fail(err, SM_ERR_ARG, "sm_hf_build_ev: bad arguments (layer %d, c %d)", l, c);
    sm_status first = SM_OK;
    sm_error first_err = {0};
#pragma omp parallel
    {
        float *w = malloc(sizeof(float) * (size_t)nI * d);
        double *desc = malloc(sizeof(double) * (size_t)d);
#pragma omp for schedule(dynamic, 1)
        for (int e = 0; e < E; e++) {
            sm_error e2;
            sm_status st = (w && desc) ? SM_OK : sm_fail(&e2, SM_ERR_NOMEM, "out of memory for a %dx%d expert matrix", nI, d);
            for (int j = 0; j < 3 && st == SM_OK; j++) {
                st = sm_hf_read_expert(m, l, e, j, w, &e2);
                if (st == SM_OK && (st = sm_ev_descriptor(desc, w, nI, d, avg ? NULL : router + (size_t)e * d, c, &e2)) != SM_OK) {
                    static const char *mat[3] = {"gate", "up", "down"};
                    char msg[sizeof e2.msg];
                    memcpy(msg, e2.msg, sizeof msg);
                    sm_fail(&e2, st, "%s: %s.experts: expert %d, %s matrix: %.300s", m->dir, m->moe[l].block, e, mat[j], msg);
                }
                for (int k = 0; k < d && st == SM_OK; k++) ev[((size_t)e * 3 + j) * d + k] = (float)desc[k];
            }
            if (st != SM_OK) {
#pragma omp critical(hf_ev_error)
                if (first == SM_OK) {
                    first = st;
                    first_err = e2;
                }
            }
        }
        free(w);
        free(desc);
    }
    if (first != SM_OK) {
        if (err) *err = first_err;
        return first;
    }
    return SM_OK;
}

void sm_hf_ev_mean(const float *ev, int E, int d, float *dbar) {
    for (int e = 0; e < E; e++)
        for (int i = 0; i < d; i++)
            dbar[(size_t)e * d + i] = (ev[((size_t)e * 3) * d + i] + ev[((size_t)e * 3 + 1) * d + i] +
                                       ev[((size_t)e * 3 + 2) * d + i]) / 3.0f;
}

/* Row-wise softmax of s (T, E) in place. */
static void softmax_rows(float *s, int T, int E) {
    for (int t = 0; t < T; t++) {
        float *r = s + (size_t)t * E, mx = r[0];
        for (int e = 1; e < E; e++) mx = r[e] > mx ? r[e] : mx;
        double z = 0;
        for (int e = 0; e < E; e++) z += (r[e] = expf(r[e] - mx));
        for (int e = 0; e < E; e++) r[e] = (float)(r[e] / z);
    }
}

/* Marks the k largest entries of p (E) in sel, ties to the lower index: the order of the routers'
 * gate (src/gate.c), on floats. */
static void topk_mark(const float *p, int E, int k, unsigned char *sel) {
    memset(sel, 0, (size_t)E);
    for (int a = 0; a < k; a++) {
        int b = -1;
        for (int e = 0; e < E; e++)
            if (!sel[e] && (b < 0 || p[e] > p[b])) b = e;
        sel[b] = 1;
    }
}

/* Logits s (T, E) must be finite: inputs within SM_HF_CALIB_MAX and finite weights keep them so unless
 * the weights are enormous, and one non-finite logit would make every score of its token NaN. */
static sm_status finite_logits(const sm_hf_model *m, const float *s, int T, int E, const char *which, sm_error *err) {
    for (size_t i = 0; i < (size_t)T * E; i++)
        if (!isfinite(s[i]))
            return sm_fail(err, SM_ERR_NUMERIC, "%s: the %s logit of calibration token %zu for expert %zu is not finite "
                           "(%g): the inputs or the weights are too large for float", m->dir, which, i / (size_t)E,
                           i % (size_t)E, (double)s[i]);
    return SM_OK;
}

sm_status sm_hf_route_stats(const sm_hf_model *m, const float *router, const float *ev, const float *x, int T,
                            double alpha, double *mean_router, double *mean_mix, double *overlap, sm_error *err) {
    const int E = m->cfg.E, d = m->cfg.d, k = m->cfg.k;
    if (T < 1 || !router || !x || !mean_router) return sm_fail(err, SM_ERR_ARG, "route stats: no calibration tokens");
    float *pr = malloc(sizeof(float) * (size_t)T * E), *pe = ev ? malloc(sizeof(float) * (size_t)T * E) : NULL;
    float *dbar = ev ? malloc(sizeof(float) * (size_t)E * d) : NULL;
    unsigned char *s1 = malloc((size_t)E), *s2 = malloc((size_t)E);
    if (!pr || !s1 || !s2 || (ev && (!pe || !dbar))) {
        free(pr); free(pe); free(dbar); free(s1); free(s2);
        return sm_fail(err, SM_ERR_NOMEM, "route stats: out of memory for %d tokens", T);
    }
    /* p_r: router logits x W^T (T, E), softmax; DeepSeek-V3's sigmoid scores normalised to sum 1 */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, E, d, 1.0f, x, d, router, d, 0.0f, pr, E);
    sm_status st = finite_logits(m, pr, T, E, "router", err);
    if (st == SM_OK && m->cfg.sigmoid) {
        /* sigmoid(l_e) / sum_f sigmoid(l_f) = softmax of log sigmoid(l): the direct quotient is 0/0 once every
         * sigmoid underflows (all logits below about -88) */
        for (size_t i = 0; i < (size_t)T * E; i++) {
            const double l = pr[i];
            pr[i] = (float)(l >= 0 ? -log1p(exp(-l)) : l - log1p(exp(l)));
        }
    }
    if (st == SM_OK) softmax_rows(pr, T, E);
    if (st == SM_OK && ev) { /* EV logits: x . (mean of the expert's three descriptors), no temperature */
        sm_hf_ev_mean(ev, E, d, dbar);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, E, d, 1.0f, x, d, dbar, d, 0.0f, pe, E);
        st = finite_logits(m, pe, T, E, "EV", err);
        if (st == SM_OK) softmax_rows(pe, T, E);
    }
    if (st != SM_OK) {
        free(pr); free(pe); free(dbar); free(s1); free(s2);
        return st;
    }
    for (int e = 0; e < E; e++) {
        mean_router[e] = 0;
        if (mean_mix) mean_mix[e] = 0;
    }
    double ov = 0;
    for (int t = 0; t < T; t++) {
        float *r = pr + (size_t)t * E;
        for (int e = 0; e < E; e++) mean_router[e] += (double)r[e] / T;
        if (!ev) continue;
        float *p = pe + (size_t)t * E;
        for (int e = 0; e < E; e++) p[e] = (float)(alpha * p[e] + (1 - alpha) * r[e]); /* P, the mix */
        if (mean_mix)
            for (int e = 0; e < E; e++) mean_mix[e] += (double)p[e] / T;
        topk_mark(r, E, k, s1);
        topk_mark(p, E, k, s2);
        int both = 0;
        for (int e = 0; e < E; e++) both += s1[e] && s2[e];
        ov += (double)both / k / T;
    }
    if (overlap) *overlap = ev ? ov : NAN;
    free(pr); free(pe); free(dbar); free(s1); free(s2);
    return SM_OK;
}

/* ---------------------------------------------------------------------------------------------- */
/* pruning */

/* Writes bytes to path atomically (path.tmp, fsync, rename). */
static sm_status write_atomic(const char *path, const void *bytes, size_t n, sm_error *err) {
    size_t pl = strlen(path);
    char *tmp = malloc(pl + 5);
    if (!tmp) return sm_fail(err, SM_ERR_NOMEM, "out of memory");
    memcpy(tmp, path, pl);
    memcpy(tmp + pl, ".tmp", 5);
    FILE *f = fopen(tmp, "wb");
    int ok = f && fwrite(bytes, 1, n, f) == n && fflush(f) == 0 && fsync(fileno(f)) == 0;
    int e = errno;
    if (f && fclose(f) != 0) ok = 0;
    if (ok && rename(tmp, path) != 0) {
        ok = 0;
        e = errno;
    }
    if (!ok) remove(tmp);
    free(tmp);
    return ok ? SM_OK : sm_fail(err, SM_ERR_IO, "%s: write failed: %s", path, strerror(e));
}

/* What happens to one source tensor. */
typedef enum { P_COPY, P_SLICE, P_RENAME, P_DROP } prune_action;

/* Classifies tensor name under the kept experts; *layer is the MoE layer (for SLICE), *newname is
 * set for RENAME (malloc'd). */
static prune_action classify(const sm_hf_model *m, const char *name, const int *keep, int E_keep, int *layer,
                             char **newname) {
    for (int l = 0; l < m->n_moe; l++) {
        const char *B = m->moe[l].block;
        size_t bl = strlen(B);
        if (strncmp(name, B, bl) != 0 || name[bl] != '.') continue;
        const char *rest = name + bl + 1;
        *layer = l;
        if (!strncmp(rest, "gate.", 5)) return P_SLICE; /* router weight, bias, e_score_correction_bias */
        if (strncmp(rest, "experts.", 8) != 0) return P_COPY; /* shared experts, shared_expert_gate, ... */
        const char *r2 = rest + 8, *endp;
        if (!isdigit((unsigned char)r2[0])) return P_SLICE; /* fused (E, ...) tensors and their biases */
        int e = expert_index(r2, m->cfg.E, &endp); /* canonical: checked by sm_hf_open */
        if (e < 0) return P_DROP;
        for (int j = 0; j < E_keep; j++)
            if (keep[l * E_keep + j] == e) {
                size_t n = strlen(name) + 16;
                *newname = malloc(n);
                if (*newname) snprintf(*newname, n, "%s.experts.%d%s", B, j, endp);
                return P_RENAME;
            }
        return P_DROP;
    }
    return P_COPY;
}

/* Copies bytes [off, off + n) of tensor t of shard sh into the stream through buf. */
static sm_status copy_bytes(const sm_safetensors *sh, const sm_st_tensor *t, size_t off, size_t n, sm_st_stream *out,
                            uint8_t *buf, sm_error *err) {
    while (n > 0) {
        size_t c = n < HF_COPY_CHUNK ? n : HF_COPY_CHUNK;
        sm_status st = sm_st_read_bytes(sh, t, off, c, buf, err);
        if (st == SM_OK) st = sm_st_stream_write(out, buf, c, err);
        if (st != SM_OK) return st;
        off += c;
        n -= c;
    }
    return SM_OK;
}

static sm_status prune_shard(const sm_hf_model *m, int s, const int *keep, int E_keep, const char *out_dir,
                             cJSON *wmap, size_t *total, uint8_t *buf, sm_error *err) {
    const sm_safetensors *sh = &m->shard[s];
    const int E = m->cfg.E;
    int n = sh->n_tensors;
    prune_action *act = calloc((size_t)(n ? n : 1), sizeof *act);
    int *lay = calloc((size_t)(n ? n : 1), sizeof *lay);
    char **nn = calloc((size_t)(n ? n : 1), sizeof *nn);
    sm_st_writer w;
    sm_st_writer_init(&w);
    sm_status st = (act && lay && nn) ? SM_OK : sm_fail(err, SM_ERR_NOMEM, "out of memory");
    for (int i = 0; i < n && st == SM_OK; i++) {
        const sm_st_tensor *t = &sh->tensors[i];
        act[i] = classify(m, t->name, keep, E_keep, &lay[i], &nn[i]);
        if (act[i] == P_DROP) continue;
        if (act[i] == P_RENAME && !nn[i]) {
            st = sm_fail(err, SM_ERR_NOMEM, "out of memory");
            break;
        }
        int64_t shape[SM_ST_MAX_DIMS];
        memcpy(shape, t->shape, sizeof shape);
        if (act[i] == P_SLICE) {
            if (t->ndim < 1 || t->shape[0] != E) {
                st = sm_fail(err, SM_ERR_FORMAT, "%s/%s: tensor '%s' sits in an MoE block's expert/router slot but its "
                             "first dimension is not the %d experts", m->dir, m->shard_file[s], t->name, E);
                break;
            }
            shape[0] = E_keep;
        }
        const char *name = act[i] == P_RENAME ? nn[i] : t->name;
        st = sm_st_writer_add_layout(&w, name, t->dtype, t->ndim, shape, err);
        if (st == SM_OK && wmap && !cJSON_AddStringToObject(wmap, name, m->shard_file[s]))
            st = sm_fail(err, SM_ERR_NOMEM, "out of memory");
    }
    for (int i = 0; i < sh->n_meta && st == SM_OK; i++) st = sm_st_writer_meta(&w, sh->meta[i].key, sh->meta[i].value, err);
    char *path = pjoin(out_dir, m->shard_file[s]);
    sm_st_stream out;
    if (st == SM_OK) st = path ? sm_st_stream_begin(&out, &w, path, err) : sm_fail(err, SM_ERR_NOMEM, "out of memory");
    if (st == SM_OK) {
        for (int i = 0; i < n && st == SM_OK; i++) {
            const sm_st_tensor *t = &sh->tensors[i];
            size_t bytes = t->end - t->begin;
            if (act[i] == P_DROP) continue;
            if (act[i] != P_SLICE) {
                st = copy_bytes(sh, t, 0, bytes, &out, buf, err);
                *total += bytes;
                continue;
            }
            size_t row = bytes / (size_t)E; /* one expert's slice */
            for (int j = 0; j < E_keep && st == SM_OK; j++)
                st = copy_bytes(sh, t, (size_t)keep[lay[i] * E_keep + j] * row, row, &out, buf, err);
            *total += row * (size_t)E_keep;
        }
        if (st == SM_OK) st = sm_st_stream_finish(&out, err);
        else sm_st_stream_abort(&out);
    }
    free(path);
    sm_st_writer_free(&w);
    for (int i = 0; i < n && nn; i++) free(nn[i]);
    free(nn);
    free(act);
    free(lay);
    return st;
}

/* Whether the resolved path p is root or lies below it (root resolved too). */
static int path_within(const char *p, const char *root) {
    size_t n = strlen(root);
    if (n == 1 && root[0] == '/') return 1;
    return strncmp(p, root, n) == 0 && (p[n] == '\0' || p[n] == '/');
}

/* One regular file: src is opened without following a final symlink and must be a regular file (a
 * FIFO is not waited on); dst is created fresh (O_EXCL, no symlink followed) with src's permission
 * bits, which are then set exactly, whatever the umask: never wider than the source, and not narrower
 * either. dst NULL only checks that src can be opened. */
static sm_status copy_file(const char *src, const char *dst, uint8_t *buf, sm_error *err) {
    int in = open(src, O_RDONLY | O_NOFOLLOW | O_NONBLOCK);
    struct stat sb;
    if (in < 0) return sm_fail(err, SM_ERR_IO, "%s: cannot open: %s", src, strerror(errno));
    if (fstat(in, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(in);
        return sm_fail(err, SM_ERR_IO, "%s: not a regular file", src);
    }
    if (!dst) {
        close(in);
        return SM_OK;
    }
    const mode_t mode = sb.st_mode & 0777;
    int out = open(dst, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW, mode);
    sm_status st = out >= 0 ? SM_OK : sm_fail(err, SM_ERR_IO, "%s: cannot create: %s", dst, strerror(errno));
    for (ssize_t r; st == SM_OK && (r = read(in, buf, HF_COPY_CHUNK)) != 0;) {
        if (r < 0) {
            if (errno != EINTR) st = sm_fail(err, SM_ERR_IO, "%s: read failed: %s", src, strerror(errno));
            continue;
        }
        for (ssize_t done = 0; st == SM_OK && done < r;) {
            ssize_t w = write(out, buf + done, (size_t)(r - done));
            if (w > 0) done += w;
            else if (w == 0 || errno != EINTR) st = sm_fail(err, SM_ERR_IO, "%s: write failed: %s", dst, strerror(errno));
        }
    }
    if (st == SM_OK && fchmod(out, mode) != 0) st = sm_fail(err, SM_ERR_IO, "%s: cannot set mode %o: %s", dst, (unsigned)mode, strerror(errno));
    if (out >= 0 && close(out) != 0 && st == SM_OK) st = sm_fail(err, SM_ERR_IO, "%s: close failed: %s", dst, strerror(errno));
    close(in);
    if (st != SM_OK && out >= 0) unlink(dst);
    return st;
}

/* Gives dst the permission bits of src (the shards, index and config.json pruning rewrites). */
static sm_status keep_mode(const char *src, const char *dst, sm_error *err) {
    struct stat sb;
    if (stat(src, &sb) != 0) return sm_fail(err, SM_ERR_IO, "%s: cannot stat: %s", src, strerror(errno));
    if (chmod(dst, sb.st_mode & 0777) != 0) return sm_fail(err, SM_ERR_IO, "%s: cannot set its mode: %s", dst, strerror(errno));
    return SM_OK;
}

/* What the symbolic link at path (`named` in messages) leads to: its resolved target in res, which must lie inside root (the
 * model directory, resolved). A link that leads outside, or nowhere, is refused, naming the link and
 * where it points: following it would copy, say, /etc/shadow into the pruned model. */
static sm_status resolve_link(const char *path, const char *named, const char *root, char res[PATH_MAX], sm_error *err) {
    char target[PATH_MAX];
    ssize_t n = readlink(path, target, sizeof target - 1);
    if (n < 0) return sm_fail(err, SM_ERR_IO, "%s: cannot read the symbolic link: %s", named, strerror(errno));
    target[n] = '\0';
    char tb[112];
    sm_hf_shown(tb, target);
    if (!realpath(path, res))
        return sm_fail(err, SM_ERR_FORMAT, "%s: a symbolic link to '%s', which cannot be resolved: %s", named, tb, strerror(errno));
    if (path_within(res, root)) return SM_OK;
    char rb[112];
    return sm_fail(err, SM_ERR_FORMAT, "%s: a symbolic link to '%s' (%s), outside the model directory %s; pruning copies "
                   "only what lies inside it: put the file itself there, or remove the link%s", named, tb,
                   sm_hf_shown(rb, res), root, strstr(res, "/blobs/") ? " (a Hugging Face cache snapshot links its files "
                   "into ../../blobs: copy the snapshot with cp -rL, or download with --local-dir, before pruning)" : "");
}

/* Copying the rest of the model directory: what pruning does not rewrite (tokenizer, generation
 * config, ...) and, recursively, its subdirectories. A Hugging Face user expects the pruned directory to
 * be a whole model repository, so folders such as original/ or onnx/ are copied as they are (they are
 * not pruned: an export in them still holds every expert). Names starting with '.' (.git, .cache, ...)
 * are left out at every depth, and at the top the files pruning writes itself. Symbolic links are
 * followed only inside the model directory and copied as what they point to (a directory as a
 * directory); a link loop, a FIFO, socket or device is refused, never skipped in silence. */
#define HF_COPY_DEPTH 32

typedef struct {
    const char *root;                     /* the model directory, resolved */
    const char *chain[HF_COPY_DEPTH + 1]; /* resolved directories being copied, root first */
    int depth;
    uint8_t *buf;                         /* copy buffer (unused when only checking) */
} copy_walk;

/* Copies directory real (named `named` in messages) to out_dir (NULL: only checks). */
static sm_status copy_tree(copy_walk *w, const char *named, const char *real, const char *out_dir, sm_error *err) {
    DIR *dp = opendir(real);
    if (!dp) return sm_fail(err, SM_ERR_IO, "%s: cannot list: %s", named, strerror(errno));
    sm_status st = SM_OK;
    struct dirent *de;
    while (st == SM_OK && (de = readdir(dp))) {
        const char *nm = de->d_name;
        size_t nl = strlen(nm);
        if (nm[0] == '.' || (w->depth == 0 && (!strcmp(nm, "config.json") || !strcmp(nm, "model.safetensors.index.json") ||
                                               (nl > 12 && !strcmp(nm + nl - 12, ".safetensors")) ||
                                               (nl > 4 && !strcmp(nm + nl - 4, ".tmp")) || !strncmp(nm, "ev_router", 9))))
            continue;
        char *path = pjoin(named, nm), *src = pjoin(real, nm), *dst = out_dir ? pjoin(out_dir, nm) : NULL, res[PATH_MAX];
        struct stat sb;
        const char *from = src;
        if (!path || !src || (out_dir && !dst)) st = sm_fail(err, SM_ERR_NOMEM, "out of memory");
        else if (lstat(src, &sb) != 0) st = sm_fail(err, SM_ERR_IO, "%s: cannot stat: %s", path, strerror(errno));
        else if (S_ISLNK(sb.st_mode) && (st = resolve_link(src, path, w->root, res, err)) == SM_OK) {
            from = res;
            if (stat(res, &sb) != 0) st = sm_fail(err, SM_ERR_IO, "%s: cannot stat: %s", path, strerror(errno));
        }
        if (st != SM_OK) {
            /* reported */
        } else if (S_ISREG(sb.st_mode)) {
            st = copy_file(from, dst, w->buf, err);
        } else if (S_ISDIR(sb.st_mode)) {
            for (int i = 0; i <= w->depth && st == SM_OK; i++) /* only a link can lead back up */
                if (!strcmp(w->chain[i], from))
                    st = sm_fail(err, SM_ERR_FORMAT, "%s: a symbolic link back to %s, which contains it: a loop; remove "
                                 "the link", path, from);
            if (st == SM_OK && w->depth == HF_COPY_DEPTH)
                st = sm_fail(err, SM_ERR_FORMAT, "%s: directories nested deeper than %d", path, HF_COPY_DEPTH);
            /* created with owner rwx to be filled, then given the source's mode */
            if (st == SM_OK && dst && mkdir(dst, 0700) != 0)
                st = sm_fail(err, SM_ERR_IO, "%s: cannot create: %s", dst, strerror(errno));
            if (st == SM_OK) {
                w->chain[++w->depth] = from;
                st = copy_tree(w, path, from, dst, err);
                w->depth--;
            }
            if (st == SM_OK && dst && chmod(dst, sb.st_mode & 0777) != 0)
                st = sm_fail(err, SM_ERR_IO, "%s: cannot set mode %o: %s", dst, (unsigned)(sb.st_mode & 0777), strerror(errno));
        } else {
            st = sm_fail(err, SM_ERR_FORMAT, "%s: not a regular file, directory or symbolic link; pruning copies only those "
                         "(remove it from the model directory)", path);
        }
        free(path);
        free(src);
        free(dst);
    }
    closedir(dp);
    return st;
}

/* Copies (out_dir NULL: checks) the rest of model directory dir, whose real path is root. */
static sm_status copy_other_files(const char *root, const char *dir, const char *out_dir, uint8_t *buf, sm_error *err) {
    copy_walk w = {.root = root, .chain = {root}, .depth = 0, .buf = buf};
    return copy_tree(&w, dir, root, out_dir, err);
}

/* out resolved into res, whether or not it exists yet: a missing out is its parent's real path plus
 * its last component. *exists tells which. */
static sm_status resolve_out(const char *out, char res[PATH_MAX], int *exists, sm_error *err) {
    *exists = 0;
    if (realpath(out, res)) {
        *exists = 1;
        return SM_OK;
    }
    struct stat sb;
    if (errno != ENOENT || lstat(out, &sb) == 0) /* a dangling symlink lstat's fine but cannot be created */
        return sm_fail(err, SM_ERR_IO, "%s: cannot resolve the output directory: %s", out,
                       errno == ENOENT ? "a symbolic link to nowhere" : strerror(errno));
    size_t n = strlen(out);
    while (n > 1 && out[n - 1] == '/') n--; /* "new/" */
    size_t slash = n;
    while (slash > 0 && out[slash - 1] != '/') slash--;
    char parent[PATH_MAX], pres[PATH_MAX];
    if (n >= sizeof parent) return sm_fail(err, SM_ERR_ARG, "%s: path too long", out);
    const size_t pl = slash == 0 ? 0 : slash > 1 ? slash - 1 : 1; /* "a/b" -> "a", "/b" -> "/", "b" -> "." */
    memcpy(parent, pl ? out : ".", pl ? pl : 1);
    parent[pl ? pl : 1] = '\0';
    if (!realpath(parent, pres))
        return sm_fail(err, SM_ERR_IO, "%s: cannot create the output directory: %s: %s", out, parent, strerror(errno));
    size_t rl = strlen(pres);
    if (rl + 1 + (n - slash) >= PATH_MAX) return sm_fail(err, SM_ERR_ARG, "%s: path too long", out);
    memcpy(res, pres, rl);
    if (strcmp(pres, "/") != 0) res[rl++] = '/';
    memcpy(res + rl, out + slash, n - slash);
    res[rl + n - slash] = '\0';
    return SM_OK;
}

sm_status sm_hf_check_prune_out(const char *dir, const char *out_dir, sm_error *err) {
    if (!dir || !out_dir || !out_dir[0]) return sm_fail(err, SM_ERR_ARG, "prune: no model or output directory");
    char src[PATH_MAX], out[PATH_MAX];
    if (!realpath(dir, src)) return sm_fail(err, SM_ERR_IO, "%s: cannot resolve: %s", dir, strerror(errno));
    int exists;
    sm_status st = resolve_out(out_dir, out, &exists, err);
    if (st != SM_OK) return st;
    if (strcmp(out, src) == 0)
        return sm_fail(err, SM_ERR_ARG, "%s: this is the model directory %s itself; the pruned model needs a directory of "
                       "its own (choose another --out)", out_dir, dir);
    if (path_within(out, src))
        return sm_fail(err, SM_ERR_ARG, "%s: inside the model directory %s, which pruning reads and copies; "
                       "choose an --out outside it", out_dir, dir);
    if ((st = copy_other_files(src, dir, NULL, NULL, err)) != SM_OK || !exists) return st;
    struct stat sb;
    if (stat(out, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return sm_fail(err, SM_ERR_ARG, "%s: exists and is not a directory; choose another --out", out_dir);
    DIR *dp = opendir(out);
    if (!dp) return sm_fail(err, SM_ERR_IO, "%s: cannot list: %s", out_dir, strerror(errno));
    struct dirent *de;
    char first[112] = "";
    while ((de = readdir(dp)))
        if (strcmp(de->d_name, ".") != 0 && strcmp(de->d_name, "..") != 0) {
            sm_hf_shown(first, de->d_name);
            break;
        }
    closedir(dp);
    if (first[0])
        return sm_fail(err, SM_ERR_ARG, "%s: the output directory is not empty (it holds '%s', perhaps from an earlier "
                       "run, which would stay beside the new files); choose another --out or remove it", out_dir, first);
    return SM_OK;
}

int sm_hf_pruned_groups(const sm_hf_config *c, int E_keep) {
    const int G = c->n_group;
    if (G <= 1 || E_keep % G != 0 || c->E % G != 0) return 1;
    const int per = E_keep / G;
    return per >= 2 && c->topk_group * per >= (c->k < E_keep ? c->k : E_keep) ? G : 1;
}

/* root[key] = v, replacing or adding. */
static int set_number(cJSON *root, const char *key, double v) {
    cJSON *n = cJSON_CreateNumber(v);
    if (!n) return 0;
    if (cJSON_GetObjectItemCaseSensitive(root, key)) {
        if (cJSON_ReplaceItemInObjectCaseSensitive(root, key, n)) return 1;
        cJSON_Delete(n);
        return 0;
    }
    return cJSON_AddItemToObject(root, key, n);
}

/* config.json with the new expert count (and what depends on it). */
static sm_status write_config(const sm_hf_model *m, int E_keep, const char *out_dir, sm_error *err) {
    char *cpath = pjoin(m->dir, "config.json"), *text = NULL, *opath = pjoin(out_dir, "config.json");
    size_t len;
    sm_status st = cpath && opath ? read_text(cpath, &text, &len, err) : sm_fail(err, SM_ERR_NOMEM, "out of memory");
    cJSON *root = st == SM_OK ? cJSON_ParseWithLength(text, len) : NULL;
    if (st == SM_OK && !root) st = sm_fail(err, SM_ERR_FORMAT, "%s: not valid JSON", cpath);
    if (st == SM_OK) {
        const sm_hf_config *c = &m->cfg;
        int ok = set_number(root, c->expert_key, E_keep);
        if (c->k > E_keep) ok = ok && set_number(root, "num_experts_per_tok", E_keep);
        if (c->n_group > 1 && sm_hf_pruned_groups(c, E_keep) == 1) /* group-limited routing no longer fits */
            ok = ok && set_number(root, "n_group", 1) && set_number(root, "topk_group", 1);
        char *out = ok ? cJSON_Print(root) : NULL;
        st = out ? write_atomic(opath, out, strlen(out), err) : sm_fail(err, SM_ERR_NOMEM, "out of memory");
        free(out);
    }
    cJSON_Delete(root);
    free(text);
    free(cpath);
    free(opath);
    return st;
}

sm_status sm_hf_prune(const sm_hf_model *m, const int *keep, int E_keep, const char *out_dir, sm_error *err) {
    const int E = m->cfg.E;
    if (E_keep < 1 || E_keep > E) return sm_fail(err, SM_ERR_ARG, "prune: kept experts must be in [1, %d] (got %d)", E, E_keep);
    for (int l = 0; l < m->n_moe; l++)
        for (int j = 0; j < E_keep; j++) {
            int e = keep[l * E_keep + j];
            if (e < 0 || e >= E || (j > 0 && e <= keep[l * E_keep + j - 1]))
                return sm_fail(err, SM_ERR_ARG, "prune: layer %d: kept experts must be ascending indices in [0, %d)", l, E);
        }
    const int G = sm_hf_pruned_groups(&m->cfg, E_keep);
    for (int l = 0; l < m->n_moe && G > 1; l++)
        for (int g = 0; g < G; g++) {
            int n = 0;
            for (int j = 0; j < E_keep; j++) n += keep[l * E_keep + j] / (E / G) == g;
            if (n != E_keep / G)
                return sm_fail(err, SM_ERR_ARG, "prune: layer %d keeps %d experts of group %d; grouped routing (%d groups) "
                               "needs %d from each", l, n, g, G, E_keep / G);
        }
    sm_status st = sm_hf_check_prune_out(m->dir, out_dir, err);
    if (st != SM_OK) return st;
    if (mkdir(out_dir, 0755) != 0 && errno != EEXIST)
        return sm_fail(err, SM_ERR_IO, "%s: cannot create: %s", out_dir, strerror(errno));
    uint8_t *buf = malloc(HF_COPY_CHUNK);
    cJSON *index = m->indexed ? cJSON_CreateObject() : NULL, *meta = NULL, *wmap = NULL;
    if (index) {
        meta = cJSON_AddObjectToObject(index, "metadata");
        wmap = cJSON_AddObjectToObject(index, "weight_map");
    }
    st = (!buf || (m->indexed && (!index || !meta || !wmap))) ? sm_fail(err, SM_ERR_NOMEM, "out of memory") : SM_OK;
    size_t total = 0;
    for (int s = 0; s < m->n_shards && st == SM_OK; s++) st = prune_shard(m, s, keep, E_keep, out_dir, wmap, &total, buf, err);
    if (st == SM_OK && index) {
        cJSON_AddNumberToObject(meta, "total_size", (double)total);
        char *text = cJSON_Print(index), *ipath = pjoin(out_dir, "model.safetensors.index.json");
        st = text && ipath ? write_atomic(ipath, text, strlen(text), err) : sm_fail(err, SM_ERR_NOMEM, "out of memory");
        free(text);
        free(ipath);
    }
    if (st == SM_OK) st = write_config(m, E_keep, out_dir, err);
    /* the rewritten files keep their sources' modes, as the copied ones do */
    static const char *const rewritten[2] = {"config.json", "model.safetensors.index.json"};
    for (int i = 0; i < m->n_shards + 2 && st == SM_OK; i++) {
        const char *nm = i < m->n_shards ? m->shard_file[i] : rewritten[i - m->n_shards];
        if (i == m->n_shards + 1 && !m->indexed) break;
        char *a = pjoin(m->dir, nm), *b = pjoin(out_dir, nm);
        st = a && b ? keep_mode(a, b, err) : sm_fail(err, SM_ERR_NOMEM, "out of memory");
        free(a);
        free(b);
    }
    char root[PATH_MAX];
    if (st == SM_OK && !realpath(m->dir, root)) st = sm_fail(err, SM_ERR_IO, "%s: cannot resolve: %s", m->dir, strerror(errno));
    if (st == SM_OK) st = copy_other_files(root, m->dir, out_dir, buf, err);
    cJSON_Delete(index);
    free(buf);
    return st;
}
