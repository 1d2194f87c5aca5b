/* Hugging Face MoE checkpoints: SSMoE (papers/001) on real models, streamed one tensor at a time.
 *
 * A model directory holds config.json and either model.safetensors or shards listed by
 * model.safetensors.index.json ({"metadata": {...}, "weight_map": {tensor: shard file}}). Layouts read
 * (decoder layer L, MoE block B = "model.layers.L.<block>"):
 *
 *   model_type            block             router          experts (per expert e)              E key
 *   mixtral               block_sparse_moe  B.gate.weight   B.experts.e.{w1,w3,w2}.weight       num_local_experts
 *   olmoe                 mlp               B.gate.weight   B.experts.e.{gate,up,down}_proj...  num_experts
 *   qwen2_moe, qwen3_moe  mlp               B.gate.weight   as olmoe; shared: B.shared_expert.* num_experts
 *                                                           and B.shared_expert_gate.weight
 *   deepseek, deepseek_v2, deepseek_v3      B.gate.weight   as olmoe; shared: B.shared_experts.* n_routed_experts
 *                                           (v3: B.gate.e_score_correction_bias (E), sigmoid scores)
 *
 * and, for any of them, fused expert tensors (transformers >= 5, Llama-4 style) in place of the
 * per-expert ones:  B.experts.gate_up_proj (E, 2I, d) with B.experts.down_proj (E, d, I)  ["fused"], or
 *                   B.experts.gate_up_proj (E, d, 2I) with B.experts.down_proj (E, I, d)  ["fused_t"];
 * gate is the first half of the 2I axis, up the second. The down_proj shape settles d == 2I.
 * Which layers are MoE follows the model's config (Qwen: decoder_sparse_step, mlp_only_layers;
 * DeepSeek: first_k_dense_replace, moe_layer_freq) and is checked against the tensors present.
 *
 * Letters: d = hidden_size, I = expert intermediate size, E routed experts, k experts per token,
 * T calibration tokens. Expert matrices for SSMoE are laid out (I, d): gate and up as stored, down
 * transposed (REFERENCE-NOTES, SSMoE). Dtypes F32, F16 and BF16 are read; pruning copies bytes as
 * they are, so a BF16 model stays BF16.
 */
#ifndef SPECMOE_HF_H
#define SPECMOE_HF_H

#include "specmoe/core/core.h"
#include "specmoe/io/safetensors.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    SM_HF_SPLIT = 0, /* one tensor per expert and matrix */
    SM_HF_FUSED,     /* gate_up (E, 2I, d), down (E, d, I) */
    SM_HF_FUSED_T    /* gate_up (E, d, 2I), down (E, I, d) */
} sm_hf_storage;

/* What config.json says, validated. */
typedef struct {
    char model_type[32];
    int d, inter, E, k, n_layers; /* inter: the experts' intermediate size I */
    int n_shared_rows; /* rows of the shared-expert matrices (0: none) */
    int norm_topk;     /* renormalise the k selected weights */
    int sigmoid;       /* DeepSeek-V3 scoring_func "sigmoid" */
    int n_group, topk_group;
    char expert_key[24]; /* the key holding E, rewritten by pruning */
    const char *block;   /* default MoE block name: "block_sparse_moe" or "mlp" */
    const char *w[3];    /* per-expert matrix names: gate, up, down */
    const char *shared;  /* shared-expert module name ("shared_expert" / "shared_experts") or NULL */
    unsigned char *is_moe; /* (n_layers) */
} sm_hf_config;

typedef struct {
    int layer;
    char block[96];         /* "model.layers.L.block_sparse_moe" */
    sm_hf_storage storage;
    int has_bias;           /* block.gate.e_score_correction_bias present */
} sm_hf_moe;

typedef struct {
    const char *name; /* owned by the shard header */
    int shard;
    const sm_st_tensor *t;
} sm_hf_entry;

typedef struct {
    char *dir;
    sm_hf_config cfg;
    int n_moe;
    sm_hf_moe *moe;
    int indexed;           /* model.safetensors.index.json present */
    int n_shards;
    char **shard_file;     /* file names inside dir */
    sm_safetensors *shard; /* headers only: data is read on demand */
    int n_entries;
    sm_hf_entry *entry;    /* every tensor, sorted by name */
} sm_hf_model;

/* Parses config.json text (what names it in messages). cfg must be freed with sm_hf_config_free. */
sm_status sm_hf_config_parse(sm_hf_config *cfg, const char *text, size_t n, const char *what, sm_error *err);
void sm_hf_config_free(sm_hf_config *cfg);
/* Parses model.safetensors.index.json text into n (tensor, shard file) pairs (arrays owned by the
 * caller, free with sm_hf_index_free). Shard names must be plain file names ending in .safetensors. */
sm_status sm_hf_index_parse(const char *text, size_t n, const char *what, char ***names, char ***files, int *count,
                            sm_error *err);
void sm_hf_index_free(char **names, char **files, int count);

/* Opens a model directory: config, index, every shard header; checks that each MoE layer's tensors
 * exist with the shapes config.json implies. Refusals name the tensor and the file. */
