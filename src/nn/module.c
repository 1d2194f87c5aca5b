/* The module contract (include/specmoe/nn/module.h): the two-pass arena, declare/reserve for a
 * whole network, JSON descriptions, and the sequential container. */
#include "specmoe/nn/module.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nn/module_internal.h"

sm_real *sm_arena_take(sm_arena *a, size_t n) {
    sm_real *p = a->base ? a->base + a->used : NULL;
    a->used += n;
    return p;
}

int *sm_arena_take_int(sm_arena *a, size_t n) {
    int *p = a->ibase ? a->ibase + a->iused : NULL;
    a->iused += n;
    return p;
}

sm_status sm_module_declare(sm_module *m, sm_params *ps, sm_shape in, sm_error *err) {
    if (in.rows < 1 || in.c < 1 || in.h < 1 || in.w < 1 || (int64_t)in.c * in.h * in.w > (1 << 28))
        return sm_fail(err, SM_ERR_ARG, "%s: bad input shape (%d rows of %d x %d x %d)", m->name, in.rows, in.c, in.h,
                       in.w);
    m->in = in;
    sm_status st = m->ops->declare(m, ps, err);
    if (st != SM_OK) return st;
    if (sm_shape_numel(m->out) > (1u << 28))
        return sm_fail(err, SM_ERR_ARG, "%s: %d rows of %d x %d x %d outputs are too many", m->name, m->out.rows,
                       m->out.c, m->out.h, m->out.w);
    if (m->residual && (m->out.rows != in.rows || sm_shape_width(m->out) != sm_shape_width(in)))
        return sm_fail(err, SM_ERR_ARG, "%s: a residual module needs its output shape equal to its input's", m->name);
    return SM_OK;
}

sm_status sm_module_reserve(sm_module *m, int max_B, sm_error *err) {
    if (max_B < 1) return sm_fail(err, SM_ERR_ARG, "%s: batch size must be >= 1", m->name);
    if (m->arena_block) return sm_fail(err, SM_ERR_ARG, "%s: activations are already reserved", m->name);
    sm_arena a = {0};
    m->ops->reserve(m, max_B, &a); /* measure */
    size_t n = a.used ? a.used : 1, ni = a.iused ? a.iused : 1;
    m->arena_block = malloc(n * sizeof(sm_real));
    m->iarena_block = malloc(ni * sizeof(int));
    if (!m->arena_block || !m->iarena_block)
        return sm_fail(err, SM_ERR_NOMEM, "%s: cannot allocate %zu MiB of activations for a batch of %d", m->name,
                       n * sizeof(sm_real) >> 20, max_B);
    sm_arena c = {m->arena_block, 0, n, m->iarena_block, 0, ni};
    m->ops->reserve(m, max_B, &c); /* carve */
    m->max_B = max_B;
    return m->ops->setup ? m->ops->setup(m, max_B, err) : SM_OK;
}

void sm_module_free(sm_module *m) {
    if (!m) return;
    free(m->arena_block);
    free(m->iarena_block);
    m->ops->destroy(m);
}

char *sm_module_to_json(const sm_module *m) {
    cJSON *o = sm_module_json_object(m);
    char *s = o ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    return s;
}

cJSON *sm_module_json_object(const sm_module *m) {
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    cJSON_AddStringToObject(o, "kind", m->ops->kind);
    cJSON_AddStringToObject(o, "name", m->name);
    if (m->residual) cJSON_AddNumberToObject(o, "residual", 1);
    if (m->ops->to_json) m->ops->to_json(m, o);
    return o;
}

sm_module *sm_module_from_json(const char *json, sm_error *err) {
    cJSON *o = cJSON_Parse(json);
    if (!cJSON_IsObject(o)) {
        cJSON_Delete(o);
        sm_fail(err, SM_ERR_FORMAT, "module: not a JSON object");
        return NULL;
    }
    sm_module *m = sm_module_from_json_object(o, err);
    cJSON_Delete(o);
    return m;
}

/* ---- sequential container ------------------------------------------------------------------- */

