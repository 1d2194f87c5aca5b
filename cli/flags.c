/* Command-line flags (see flags.h). */
#include "flags.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int fl_set(fl_flag *f, const char *v, const char *cmd) {
    char *end = NULL;
    errno = 0;
    switch (f->type) {
    case FL_INT: {
        long x = strtol(v, &end, 10);
        if (!*v || *end || errno || x < -2147483647L || x > 2147483647L) goto bad;
        *(int *)f->dst = (int)x;
        return 0;
    }
    case FL_LONG: {
        long x = strtol(v, &end, 10);
        if (!*v || *end || errno) goto bad;
        *(long *)f->dst = x;
        return 0;
    }
    case FL_U64: {
        if (*v == '-') goto bad;
        unsigned long long x = strtoull(v, &end, 10);
        if (!*v || *end || errno) goto bad;
        *(uint64_t *)f->dst = (uint64_t)x;
        return 0;
    }
    case FL_DOUBLE: {
        /* decimal only: strtod would also read hex ("0x10" = 16), "inf" and "nan" */
        if (v[strspn(v, "0123456789.eE+-")]) goto bad;
        double x = strtod(v, &end);
        if (!*v || *end || errno || !isfinite(x)) goto bad;
        *(double *)f->dst = x;
        return 0;
    }
    case FL_STRING:
        *(const char **)f->dst = v;
        return 0;
    case FL_BOOL:
        if (!strcmp(v, "1") || !strcmp(v, "true") || !strcmp(v, "yes") || !strcmp(v, "on")) *(int *)f->dst = 1;
        else if (!strcmp(v, "0") || !strcmp(v, "false") || !strcmp(v, "no") || !strcmp(v, "off")) *(int *)f->dst = 0;
        else goto bad;
        return 0;
    }
bad:
    fprintf(stderr, "specmoe %s: --%s: '%s' is not a valid %s\n", cmd, f->name, v,
            f->type == FL_DOUBLE ? "decimal number" : f->type == FL_BOOL ? "boolean (0/1)" :
            f->type == FL_U64 ? "non-negative integer" : "integer");
    return 2;
}

static const char *type_name(fl_type t) {
    switch (t) {
    case FL_INT: case FL_LONG: return "INT";
    case FL_U64: return "U64";
    case FL_DOUBLE: return "NUM";
    case FL_STRING: return "STR";
    case FL_BOOL: return "[0|1]";
    }
    return "?";
}

void fl_print_help(const fl_flag *fl, int n, const char *cmd, const char *usage) {
    printf("usage: specmoe %s %s\n\nflags (default in brackets):\n", cmd, usage);
    for (int i = 0; i < n; i++) {
        char left[64];
        snprintf(left, sizeof left, "--%s %s", fl[i].name, type_name(fl[i].type));
        printf("  %-28s %s [%s]\n", left, fl[i].help, fl[i].def ? fl[i].def : "unset");
    }
    printf("  %-28s %s\n", "--help", "print this help");
}

const fl_flag *fl_find(const fl_flag *fl, int n, const char *name) {
    for (int i = 0; i < n; i++)
        if (!strcmp(fl[i].name, name)) return &fl[i];
    return NULL;
}

