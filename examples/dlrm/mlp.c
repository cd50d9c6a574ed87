/* Dense layers of mlp.h: output = input . W + b on cblas_sgemm, ReLU between layers, and
 * the backward pass down to the input. GEMM in one thread is deterministic; with more
 * OpenBLAS threads it is deterministic for a given thread count. */
#include "mlp.h"

#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "keel/ec.h"

static float *allocate_floats(size_t count) { return calloc(count ? count : 1, sizeof(float)); }

void dlrm_mlp_release(dlrm_mlp *mlp) {
  for (size_t l = 0; l <= DLRM_MAX_LAYERS; l++) free(mlp->outputs[l]);
  free(mlp->errors[0]);
  free(mlp->errors[1]);
  memset(mlp, 0, sizeof *mlp);
}

keel_status dlrm_mlp_init(dlrm_mlp *mlp, size_t input_width, const size_t *widths,
                          size_t layer_count, bool relu_last, size_t offset, size_t first_layer,
                          size_t max_batch) {
  memset(mlp, 0, sizeof *mlp);
  if (layer_count == 0 || layer_count > DLRM_MAX_LAYERS || max_batch == 0) return KEEL_EINVAL;
  mlp->layer_count = layer_count;
  mlp->relu_last = relu_last;
  mlp->first_layer = first_layer;
  mlp->max_batch = max_batch;
  mlp->widths[0] = input_width;
  size_t widest_error = 1;
  for (size_t l = 1; l <= layer_count; l++) {
    size_t width = widths[l - 1];
    if (width == 0 || width > DLRM_MAX_WIDTH) return KEEL_EINVAL;
    mlp->widths[l] = width;
    /* Errors are kept at every width but the input's, which goes to the caller. */
    if (width > widest_error) widest_error = width;
  }
  for (size_t l = 1; l <= layer_count; l++) {
    size_t in = mlp->widths[l - 1];
    if (in == 0 || in > KEEL_EC_ROW_MAX_DIM / mlp->widths[l]) return KEEL_EINVAL;
  }
  for (size_t l = 1; l <= layer_count; l++) {
    mlp->weight_offset[l] = offset;
    offset += mlp->widths[l - 1] * mlp->widths[l];
    mlp->bias_offset[l] = offset;
    offset += mlp->widths[l];
  }
  mlp->end_offset = offset;
  bool allocated = true;
  for (size_t l = 1; l <= layer_count; l++) {
    mlp->outputs[l] = allocate_floats(max_batch * mlp->widths[l]);
    allocated = allocated && mlp->outputs[l] != NULL;
  }
  mlp->errors[0] = allocate_floats(max_batch * widest_error);
  mlp->errors[1] = allocate_floats(max_batch * widest_error);
  if (!allocated || mlp->errors[0] == NULL || mlp->errors[1] == NULL) {
    dlrm_mlp_release(mlp);
    return KEEL_ENOMEM;
  }
  return KEEL_OK;
}

void dlrm_mlp_initial(const dlrm_mlp *mlp, uint64_t seed, float *parameters) {
  for (size_t l = 1; l <= mlp->layer_count; l++) {
    size_t in = mlp->widths[l - 1], out = mlp->widths[l];
    float bound = sqrtf(6.0f / (float)(in + out));
    uint64_t layer_seed = keel_random_seed_for(seed, mlp->first_layer + l - 1, 1);
    /* Cannot fail: init checked in * out <= KEEL_EC_ROW_MAX_DIM, and the bound is finite. */
    keel_ec_row_initial(layer_seed, 0, (int)(in * out), bound, parameters + mlp->weight_offset[l]);
    memset(parameters + mlp->bias_offset[l], 0, out * sizeof(float));
  }
}

static void relu(float *values, size_t count) {
  for (size_t i = 0; i < count; i++) {
    if (!(values[i] > 0.0f)) values[i] = 0.0f;
  }
}

/* ReLU passes the error only where it passed the signal. */
static void relu_backward(const float *output, float *error, size_t count) {
  for (size_t i = 0; i < count; i++) {
    if (!(output[i] > 0.0f)) error[i] = 0.0f;
  }
}

const float *dlrm_mlp_forward(dlrm_mlp *mlp, const float *parameters, const float *input,
                              size_t count) {
  size_t last = mlp->layer_count;
  for (size_t l = 1; l <= last; l++) {
    size_t in = mlp->widths[l - 1], out = mlp->widths[l];
    const float *below = l == 1 ? input : mlp->outputs[l - 1];
    float *output = mlp->outputs[l];
    /* Starting from the biases lets the GEMM add them (beta = 1) in the same pass. */
    for (size_t row = 0; row < count; row++)
      memcpy(output + row * out, parameters + mlp->bias_offset[l], out * sizeof(float));
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)count, (int)out, (int)in, 1.0f,
                below, (int)in, parameters + mlp->weight_offset[l], (int)out, 1.0f, output,
                (int)out);
    if (l < last || mlp->relu_last) relu(output, count * out);
  }
  return mlp->outputs[last];
}

void dlrm_mlp_backward(dlrm_mlp *mlp, const float *parameters, const float *input,
                       float *output_error, size_t count, float *gradient, float *input_error) {
  size_t last = mlp->layer_count;
  if (mlp->relu_last) relu_backward(mlp->outputs[last], output_error, count * mlp->widths[last]);
  float *error = output_error;
  for (size_t l = last; l >= 1; l--) {
    size_t in = mlp->widths[l - 1], out = mlp->widths[l];
    const float *below = l == 1 ? input : mlp->outputs[l - 1];
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)in, (int)out, (int)count, 1.0f, below,
                (int)in, error, (int)out, 0.0f, gradient + mlp->weight_offset[l], (int)out);
    float *bias_gradient = gradient + mlp->bias_offset[l];
    memset(bias_gradient, 0, out * sizeof(float));
    for (size_t row = 0; row < count; row++) {
      for (size_t c = 0; c < out; c++) bias_gradient[c] += error[row * out + c];
    }
    float *error_below = l == 1 ? input_error : mlp->errors[l % 2];
    if (error_below == NULL) break;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)count, (int)in, (int)out, 1.0f, error,
                (int)out, parameters + mlp->weight_offset[l], (int)out, 0.0f, error_below, (int)in);
    if (l > 1) relu_backward(below, error_below, count * in);
    error = error_below;
  }
}