typedef struct {
    sm_module base;
    int n;
    sm_module **child;
    sm_real **out;  /* (n) child outputs (B * rows_i, F_i) */
    sm_real **dout; /* (n) gradients w.r.t. them */
} seq_mod;

static sm_status seq_declare(sm_module *m, sm_params *ps, sm_error *err) {
    seq_mod *s = (seq_mod *)m;
    sm_shape cur = m->in;
    for (int i = 0; i < s->n; i++) {
        sm_module *c = s->child[i];
        char num[16];
        snprintf(num, sizeof num, "%d", i);
        if (!c->name[0] && sm_param_name(c->name, m->name, num)) return sm_fail(err, SM_ERR_ARG, "%s: name too long", m->name);
        sm_status st = sm_module_declare(c, ps, cur, err);
        if (st != SM_OK) return st;
        cur = c->out;
    }
    m->out = cur;
    return SM_OK;
}

static void seq_reserve(sm_module *m, int max_B, sm_arena *a) {
    seq_mod *s = (seq_mod *)m;
    for (int i = 0; i < s->n; i++) {
        sm_module *c = s->child[i];
        c->max_B = max_B;
        c->ops->reserve(c, max_B, a);
        s->out[i] = sm_arena_take(a, (size_t)max_B * sm_shape_numel(c->out));
        s->dout[i] = sm_arena_take(a, (size_t)max_B * sm_shape_numel(c->out));
    }
}

static sm_status seq_setup(sm_module *m, int max_B, sm_error *err) {
    seq_mod *s = (seq_mod *)m;
    for (int i = 0; i < s->n; i++)
        if (s->child[i]->ops->setup) {
            sm_status st = s->child[i]->ops->setup(s->child[i], max_B, err);
            if (st != SM_OK) return st;
        }
    return SM_OK;
}

void sm_seq_forward_range(sm_module *m, int first, int last, sm_real *out, const sm_real *in, int B,
                          const sm_ctx *ctx) {
    seq_mod *s = (seq_mod *)m;
    for (int i = first; i < last; i++) {
        sm_module *c = s->child[i];
        const sm_real *x = i == first ? in : s->out[i - 1];
        sm_module_forward(c, s->out[i], x, B, ctx);
        if (c->residual)
            for (size_t j = 0, n = (size_t)B * sm_shape_numel(c->out); j < n; j++) s->out[i][j] += x[j];
    }
    if (last > first && out && out != s->out[last - 1])
        memcpy(out, s->out[last - 1], sizeof(sm_real) * (size_t)B * sm_shape_numel(s->child[last - 1]->out));
}

static void seq_forward(sm_module *m, sm_real *out, const sm_real *in, int B, const sm_ctx *ctx) {
    sm_seq_forward_range(m, 0, ((seq_mod *)m)->n, out, in, B, ctx);
}

/* din of child i is the previous child's dout (zeroed first: backwards accumulate) or, for the first
 * child, the caller's din (accumulated into, may be NULL). */
void sm_seq_backward_extra(sm_module *m, sm_real *din, const sm_real *dout, const sm_real *in, int B, const sm_ctx *ctx,
                           const sm_real *const *extra) {
    seq_mod *s = (seq_mod *)m;
    for (int i = s->n - 1; i >= 0; i--) {
        sm_module *c = s->child[i];
        const sm_real *x = i ? s->out[i - 1] : in, *dy = i == s->n - 1 ? dout : s->dout[i];
        sm_real *dx = i ? s->dout[i - 1] : din;
        size_t nin = (size_t)B * sm_shape_numel(c->in);
        if (extra && i < s->n - 1 && extra[i])
            for (size_t j = 0, n = (size_t)B * sm_shape_numel(c->out); j < n; j++) s->dout[i][j] += extra[i][j];
        if (i) memset(dx, 0, sizeof(sm_real) * nin);
        sm_module_backward(c, dx, dy, x, B, ctx);
        if (dx && c->residual)
            for (size_t j = 0; j < nin; j++) dx[j] += dy[j];
    }
}

