/* Safetensors reader/writer: round trip, F16/BF16 decoding, and refusal of malformed files. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <sys/stat.h>

#include "specmoe/io/safetensors.h"
#include "testutil.h"

/* Builds a safetensors file in a fresh malloc'd buffer of exactly the file's size (so ASan sees any
 * read past the end): 8-byte length of `json`, json, then data_len bytes of data. */
static uint8_t *make_st_n(const char *json, size_t hl, const void *data, size_t data_len, size_t *size) {
    *size = 8 + hl + data_len;
    uint8_t *b = malloc(*size ? *size : 1);
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)((uint64_t)hl >> (8 * i));
    memcpy(b + 8, json, hl);
    if (data_len) memcpy(b + 8 + hl, data, data_len);
    return b;
}

static uint8_t *make_st(const char *json, const void *data, size_t data_len, size_t *size) {
    return make_st_n(json, strlen(json), data, data_len, size);
}

/* Parses json+data, expects failure with a message containing `needle`; returns nothing, asserts. */
static void expect_refused(const char *json, const void *data, size_t data_len, const char *needle) {
    size_t size;
    uint8_t *b = make_st(json, data, data_len, &size);
    sm_safetensors st;
    sm_error err = {0};
    sm_status rc = sm_safetensors_parse(&st, b, size, "bad.safetensors", &err);
    cr_expect_neq(rc, SM_OK, "accepted: %s", json);
    cr_expect(strstr(err.msg, "bad.safetensors") != NULL, "message does not name the file: %s", err.msg);
    cr_expect(strstr(err.msg, needle) != NULL, "for %s: message '%s' lacks '%s'", json, err.msg, needle);
    cr_expect_eq(st.n_tensors, 0);
    cr_expect_null(st.tensors);
    free(b);
}

static int file_exists(const char *p) { return access(p, F_OK) == 0; }

