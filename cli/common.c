/* Helpers shared by the specmoe commands and benchmarks (see common.h). */
#include "common.h"
#include "flags.h"

#include <ctype.h>
#include <omp.h>
#include <stdarg.h>
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

int cli_fail(sm_status st, const sm_error *err) {
    fprintf(stderr, "specmoe: %s\n", err->msg);
    /* a caller that only got NULL back passes SM_ERR_ARG; the error itself knows better (out of
     * memory is a runtime failure, exit 1, not a usage error) */
    if (st == SM_ERR_ARG && err->code != SM_OK) st = err->code;
    return st == SM_ERR_ARG ? CLI_EXIT_USAGE : CLI_EXIT_RUNTIME;
}

int cli_write_text(const char *path, const char *text) {
    if (!text) return -1;
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    int bad = fputs(text, f) < 0;
    return (fclose(f) != 0 || bad) ? -1 : 0;
}

int cli_gnuplot(const char *who, const char *script_path, const char *text, const char *out) {
    if (cli_write_text(script_path, text)) {
        fprintf(stderr, "specmoe %s: cannot write %s\n", who, script_path);
        return CLI_EXIT_RUNTIME;
    }
    char cmd[8600];
    snprintf(cmd, sizeof cmd, "gnuplot '%s'", script_path);
    if (system(cmd) != 0) {
        fprintf(stderr, "specmoe %s: gnuplot failed on %s (is %s writable?)\n", who, script_path, out);
        return CLI_EXIT_RUNTIME;
    }
    return 0;
}

void cli_bprintf(cli_buf *b, const char *fmt, ...) {
    if (b->failed) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int w = vsnprintf(b->s ? b->s + b->n : NULL, b->s ? b->cap - b->n : 0, fmt, ap);
        va_end(ap);
        if (w < 0) {
            b->failed = 1;
            return;
        }
        if (b->s && b->n + (size_t)w < b->cap) {
            b->n += (size_t)w;
            return;
        }
        size_t cap = b->cap ? 2 * b->cap : 65536;
        while (cap < b->n + (size_t)w + 1) cap *= 2;
        char *s = realloc(b->s, cap);
        if (!s) {
            b->failed = 1;
            return;
        }
        b->s = s;
        b->cap = cap;
    }
}

void cli_bench_train_config(sm_train_config *tc, int epochs, int batch, double lr, double wd, uint64_t seed) {
    sm_train_config_default(tc);
    tc->epochs = epochs;
    tc->batch = batch;
    tc->opt.kind = SM_OPT_ADAMW;
    tc->opt.lr = lr;
    tc->opt.weight_decay = wd;
    tc->seed = seed;
    tc->log_every = 1 << 30; /* silent: the benchmark prints its own summary */
}

void cli_set_threads(int n) {
    if (n > 0) omp_set_num_threads(n);
}

/* ---------------------------------------------------------------------------------------------- */
/* command tables */

static void print_table(const cli_table *t) {
    char word[32];
    size_t k = 0;
    for (; t->kind[k] && k + 1 < sizeof word; k++) word[k] = (char)toupper((unsigned char)t->kind[k]);
    word[k] = 0;
    int w = 0;
    for (int i = 0; i < t->n; i++) w = (int)strlen(t->rows[i].name) > w ? (int)strlen(t->rows[i].name) : w;
    printf("usage: %s %s [flags]    (%s %s --help: the %s's flags)\n\n%ss:\n", t->prog, word, t->prog, word, t->kind,
           t->kind);
    for (int i = 0; i < t->n; i++) printf("  %-*s  %s\n", w, t->rows[i].name, t->rows[i].summary);
    if (t->footer) printf("\n%s\n", t->footer);
}

int cli_dispatch(const cli_table *t, int argc, char **argv, int at) {
    const char *word = at < argc ? argv[at] : NULL;
    if (!word || !strcmp(word, "--help") || !strcmp(word, "-h") || !strcmp(word, "help")) {
        print_table(t);
        return word ? 0 : CLI_EXIT_USAGE;
    }
    for (int i = 0; i < t->n; i++)
        if (!strcmp(word, t->rows[i].name)) return t->rows[i].run(argc, argv);
    fprintf(stderr, "%s: unknown %s '%s' (one of:", t->prog, t->kind, word);
    for (int i = 0; i < t->n; i++) fprintf(stderr, "%s %s", i ? "," : "", t->rows[i].name);
    fprintf(stderr, "; see %s --help)\n", t->prog);
    return CLI_EXIT_USAGE;
}