sm_status sm_hf_open(sm_hf_model *m, const char *dir, sm_error *err);
void sm_hf_close(sm_hf_model *m);
const sm_hf_entry *sm_hf_find(const sm_hf_model *m, const char *name);

/* Router of MoE layer l (index into m->moe): w (E, d). */
sm_status sm_hf_read_router(const sm_hf_model *m, int l, float *w, sm_error *err);
/* Matrix j of expert e of MoE layer l as (I, d): j = 0 gate, 1 up (as stored), 2 down transposed. */
sm_status sm_hf_read_expert(const sm_hf_model *m, int l, int e, int j, float *out, sm_error *err);
/* Bytes of one layer's routed-expert weights as stored on disk. */
size_t sm_hf_layer_expert_bytes(const sm_hf_model *m, int l);

/* SSMoE descriptors of MoE layer l: ev (E, 3, d), experts spread over the OpenMP threads; router
 * rows select the singular vectors (avg = 0) or the top-c by singular value do (avg = 1). */
sm_status sm_hf_build_ev(const sm_hf_model *m, int l, int c, int avg, const float *router, float *ev, sm_error *err);

/* dbar (E, d) = each expert's mean descriptor, from ev (E, 3, d): EV logits are x . dbar_e. */
void sm_hf_ev_mean(const float *ev, int E, int d, float *dbar);

/* Routing statistics of layer l on calibration tokens x (T, d):
 *   mean_router (E): mean learned-router probability (softmax of x W^T; sigmoid scores normalised to
 *                    sum 1 for DeepSeek-V3);
 *   mean_mix (E):    mean mixed probability alpha p_ev + (1 - alpha) p_router (p_ev = softmax of the
 *                    EV logits, an expert's mean descriptor dotted with x); NULL ev skips it;
 *   overlap:         mean fraction of a token's top-k under the mix that is also in the router's top-k
 *                    (SSMoE App. D.6); NaN without ev.
 * A logit that is not finite (float overflow) is refused with SM_ERR_NUMERIC rather than turned into
 * NaN scores. */
sm_status sm_hf_route_stats(const sm_hf_model *m, const float *router, const float *ev, const float *x, int T,
                            double alpha, double *mean_router, double *mean_mix, double *overlap, sm_error *err);

/* Calibration inputs of MoE block `block` (d wide) from a safetensors file: the tensor named after the
 * block (its input, after post_attention_layernorm), else one named "hidden_states"; (T, d), F32/F16/
 * BF16, every value finite and within +-SM_HF_CALIB_MAX (no layer-norm output comes near it, and the
 * float router logits of larger inputs can overflow). *x is malloc'd. */
#define SM_HF_CALIB_MAX 1e15
sm_status sm_hf_read_calib(const char *path, const char *block, int d, float **x, int *T, sm_error *err);
/* The same from a safetensors file already parsed in memory (sm_safetensors_parse) or opened header-only
 * (sm_safetensors_open); what names it in messages (NULL: its path). */
sm_status sm_hf_calib_from_safetensors(const sm_safetensors *f, const char *what, const char *block, int d, float **x,
                                       int *T, sm_error *err);

/* Expert groups a pruned model keeps (DeepSeek-V3 group-limited routing, n_group groups of E/n_group
 * consecutive experts): n_group when E_keep splits into equal groups of at least 2 from which
 * topk_group groups still supply k experts - the pruner must then keep E_keep/n_group per group, so
 * renumbering keeps every expert in its group; otherwise 1, and the pruned config routes ungrouped. */
int sm_hf_pruned_groups(const sm_hf_config *cfg, int E_keep);

/* Writes a copy of the model to out_dir with only the experts keep (n_moe, E_keep) of each MoE layer
 * (ascending), renumbered 0..E_keep-1: router rows, bias entries, per-expert tensors and fused slices
 * follow; every other tensor and file is copied byte for byte, a file with its source's permission bits
 * (shards, index and config.json too), a symbolic link only when it resolves inside the model directory
 * (copied as the file it points to); config.json gets the new expert count
 * (and k = min(k, E_keep); n_group = topk_group = 1 when sm_hf_pruned_groups says 1). With groups kept,
 * keep must hold E_keep / n_group experts of every group (refused otherwise). out_dir must pass
 * sm_hf_check_prune_out (new or empty, outside the model directory).
 * Streams through a fixed buffer: memory does not grow with the model. */
sm_status sm_hf_prune(const sm_hf_model *m, const int *keep, int E_keep, const char *out_dir, sm_error *err);
/* What sm_hf_prune requires before it writes anything, for a caller to check up front: out_dir a
 * directory that does not exist yet (its parent must) or is empty, and neither the model directory dir
 * nor inside it (symlinks resolved) - SM_ERR_ARG names the problem; and every file of dir that pruning
 * copies readable, with no symbolic link among them that resolves outside dir - SM_ERR_FORMAT names
 * the link and where it points. SM_ERR_IO when a path cannot be resolved or read. */
sm_status sm_hf_check_prune_out(const char *dir, const char *out_dir, sm_error *err);

#ifdef __cplusplus
}
#endif
#endif