Test(safetensors, round_trip) {
    const char *dir = tu_tmpdir();
    char path[256], tmp[264];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);

    /* w1 (2, 3), b1 (4), s () scalar, plus an empty (0, 5) tensor */
    float w1[6] = {1.0f, -2.5f, 3.25f, -0.0f, 1e-40f /* subnormal */, 65504.0f};
    float b1[4] = {INFINITY, -INFINITY, 0.1f, 1234567.0f};
    float s = 42.0f;
    int64_t sh_w1[2] = {2, 3}, sh_b1[1] = {4}, sh_e[2] = {0, 5};
    sm_st_writer w;
    sm_st_writer_init(&w);
    sm_error err = {0};
    cr_assert_eq(sm_st_writer_add(&w, "layer.w1", 2, sh_w1, w1, &err), SM_OK, "%s", err.msg);
    cr_assert_eq(sm_st_writer_add(&w, "layer.b1", 1, sh_b1, b1, &err), SM_OK, "%s", err.msg);
    cr_assert_eq(sm_st_writer_add(&w, "scale", 0, NULL, &s, &err), SM_OK, "%s", err.msg);
    cr_assert_eq(sm_st_writer_add(&w, "empty", 2, sh_e, NULL, &err), SM_OK, "%s", err.msg);
    cr_assert_eq(sm_st_writer_meta(&w, "format", "pt", &err), SM_OK);
    cr_assert_eq(sm_st_writer_meta(&w, "note", "quote \" backslash \\ tab \t done", &err), SM_OK);
    cr_assert_eq(sm_st_writer_meta(&w, "format", "specmoe", &err), SM_OK); /* replaces */
    cr_assert_eq(sm_st_writer_write(&w, path, &err), SM_OK, "%s", err.msg);
    sm_st_writer_free(&w);
    cr_expect(!file_exists(tmp), "%s left behind", tmp);

    /* raw layout: header padded to a multiple of 8 with spaces, __metadata__ first */
    size_t n;
    unsigned char *raw = tu_read_file(path, &n);
    cr_assert_not_null(raw);
    uint64_t hl = 0;
    for (int i = 0; i < 8; i++) hl |= (uint64_t)raw[i] << (8 * i);
    cr_expect_eq(hl % 8, 0);
    cr_expect(memcmp(raw + 8, "{\"__metadata__\"", 15) == 0);
    cr_expect_eq(n, 8 + hl + 4 * (6 + 4 + 1));
    free(raw);

    sm_safetensors st;
    cr_assert_eq(sm_safetensors_load(&st, path, &err), SM_OK, "%s", err.msg);
    cr_expect_eq(st.n_tensors, 4);
    cr_expect_eq(st.header_len, hl);
    cr_expect_str_eq(sm_safetensors_meta(&st, "format"), "specmoe");
    cr_expect_str_eq(sm_safetensors_meta(&st, "note"), "quote \" backslash \\ tab \t done");
    cr_expect_null(sm_safetensors_meta(&st, "absent"));
    cr_expect_eq(st.n_meta, 2);

    /* tensors come back in data-offset order, which is the order they were added */
    cr_expect_str_eq(st.tensors[0].name, "layer.w1");
    cr_expect_str_eq(st.tensors[1].name, "layer.b1");

    const sm_st_tensor *t = sm_safetensors_find(&st, "layer.w1");
    cr_assert_not_null(t);
    cr_expect_eq(t->dtype, SM_DT_F32);
    cr_expect_eq(t->ndim, 2);
    cr_expect_eq(t->shape[0], 2);
    cr_expect_eq(t->shape[1], 3);
    float out[6];
    cr_assert_eq(sm_st_tensor_to_f32(t, out, 6, &err), SM_OK, "%s", err.msg);
    cr_expect(memcmp(out, w1, sizeof w1) == 0, "w1 not bit-equal");

    t = sm_safetensors_find(&st, "layer.b1");
    cr_assert_not_null(t);
    cr_assert_eq(sm_st_tensor_to_f32(t, out, 4, &err), SM_OK);
    cr_expect(memcmp(out, b1, sizeof b1) == 0, "b1 not bit-equal");

    t = sm_safetensors_find(&st, "scale");
    cr_assert_not_null(t);
    cr_expect_eq(t->ndim, 0);
    cr_expect_eq(t->numel, 1);
    cr_assert_eq(sm_st_tensor_to_f32(t, out, 1, &err), SM_OK);
    cr_expect(memcmp(out, &s, sizeof s) == 0);

    t = sm_safetensors_find(&st, "empty");
    cr_assert_not_null(t);
    cr_expect_eq(t->numel, 0);
    cr_expect_eq(sm_st_tensor_to_f32(t, out, 0, &err), SM_OK);

    cr_expect_null(sm_safetensors_find(&st, "nope"));
    /* wrong count is refused */
    cr_expect_neq(sm_st_tensor_to_f32(sm_safetensors_find(&st, "layer.w1"), out, 5, &err), SM_OK);
    sm_safetensors_free(&st);
    cr_expect_null(st.tensors);
    cr_expect_null(st.buf);
}

Test(safetensors, empty_file_round_trip) {
    char path[256];
    snprintf(path, sizeof path, "%s/empty.safetensors", tu_tmpdir());
    sm_st_writer w;
    sm_st_writer_init(&w);
    sm_error err = {0};
    cr_assert_eq(sm_st_writer_write(&w, path, &err), SM_OK, "%s", err.msg);
    sm_st_writer_free(&w);
    sm_safetensors st;
    cr_assert_eq(sm_safetensors_load(&st, path, &err), SM_OK, "%s", err.msg);
    cr_expect_eq(st.n_tensors, 0);
    cr_expect_eq(st.n_meta, 0);
    sm_safetensors_free(&st);
}