/* ---------------------------------------------------------------------------------------------- */
/* run directories, shared by plot and report */

cJSON *cli_run_settings(const char *dir) {
    char path[4200];
    snprintf(path, sizeof path, "%s/settings.json", dir);
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    cli_buf b = {0};
    char chunk[4096];
    for (size_t n; (n = fread(chunk, 1, sizeof chunk, f)) > 0;) cli_bprintf(&b, "%.*s", (int)n, chunk);
    fclose(f);
    cJSON *o = b.s && !b.failed ? cJSON_Parse(b.s) : NULL;
    free(b.s);
    return o;
}

char *cli_run_group_key(const char *dir, int drop_env) {
    cJSON *o = cli_run_settings(dir);
    if (!o) return NULL;
    static const char *const drop[] = {"seed", "threads", "out", "resume", "stop-after", "stop_after", "progress-every"};
    for (size_t i = 0; i < sizeof drop / sizeof drop[0]; i++) cJSON_DeleteItemFromObjectCaseSensitive(o, drop[i]);
    /* an agent's bookkeeping options do not change what it learns either */
    cJSON *as = cJSON_GetObjectItemCaseSensitive(o, "agent_settings");
    static const char *const drop_agent[] = {"save_replay", "ckpt_every", "log_every", "checkpoint_every", "dormant_tau"};
    for (size_t i = 0; as && i < sizeof drop_agent / sizeof drop_agent[0]; i++)
        cJSON_DeleteItemFromObjectCaseSensitive(as, drop_agent[i]);
    if (drop_env) { /* the environment, and the network's sizes that follow from it */
        cJSON_DeleteItemFromObjectCaseSensitive(o, "env");
        cJSON *net = cJSON_GetObjectItemCaseSensitive(o, "network");
        static const char *const drop_net[] = {"in_dim", "in_c", "in_h", "in_w", "n_classes"};
        for (size_t i = 0; net && i < sizeof drop_net / sizeof drop_net[0]; i++)
            cJSON_DeleteItemFromObjectCaseSensitive(net, drop_net[i]);
    }
    char *key = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return key;
}

/* The directory's last path component without a trailing seed ("-s3", "-3"): the group's label. */
void cli_run_label(const char *dir, char *buf, size_t n) {
    const char *base = strrchr(dir, '/');
    while (base && base[1] == 0 && base > dir) { /* trailing slash */
        const char *p = base - 1;
        while (p > dir && *p != '/') p--;
        base = *p == '/' ? p : NULL;
    }
    snprintf(buf, n, "%s", base ? base + 1 : dir);
    size_t len = strlen(buf);
    while (len && buf[len - 1] == '/') buf[--len] = 0;
    size_t k = len;
    while (k && buf[k - 1] >= '0' && buf[k - 1] <= '9') k--;
    if (k < len && k >= 1 && buf[k - 1] == 's' && k >= 2 && buf[k - 2] == '-') buf[k - 2] = 0;
    else if (k < len && k >= 1 && buf[k - 1] == '-') buf[k - 1] = 0;
    for (char *p = buf; *p; p++)
        if (*p == '"' || *p == '\\') *p = '_';
}


/* ---------------------------------------------------------------------------------------------- */
/* data and routing, shared by train and eval */

sm_status cli_load_split(sm_dataset *ds, const cli_data_opts *o, const char *split, int train_subset, sm_error *err) {
    sm_status st = sm_dataset_load_fashion(ds, o->data, split, err);
    if (st != SM_OK) return st;
    int classes[64];
    int n = sm_parse_class_list(o->classes, classes, 64, ds->n_classes, err);
    if (n < 0) {
        sm_dataset_free(ds);
        return SM_ERR_ARG;
    }
    if (n < ds->n_classes || (train_subset && o->per_class > 0)) {
        st = sm_dataset_select(ds, classes, n, train_subset ? o->per_class : 0, 0, err);
        if (st != SM_OK) sm_dataset_free(ds);
    }
    return st;
}

