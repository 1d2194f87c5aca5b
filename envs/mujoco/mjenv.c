/* The shared part of the MuJoCo environments (envs/mujoco/mjenv.h). */
#include "mjenv.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "../classic/draw.h"

/* One lock for every family's model: loading happens once per family per process. */
static pthread_mutex_t g_load_lock = PTHREAD_MUTEX_INITIALIZER;

/* mj_loadXML of embedded text: MuJoCo 2.2 reads a model from memory through its virtual file system
 * (mj_makeEmptyFileVFS gives a buffer under a file name, which mj_loadXML then finds). The mjVFS
 * holds 2000 file names of 1000 bytes, so it is allocated, not put on the stack. */
static mjModel *load_embedded(const char *name, const char *xml, char *msg, int msg_size) {
    mjVFS *vfs = malloc(sizeof *vfs);
    if (!vfs) {
        snprintf(msg, (size_t)msg_size, "out of memory for MuJoCo's virtual file system");
        return NULL;
    }
    mj_defaultVFS(vfs);
    int n = (int)strlen(xml), rc = mj_makeEmptyFileVFS(vfs, name, n);
    mjModel *m = NULL;
    if (rc != 0) snprintf(msg, (size_t)msg_size, "mj_makeEmptyFileVFS failed (%d)", rc);
    else {
        memcpy(vfs->filedata[mj_findFileVFS(vfs, name)], xml, (size_t)n);
        m = mj_loadXML(name, vfs, msg, msg_size);
    }
    mj_deleteVFS(vfs);
    free(vfs);
    return m;
}

sm_status mjenv_load(mjenv_model *mm, sm_error *err) {
    char msg[512] = "";
    pthread_mutex_lock(&g_load_lock);
    if (!mm->model) mm->model = mm->xml ? load_embedded(mm->file, mm->xml, msg, (int)sizeof msg)
                                        : mj_loadXML(mm->file, NULL, msg, (int)sizeof msg);
    if (mm->model) { /* sizes read by mj_makeData only */
        mm->model->nstack = mm->nstack;
        mm->model->njmax = mm->njmax;
        mm->model->nconmax = mm->nconmax;
    }
    int ok = mm->model != NULL;
    pthread_mutex_unlock(&g_load_lock);
    if (ok) return SM_OK;
    return sm_fail(err, SM_ERR_IO, "%s: cannot load the MuJoCo model: %s%s", mm->file, msg[0] ? msg : "unknown error",
                   mm->xml ? "" : " (Debian: apt-get install libmujoco-samples; scripts/setup.sh)");
}

void mjenv_init(mjenv_base *b, mjenv_model *mm, int frame_skip, uint64_t seed) {
    sm_rng_seed(&b->rng, seed);
    if (!mm->model) mjenv_load(mm, NULL); /* prepare normally did it; without a model d stays NULL */
    b->m = mm->model;
    b->d = b->m ? mj_makeData(b->m) : NULL;
    b->frame_skip = frame_skip;
}

void mjenv_close(void *st) {
    mjenv_base *b = st;
    if (b->d) mj_deleteData(b->d);
    b->d = NULL;
}

static size_t mj_values(const mjModel *m) { return 1 + (size_t)m->nq + 2 * (size_t)m->nv + (size_t)m->na; }

size_t mjenv_save_size(const sm_env_spec *s, const void *st) {
    return s->state_bytes + sizeof(mjtNum) * mj_values(((const mjenv_base *)st)->m);
}

void mjenv_save(const sm_env_spec *s, const void *st, void *buf) {
    const mjenv_base *b = st;
    const mjModel *m = b->m;
    const mjData *d = b->d;
    memcpy(buf, st, s->state_bytes);
    mjtNum *x = (mjtNum *)((unsigned char *)buf + s->state_bytes);
    *x++ = d->time;
    memcpy(x, d->qpos, sizeof(mjtNum) * m->nq), x += m->nq;
    memcpy(x, d->qvel, sizeof(mjtNum) * m->nv), x += m->nv;
    memcpy(x, d->act, sizeof(mjtNum) * m->na), x += m->na;
    memcpy(x, d->qacc_warmstart, sizeof(mjtNum) * m->nv);
}