/* Decodes the given half-precision patterns through the parser and to_f32. */
static void decode16(const char *dtype, const uint16_t *bits, int n, float *out) {
    char json[256];
    snprintf(json, sizeof json, "{\"t\":{\"dtype\":\"%s\",\"shape\":[%d],\"data_offsets\":[0,%d]}}", dtype, n,
             2 * n);
    uint8_t data[64];
    for (int i = 0; i < n; i++) {
        data[2 * i] = (uint8_t)bits[i];
        data[2 * i + 1] = (uint8_t)(bits[i] >> 8);
    }
    size_t size;
    uint8_t *b = make_st(json, data, 2 * (size_t)n, &size);
    sm_safetensors st;
    sm_error err = {0};
    cr_assert_eq(sm_safetensors_parse(&st, b, size, "<memory>", &err), SM_OK, "%s", err.msg);
    cr_assert_eq(st.n_tensors, 1);
    cr_assert_eq(sm_st_tensor_to_f32(&st.tensors[0], out, (size_t)n, &err), SM_OK, "%s", err.msg);
    sm_safetensors_free(&st);
    free(b);
}

static uint32_t fbits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

Test(safetensors, f16_decoding) {
    const uint16_t bits[] = {0x3C00, 0xC000, 0x7BFF, 0x0001, 0x03FF, 0x0400, 0x7C00,
                             0xFC00, 0x7E00, 0x8000, 0x3555, 0x8001, 0x0000};
    const float want[] = {1.0f,
                          -2.0f,
                          65504.0f,
                          0x1p-24f,          /* smallest subnormal */
                          1023 * 0x1p-24f,   /* largest subnormal */
                          0x1p-14f,          /* smallest normal */
                          INFINITY,
                          -INFINITY,
                          NAN,
                          -0.0f,
                          0.333251953125f,
                          -0x1p-24f,
                          0.0f};
    int n = (int)(sizeof bits / sizeof bits[0]);
    float out[16];
    decode16("F16", bits, n, out);
    for (int i = 0; i < n; i++) {
        if (isnan(want[i])) {
            cr_expect(isnan(out[i]), "0x%04x -> %g, want NaN", bits[i], out[i]);
        } else {
            cr_expect_eq(fbits(out[i]), fbits(want[i]), "0x%04x -> %a, want %a", bits[i], out[i], want[i]);
        }
    }
}

Test(safetensors, bf16_decoding) {
    const uint16_t bits[] = {0x3F80, 0xC040, 0x7F80, 0xFF80, 0x7FC0, 0x0001, 0x4049, 0x8000};
    const uint32_t want[] = {0x3F800000, 0xC0400000, 0x7F800000, 0xFF800000,
                             0x7FC00000, 0x00010000, 0x40490000, 0x80000000};
    int n = (int)(sizeof bits / sizeof bits[0]);
    float out[16];
    decode16("BF16", bits, n, out);
    for (int i = 0; i < n; i++)
        cr_expect_eq(fbits(out[i]), want[i], "0x%04x -> 0x%08x, want 0x%08x", bits[i], fbits(out[i]), want[i]);
    cr_expect_eq(out[0], 1.0f);
    cr_expect_eq(out[1], -3.0f);
    cr_expect_eq(out[6], 3.140625f);
}

Test(safetensors, other_dtypes_listed_not_converted) {
    uint8_t data[16] = {0};
    size_t size;
    uint8_t *b = make_st("{\"a\":{\"dtype\":\"U8\",\"shape\":[2,4],\"data_offsets\":[0,8]},"
                         "\"b\":{\"dtype\":\"I64\",\"shape\":[1],\"data_offsets\":[8,16]}}",
                         data, 16, &size);
    sm_safetensors st;
    sm_error err = {0};
    cr_assert_eq(sm_safetensors_parse(&st, b, size, "<memory>", &err), SM_OK, "%s", err.msg);
    const sm_st_tensor *t = sm_safetensors_find(&st, "a");
    cr_assert_not_null(t);
    cr_expect_eq(t->dtype, SM_DT_U8);
    cr_expect_eq(t->numel, 8);
    cr_expect_eq(t->data, b + size - 16);
    float out[8];
    cr_expect_eq(sm_st_tensor_to_f32(t, out, 8, &err), SM_ERR_ARG);
    cr_expect(strstr(err.msg, "U8") != NULL, "%s", err.msg);
    cr_expect_str_eq(sm_dtype_name(SM_DT_BF16), "BF16");
    cr_expect_eq(sm_dtype_size(SM_DT_I64), 8);
    sm_safetensors_free(&st);
    free(b);
}