int cli_config_has_moe(const sm_model_config *mc) {
    for (int i = 0; i < mc->n_layers; i++)
        if (mc->layers[i].kind == SM_LAYER_MOE) return 1;
    return 0;
}

const char *cli_router_help(char *buf, size_t n, const char *before, const char *after) {
    snprintf(buf, n, "%s%s%s", before, sm_router_names(), after);
    return buf;
}

void cli_print_routing(const char *title, const sm_eval_result *ev) {
    for (int l = 0; l < ev->n_moe; l++) {
        sm_routing_summary s;
        sm_routing_summarize(&ev->routing[l], &s);
        printf("%s moe layer %d: routing entropy %.3f nats (%.2f effective experts), load CV %.3f, MaxVio %.3f, "
               "active experts %.0f%%, dropped %ld (%.2f%%)\n",
               title, l, s.entropy, s.eff_experts, s.cv, s.max_vio, 100 * s.active_ratio, ev->routing[l].dropped,
               100 * s.drop_frac);
        /* the collapse verdict: which expert, its share of the tokens, the threshold, and why it matters */
        double thr = 100 * sm_collapse_threshold(s.E), min = 100 * s.min_share;
        if (s.n_collapsed > 1)
            printf("%s moe layer %d: COLLAPSED: %d experts get < %.2g%% of tokens (least: expert %d, %.2g%%): they are "
                   "barely trained and waste capacity\n", title, l, s.n_collapsed, thr, s.min_expert, min);
        else if (s.collapsed)
            printf("%s moe layer %d: COLLAPSED: expert %d gets %.2g%% of tokens (< %.2g%%): it is barely trained and "
                   "wastes capacity\n", title, l, s.min_expert, min, thr);
        else
            printf("%s moe layer %d: routing healthy: every expert gets >= %.2g%% of tokens (min %.3g%%, expert %d)\n",
                   title, l, thr, min, s.min_expert);
        printf("%s moe layer %d: load per expert:", title, l);
        for (int e = 0; e < s.E; e++) printf(" %.3f", s.load_frac[e]);
        printf("\n");
    }
}

/* ---------------------------------------------------------------------------------------------- */
/* child processes of the studies */

int cli_parse_study(fl_flag *fl, int n, int argc, char **argv, const char *name, const char *const *tier, int *full) {
    char cmd[64];
    snprintf(cmd, sizeof cmd, "bench %s", name);
    const char *pos[1];
    int npos;
    int rc = fl_parse(fl, n, argc, argv, 3, cmd, "[flags]", pos, 0, &npos);
    if (rc) return rc;
    *full = !strcmp(*tier, "full");
    if (!*full && strcmp(*tier, "quick")) {
        fprintf(stderr, "specmoe %s: --tier must be quick or full (got '%s')\n", cmd, *tier);
        return 2;
    }
    return 0;
}

int cli_in_list(const char *list, const char *item) {
    size_t n = strlen(item);
    for (const char *p = list; *p;) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if (len == n && !strncmp(p, item, n)) return 1;
        if (!e) break;
        p = e + 1;
    }
    return 0;
}

const char *cli_list_unknown(const char *list, const char *known, char *buf, size_t n) {
    for (const char *p = list; *p;) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        snprintf(buf, n, "%.*s", (int)len, p);
        if (!cli_in_list(known, buf)) return buf;
        if (!e) break;
        p = e + 1;
    }
    return NULL;
}

int cli_file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

int cli_mkdirs(const char *path) {
    char b[1024];
    snprintf(b, sizeof b, "%s", path);
    for (char *p = b + 1; *p; p++)
        if (*p == '/') {
            *p = 0;
            if (mkdir(b, 0755) && errno != EEXIST) return -1;
            *p = '/';
        }
    return mkdir(b, 0755) && errno != EEXIST ? -1 : 0;
}

