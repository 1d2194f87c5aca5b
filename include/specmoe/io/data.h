/* Datasets: IDX files (MNIST / Fashion-MNIST format, optionally gzip-compressed), class subsets,
 * per-class counts, seeded shuffling and minibatches.
 *
 * IDX: big-endian u32 magic 0x00000800 | (type << 8) | ndim with type 0x08 (u8), then ndim big-endian
 * u32 dimensions, then the data. Images: ndim 3 (N, rows, cols); labels: ndim 1 (N).
 */
#ifndef SPECMOE_DATA_H
#define SPECMOE_DATA_H

#include "specmoe/core/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Where Debian's dataset-fashion-mnist package installs the files. */
#define SM_FASHION_MNIST_DIR "/usr/share/datasets/fashion-mnist"

typedef struct {
    int ndim;
    uint32_t dims[4];
    size_t count;   /* product of dims */
    uint8_t *data;  /* (count) owned */
} sm_idx;

/* Parses an uncompressed IDX buffer of u8 data. what names the source in messages. */
sm_status sm_idx_parse(sm_idx *out, const uint8_t *buf, size_t size, const char *what, sm_error *err);
/* Reads a .gz or plain IDX file (zlib's gzread handles both). max_bytes bounds the decompressed size. */
sm_status sm_idx_load(sm_idx *out, const char *path, size_t max_bytes, sm_error *err);
void sm_idx_free(sm_idx *x);

/* A labelled dataset of n examples of dim features (floats in [0,1] from u8 pixels / 255). */
typedef struct {
    int n, dim, n_classes;
    float *x;    /* (n, dim) */
    int *y;      /* (n) */
} sm_dataset;

/* Loads images+labels IDX pair; checks counts match, labels < n_classes (10), image dims. */
sm_status sm_dataset_load_idx(sm_dataset *ds, const char *images_path, const char *labels_path,
                              sm_error *err);
/* Loads split "train" or "test" of Fashion-MNIST from dir (NULL = SM_FASHION_MNIST_DIR). */
sm_status sm_dataset_load_fashion(sm_dataset *ds, const char *dir, const char *split, sm_error *err);
void sm_dataset_free(sm_dataset *ds);

/* Keeps only the listed classes (classes[0..n_sel), original label ids kept) and at most
 * per_class examples of each (<= 0: all), the first ones in file order. Labels keep their ids
 * unless relabel != 0, in which case class classes[i] becomes i. */
sm_status sm_dataset_select(sm_dataset *ds, const int *classes, int n_sel, int per_class, int relabel,
                            sm_error *err);
/* Fashion-MNIST's name of label id (0..9), or "?" */
const char *sm_fashion_class_name(int id);
/* Parses "0,1,7", "Bag,Sneaker" (Fashion-MNIST names) or "all" into a class list; returns count or -1 (err filled). */
int sm_parse_class_list(const char *s, int *classes, int max, int n_classes, sm_error *err);

/* Minibatch iterator: the order of epoch e is a permutation drawn from rng seeded with
 * (seed, e), so any epoch can be regenerated exactly (resume equals uninterrupted). */
typedef struct {
    const sm_dataset *ds;
    int batch;
    uint64_t seed;
    int shuffle;
    int epoch;
    int pos;        /* index of the next example within the epoch */
    int *order;     /* (n) */
} sm_batcher;

sm_status sm_batcher_init(sm_batcher *b, const sm_dataset *ds, int batch, uint64_t seed, int shuffle,
                          sm_error *err);
/* Positions the batcher at (epoch, pos). */
void sm_batcher_seek(sm_batcher *b, int epoch, int pos);
/* Copies the next batch (<= batch rows; the last batch of an epoch may be short) into x (B,dim),
 * y (B) and returns B; at the end of an epoch returns 0 and advances to the next epoch. */
int sm_batcher_next(sm_batcher *b, float *x, int *y);
void sm_batcher_free(sm_batcher *b);

#ifdef __cplusplus
}
#endif
#endif
