/* Safetensors reader and writer (https://github.com/huggingface/safetensors, "Format").
 *
 *   offset 0      u64 N, little-endian
 *   offset 8      N bytes of UTF-8 JSON: {"__metadata__": {str: str}, name: {dtype, shape, data_offsets}}
 *   offset 8 + N  data section; data_offsets [begin, end) are relative to its first byte
 *
 * The reader treats the file as hostile: every length, offset and count is checked before it is used,
 * and a malformation is refused with a message naming the source, the tensor and the file offset. The
 * rules follow the reference implementation (safetensors/src/tensor.rs, Metadata::validate): the
 * tensors, sorted by offset, must tile the data section exactly - no overlap, no gap, no trailing byte.
 *
 * The writer emits F32 only, "__metadata__" first, tensors in the order they were added, and pads the
 * header with spaces so the data section starts 8-byte aligned (as the HF library does).
 */
#define _POSIX_C_SOURCE 200809L
#include "specmoe/io/safetensors.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* The reference implementation refuses headers above 100 MB; we use 100 MiB. */
#define ST_MAX_HEADER ((uint64_t)100 << 20)
/* sm_safetensors_load reads the whole file into memory; anything larger is refused up front. */
#define ST_MAX_FILE ((uint64_t)64 << 30)
/* JSON numbers are doubles in cJSON: integers above 2^53 cannot be represented exactly. */
#define ST_MAX_JSON_INT 9007199254740992.0

/* ---------------------------------------------------------------------------------------------- */
/* dtypes */

/* Indexed by sm_dtype; names and sizes as in the safetensors spec. */
static const struct {
    const char *name;
    size_t size;
} dtype_table[] = {
    [SM_DT_F32] = {"F32", 4}, [SM_DT_F16] = {"F16", 2},  [SM_DT_BF16] = {"BF16", 2},
    [SM_DT_F64] = {"F64", 8}, [SM_DT_I64] = {"I64", 8},  [SM_DT_I32] = {"I32", 4},
    [SM_DT_U8] = {"U8", 1},   [SM_DT_BOOL] = {"BOOL", 1}, [SM_DT_I8] = {"I8", 1},
    [SM_DT_I16] = {"I16", 2}, [SM_DT_U16] = {"U16", 2},  [SM_DT_U32] = {"U32", 4},
    [SM_DT_U64] = {"U64", 8},
};
#define N_DTYPES ((int)(sizeof dtype_table / sizeof dtype_table[0]))

const char *sm_dtype_name(sm_dtype t) {
    if ((int)t < 0 || (int)t >= N_DTYPES) return "?";
    return dtype_table[t].name;
}

size_t sm_dtype_size(sm_dtype t) {
    if ((int)t < 0 || (int)t >= N_DTYPES) return 0;
    return dtype_table[t].size;
}

/* Returns 0 and sets *out for a known dtype string, -1 otherwise. */
static int dtype_lookup(const char *s, sm_dtype *out) {
    for (int i = 0; i < N_DTYPES; i++) {
        if (strcmp(s, dtype_table[i].name) == 0) {
            *out = (sm_dtype)i;
            return 0;
        }
    }
    return -1;
}