int fl_parse(fl_flag *fl, int n, int argc, char **argv, int first, const char *cmd, const char *usage,
             const char **pos, int max_pos, int *n_pos) {
    for (int i = 0; i < n; i++) {
        fl[i].set = 0;
        if (fl[i].def) {
            if (fl_set(&fl[i], fl[i].def, cmd)) return 2; /* a bad built-in default is a bug */
        } else if (fl[i].type == FL_STRING) {
            *(const char **)fl[i].dst = NULL;
        }
    }
    *n_pos = 0;
    for (int a = first; a < argc; a++) {
        const char *arg = argv[a];
        if (!strcmp(arg, "--help") || !strcmp(arg, "-h")) {
            fl_print_help(fl, n, cmd, usage);
            return 1;
        }
        if (strncmp(arg, "--", 2) != 0) {
            if (*n_pos >= max_pos) {
                fprintf(stderr, "specmoe %s: unexpected argument '%s' (see specmoe %s --help)\n", cmd, arg, cmd);
                return 2;
            }
            pos[(*n_pos)++] = arg;
            continue;
        }
        char name[64];
        const char *eq = strchr(arg + 2, '=');
        size_t len = eq ? (size_t)(eq - arg - 2) : strlen(arg + 2);
        if (len >= sizeof name) len = sizeof name - 1;
        memcpy(name, arg + 2, len);
        name[len] = 0;
        fl_flag *f = (fl_flag *)fl_find(fl, n, name);
        if (!f) {
            fprintf(stderr, "specmoe %s: unknown flag '--%s' (see specmoe %s --help)\n", cmd, name, cmd);
            return 2;
        }
        const char *v = eq ? eq + 1 : NULL;
        /* a boolean is a plain switch (--noisy) unless a boolean word follows (--noisy 0, --noisy=off) */
        if (!v && f->type == FL_BOOL) {
            static const char *const words[] = {"0", "1", "true", "false", "yes", "no", "on", "off"};
            int word = 0;
            for (size_t w = 0; a + 1 < argc && w < sizeof words / sizeof words[0]; w++) word |= !strcmp(argv[a + 1], words[w]);
            if (!word) v = "1";
        }
        if (!v) {
            if (a + 1 >= argc) {
                fprintf(stderr, "specmoe %s: --%s needs a value\n", cmd, name);
                return 2;
            }
            v = argv[++a];
        }
        if (fl_set(f, v, cmd)) return 2;
        f->set = 1;
    }
    return 0;
}

/* the shortest of %.15g and %.17g that reads back to x: "0.1", not "0.10000000000000001" */
static void format_double(double x, char *buf, size_t n) {
    snprintf(buf, n, "%.15g", x);
    if (strtod(buf, NULL) != x) snprintf(buf, n, "%.17g", x);
}

const char *fl_format(const fl_flag *f, char *buf, size_t n) {
    switch (f->type) {
    case FL_INT: snprintf(buf, n, "%d", *(const int *)f->dst); break;
    case FL_LONG: snprintf(buf, n, "%ld", *(const long *)f->dst); break;
    case FL_U64: snprintf(buf, n, "%" PRIu64, *(const uint64_t *)f->dst); break;
    case FL_DOUBLE: format_double(*(const double *)f->dst, buf, n); break;
    case FL_STRING: snprintf(buf, n, "%s", *(const char *const *)f->dst ? *(const char *const *)f->dst : ""); break;
    case FL_BOOL: snprintf(buf, n, "%d", *(const int *)f->dst); break;
    }
    return buf;
}

cJSON *fl_to_json(const fl_flag *fl, int n) {
    cJSON *o = cJSON_CreateObject();
    for (int i = 0; o && i < n; i++) {
        const fl_flag *f = &fl[i];
        const void *d = f->dst;
        switch (f->type) {
        case FL_INT: cJSON_AddNumberToObject(o, f->name, *(const int *)d); break;
        case FL_LONG: cJSON_AddNumberToObject(o, f->name, (double)*(const long *)d); break;
        case FL_U64: {
            uint64_t u = *(const uint64_t *)d;
            char b[32];
            if (u <= (1ull << 53)) cJSON_AddNumberToObject(o, f->name, (double)u);
            else cJSON_AddStringToObject(o, f->name, fl_format(f, b, sizeof b));
            break;
        }
        case FL_DOUBLE: cJSON_AddNumberToObject(o, f->name, *(const double *)d); break;
        case FL_STRING:
            if (*(const char *const *)d) cJSON_AddStringToObject(o, f->name, *(const char *const *)d);
            else cJSON_AddNullToObject(o, f->name);
            break;
        case FL_BOOL: cJSON_AddBoolToObject(o, f->name, *(const int *)d); break;
        }
    }
    return o;
}

const char *fl_json_text(const fl_flag *f, const cJSON *v, char *buf, size_t n) {
    if (cJSON_IsString(v) && (f->type == FL_STRING || f->type == FL_U64)) return v->valuestring;
    if (cJSON_IsBool(v) && f->type == FL_BOOL) return cJSON_IsTrue(v) ? "1" : "0";
    if (cJSON_IsNumber(v) && f->type == FL_DOUBLE) {
        format_double(v->valuedouble, buf, n);
        return buf;
    }
    if (cJSON_IsNumber(v) && f->type != FL_STRING && f->type != FL_BOOL) {
        snprintf(buf, n, "%.0f", v->valuedouble);
        return buf;
    }
    return NULL;
}
