/* The DLRM of Naumov et al. (2019): a bottom MLP over the dense features, one embedding bag
 * (sum of `hotness` rows) per table, the pairwise dot products of those T + 1 vectors, and a
 * top MLP over [bottom output, dot products] to one click logit, with its full backward
 * pass. The model owns only workspaces: the dense parameters and the rows are the caller's,
 * pulled from a parameter backend (params.h). */
#ifndef DLRM_MODEL_H
#define DLRM_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "batch.h"
#include "mlp.h"

typedef struct dlrm_shape {
  size_t table_count;    /* T */
  size_t dim;            /* embedding width; the bottom MLP's last width */
  size_t dense_features; /* D */
  size_t hotness;
  size_t bottom[DLRM_MAX_LAYERS]; /* output widths; bottom[bottom_count - 1] == dim */
  size_t bottom_count;
  size_t top[DLRM_MAX_LAYERS]; /* output widths; top[top_count - 1] == 1 */
  size_t top_count;
} dlrm_shape;

typedef struct dlrm_model dlrm_model;

/* Makes the workspaces of a model of this shape for batches of up to max_batch samples.
 * KEEL_EINVAL (the bottom MLP must end in dim, the top in 1; sizes as mlp.h), KEEL_ENOMEM;
 * *model_p set only on success; the caller ends it with dlrm_model_destroy. */
keel_status dlrm_model_create(const dlrm_shape *shape, size_t max_batch, dlrm_model **model_p);
void dlrm_model_destroy(dlrm_model *model);

/* The dense parameters, one flat vector: the bottom MLP's layers then the top MLP's, each
 * layer its weights ([in][out], row-major) then its biases. */
size_t dlrm_model_dense_count(const dlrm_model *model);
/* Their initial values from seed (dlrm_mlp_initial; layers numbered bottom first). */
void dlrm_model_dense_initial(const dlrm_model *model, uint64_t seed, float *parameters);

/* The click logits of batch's samples (batch->count of them, 1 .. max_batch), from the dense
 * parameters and batch->row_values. Allocates nothing. KEEL_EINVAL for a bad count. */
keel_status dlrm_model_forward(dlrm_model *model, const float *parameters, const dlrm_batch *batch,
                               float *logits);

/* Forward and backward over the batch: *loss_p is the mean binary cross-entropy of the
 * logits against batch->labels; dense_gradient (dense count values) and batch->row_gradients
 * (row_count x dim) are the gradient of scale x the summed loss, the rows' summed over every
 * occurrence in the batch. scale = 1 / count gives the mean's gradient; 1 / (count x
 * workers) makes the workers' gradients add up to the global batch's mean, as synchronous
 * servers add them. Allocates nothing; deterministic for a given OpenBLAS thread count.
 * KEEL_EINVAL for a bad count. */
keel_status dlrm_model_gradient(dlrm_model *model, const float *parameters, dlrm_batch *batch,
                                float scale, float *dense_gradient, double *loss_p);

#endif