/* IEEE binary16 -> binary32, exact for every input (binary32 holds all binary16 values). */
static float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h >> 15) << 31;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;
    uint32_t bits;
    if (exp == 0) {
        /* zero or subnormal: value = mant * 2^-24, exactly representable as a float */
        float v = ldexpf((float)mant, -24);
        return (h >> 15) ? -v : v;
    } else if (exp == 31) {
        /* inf (mant == 0) or NaN; the payload moves up so the quiet bit stays the quiet bit */
        bits = sign | 0x7f800000u | (mant << 13);
    } else {
        /* normal: rebias the exponent from 15 to 127 */
        bits = sign | ((exp + 112u) << 23) | (mant << 13);
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* bfloat16 is the top half of a binary32. */
static float bf16_to_f32(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* Byte-wise little-endian loads: independent of host byte order and alignment. */
static uint16_t rd_u16le(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static uint32_t rd_u32le(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}
static uint64_t rd_u64le(const uint8_t *p) {
    return (uint64_t)rd_u32le(p) | ((uint64_t)rd_u32le(p + 4) << 32);
}

/* n little-endian F32/F16/BF16 values at p -> floats (other dtypes are refused by the callers) */
static void convert_f32(sm_dtype dt, const uint8_t *p, float *out, size_t n) {
    switch (dt) {
    case SM_DT_F32:
        for (size_t i = 0; i < n; i++) {
            uint32_t b = rd_u32le(p + 4 * i);
            memcpy(&out[i], &b, sizeof b);
        }
        break;
    case SM_DT_F16:
        for (size_t i = 0; i < n; i++) out[i] = f16_to_f32(rd_u16le(p + 2 * i));
        break;
    case SM_DT_BF16:
        for (size_t i = 0; i < n; i++) out[i] = bf16_to_f32(rd_u16le(p + 2 * i));
        break;
    default:
        break;
    }
}

sm_status sm_st_tensor_to_f32(const sm_st_tensor *t, float *out, size_t n, sm_error *err) {
    if (!t) return sm_fail(err, SM_ERR_ARG, "sm_st_tensor_to_f32: no tensor");
    const char *name = t->name ? t->name : "?";
    if (n != t->numel)
        return sm_fail(err, SM_ERR_ARG, "tensor '%s': asked for %zu values, tensor has %zu", name, n,
                       t->numel);
    if (t->dtype != SM_DT_F32 && t->dtype != SM_DT_F16 && t->dtype != SM_DT_BF16)
        return sm_fail(err, SM_ERR_ARG, "tensor '%s': dtype %s cannot be converted to float (only F32, F16, BF16)",
                       name, sm_dtype_name(t->dtype));
    /* the struct may have been filled by hand: re-check that the byte range matches the count */
    size_t es = sm_dtype_size(t->dtype);
    if (t->end < t->begin || t->end - t->begin != n * es || (n && (!t->data || !out)))
        return sm_fail(err, SM_ERR_ARG, "tensor '%s': byte range [%zu, %zu) does not hold %zu %s values",
                       name, t->begin, t->end, n, sm_dtype_name(t->dtype));
    convert_f32(t->dtype, t->data, out, n);
    return SM_OK;
}

/* ---------------------------------------------------------------------------------------------- */
/* reader */

static char *dup_str(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

/* A tensor name fit for an error message: at most 64 characters, control bytes shown as '?', so a
 * hostile name can neither flood the message nor garble a terminal. */
static const char *shown(char out[80], const char *s) {
    size_t i = 0;
    if (!s) s = "?";
    for (; s[i] && i < 64; i++) out[i] = ((unsigned char)s[i] < 0x20 || s[i] == 0x7f) ? '?' : s[i];
    if (s[i]) {
        memcpy(out + i, "...", 3);
        i += 3;
    }
    out[i] = '\0';
    return out;
}

/* A JSON number that is an exact non-negative integer below 2^53 (cJSON stores numbers as double). */
static int json_uint(const cJSON *j, uint64_t *out) {
    if (!cJSON_IsNumber(j)) return 0;
    double d = j->valuedouble;
    if (!(d >= 0.0) || d > ST_MAX_JSON_INT || d != floor(d)) return 0;
    *out = (uint64_t)d;
    return 1;
}

/* Index of the first byte of s[0..n) that breaks strict UTF-8 (overlong forms, surrogates, code
 * points above U+10FFFF, NUL), or n if there is none. The spec requires a UTF-8 header and cJSON does
 * not check encodings; a NUL would silently truncate a name. */
static size_t utf8_bad(const unsigned char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i];
        size_t len;
        unsigned lo = 0x80, hi = 0xbf; /* allowed range of the first continuation byte */
        if (c == 0) return i;
        if (c < 0x80) {
            i++;
            continue;
        } else if (c >= 0xc2 && c <= 0xdf) {
            len = 2;
        } else if (c >= 0xe0 && c <= 0xef) {
            len = 3;
            if (c == 0xe0) lo = 0xa0;      /* overlong */
            else if (c == 0xed) hi = 0x9f; /* UTF-16 surrogates */
        } else if (c >= 0xf0 && c <= 0xf4) {
            len = 4;
            if (c == 0xf0) lo = 0x90;      /* overlong */
            else if (c == 0xf4) hi = 0x8f; /* above U+10FFFF */
        } else {
            return i;
        }
        if (n - i < len) return i;
        if (s[i + 1] < lo || s[i + 1] > hi) return i;
        for (size_t k = 2; k < len; k++)
            if (s[i + k] < 0x80 || s[i + k] > 0xbf) return i;
        i += len;
    }
    return n;
}

static int cmp_offset(const void *a, const void *b) {
    const sm_st_tensor *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return strcmp(x->name, y->name); /* names are unique, so the order is total and deterministic */
}

static int cmp_name_ptr(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Validates one tensor entry j named `name` into t (name not yet set). data_len is the size of the
 * data section, data_at its file offset. */
static sm_status parse_tensor(sm_st_tensor *t, const cJSON *j, const char *name, size_t data_len,
                              size_t data_at, const char *what, sm_error *err) {
    char nb[80];
    shown(nb, name);
    if (!cJSON_IsObject(j))
        return sm_fail(err, SM_ERR_FORMAT, "%s: tensor '%s': entry is not a JSON object", what, nb);

    const cJSON *jd = cJSON_GetObjectItemCaseSensitive(j, "dtype");
    if (!jd) return sm_fail(err, SM_ERR_FORMAT, "%s: tensor '%s': missing \"dtype\"", what, nb);
    if (!cJSON_IsString(jd) || !jd->valuestring)
        return sm_fail(err, SM_ERR_FORMAT, "%s: tensor '%s': \"dtype\" is not a string", what, nb);
    if (dtype_lookup(jd->valuestring, &t->dtype) != 0) {
        char db[80];
        return sm_fail(err, SM_ERR_FORMAT, "%s: tensor '%s': unknown or unsupported dtype '%s'", what, nb,
                       shown(db, jd->valuestring));
    }
    size_t es = sm_dtype_size(t->dtype);

    const cJSON *js = cJSON_GetObjectItemCaseSensitive(j, "shape");
    if (!js) return sm_fail(err, SM_ERR_FORMAT, "%s: tensor '%s': missing \"shape\"", what, nb);
    if (!cJSON_IsArray(js))
        return sm_fail(err, SM_ERR_FORMAT, "%s: tensor '%s': \"shape\" is not an array", what, nb);
    int nd = cJSON_GetArraySize(js);
    if (nd > SM_ST_MAX_DIMS)
        return sm_fail(err, SM_ERR_FORMAT, "%s: tensor '%s': rank %d exceeds the supported %d", what, nb, nd,
                       SM_ST_MAX_DIMS);
    t->ndim = nd;
    int any_zero = 0;
    int d = 0;
    for (const cJSON *e = js->child; e; e = e->next, d++) {
        uint64_t v;
        if (!json_uint(e, &v))
            return sm_fail(err, SM_ERR_FORMAT, "%s: tensor '%s': shape[%d] is not a non-negative integer",
                           what, nb, d);
        t->shape[d] = (int64_t)v;
        if (v == 0) any_zero = 1;
    }
    /* numel = prod(shape); a zero anywhere makes it 0 even if the other factors would overflow */
    size_t numel = 1;
    if (any_zero) {
        numel = 0;
    } else {
        for (int i = 0; i < nd; i++) {
            uint64_t v = (uint64_t)t->shape[i];
            if (v > SIZE_MAX || numel > SIZE_MAX / (size_t)v || numel * (size_t)v > SIZE_MAX / es)
                return sm_fail(err, SM_ERR_FORMAT, "%s: tensor '%s': shape overflows the addressable size",
                               what, nb);
            numel *= (size_t)v;
        }
    }
    t->numel = numel;
    size_t nbytes = numel * es; /* cannot overflow: checked above */

    const cJSON *jo = cJSON_GetObjectItemCaseSensitive(j, "data_offsets");
    if (!jo) return sm_fail(err, SM_ERR_FORMAT, "%s: tensor '%s': missing \"data_offsets\"", what, nb);
    uint64_t b, e;
    if (!cJSON_IsArray(jo) || cJSON_GetArraySize(jo) != 2 || !json_uint(jo->child, &b) ||
        !json_uint(jo->child->next, &e))
        return sm_fail(err, SM_ERR_FORMAT, "%s: tensor '%s': \"data_offsets\" is not two non-negative integers",
                       what, nb);
    if (b > e)
        return sm_fail(err, SM_ERR_FORMAT, "%s: tensor '%s': data_offsets [%llu, %llu) begin after end", what,
                       nb, (unsigned long long)b, (unsigned long long)e);
    if (e > data_len)
        return sm_fail(err, SM_ERR_FORMAT,
                       "%s: tensor '%s': data_offsets [%llu, %llu) end beyond data section of %zu bytes "
                       "(data section at file offset %zu)",
                       what, nb, (unsigned long long)b, (unsigned long long)e, data_len, data_at);
    if (e - b != nbytes)
        return sm_fail(err, SM_ERR_FORMAT,
                       "%s: tensor '%s': data_offsets [%llu, %llu) span %llu bytes but shape and dtype %s "
                       "need %zu (file offset %zu)",
                       what, nb, (unsigned long long)b, (unsigned long long)e, (unsigned long long)(e - b),
                       dtype_table[t->dtype].name, nbytes, data_at + (size_t)b);
    t->begin = (size_t)b;
    t->end = (size_t)e;
    return SM_OK;
}

void sm_safetensors_free(sm_safetensors *st) {
    if (!st) return;
    for (int i = 0; i < st->n_tensors; i++) free(st->tensors[i].name);
    free(st->tensors);
    for (int i = 0; i < st->n_meta; i++) {
        free(st->meta[i].key);
        free(st->meta[i].value);
    }
    free(st->meta);
    free(st->path);
    if (st->owns_buf) free(st->buf);
    memset(st, 0, sizeof *st);
}

/* Checks the 8-byte length prefix p of a file of `size` bytes; the header length goes to *hlen. */
static sm_status check_prefix(const uint8_t *p, size_t size, const char *what, size_t *hlen, sm_error *err) {
    if (size < 8)
        return sm_fail(err, SM_ERR_FORMAT, "%s: truncated: %zu bytes, shorter than the 8-byte header length",
                       what, size);
    uint64_t n = rd_u64le(p);
    if (n > ST_MAX_HEADER)
        return sm_fail(err, SM_ERR_FORMAT, "%s: header length %llu (file offset 0) exceeds the 100 MiB limit",
                       what, (unsigned long long)n);
    if (n > size - 8)
        return sm_fail(err, SM_ERR_FORMAT,
                       "%s: truncated: header length %llu (file offset 0) runs past the end of the %zu-byte file",
                       what, (unsigned long long)n, size);
    *hlen = (size_t)n;
    return SM_OK;
}

/* Parses the JSON header hbytes[0..hlen) of a file of `size` bytes into st (names, dtypes, shapes,
 * offsets; data pointers left NULL) and checks that the tensors tile the data section. */
static sm_status parse_header(sm_safetensors *st, const uint8_t *hbytes, size_t hlen, size_t size,
                              const char *what, sm_error *err) {
    size_t data_at = 8 + hlen, data_len = size - data_at;
    /* cJSON gets its own NUL-terminated copy: the caller's buffer need not be terminated, and a
     * terminator bounds any read that runs past the stated length. */
    char *hdr = malloc(hlen + 1);
    if (!hdr) return sm_fail(err, SM_ERR_NOMEM, "%s: out of memory for a %zu-byte header", what, hlen);
    memcpy(hdr, hbytes, hlen);
    hdr[hlen] = '\0';
    const char *end = NULL;
    cJSON *root = NULL;
    sm_status rc = SM_OK;
    const char **names = NULL;
    size_t bad = utf8_bad((const unsigned char *)hdr, hlen);
    if (bad < hlen) {
        rc = sm_fail(err, SM_ERR_FORMAT, "%s: header is not valid UTF-8 (byte 0x%02x at file offset %zu)", what,
                     (unsigned char)hdr[bad], 8 + bad);
        goto done;
    }
    root = cJSON_ParseWithLengthOpts(hdr, hlen, &end, 0);
    if (!root) {
        size_t at = (end && end >= hdr && end <= hdr + hlen) ? (size_t)(end - hdr) : 0;
        rc = sm_fail(err, SM_ERR_FORMAT, "%s: header is not valid JSON (error near file offset %zu)", what,
                     8 + at);
        goto done;
    }
    /* only whitespace may follow the object: the HF writer pads with spaces */
    for (const char *p = end ? end : hdr + hlen; p < hdr + hlen; p++) {
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r') {
            rc = sm_fail(err, SM_ERR_FORMAT, "%s: header has trailing bytes after the JSON value (file offset %zu)",
                         what, 8 + (size_t)(p - hdr));
            goto done;
        }
    }
    if (!cJSON_IsObject(root)) {
        rc = sm_fail(err, SM_ERR_FORMAT, "%s: header is not a JSON object (file offset 8)", what);
        goto done;
    }

    /* count entries so each array is allocated once */
    size_t n_ent = 0;
    const cJSON *jmeta = NULL;
    for (const cJSON *e = root->child; e; e = e->next) {
        if (e->string && strcmp(e->string, "__metadata__") == 0) {
            if (jmeta) {
                rc = sm_fail(err, SM_ERR_FORMAT, "%s: header has \"__metadata__\" twice", what);
                goto done;
            }
            jmeta = e;
        } else {
            n_ent++;
        }
    }
    if (n_ent > (size_t)INT32_MAX) {
        rc = sm_fail(err, SM_ERR_FORMAT, "%s: too many tensors (%zu)", what, n_ent);
        goto done;
    }

    if (jmeta) {
        if (!cJSON_IsObject(jmeta)) {
            rc = sm_fail(err, SM_ERR_FORMAT, "%s: \"__metadata__\" is not a JSON object", what);
            goto done;
        }
        int nm = cJSON_GetArraySize(jmeta);
        if (nm > 0) {
            st->meta = calloc((size_t)nm, sizeof *st->meta);
            if (!st->meta) {
                rc = sm_fail(err, SM_ERR_NOMEM, "%s: out of memory for %d metadata entries", what, nm);
                goto done;
            }
        }
        for (const cJSON *e = jmeta->child; e; e = e->next) {
            char kb[80];
            if (!e->string || !cJSON_IsString(e) || !e->valuestring) {
                rc = sm_fail(err, SM_ERR_FORMAT, "%s: __metadata__ value for key '%s' is not a string", what,
                             shown(kb, e->string));
                goto done;
            }
            for (int i = 0; i < st->n_meta; i++) {
                if (strcmp(st->meta[i].key, e->string) == 0) {
                    rc = sm_fail(err, SM_ERR_FORMAT, "%s: __metadata__ key '%s' appears twice", what,
                                 shown(kb, e->string));
                    goto done;
                }
            }
            sm_st_meta *m = &st->meta[st->n_meta];
            m->key = dup_str(e->string);
            m->value = dup_str(e->valuestring);
            st->n_meta++; /* counted before the check so free releases a half-made pair */
            if (!m->key || !m->value) {
                rc = sm_fail(err, SM_ERR_NOMEM, "%s: out of memory for metadata", what);
                goto done;
            }
        }
    }

    if (n_ent > 0) {
        st->tensors = calloc(n_ent, sizeof *st->tensors);
        names = malloc(n_ent * sizeof *names);
        if (!st->tensors || !names) {
            rc = sm_fail(err, SM_ERR_NOMEM, "%s: out of memory for %zu tensors", what, n_ent);
            goto done;
        }
    }
    for (const cJSON *e = root->child; e; e = e->next) {
        if (e == jmeta) continue;
        if (!e->string) { /* cannot happen for a parsed object; guards the strcmp below */
            rc = sm_fail(err, SM_ERR_FORMAT, "%s: header entry without a name", what);
            goto done;
        }
        sm_st_tensor *t = &st->tensors[st->n_tensors];
        rc = parse_tensor(t, e, e->string, data_len, data_at, what, err);
        if (rc != SM_OK) goto done;
        t->name = dup_str(e->string);
        if (!t->name) {
            rc = sm_fail(err, SM_ERR_NOMEM, "%s: out of memory for tensor names", what);
            goto done;
        }
        names[st->n_tensors] = t->name;
        st->n_tensors++;
    }

    /* JSON allows repeated keys; a repeated tensor name would make lookups ambiguous */
    /* (qsort's pointer must be non-NULL even for zero elements, hence the guards) */
    if (st->n_tensors > 1) qsort(names, (size_t)st->n_tensors, sizeof *names, cmp_name_ptr);
    for (int i = 1; i < st->n_tensors; i++) {
        if (strcmp(names[i - 1], names[i]) == 0) {
            char nb[80];
            rc = sm_fail(err, SM_ERR_FORMAT, "%s: tensor '%s' appears twice in the header", what,
                         shown(nb, names[i]));
            goto done;
        }
    }

    /* the tensors, in offset order, must tile [0, data_len) exactly */
    if (st->n_tensors > 1) qsort(st->tensors, (size_t)st->n_tensors, sizeof *st->tensors, cmp_offset);
    size_t covered = 0;
    for (int i = 0; i < st->n_tensors; i++) {
        const sm_st_tensor *t = &st->tensors[i];
        char nb[80], pb[80];
        if (t->begin < covered) {
            rc = sm_fail(err, SM_ERR_FORMAT,
                         "%s: tensor '%s' [%zu, %zu) overlaps tensor '%s' ending at %zu (file offset %zu)", what,
                         shown(nb, t->name), t->begin, t->end, shown(pb, st->tensors[i - 1].name), covered,
                         data_at + t->begin);
            goto done;
        }
        if (t->begin > covered) {
            rc = sm_fail(err, SM_ERR_FORMAT,
                         "%s: gap in data section: bytes [%zu, %zu) before tensor '%s' belong to no tensor "
                         "(file offset %zu)",
                         what, covered, t->begin, shown(nb, t->name), data_at + covered);
            goto done;
        }
        covered = t->end;
    }
    if (covered != data_len) {
        rc = sm_fail(err, SM_ERR_FORMAT,
                     "%s: data section has %zu bytes but the tensors cover only %zu (%zu trailing bytes at "
                     "file offset %zu)",
                     what, data_len, covered, data_len - covered, data_at + covered);
        goto done;
    }
    st->size = size;
    st->header_len = hlen;

done:
    free(names);
    cJSON_Delete(root);
    free(hdr);
    if (rc != SM_OK) sm_safetensors_free(st); /* owns_buf is 0 here: the caller's buffer survives */
    return rc;
}

sm_status sm_safetensors_parse(sm_safetensors *st, const uint8_t *buf, size_t size, const char *what,
                               sm_error *err) {
    if (!what) what = "<memory>";
    if (!st) return sm_fail(err, SM_ERR_ARG, "%s: no output struct", what);
    memset(st, 0, sizeof *st);
    if (!buf && size) return sm_fail(err, SM_ERR_ARG, "%s: NULL buffer of %zu bytes", what, size);
    size_t hlen;
    sm_status rc = check_prefix(buf, size, what, &hlen, err);
    if (rc == SM_OK) rc = parse_header(st, buf + 8, hlen, size, what, err);
    if (rc != SM_OK) return rc;
    for (int i = 0; i < st->n_tensors; i++) st->tensors[i].data = buf + 8 + hlen + st->tensors[i].begin;
    st->buf = (uint8_t *)buf; /* borrowed: owns_buf stays 0 */
    return SM_OK;
}

sm_status sm_safetensors_load(sm_safetensors *st, const char *path, sm_error *err) {
    if (!st || !path) return sm_fail(err, SM_ERR_ARG, "sm_safetensors_load: NULL argument");
    memset(st, 0, sizeof *st);
    size_t size;
    FILE *f = sm_open_regular(path, &size, err);
    if (!f) return SM_ERR_IO;
    if ((uint64_t)size > ST_MAX_FILE) {
        fclose(f);
        return sm_fail(err, SM_ERR_FORMAT, "%s: file of %zu bytes exceeds the 64 GiB limit", path, size);
    }
    uint8_t *buf = malloc(size ? size : 1);
    if (!buf) {
        fclose(f);
        return sm_fail(err, SM_ERR_NOMEM, "%s: out of memory for %zu bytes", path, size);
    }
    size_t got = fread(buf, 1, size, f);
    int bad = ferror(f), e = errno;
    /* a file that grows or shrinks under us would be parsed against the wrong length */
    int grew = (got == size && !bad && fgetc(f) != EOF);
    fclose(f);
    if (got != size || bad || grew) {
        free(buf);
        if (bad) return sm_fail(err, SM_ERR_IO, "%s: read failed after %zu of %zu bytes: %s", path, got, size,
                                strerror(e));
        return sm_fail(err, SM_ERR_IO, "%s: file changed size while being read (%zu bytes expected)", path,
                       size);
    }
    sm_status rc = sm_safetensors_parse(st, buf, size, path, err);
    if (rc != SM_OK) {
        free(buf);
        return rc;
    }
    st->owns_buf = 1;
    return SM_OK;
}

sm_status sm_safetensors_open(sm_safetensors *st, const char *path, sm_error *err) {
    if (!st || !path) return sm_fail(err, SM_ERR_ARG, "sm_safetensors_open: NULL argument");
    memset(st, 0, sizeof *st);
    size_t size = 0;
    FILE *f = sm_open_regular(path, &size, err);
    if (!f) return SM_ERR_IO;
    sm_status rc = SM_OK;
    uint8_t pre[8], *hdr = NULL;
    size_t hlen = 0;
    if (rc == SM_OK) {
        size_t got = fread(pre, 1, size < 8 ? size : 8, f);
        rc = got == (size < 8 ? size : 8) ? check_prefix(pre, size, path, &hlen, err)
                                         : sm_fail(err, SM_ERR_IO, "%s: read failed at offset 0", path);
    }
    if (rc == SM_OK && !(hdr = malloc(hlen ? hlen : 1)))
        rc = sm_fail(err, SM_ERR_NOMEM, "%s: out of memory for a %zu-byte header", path, hlen);
    if (rc == SM_OK && fread(hdr, 1, hlen, f) != hlen)
        rc = sm_fail(err, SM_ERR_IO, "%s: header read failed (file offset 8)", path);
    fclose(f);
    if (rc == SM_OK) rc = parse_header(st, hdr, hlen, size, path, err);
    free(hdr);
    if (rc != SM_OK) return rc;
    if (!(st->path = dup_str(path))) {
        sm_safetensors_free(st);
        return sm_fail(err, SM_ERR_NOMEM, "%s: out of memory", path);
    }
    return SM_OK;
}

sm_status sm_st_read_bytes(const sm_safetensors *st, const sm_st_tensor *t, size_t off, size_t n, void *out,
                           sm_error *err) {
    if (!st || !t || (n && !out)) return sm_fail(err, SM_ERR_ARG, "sm_st_read_bytes: NULL argument");
    char nb[80];
    if (off > t->end - t->begin || n > t->end - t->begin - off)
        return sm_fail(err, SM_ERR_ARG, "tensor '%s': bytes [%zu, %zu) outside its %zu bytes", shown(nb, t->name),
                       off, off + n, t->end - t->begin);
    if (t->data) { /* in memory */
        memcpy(out, t->data + off, n);
        return SM_OK;
    }
    if (!st->path) return sm_fail(err, SM_ERR_ARG, "tensor '%s': neither in memory nor backed by a file", nb);
    int fd = open(st->path, O_RDONLY | O_NONBLOCK); /* never wait on a FIFO swapped in */
    if (fd < 0) return sm_fail(err, SM_ERR_IO, "%s: cannot open: %s", st->path, strerror(errno));
    size_t at = 8 + st->header_len + t->begin + off, done = 0;
    while (done < n) {
        ssize_t r = pread(fd, (uint8_t *)out + done, n - done, (off_t)(at + done));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            int e = errno;
            close(fd);
            return sm_fail(err, SM_ERR_IO, "%s: tensor '%s': read at file offset %zu failed: %s", st->path,
                           shown(nb, t->name), at + done, r == 0 ? "file shorter than its header says" : strerror(e));
        }
        done += (size_t)r;
    }
    close(fd);
    return SM_OK;
}

sm_status sm_st_read_f32(const sm_safetensors *st, const sm_st_tensor *t, size_t first, size_t n, float *out,
                         sm_error *err) {
    if (!t) return sm_fail(err, SM_ERR_ARG, "sm_st_read_f32: no tensor");
    char nb[80];
    if (t->dtype != SM_DT_F32 && t->dtype != SM_DT_F16 && t->dtype != SM_DT_BF16)
        return sm_fail(err, SM_ERR_FORMAT, "tensor '%s': dtype %s cannot be converted to float (only F32, F16, BF16)",
                       shown(nb, t->name), sm_dtype_name(t->dtype));
    if (first > t->numel || n > t->numel - first)
        return sm_fail(err, SM_ERR_ARG, "tensor '%s': elements [%zu, %zu) outside its %zu", shown(nb, t->name), first,
                       first + n, t->numel);
    size_t es = sm_dtype_size(t->dtype);
    /* stage the raw bytes at the far end of out (es <= 4 = sizeof(float)): converting front to back
     * never overwrites a byte still to be read */
    uint8_t *raw = (uint8_t *)out + n * (sizeof(float) - es);
    sm_status rc = sm_st_read_bytes(st, t, first * es, n * es, raw, err);
    if (rc != SM_OK) return rc;
    if (es == sizeof(float)) {
        convert_f32(t->dtype, raw, out, n);
        return SM_OK;
    }
    for (size_t i = 0; i < n; i++) { /* out[i] (bytes 4i..4i+3) ends before element i+1's raw bytes at 2n+2i+2 */
        uint16_t h = rd_u16le(raw + 2 * i);
        out[i] = t->dtype == SM_DT_F16 ? f16_to_f32(h) : bf16_to_f32(h);
    }
    return SM_OK;
}

const sm_st_tensor *sm_safetensors_find(const sm_safetensors *st, const char *name) {
    if (!st || !name) return NULL;
    for (int i = 0; i < st->n_tensors; i++)
        if (strcmp(st->tensors[i].name, name) == 0) return &st->tensors[i];
    return NULL;
}

const char *sm_safetensors_meta(const sm_safetensors *st, const char *key) {
    if (!st || !key) return NULL;
    for (int i = 0; i < st->n_meta; i++)
        if (strcmp(st->meta[i].key, key) == 0) return st->meta[i].value;
    return NULL;
}

/* ---------------------------------------------------------------------------------------------- */
/* writer */

void sm_st_writer_init(sm_st_writer *w) { memset(w, 0, sizeof *w); }

void sm_st_writer_free(sm_st_writer *w) {
    if (!w) return;
    free(w->t);
    for (int i = 0; i < w->n_meta; i++) {
        free(w->meta[i].key);
        free(w->meta[i].value);
    }
    free(w->meta);
    memset(w, 0, sizeof *w);
}

/* numel * dtype size of a writer tensor, or 0 with *ok = 0 on overflow */
static size_t out_bytes(const sm_st_out_tensor *t, int *ok) {
    size_t es = sm_dtype_size(t->dtype);
    size_t n = 1;
    *ok = 1;
    for (int i = 0; i < t->ndim; i++) {
        uint64_t d = (uint64_t)t->shape[i];
        if (d == 0) return 0;
        if (d > SIZE_MAX || n > SIZE_MAX / (size_t)d) {
            *ok = 0;
            return 0;
        }
        n *= (size_t)d;
    }
    if (es == 0 || n > SIZE_MAX / es) {
        *ok = 0;
        return 0;
    }
    return n * es;
}

sm_status sm_st_writer_add(sm_st_writer *w, const char *name, int ndim, const int64_t *shape,
                           const float *data, sm_error *err) {
    sm_status rc = sm_st_writer_add_layout(w, name, SM_DT_F32, ndim, shape, err);
    if (rc != SM_OK) return rc;
    int ok;
    size_t nb = out_bytes(&w->t[w->n - 1], &ok);
    if (nb && !data) {
        w->n--;
        return sm_fail(err, SM_ERR_ARG, "tensor '%s': NULL data for %zu bytes", name, nb);
    }
    w->t[w->n - 1].data = data;
    return SM_OK;
}

sm_status sm_st_writer_add_u8(sm_st_writer *w, const char *name, size_t n, const void *bytes, sm_error *err) {
    int64_t shape[1] = {(int64_t)n};
    sm_status st = sm_st_writer_add_layout(w, name, SM_DT_U8, 1, shape, err);
    if (st == SM_OK) w->t[w->n - 1].bytes = bytes;
    return st;
}

sm_status sm_st_writer_add_layout(sm_st_writer *w, const char *name, sm_dtype dtype, int ndim, const int64_t *shape,
                                  sm_error *err) {
    if (!w || !name) return sm_fail(err, SM_ERR_ARG, "sm_st_writer_add: NULL writer or name");
    if (sm_dtype_size(dtype) == 0) return sm_fail(err, SM_ERR_ARG, "tensor '%s': unknown dtype %d", name, (int)dtype);
    if (!name[0] || strcmp(name, "__metadata__") == 0)
        return sm_fail(err, SM_ERR_ARG, "tensor name '%s' is reserved or empty", name);
    if (ndim < 0 || ndim > SM_ST_MAX_DIMS || (ndim > 0 && !shape))
        return sm_fail(err, SM_ERR_ARG, "tensor '%s': rank %d outside 0..%d", name, ndim, SM_ST_MAX_DIMS);
    for (int i = 0; i < w->n; i++)
        if (strcmp(w->t[i].name, name) == 0)
            return sm_fail(err, SM_ERR_ARG, "tensor '%s' added twice", name);
    sm_st_out_tensor t;
    memset(&t, 0, sizeof t);
    t.name = name;
    t.dtype = dtype;
    t.ndim = ndim;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0 || (double)shape[i] > ST_MAX_JSON_INT)
            return sm_fail(err, SM_ERR_ARG, "tensor '%s': dimension %d is %lld", name, i, (long long)shape[i]);
        t.shape[i] = shape[i];
    }
    int ok;
    size_t nb = out_bytes(&t, &ok);
    if (!ok) return sm_fail(err, SM_ERR_ARG, "tensor '%s': shape overflows the addressable size", name);
    (void)nb;
    if (w->n == w->cap) {
        int cap = w->cap ? 2 * w->cap : 16;
        sm_st_out_tensor *p = realloc(w->t, sizeof *p * (size_t)cap);
        if (!p) return sm_fail(err, SM_ERR_NOMEM, "tensor '%s': out of memory", name);
        w->t = p;
        w->cap = cap;
    }
    w->t[w->n++] = t;
    return SM_OK;
}