/* A small valid file: every proper prefix must be refused, never crash; the full file parses. */
Test(safetensors, every_prefix_refused) {
    uint8_t data[24];
    for (int i = 0; i < 24; i++) data[i] = (uint8_t)(i * 7);
    size_t size;
    uint8_t *full = make_st("{\"__metadata__\":{\"k\":\"v\"},"
                            "\"a\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16]},"
                            "\"b\":{\"dtype\":\"F16\",\"shape\":[4],\"data_offsets\":[16,24]}}",
                            data, 24, &size);
    sm_safetensors st;
    sm_error err = {0};
    cr_assert_eq(sm_safetensors_parse(&st, full, size, "<memory>", &err), SM_OK, "%s", err.msg);
    sm_safetensors_free(&st);
    for (size_t len = 0; len < size; len++) {
        uint8_t *p = malloc(len ? len : 1); /* exact size so ASan catches over-reads */
        memcpy(p, full, len);
        err.msg[0] = '\0';
        sm_status rc = sm_safetensors_parse(&st, p, len, "prefix.safetensors", &err);
        cr_expect_neq(rc, SM_OK, "prefix of %zu / %zu bytes accepted", len, size);
        cr_expect(strstr(err.msg, "prefix.safetensors") != NULL, "len %zu: %s", len, err.msg);
        cr_expect_eq(st.n_tensors, 0);
        free(p);
    }
    free(full);
}

Test(safetensors, short_and_oversized_header_length) {
    sm_safetensors st;
    sm_error err = {0};
    uint8_t b[16] = {0};
    cr_expect_eq(sm_safetensors_parse(&st, b, 7, "short.safetensors", &err), SM_ERR_FORMAT);
    cr_expect(strstr(err.msg, "short.safetensors") && strstr(err.msg, "8-byte"), "%s", err.msg);

    /* N = 1000 in a 16-byte file */
    b[0] = 0xe8;
    b[1] = 0x03;
    cr_expect_eq(sm_safetensors_parse(&st, b, 16, "x.safetensors", &err), SM_ERR_FORMAT);
    cr_expect(strstr(err.msg, "header length 1000") && strstr(err.msg, "past the end"), "%s", err.msg);

    /* N = 2^64 - 1: above the 100 MiB cap */
    memset(b, 0xff, 8);
    cr_expect_eq(sm_safetensors_parse(&st, b, 16, "x.safetensors", &err), SM_ERR_FORMAT);
    cr_expect(strstr(err.msg, "100 MiB"), "%s", err.msg);
}

Test(safetensors, header_not_object) {
    expect_refused("[]", NULL, 0, "not a JSON object");
    expect_refused("3", NULL, 0, "not a JSON object");
    expect_refused("\"str\"", NULL, 0, "not a JSON object");
    expect_refused("null", NULL, 0, "not a JSON object");
}

Test(safetensors, invalid_json) {
    expect_refused("", NULL, 0, "not valid JSON");
    expect_refused("{", NULL, 0, "not valid JSON");
    expect_refused("{\"a\":", NULL, 0, "not valid JSON");
    expect_refused("{,}", NULL, 0, "not valid JSON");
    expect_refused("{\"a\":{\"dtype\":\"F32\"", NULL, 0, "not valid JSON");
    expect_refused("{} x", NULL, 0, "trailing bytes");
    expect_refused("{\"\xff\":1}", NULL, 0, "UTF-8");
    expect_refused("{\"\xc0\x80\":1}", NULL, 0, "UTF-8"); /* overlong NUL */
}

/* A NUL inside the header would truncate names in cJSON's C strings: refused as bad UTF-8. */
Test(safetensors, nul_in_header) {
    size_t size;
    uint8_t *b = make_st_n("{}\0 ", 4, NULL, 0, &size);
    sm_safetensors st;
    sm_error err = {0};
    cr_expect_eq(sm_safetensors_parse(&st, b, size, "nul.safetensors", &err), SM_ERR_FORMAT);
    cr_expect(strstr(err.msg, "UTF-8") && strstr(err.msg, "file offset 10"), "%s", err.msg);
    free(b);
}