static void seq_backward(sm_module *m, sm_real *din, const sm_real *dout, const sm_real *in, int B, const sm_ctx *ctx) {
    sm_seq_backward_extra(m, din, dout, in, B, ctx, NULL);
}

static void seq_to_json(const sm_module *m, cJSON *o) {
    const seq_mod *s = (const seq_mod *)m;
    cJSON *a = cJSON_AddArrayToObject(o, "children");
    for (int i = 0; i < s->n && a; i++) cJSON_AddItemToArray(a, sm_module_json_object(s->child[i]));
}

static void seq_destroy(sm_module *m) {
    seq_mod *s = (seq_mod *)m;
    for (int i = 0; i < s->n; i++) sm_module_free(s->child[i]);
    free(s->child);
    free(s->out);
    free(s->dout);
    free(s);
}

static double seq_macs(const sm_module *m) {
    double n = 0;
    for (int i = 0; i < sm_seq_count(m); i++) n += sm_module_macs(sm_seq_child(m, i));
    return n;
}
static const sm_module_ops kSeqOps = {"seq", seq_declare, seq_reserve, seq_setup, seq_forward,
                                      seq_backward, seq_to_json, seq_destroy, seq_macs};

double sm_module_macs(const sm_module *m) { return m && m->ops->macs ? m->ops->macs(m) : 0; }

sm_module *sm_seq_module(const char *name, sm_module *const *children, int n, sm_error *err) {
    seq_mod *s = calloc(1, sizeof *s);
    if (s) {
        s->child = calloc((size_t)(n > 0 ? n : 1), sizeof *s->child);
        s->out = calloc((size_t)(n > 0 ? n : 1), sizeof *s->out);
        s->dout = calloc((size_t)(n > 0 ? n : 1), sizeof *s->dout);
    }
    if (!s || !s->child || !s->out || !s->dout) {
        if (s) free(s->child), free(s->out), free(s->dout);
        free(s);
        for (int i = 0; i < n; i++) sm_module_free(children[i]);
        sm_fail(err, SM_ERR_NOMEM, "%s: out of memory", name);
        return NULL;
    }
    s->base.ops = &kSeqOps;
    snprintf(s->base.name, sizeof s->base.name, "%s", name);
    s->n = n;
    for (int i = 0; i < n; i++) s->child[i] = children[i];
    if (n < 1) {
        sm_module_free(&s->base);
        sm_fail(err, SM_ERR_ARG, "%s: a sequential container needs at least one module", name);
        return NULL;
    }
    return &s->base;
}

int sm_seq_count(const sm_module *m) { return m->ops == &kSeqOps ? ((const seq_mod *)m)->n : 0; }
sm_module *sm_seq_child(const sm_module *m, int i) {
    return m->ops == &kSeqOps && i >= 0 && i < ((const seq_mod *)m)->n ? ((const seq_mod *)m)->child[i] : NULL;
}
const sm_real *sm_seq_output(const sm_module *m, int i) {
    return m->ops == &kSeqOps && i >= 0 && i < ((const seq_mod *)m)->n ? ((const seq_mod *)m)->out[i] : NULL;
}

sm_module *sm_seq_from_json(const cJSON *o, const char *name, sm_error *err) {
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(o, "children");
    int n = cJSON_GetArraySize(a);
    if (!cJSON_IsArray(a) || n < 1 || n > 4096) {
        sm_fail(err, SM_ERR_FORMAT, "module '%s': 'children' missing or not a non-empty array", name);
        return NULL;
    }
    sm_module **ch = calloc((size_t)n, sizeof *ch);
    if (!ch) {
        sm_fail(err, SM_ERR_NOMEM, "module '%s': out of memory", name);
        return NULL;
    }
    int i = 0;
    for (const cJSON *c = a->child; c; c = c->next, i++)
        if (!(ch[i] = sm_module_from_json_object(c, err))) {
            for (int j = 0; j < i; j++) sm_module_free(ch[j]);
            free(ch);
            return NULL;
        }
    sm_module *m = sm_seq_module(name, ch, n, err);
    free(ch);
    return m;
}