/* Setting a key twice replaces its value (metadata is a string -> string map). */
sm_status sm_st_writer_meta(sm_st_writer *w, const char *key, const char *value, sm_error *err) {
    if (!w || !key || !value) return sm_fail(err, SM_ERR_ARG, "sm_st_writer_meta: NULL argument");
    char *v = dup_str(value);
    if (!v) return sm_fail(err, SM_ERR_NOMEM, "metadata '%s': out of memory", key);
    for (int i = 0; i < w->n_meta; i++) {
        if (strcmp(w->meta[i].key, key) == 0) {
            free(w->meta[i].value);
            w->meta[i].value = v;
            return SM_OK;
        }
    }
    char *k = dup_str(key);
    if (!k) {
        free(v);
        return sm_fail(err, SM_ERR_NOMEM, "metadata '%s': out of memory", key);
    }
    if (w->n_meta == w->cap_meta) {
        int cap = w->cap_meta ? 2 * w->cap_meta : 8;
        sm_st_meta *p = realloc(w->meta, sizeof *p * (size_t)cap);
        if (!p) {
            free(k);
            free(v);
            return sm_fail(err, SM_ERR_NOMEM, "metadata '%s': out of memory", key);
        }
        w->meta = p;
        w->cap_meta = cap;
    }
    w->meta[w->n_meta].key = k;
    w->meta[w->n_meta].value = v;
    w->n_meta++;
    return SM_OK;
}