Test(safetensors, bad_entries) {
    uint8_t d[16] = {0};
    expect_refused("{\"x\":3}", NULL, 0, "'x': entry is not a JSON object");
    expect_refused("{\"x\":{\"shape\":[],\"data_offsets\":[0,4]}}", d, 4, "'x': missing \"dtype\"");
    expect_refused("{\"x\":{\"dtype\":7,\"shape\":[],\"data_offsets\":[0,4]}}", d, 4, "not a string");
    expect_refused("{\"x\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", d, 4, "missing \"shape\"");
    expect_refused("{\"x\":{\"dtype\":\"F32\",\"shape\":{},\"data_offsets\":[0,4]}}", d, 4, "not an array");
    expect_refused("{\"x\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", d, 4,
                   "shape[0] is not a non-negative integer");
    expect_refused("{\"x\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,4]}}", d, 4,
                   "shape[0] is not a non-negative integer");
    expect_refused("{\"x\":{\"dtype\":\"F32\",\"shape\":[1,\"2\"],\"data_offsets\":[0,4]}}", d, 4, "shape[1]");
    expect_refused("{\"x\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}", d, 4,
                   "rank 9");
    expect_refused("{\"x\":{\"dtype\":\"F32\",\"shape\":[1099511627776,1099511627776,1099511627776],"
                   "\"data_offsets\":[0,4]}}",
                   d, 4, "overflow");
    expect_refused("{\"x\":{\"dtype\":\"F32\",\"shape\":[1]}}", d, 4, "missing \"data_offsets\"");
    expect_refused("{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}", d, 4, "two non-negative");
    expect_refused("{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4,8]}}", d, 8, "two non-negative");
    expect_refused("{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,\"4\"]}}", d, 4,
                   "two non-negative");
    expect_refused("{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,4]}}", d, 8, "begin after end");
    expect_refused("{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                   "\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
                   d, 8, "'x' appears twice");
}

Test(safetensors, offsets_out_of_range) {
    uint8_t d[64] = {0};
    expect_refused("{\"x\":{\"dtype\":\"F32\",\"shape\":[20],\"data_offsets\":[0,80]}}", d, 64,
                   "'x': data_offsets [0, 80) end beyond data section of 64 bytes");
    expect_refused("{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[100,104]}}", d, 64, "beyond");
}

Test(safetensors, offsets_inconsistent_with_shape) {
    uint8_t d[16] = {0};
    expect_refused("{\"x\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", d, 8,
                   "span 8 bytes but shape and dtype F32 need 12");
    expect_refused("{\"x\":{\"dtype\":\"F16\",\"shape\":[2,2],\"data_offsets\":[0,16]}}", d, 16, "need 8");
}

Test(safetensors, unknown_dtype) {
    uint8_t d[4] = {0};
    expect_refused("{\"weird\":{\"dtype\":\"F8_XYZ\",\"shape\":[4],\"data_offsets\":[0,4]}}", d, 4,
                   "tensor 'weird': unknown or unsupported dtype 'F8_XYZ'");
}

Test(safetensors, overlap_and_gaps) {
    uint8_t d[16] = {0};
    expect_refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                   "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
                   d, 12, "overlaps tensor 'a'");
    /* two names on the same bytes */
    expect_refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                   "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}",
                   d, 8, "overlaps");
    expect_refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                   "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}",
                   d, 12, "gap in data section: bytes [4, 8)");
    expect_refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", d, 8, "gap");
    /* trailing bytes not covered by any tensor */
    expect_refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", d, 16, "12 trailing bytes");
    expect_refused("{}", d, 4, "trailing bytes");
}

