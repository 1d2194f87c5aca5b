/* Safetensors reader and writer (the Hugging Face format):
 *
 *   [8 bytes: little-endian u64 N][N bytes: UTF-8 JSON object][raw little-endian tensor bytes]
 *
 * The JSON maps tensor names to {"dtype", "shape", "data_offsets": [begin, end]} (offsets relative to
 * the byte after the header) and may hold "__metadata__": {string: string}.
 * Written: F32 from memory, any dtype through the streaming writer. Read: F32, F16, BF16 (converted to
 * float on request), whole-file or header-only with ranged reads; other dtypes are listed but
 * cannot be converted. Every malformation is refused with a message naming the file and offset.
 */
#ifndef SPECMOE_SAFETENSORS_H
#define SPECMOE_SAFETENSORS_H

#include <stdio.h>

#include "specmoe/core/core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { SM_DT_F32 = 0, SM_DT_F16, SM_DT_BF16, SM_DT_F64, SM_DT_I64, SM_DT_I32, SM_DT_U8, SM_DT_BOOL,
               SM_DT_I8, SM_DT_I16, SM_DT_U16, SM_DT_U32, SM_DT_U64 } sm_dtype;
const char *sm_dtype_name(sm_dtype t);
size_t sm_dtype_size(sm_dtype t);

#define SM_ST_MAX_DIMS 8

typedef struct {
    char *name;
    sm_dtype dtype;
    int ndim;
    int64_t shape[SM_ST_MAX_DIMS];
    size_t numel;
    size_t begin, end;     /* byte offsets into the data section */
    const uint8_t *data;   /* points into the file buffer; NULL when opened header-only */
} sm_st_tensor;

typedef struct {
    char *key, *value;
} sm_st_meta;

typedef struct {
    uint8_t *buf;          /* whole file (owned when loaded from a path) */
    size_t size;
    int owns_buf;
    size_t header_len;
    int n_tensors;
    sm_st_tensor *tensors; /* in file order of data offsets */
    int n_meta;
    sm_st_meta *meta;
    char *path;            /* set by sm_safetensors_open: tensor bytes are read from this file on demand */
} sm_safetensors;

/* Parses an in-memory file. buf must stay alive while st is used; the parse copies names only.
 * what names the source in error messages (a path, or "<memory>"). */
sm_status sm_safetensors_parse(sm_safetensors *st, const uint8_t *buf, size_t size, const char *what,
                               sm_error *err);
/* Reads and parses a file. */
sm_status sm_safetensors_load(sm_safetensors *st, const char *path, sm_error *err);
/* Reads and parses only the header of a file (all the same checks against the file's size); tensor
 * data stays on disk and is read with sm_st_read_bytes / sm_st_read_f32. This is how multi-gigabyte
 * Hugging Face shards are streamed a tensor (or an expert's slice) at a time. */
sm_status sm_safetensors_open(sm_safetensors *st, const char *path, sm_error *err);
void sm_safetensors_free(sm_safetensors *st);
/* Bytes [off, off + n) of tensor t of st (in memory or on disk) into out. */
sm_status sm_st_read_bytes(const sm_safetensors *st, const sm_st_tensor *t, size_t off, size_t n, void *out,
                           sm_error *err);
/* Elements [first, first + n) of t (F32, F16 or BF16) converted to float. */
sm_status sm_st_read_f32(const sm_safetensors *st, const sm_st_tensor *t, size_t first, size_t n, float *out,
                         sm_error *err);
const sm_st_tensor *sm_safetensors_find(const sm_safetensors *st, const char *name);
const char *sm_safetensors_meta(const sm_safetensors *st, const char *key);
/* Converts tensor t (F32, F16 or BF16) to n floats in out; refuses other dtypes and n != numel. */
/* (U8 tensors are read with sm_st_read_bytes.) */
sm_status sm_st_tensor_to_f32(const sm_st_tensor *t, float *out, size_t n, sm_error *err);

/* Writer: collect tensors (pointers are borrowed until write), then write atomically:
 * path.tmp is written, flushed (fflush + fsync) and renamed over path. */
typedef struct {
    const char *name;
    sm_dtype dtype;        /* F32 for sm_st_writer_add; any for layout-only tensors */
    int ndim;
    int64_t shape[SM_ST_MAX_DIMS];
    const float *data;
    const uint8_t *bytes;  /* U8 tensors from memory (sm_st_writer_add_u8) */
} sm_st_out_tensor;

typedef struct {
    int n, cap;
    sm_st_out_tensor *t;
    int n_meta, cap_meta;
    sm_st_meta *meta; /* copied strings */
} sm_st_writer;

void sm_st_writer_init(sm_st_writer *w);
sm_status sm_st_writer_add(sm_st_writer *w, const char *name, int ndim, const int64_t *shape,
                           const float *data, sm_error *err);
/* A tensor of any dtype without data: for a stream (below), which takes its bytes later. */
sm_status sm_st_writer_add_layout(sm_st_writer *w, const char *name, sm_dtype dtype, int ndim, const int64_t *shape,
                                  sm_error *err);
/* A U8 tensor of n bytes from memory (borrowed until write): raw state such as a replay buffer. */
sm_status sm_st_writer_add_u8(sm_st_writer *w, const char *name, size_t n, const void *bytes, sm_error *err);
sm_status sm_st_writer_meta(sm_st_writer *w, const char *key, const char *value, sm_error *err);
sm_status sm_st_writer_write(const sm_st_writer *w, const char *path, sm_error *err);
void sm_st_writer_free(sm_st_writer *w);

/* Streaming write, for files larger than memory: begin writes the header of the writer's layout to
 * path.tmp, write appends raw little-endian tensor bytes in layout order (in pieces of any size),
 * finish checks that exactly the declared bytes came, flushes, fsyncs and renames over path. Any
 * failure removes path.tmp; abort does so explicitly. */
typedef struct {
    FILE *f;
    char *path, *tmp;
    size_t expected, written;
} sm_st_stream;
sm_status sm_st_stream_begin(sm_st_stream *s, const sm_st_writer *layout, const char *path, sm_error *err);
sm_status sm_st_stream_write(sm_st_stream *s, const void *bytes, size_t n, sm_error *err);
/* n floats as F32 little-endian bytes. */
sm_status sm_st_stream_write_f32(sm_st_stream *s, const float *x, size_t n, sm_error *err);
sm_status sm_st_stream_finish(sm_st_stream *s, sm_error *err);
void sm_st_stream_abort(sm_st_stream *s);

#ifdef __cplusplus
}
#endif
#endif