/* Growable string for the header; `failed` latches the first allocation failure. */
typedef struct {
    char *s;
    size_t len, cap;
    int failed;
} strbuf;

static void sb_put(strbuf *b, const char *s, size_t n) {
    if (b->failed) return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1) cap *= 2;
        char *p = realloc(b->s, cap);
        if (!p) {
            b->failed = 1;
            return;
        }
        b->s = p;
        b->cap = cap;
    }
    memcpy(b->s + b->len, s, n);
    b->len += n;
    b->s[b->len] = '\0';
}

static void sb_str(strbuf *b, const char *s) { sb_put(b, s, strlen(s)); }

static void sb_u64(strbuf *b, uint64_t v) {
    char tmp[32];
    int n = snprintf(tmp, sizeof tmp, "%llu", (unsigned long long)v);
    sb_put(b, tmp, (size_t)n);
}

/* A JSON string literal: quotes, backslashes and control bytes escaped, other bytes verbatim. */
static void sb_json_str(strbuf *b, const char *s) {
    sb_put(b, "\"", 1);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        char esc[8];
        if (*p == '"' || *p == '\\') {
            esc[0] = '\\';
            esc[1] = (char)*p;
            sb_put(b, esc, 2);
        } else if (*p < 0x20) {
            snprintf(esc, sizeof esc, "\\u%04x", *p);
            sb_put(b, esc, 6);
        } else {
            sb_put(b, (const char *)p, 1);
        }
    }
    sb_put(b, "\"", 1);
}