Test(safetensors, metadata_rules) {
    expect_refused("{\"__metadata__\":{\"a\":1}}", NULL, 0, "__metadata__ value for key 'a' is not a string");
    expect_refused("{\"__metadata__\":{\"a\":null}}", NULL, 0, "not a string");
    expect_refused("{\"__metadata__\":[\"a\"]}", NULL, 0, "\"__metadata__\" is not a JSON object");
    expect_refused("{\"__metadata__\":\"x\"}", NULL, 0, "not a JSON object");
    expect_refused("{\"__metadata__\":{\"a\":\"1\",\"a\":\"2\"}}", NULL, 0, "appears twice");
    expect_refused("{\"__metadata__\":{},\"__metadata__\":{}}", NULL, 0, "twice");
}

Test(safetensors, padded_header_accepted) {
    uint8_t d[4] = {0, 0, 0x80, 0x3f}; /* 1.0f little-endian */
    size_t size;
    uint8_t *b = make_st("{\"one\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}     ", d, 4, &size);
    sm_safetensors st;
    sm_error err = {0};
    cr_assert_eq(sm_safetensors_parse(&st, b, size, "<memory>", &err), SM_OK, "%s", err.msg);
    float v;
    cr_assert_eq(sm_st_tensor_to_f32(&st.tensors[0], &v, 1, &err), SM_OK);
    cr_expect_eq(v, 1.0f);
    sm_safetensors_free(&st);
    free(b);
}

Test(safetensors, failed_write_reports_path) {
    const char *path = "/nonexistent-specmoe-dir/sub/out.safetensors";
    float x[2] = {1, 2};
    int64_t sh[1] = {2};
    sm_st_writer w;
    sm_st_writer_init(&w);
    sm_error err = {0};
    cr_assert_eq(sm_st_writer_add(&w, "x", 1, sh, x, &err), SM_OK);
    cr_expect_eq(sm_st_writer_write(&w, path, &err), SM_ERR_IO);
    cr_expect(strstr(err.msg, path) != NULL, "%s", err.msg);
    sm_st_writer_free(&w);

    /* the target is a directory: the tmp file is written, rename fails, tmp is removed */
    const char *dir = tu_tmpdir();
    char sub[256], tmp[264];
    snprintf(sub, sizeof sub, "%s/adir", dir);
    snprintf(tmp, sizeof tmp, "%s.tmp", sub);
    cr_assert_eq(mkdir(sub, 0700), 0);
    sm_st_writer_init(&w);
    cr_assert_eq(sm_st_writer_add(&w, "x", 1, sh, x, &err), SM_OK);
    cr_expect_eq(sm_st_writer_write(&w, sub, &err), SM_ERR_IO);
    cr_expect(strstr(err.msg, "rename") != NULL, "%s", err.msg);
    cr_expect(!file_exists(tmp), "%s left behind", tmp);
    sm_st_writer_free(&w);
}

Test(safetensors, load_errors) {
    sm_safetensors st;
    sm_error err = {0};
    cr_expect_eq(sm_safetensors_load(&st, "/nonexistent-specmoe/x.safetensors", &err), SM_ERR_IO);
    cr_expect(strstr(err.msg, "/nonexistent-specmoe/x.safetensors") != NULL, "%s", err.msg);
    const char *dir = tu_tmpdir();
    cr_expect_neq(sm_safetensors_load(&st, dir, &err), SM_OK);
    cr_expect(strstr(err.msg, "not a regular file") != NULL, "%s", err.msg);

    /* a malformed file on disk: the message names the path */
    char path[256];
    snprintf(path, sizeof path, "%s/bad.safetensors", dir);
    size_t size;
    uint8_t *b = make_st("[]", NULL, 0, &size);
    cr_assert_eq(tu_write_file(path, b, size), 0);
    free(b);
    cr_expect_eq(sm_safetensors_load(&st, path, &err), SM_ERR_FORMAT);
    cr_expect(strstr(err.msg, path) != NULL, "%s", err.msg);
    cr_expect_null(st.buf);

    /* a sparse file just over 64 GiB is refused before any allocation (skipped where the file
     * system cannot make sparse files) */
    char huge[256];
    snprintf(huge, sizeof huge, "%s/huge.safetensors", dir);
    cr_assert_eq(tu_write_file(huge, "", 0), 0);
    if (truncate(huge, ((off_t)64 << 30) + 1) == 0) {
        cr_expect_eq(sm_safetensors_load(&st, huge, &err), SM_ERR_FORMAT);
        cr_expect(strstr(err.msg, "64 GiB") && strstr(err.msg, huge), "%s", err.msg);
        unlink(huge);
    }
}