int cli_argv_push(cli_argv *a, const char *arg) {
    size_t n = strlen(arg) + 1;
    if (a->argc >= CLI_ARGV_MAX || a->used + n > sizeof a->buf) return -1;
    memcpy(a->buf + a->used, arg, n);
    a->argv[a->argc++] = a->buf + a->used;
    a->used += n;
    a->argv[a->argc] = NULL;
    return 0;
}

int cli_argv_words(cli_argv *a, const char *words) {
    char w[1024];
    snprintf(w, sizeof w, "%s", words);
    int bad = 0;
    for (char *save = NULL, *t = strtok_r(w, " ", &save); t; t = strtok_r(NULL, " ", &save)) bad |= cli_argv_push(a, t);
    return bad;
}

int cli_run_fingerprint(const cli_argv *a, const char *out, char *buf, size_t n) {
    const size_t lo = out ? strlen(out) : 0;
    size_t used = 0;
    if (n) buf[0] = 0;
    for (int i = 1; i < a->argc; i++) {
        const char *s = a->argv[i];
        if (!strcmp(s, "--out")) {
            i++;
            continue;
        }
        /* the out directory only in a path argument's value (--init-from), so that a short --out such as
         * "1" or "mujoco" cannot rewrite a number or an environment name */
        const int at_out = lo && i > 1 && !strcmp(a->argv[i - 1], "--init-from") && !strncmp(s, out, lo) && s[lo] == '/';
        const int w = snprintf(buf + used, n - used, "%s%s%s", used ? " " : "", at_out ? "OUT" : "", at_out ? s + lo : s);
        if (w < 0 || (size_t)w >= n - used) return -1;
        used += (size_t)w;
    }
    return 0;
}

int cli_run_plan_check(const char *dir, const char *fp, char *other, size_t n) {
    char path[1100];
    snprintf(path, sizeof path, "%s/command", dir);
    FILE *f = fopen(path, "r");
    if (!f) return 1;
    size_t k = n ? fread(other, 1, n - 1, f) : 0;
    fclose(f);
    if (n) other[k] = 0;
    char *nl = n ? strchr(other, '\n') : NULL;
    if (nl) *nl = 0;
    return n && !strcmp(other, fp) ? 0 : -1;
}

void cli_run_plan_verify(const char *study, const char *dir, const char *fp, int *stale, int *unrecorded) {
    char had[CLI_ARGV_BUF];
    const int c = cli_run_plan_check(dir, fp, had, sizeof had);
    *unrecorded += c == 1;
    if (c < 0 && (*stale)++ < 5)
        fprintf(stderr, "specmoe bench %s: %s ran another command than this plan's:\n  ran:     %s\n  planned: %s\n", study, dir,
                had, fp);
}

int cli_run_plan_write(const char *dir, const char *fp) {
    char path[1100];
    snprintf(path, sizeof path, "%s/command", dir);
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    int bad = fprintf(f, "%s\n", fp) < 0;
    return (fclose(f) != 0 || bad) ? -1 : 0;
}

int cli_run_lock(const char *dir) {
    char path[1100];
    snprintf(path, sizeof path, "%s/lock", dir);
    const int fd0 = open(path, O_RDWR | O_CREAT, 0644); /* not O_CLOEXEC: the spawned training inherits it */
    if (fd0 < 0) return -1;
    int fd = fd0;
    if (fd0 < 3) { /* a caller started with 0, 1 or 2 closed: keep it off the standard streams */
        fd = fcntl(fd0, F_DUPFD, 3);
        close(fd0);
        if (fd < 0) return -1;
    }
    if (flock(fd, LOCK_EX | LOCK_NB) == 0) return fd;
    const int busy = errno == EWOULDBLOCK;
    close(fd);
    return busy ? -2 : -1;
}

int cli_spawn(const cli_argv *a, const char *log) {
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
            close(fd);
        }
        execv(a->argv[0], a->argv);
        _exit(127);
    }
    return (int)pid;
}

int cli_self_exe(char *buf, size_t n) {
    ssize_t sl = readlink("/proc/self/exe", buf, n - 1);
    if (sl <= 0) return -1;
    buf[sl] = 0;
    return 0;
}