/* The header of w: {"__metadata__":{...},"name":{"dtype":..,"shape":[..],"data_offsets":[b,e]},...},
 * space-padded so the data section starts 8-byte aligned; *data_len gets the data section's size. */
static sm_status build_header(const sm_st_writer *w, strbuf *h, size_t *data_len, const char *path, sm_error *err) {
    sb_str(h, "{");
    int first = 1;
    if (w->n_meta > 0) {
        sb_str(h, "\"__metadata__\":{");
        for (int i = 0; i < w->n_meta; i++) {
            if (i) sb_str(h, ",");
            sb_json_str(h, w->meta[i].key);
            sb_str(h, ":");
            sb_json_str(h, w->meta[i].value);
        }
        sb_str(h, "}");
        first = 0;
    }
    size_t off = 0;
    for (int i = 0; i < w->n; i++) {
        const sm_st_out_tensor *t = &w->t[i];
        int ok;
        size_t nb = out_bytes(t, &ok);
        if (!ok || off > SIZE_MAX - nb)
            return sm_fail(err, SM_ERR_ARG, "%s: tensor '%s': data section overflows", path, t->name);
        if (!first) sb_str(h, ",");
        first = 0;
        sb_json_str(h, t->name);
        sb_str(h, ":{\"dtype\":\"");
        sb_str(h, sm_dtype_name(t->dtype));
        sb_str(h, "\",\"shape\":[");
        for (int d = 0; d < t->ndim; d++) {
            if (d) sb_str(h, ",");
            sb_u64(h, (uint64_t)t->shape[d]);
        }
        sb_str(h, "],\"data_offsets\":[");
        sb_u64(h, off);
        sb_str(h, ",");
        sb_u64(h, off + nb);
        sb_str(h, "]}");
        off += nb;
    }
    sb_str(h, "}");
    while (!h->failed && h->len % 8 != 0) sb_str(h, " ");
    if (h->failed) return sm_fail(err, SM_ERR_NOMEM, "%s: out of memory building the header", path);
    *data_len = off;
    return SM_OK;
}