Test(safetensors, writer_refuses_bad_input) {
    sm_st_writer w;
    sm_st_writer_init(&w);
    sm_error err = {0};
    float x[4] = {0};
    int64_t sh[1] = {4}, neg[1] = {-1};
    cr_expect_eq(sm_st_writer_add(&w, "x", 1, sh, x, &err), SM_OK);
    cr_expect_eq(sm_st_writer_add(&w, "x", 1, sh, x, &err), SM_ERR_ARG);
    cr_expect(strstr(err.msg, "twice") != NULL, "%s", err.msg);
    cr_expect_eq(sm_st_writer_add(&w, "y", 9, sh, x, &err), SM_ERR_ARG);
    cr_expect_eq(sm_st_writer_add(&w, "y", 1, neg, x, &err), SM_ERR_ARG);
    cr_expect_eq(sm_st_writer_add(&w, "y", 1, sh, NULL, &err), SM_ERR_ARG);
    cr_expect_eq(sm_st_writer_add(&w, "__metadata__", 1, sh, x, &err), SM_ERR_ARG);
    cr_expect_eq(sm_st_writer_add(&w, "", 1, sh, x, &err), SM_ERR_ARG);
    cr_expect_eq(w.n, 1);
    sm_st_writer_free(&w);
}

/* Names with JSON-special and non-ASCII characters survive the round trip. */
Test(safetensors, escaped_names_round_trip) {
    char path[256];
    snprintf(path, sizeof path, "%s/names.safetensors", tu_tmpdir());
    const char *names[3] = {"a\"b", "c\\d\n", "\xc3\xa9t\xc3\xa9"};
    float v[3] = {1, 2, 3};
    sm_st_writer w;
    sm_st_writer_init(&w);
    sm_error err = {0};
    for (int i = 0; i < 3; i++) cr_assert_eq(sm_st_writer_add(&w, names[i], 0, NULL, &v[i], &err), SM_OK);
    cr_assert_eq(sm_st_writer_write(&w, path, &err), SM_OK, "%s", err.msg);
    sm_st_writer_free(&w);
    sm_safetensors st;
    cr_assert_eq(sm_safetensors_load(&st, path, &err), SM_OK, "%s", err.msg);
    for (int i = 0; i < 3; i++) {
        const sm_st_tensor *t = sm_safetensors_find(&st, names[i]);
        cr_assert_not_null(t, "%s", names[i]);
        float o;
        cr_assert_eq(sm_st_tensor_to_f32(t, &o, 1, &err), SM_OK);
        cr_expect_eq(o, v[i]);
    }
    sm_safetensors_free(&st);
}

/* Header-only open + ranged reads give the same values as the whole-file load, for F32 and BF16
 * written by the streaming writer; a stream that gets too few or too many bytes leaves no file. */
