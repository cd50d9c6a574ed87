/* The two MLPs of the DLRM example: dense layers on cblas_sgemm whose parameters live in
 * the caller's flat dense vector (the parameter backend owns them), with the gradient of
 * the input as well, which the interaction below the top MLP needs. */
#ifndef DLRM_MLP_H
#define DLRM_MLP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "keel/core.h"

#define DLRM_MAX_LAYERS 8
#define DLRM_MAX_WIDTH 4096

/* Layer l (1 .. layer_count) maps widths[l-1] inputs to widths[l] outputs. Its parameters,
 * at the offsets below in the dense vector: the weights as a row-major
 * [widths[l-1]][widths[l]] matrix (input index major), then widths[l] biases. ReLU follows
 * every layer but the last, and the last too when relu_last. */
typedef struct dlrm_mlp {
  size_t layer_count;
  size_t widths[DLRM_MAX_LAYERS + 1];
  size_t weight_offset[DLRM_MAX_LAYERS + 1];
  size_t bias_offset[DLRM_MAX_LAYERS + 1];
  size_t end_offset;  /* one past its last parameter */
  size_t first_layer; /* its first layer's index among all layers, for initialisation */
  bool relu_last;
  size_t max_batch;
  float *outputs[DLRM_MAX_LAYERS + 1]; /* [l], l >= 1: layer l's output for the batch */
  float *errors[2];                    /* the loss gradient at one layer and the next below */
} dlrm_mlp;

/* Lays the MLP out from dense offset `offset` on (input width, then layer_count output
 * widths, each 1 .. DLRM_MAX_WIDTH, layer_count 1 .. DLRM_MAX_LAYERS) and allocates its
 * workspaces for batches of up to max_batch samples, so that forward and backward allocate
 * nothing. KEEL_EINVAL for sizes out of range, or a layer of more than KEEL_EC_ROW_MAX_DIM
 * weights (each is made by one keel_ec_row_initial); KEEL_ENOMEM; on failure *mlp holds
 * nothing to release. */
keel_status dlrm_mlp_init(dlrm_mlp *mlp, size_t input_width, const size_t *widths,
                          size_t layer_count, bool relu_last, size_t offset, size_t first_layer,
                          size_t max_batch);
/* Frees the workspaces; a zeroed dlrm_mlp is fine. */
void dlrm_mlp_release(dlrm_mlp *mlp);

/* Writes the MLP's initial parameters into its part of the dense vector: layer l's weights
 * are keel_ec_row_initial(keel_random_seed_for(seed, first_layer + l - 1, 1), 0, in * out,
 * sqrt(6 / (in + out))), uniform (Glorot); its biases are 0. */
void dlrm_mlp_initial(const dlrm_mlp *mlp, uint64_t seed, float *parameters);

/* Runs count (1 .. max_batch) samples of input (count x widths[0]) through the layers;
 * returns the last output (count x widths[layer_count]), owned by the MLP, valid until the
 * next forward. */
const float *dlrm_mlp_forward(dlrm_mlp *mlp, const float *parameters, const float *input,
                              size_t count);

/* After a forward of the same input: output_error is the loss gradient at the last output
 * (count x widths[layer_count], overwritten). Writes the MLP's part of gradient (weights
 * and biases, summed over the samples) and, when input_error is not NULL, the gradient at
 * the input (count x widths[0]). */
void dlrm_mlp_backward(dlrm_mlp *mlp, const float *parameters, const float *input,
                       float *output_error, size_t count, float *gradient, float *input_error);

#endif