void sm_st_stream_abort(sm_st_stream *s) {
    if (!s) return;
    if (s->f) fclose(s->f);
    if (s->tmp) remove(s->tmp);
    free(s->tmp);
    free(s->path);
    memset(s, 0, sizeof *s);
}

sm_status sm_st_stream_begin(sm_st_stream *s, const sm_st_writer *w, const char *path, sm_error *err) {
    if (!s || !w || !path) return sm_fail(err, SM_ERR_ARG, "sm_st_stream_begin: NULL argument");
    memset(s, 0, sizeof *s);
    strbuf h = {0};
    size_t data_len = 0;
    sm_status rc = build_header(w, &h, &data_len, path, err);
    if (rc != SM_OK) {
        free(h.s);
        return rc;
    }
    size_t plen = strlen(path);
    s->path = dup_str(path);
    s->tmp = malloc(plen + 5);
    if (!s->path || !s->tmp) {
        free(h.s);
        sm_st_stream_abort(s);
        return sm_fail(err, SM_ERR_NOMEM, "%s: out of memory", path);
    }
    memcpy(s->tmp, path, plen);
    memcpy(s->tmp + plen, ".tmp", 5);
    s->f = fopen(s->tmp, "wb");
    if (!s->f) {
        int e = errno;
        rc = sm_fail(err, SM_ERR_IO, "%s: cannot create %s: %s", path, s->tmp, strerror(e));
        free(s->tmp); /* nothing to remove */
        s->tmp = NULL;
        free(h.s);
        sm_st_stream_abort(s);
        return rc;
    }
    uint8_t len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (uint8_t)((uint64_t)h.len >> (8 * i));
    int bad = fwrite(len8, 1, 8, s->f) != 8 || fwrite(h.s, 1, h.len, s->f) != h.len;
    free(h.s);
    if (bad) {
        int e = errno;
        sm_st_stream_abort(s);
        return sm_fail(err, SM_ERR_IO, "%s: write header failed: %s", path, strerror(e));
    }
    s->expected = data_len;
    return SM_OK;
}