Test(safetensors, stream_write_and_ranged_read) {
    const char *dir = tu_tmpdir();
    char path[256], tmp[264];
    snprintf(path, sizeof path, "%s/stream.safetensors", dir);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    sm_error err = {0};
    sm_st_writer w;
    sm_st_writer_init(&w);
    int64_t sa[2] = {3, 4}, sb[1] = {5};
    cr_assert_eq(sm_st_writer_add_layout(&w, "a", SM_DT_F32, 2, sa, &err), SM_OK, "%s", err.msg);
    cr_assert_eq(sm_st_writer_add_layout(&w, "b", SM_DT_BF16, 1, sb, &err), SM_OK, "%s", err.msg);
    /* layout-only tensors cannot go through the in-memory writer */
    cr_expect_eq(sm_st_writer_write(&w, path, &err), SM_ERR_ARG);
    float a[12];
    uint8_t abytes[48], bbytes[10];
    for (int i = 0; i < 12; i++) {
        a[i] = 0.5f * (float)i - 2.0f;
        uint32_t u;
        memcpy(&u, &a[i], 4);
        for (int k = 0; k < 4; k++) abytes[4 * i + k] = (uint8_t)(u >> (8 * k));
    }
    for (int i = 0; i < 5; i++) { /* bf16 = the high half of a float: 1, 2, 3, 4, 5 */
        float v = (float)(i + 1);
        uint32_t u;
        memcpy(&u, &v, 4);
        bbytes[2 * i] = (uint8_t)(u >> 16);
        bbytes[2 * i + 1] = (uint8_t)(u >> 24);
    }
    sm_st_stream s;
    cr_assert_eq(sm_st_stream_begin(&s, &w, path, &err), SM_OK, "%s", err.msg);
    cr_assert_eq(sm_st_stream_write(&s, abytes, 20, &err), SM_OK); /* in uneven pieces */
    cr_assert_eq(sm_st_stream_write(&s, abytes + 20, 28, &err), SM_OK);
    cr_assert_eq(sm_st_stream_write(&s, bbytes, 10, &err), SM_OK);
    cr_assert_eq(sm_st_stream_finish(&s, &err), SM_OK, "%s", err.msg);
    cr_expect(!file_exists(tmp));

    sm_safetensors st;
    cr_assert_eq(sm_safetensors_open(&st, path, &err), SM_OK, "%s", err.msg);
    const sm_st_tensor *ta = sm_safetensors_find(&st, "a"), *tb = sm_safetensors_find(&st, "b");
    cr_assert(ta && tb && !ta->data && tb->dtype == SM_DT_BF16);
    float got[12];
    cr_assert_eq(sm_st_read_f32(&st, ta, 5, 7, got, &err), SM_OK, "%s", err.msg);
    for (int i = 0; i < 7; i++) cr_expect_eq(got[i], a[5 + i]);
    cr_assert_eq(sm_st_read_f32(&st, tb, 1, 4, got, &err), SM_OK, "%s", err.msg);
    for (int i = 0; i < 4; i++) cr_expect_eq(got[i], (float)(i + 2));
    cr_expect_neq(sm_st_read_f32(&st, tb, 3, 3, got, &err), SM_OK); /* past the end */
    cr_expect(strstr(err.msg, "'b'") != NULL, "%s", err.msg);
    sm_safetensors_free(&st);

    /* too few bytes: refused at finish, nothing left behind; too many: refused at write */
    cr_assert_eq(sm_st_stream_begin(&s, &w, path, &err), SM_OK);
    cr_assert_eq(sm_st_stream_write(&s, abytes, 48, &err), SM_OK);
    cr_expect_neq(sm_st_stream_finish(&s, &err), SM_OK);
    cr_expect(strstr(err.msg, "48 of the 58") != NULL, "%s", err.msg);
    cr_expect(!file_exists(tmp));
    cr_assert_eq(sm_st_stream_begin(&s, &w, path, &err), SM_OK);
    uint8_t big[64] = {0};
    cr_expect_neq(sm_st_stream_write(&s, big, 64, &err), SM_OK);
    cr_expect(!file_exists(tmp));
    sm_st_writer_free(&w);

    /* a file truncated after its header was parsed: the read fails with the path */
    cr_assert_eq(sm_safetensors_open(&st, path, &err), SM_OK); /* the good file from above */
    cr_assert_eq(truncate(path, 8 + (off_t)st.header_len + 30), 0);
    cr_expect_neq(sm_st_read_f32(&st, sm_safetensors_find(&st, "b"), 0, 5, got, &err), SM_OK);
    cr_expect(strstr(err.msg, path) != NULL, "%s", err.msg);
    sm_safetensors_free(&st);
    cr_expect_neq(sm_safetensors_open(&st, path, &err), SM_OK); /* and reopening refuses it */
}
