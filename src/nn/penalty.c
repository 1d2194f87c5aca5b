/* Penalty registry (include/specmoe/nn/penalty.h): adding a penalty kind = one line here. */
#include "specmoe/nn/penalty.h"

extern const sm_penalty_kind sm_srmoe_penalty_kind;

static const sm_penalty_kind *const kKinds[] = {&sm_srmoe_penalty_kind};

sm_status sm_model_attach_penalties(sm_model *m, sm_error *err) {
    for (size_t i = 0; i < sizeof kKinds / sizeof kKinds[0]; i++) {
        sm_status st = SM_OK;
        sm_penalty *p = kKinds[i]->attach(m, &st, err);
        if (st != SM_OK) return st;
        if (!p) continue;
        if (m->n_penalties == (int)(sizeof m->penalties / sizeof m->penalties[0])) {
            p->ops->destroy(p);
            return sm_fail(err, SM_ERR_ARG, "model: too many penalties");
        }
        m->penalties[m->n_penalties++] = p;
    }
    return SM_OK;
}