sm_status sm_st_stream_write(sm_st_stream *s, const void *bytes, size_t n, sm_error *err) {
    if (!s || !s->f || (n && !bytes)) return sm_fail(err, SM_ERR_ARG, "sm_st_stream_write: stream not open");
    if (n > s->expected - s->written) {
        char *p = s->path;
        s->path = NULL;
        sm_st_stream_abort(s);
        sm_status rc = sm_fail(err, SM_ERR_ARG, "%s: more tensor bytes written than the header declares", p);
        free(p);
        return rc;
    }
    if (n && fwrite(bytes, 1, n, s->f) != n) {
        int e = errno;
        char *p = s->path;
        s->path = NULL;
        sm_st_stream_abort(s);
        sm_status rc = sm_fail(err, SM_ERR_IO, "%s: write tensor data failed: %s", p, strerror(e));
        free(p);
        return rc;
    }
    s->written += n;
    return SM_OK;
}

sm_status sm_st_stream_finish(sm_st_stream *s, sm_error *err) {
    if (!s || !s->f) return sm_fail(err, SM_ERR_ARG, "sm_st_stream_finish: stream not open");
    const char *step = NULL;
    int e = 0;
    if (s->written != s->expected) step = "check byte count";
    if (!step && fflush(s->f) != 0) step = "flush";
    /* fsync before rename: otherwise a crash can leave the new name pointing at unwritten blocks */
    if (!step && fsync(fileno(s->f)) != 0) step = "fsync";
    if (step) e = errno;
    if (fclose(s->f) != 0 && !step) {
        e = errno;
        step = "close";
    }
    s->f = NULL;
    if (!step && rename(s->tmp, s->path) != 0) {
        e = errno;
        step = "rename";
    }
    sm_status rc = SM_OK;
    if (step) {
        if (s->written != s->expected)
            rc = sm_fail(err, SM_ERR_ARG, "%s: %zu of the %zu declared tensor bytes were written", s->path, s->written,
                         s->expected);
        else
            rc = sm_fail(err, SM_ERR_IO, "%s: %s failed: %s", s->path, step, strerror(e));
        sm_st_stream_abort(s);
        return rc;
    }
    /* make the rename itself durable; best effort, the data is already safe on disk */
    char *slash = strrchr(s->path, '/');
    char *dir = slash ? malloc((size_t)(slash - s->path) + 2) : NULL;
    if (dir) {
        size_t dl = slash == s->path ? 1 : (size_t)(slash - s->path);
        memcpy(dir, s->path, dl);
        dir[dl] = '\0';
    }
    int fd = open(dir ? dir : ".", O_RDONLY);
    if (fd >= 0) {
        (void)fsync(fd);
        close(fd);
    }
    free(dir);
    free(s->tmp);
    s->tmp = NULL; /* renamed: nothing to remove */
    sm_st_stream_abort(s);
    return SM_OK;
}