void mjenv_load_state(const sm_env_spec *s, void *st, const void *buf) {
    mjenv_base *b = st;
    const mjModel *m = b->m;
    mjData *d = b->d;
    memcpy(st, buf, s->state_bytes);
    b->m = m; /* this environment's own model and mjData, not the saved pointers */
    b->d = d;
    const mjtNum *x = (const mjtNum *)((const unsigned char *)buf + s->state_bytes);
    d->time = *x++;
    memcpy(d->qpos, x, sizeof(mjtNum) * m->nq), x += m->nq;
    memcpy(d->qvel, x, sizeof(mjtNum) * m->nv), x += m->nv;
    memcpy(d->act, x, sizeof(mjtNum) * m->na), x += m->na;
    mj_forward(m, d);
    /* the constraint solver of the next step starts from the saved warm start, as it would have */
    memcpy(d->qacc_warmstart, x, sizeof(mjtNum) * m->nv);
}

void mjenv_reset(mjenv_base *b, double qpos_noise, double qvel_noise) {
    const mjModel *m = b->m;
    mjData *d = b->d;
    mj_resetData(m, d);
    for (int j = 0; j < m->njnt; j++) {
        if (m->jnt_type[j] == mjJNT_FREE) continue;
        int q = m->jnt_qposadr[j]; /* a ball joint would need the same care; none of ours has one */
        d->qpos[q] += qpos_noise * (2 * sm_rng_uniform(&b->rng) - 1);
    }
    for (int i = 0; i < m->nv; i++) d->qvel[i] = qvel_noise * sm_rng_normal(&b->rng);
    mj_forward(m, d);
}

void mjenv_advance(mjenv_base *b, const float *a) {
    const mjModel *m = b->m;
    mjData *d = b->d;
    for (int i = 0; i < m->nu; i++) {
        float x = a[i];
        d->ctrl[i] = x < -1.0f ? -1.0 : x > 1.0f ? 1.0 : x == x ? (double)x : 0.0; /* NaN -> 0 */
    }
    for (int k = 0; k < b->frame_skip; k++) {
        mj_step2(m, d);
        mj_step1(m, d);
    }
}

double mjenv_ctrl_sq(const mjenv_base *b) {
    double s = 0;
    for (int i = 0; i < b->m->nu; i++) s += b->d->ctrl[i] * b->d->ctrl[i];
    return s / b->m->nu;
}

double mjenv_tolerance(double x, double lo, double hi, double margin, mjenv_sigmoid s, double value_at_margin) {
    if (lo <= x && x <= hi) return 1.0;
    if (margin <= 0) return 0.0;
    double dist = (x < lo ? lo - x : x - hi) / margin;
    switch (s) {
    case MJENV_GAUSSIAN: {
        double scale = sqrt(-2 * log(value_at_margin));
        return exp(-0.5 * (dist * scale) * (dist * scale));
    }
    case MJENV_LINEAR: {
        double sx = dist * (1 - value_at_margin);
        return fabs(sx) < 1 ? 1 - sx : 0.0;
    }
    case MJENV_QUADRATIC: {
        double sx = dist * sqrt(1 - value_at_margin);
        return fabs(sx) < 1 ? 1 - sx * sx : 0.0;
    }
    }
    return 0.0;
}

void mjenv_render(const mjenv_base *b, unsigned char *rgb, int h, int w, int up, double cx, double cy,
                  double width, double tx, double ty, double tr) {
    const mjModel *m = b->m;
    const mjData *d = b->d;
    const double half_h = width * h / w / 2; /* the same scale on both axes, centred on cy */
    draw_view v = draw_begin(rgb, h, w, cx - width / 2, cx + width / 2, cy - half_h, cy + half_h, kDrawWhite);
    if (up == 2) draw_line(&v, cx - width, 0, cx + width, 0, 0.02, kDrawGrey);
    if (tr > 0) draw_disc(&v, tx, ty, tr, kDrawRed);
    for (int g = 0; g < m->ngeom; g++) {
        const double *p = d->geom_xpos + 3 * g, *r = d->geom_xmat + 9 * g, *size = m->geom_size + 3 * g;
        switch (m->geom_type[g]) {
        case mjGEOM_PLANE:
            break;
        case mjGEOM_CAPSULE:
        case mjGEOM_CYLINDER: { /* the segment along the geom's local z axis (column 2 of xmat) */
            double ax = size[1] * r[2], au = size[1] * r[3 * up + 2];
            draw_line(&v, p[0] - ax, p[up] - au, p[0] + ax, p[up] + au, 2 * size[0], kDrawBrown);
            break;
        }
        case mjGEOM_BOX:
            draw_rect(&v, p[0], p[up], 2 * size[0], 2 * size[up], kDrawBlue);
            break;
        default: /* spheres and the rest: a disc of the first size */
            draw_disc(&v, p[0], p[up], size[0], kDrawBlue);
        }
    }
}