sm_status sm_st_writer_write(const sm_st_writer *w, const char *path, sm_error *err) {
    if (!w || !path) return sm_fail(err, SM_ERR_ARG, "sm_st_writer_write: NULL argument");
    for (int i = 0; i < w->n; i++) {
        int ok;
        int has = w->t[i].dtype == SM_DT_F32 ? w->t[i].data != NULL : w->t[i].dtype == SM_DT_U8 && w->t[i].bytes;
        if (out_bytes(&w->t[i], &ok) && !has)
            return sm_fail(err, SM_ERR_ARG, "%s: tensor '%s' has no F32 or U8 data (layout-only tensors need a stream)",
                           path, w->t[i].name);
    }
    sm_st_stream s;
    sm_status rc = sm_st_stream_begin(&s, w, path, err);
    for (int i = 0; rc == SM_OK && i < w->n; i++) {
        int ok;
        size_t nb = out_bytes(&w->t[i], &ok);
        rc = w->t[i].dtype == SM_DT_U8 ? sm_st_stream_write(&s, w->t[i].bytes, nb, err)
                                       : sm_st_stream_write_f32(&s, w->t[i].data, nb / 4, err);
    }
    return rc == SM_OK ? sm_st_stream_finish(&s, err) : rc;
}

sm_status sm_st_stream_write_f32(sm_st_stream *s, const float *x, size_t n, sm_error *err) {
    uint8_t chunk[4096]; /* little-endian through a staging buffer, whatever the host byte order */
    sm_status rc = SM_OK;
    while (rc == SM_OK && n > 0) {
        size_t m = n < sizeof chunk / 4 ? n : sizeof chunk / 4;
        for (size_t j = 0; j < m; j++) {
            uint32_t u;
            memcpy(&u, &x[j], sizeof u);
            for (int b = 0; b < 4; b++) chunk[4 * j + b] = (uint8_t)(u >> (8 * b));
        }
        rc = sm_st_stream_write(s, chunk, 4 * m, err);
        x += m;
        n -= m;
    }
    return rc;
}
