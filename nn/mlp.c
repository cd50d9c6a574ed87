/* The multilayer perceptron of nn.h: dense layers on cblas_sgemm with ReLU, softmax
 * cross-entropy, parameters and gradient as single flat arrays. Workspaces are sized for
 * the largest batch at creation so a training step allocates nothing. */
#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "nn.h"

struct nn_mlp {
  size_t layer_count; /* sizes, so dense layers are 1 .. layer_count - 1 */
  size_t sizes[NN_MAX_LAYERS];
  size_t weight_offset[NN_MAX_LAYERS];
  size_t bias_offset[NN_MAX_LAYERS];
  size_t parameter_count;
  size_t max_batch;
  size_t max_width;
  float *parameters;
  /* outputs[l]: layer l's output for the batch (after ReLU for hidden layers; the last holds
   * logits, then probabilities); outputs[0] is unused since the input is the caller's. */
  float *outputs[NN_MAX_LAYERS];
  /* Two max_batch x max_width buffers: the error at one layer and at the one below it. */
  float *errors[2];
};

/* Frees everything; tolerates a partly built MLP, which is how creation unwinds. */
void nn_mlp_destroy(nn_mlp *mlp) {
  if (mlp == NULL) return;
  for (size_t l = 0; l < NN_MAX_LAYERS; l++) free(mlp->outputs[l]);
  free(mlp->errors[0]);
  free(mlp->errors[1]);
  free(mlp->parameters);
  free(mlp);
}

static float *allocate_floats(size_t count) {
  if (count > SIZE_MAX / sizeof(float)) return NULL;
  return calloc(count, sizeof(float));
}

keel_status nn_mlp_create(const size_t *layer_sizes, size_t layer_count, size_t max_batch,
                          uint64_t seed, nn_mlp **mlp_p) {
  if (layer_sizes == NULL || layer_count < 2 || layer_count > NN_MAX_LAYERS || max_batch == 0)
    return KEEL_EINVAL;
  /* Bounds keep every product below in size_t and every class index in a uint8_t label. */
  const size_t max_size = (size_t)1 << 20;
  for (size_t l = 0; l < layer_count; l++) {
    if (layer_sizes[l] == 0 || layer_sizes[l] > max_size) return KEEL_EINVAL;
  }
  if (layer_sizes[layer_count - 1] > 256 || max_batch > max_size) return KEEL_EINVAL;

  nn_mlp *mlp = calloc(1, sizeof *mlp);
  if (mlp == NULL) return KEEL_ENOMEM;
  mlp->layer_count = layer_count;
  mlp->max_batch = max_batch;
  size_t offset = 0;
  for (size_t l = 0; l < layer_count; l++) {
    mlp->sizes[l] = layer_sizes[l];
    if (layer_sizes[l] > mlp->max_width) mlp->max_width = layer_sizes[l];
    if (l == 0) continue;
    mlp->weight_offset[l] = offset;
    offset += layer_sizes[l - 1] * layer_sizes[l];
    mlp->bias_offset[l] = offset;
    offset += layer_sizes[l];
  }
  mlp->parameter_count = offset;
  mlp->parameters = allocate_floats(offset);
  mlp->errors[0] = allocate_floats(max_batch * mlp->max_width);
  mlp->errors[1] = allocate_floats(max_batch * mlp->max_width);
  bool allocated = mlp->parameters && mlp->errors[0] && mlp->errors[1];
  for (size_t l = 1; l < layer_count; l++) {
    mlp->outputs[l] = allocate_floats(max_batch * layer_sizes[l]);
    allocated = allocated && mlp->outputs[l];
  }
  if (!allocated) {
    nn_mlp_destroy(mlp);
    return KEEL_ENOMEM;
  }

  keel_random random;
  keel_random_seed(&random, seed);
  for (size_t l = 1; l < layer_count; l++) {
    double bound = sqrt(6.0 / (double)layer_sizes[l - 1]);
    float *weights = mlp->parameters + mlp->weight_offset[l];
    size_t weight_count = layer_sizes[l - 1] * layer_sizes[l];
    for (size_t i = 0; i < weight_count; i++) {
      weights[i] = (float)((2.0 * keel_random_unit(&random) - 1.0) * bound);
    }
  }
  /* Threaded GEMM would split sums differently from run to run on some sizes, and several
   * workers already share the cores. */
  openblas_set_num_threads(1);
  *mlp_p = mlp;
  return KEEL_OK;
}

float *nn_mlp_parameters(nn_mlp *mlp) { return mlp->parameters; }
size_t nn_mlp_parameter_count(const nn_mlp *mlp) { return mlp->parameter_count; }
size_t nn_mlp_input_size(const nn_mlp *mlp) { return mlp->sizes[0]; }
size_t nn_mlp_class_count(const nn_mlp *mlp) { return mlp->sizes[mlp->layer_count - 1]; }
size_t nn_mlp_max_batch(const nn_mlp *mlp) { return mlp->max_batch; }

/* Runs the dense layers over count samples, leaving logits in the last output. */
static void forward(nn_mlp *mlp, const float *inputs, size_t count) {
  size_t last = mlp->layer_count - 1;
  for (size_t l = 1; l <= last; l++) {
    size_t in = mlp->sizes[l - 1], out = mlp->sizes[l];
    const float *below = l == 1 ? inputs : mlp->outputs[l - 1];
    const float *weights = mlp->parameters + mlp->weight_offset[l];
    const float *biases = mlp->parameters + mlp->bias_offset[l];
    float *output = mlp->outputs[l];
    /* Starting from the biases lets the GEMM add them (beta = 1) in the same pass. */
    for (size_t row = 0; row < count; row++)
      memcpy(output + row * out, biases, out * sizeof(float));
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)count, (int)out, (int)in, 1.0f,
                below, (int)in, weights, (int)out, 1.0f, output, (int)out);
    if (l == last) break;
    for (size_t i = 0; i < count * out; i++) {
      if (!(output[i] > 0.0f)) output[i] = 0.0f;
    }
  }
}

/* Turns each row of logits into probabilities in place and returns the summed loss.
 * Subtracting the row's log-sum-exp keeps exp from overflowing; the sum is in double so a
 * large batch's mean loss does not depend on float rounding of the running total. */
static double softmax_cross_entropy(float *logits, const uint8_t *labels, size_t count,
                                    size_t classes) {
  double total = 0.0;
  for (size_t row = 0; row < count; row++) {
    float *row_logits = logits + row * classes;
    float largest = row_logits[0];
    for (size_t c = 1; c < classes; c++) {
      if (row_logits[c] > largest) largest = row_logits[c];
    }
    double sum = 0.0;
    for (size_t c = 0; c < classes; c++) sum += exp((double)(row_logits[c] - largest));
    double log_sum = (double)largest + log(sum);
    total += log_sum - (double)row_logits[labels[row]];
    for (size_t c = 0; c < classes; c++) {
      row_logits[c] = (float)exp((double)row_logits[c] - log_sum);
    }
  }
  return total;
}

static bool labels_valid(const nn_mlp *mlp, const uint8_t *labels, size_t count) {
  size_t classes = nn_mlp_class_count(mlp);
  for (size_t i = 0; i < count; i++) {
    if (labels[i] >= classes) return false;
  }
  return true;
}

keel_status nn_mlp_loss(nn_mlp *mlp, const float *inputs, const uint8_t *labels, size_t count,
                        double *loss_p) {
  if (count > mlp->max_batch || !labels_valid(mlp, labels, count)) return KEEL_EINVAL;
  if (count == 0) {
    *loss_p = 0.0;
    return KEEL_OK;
  }
  forward(mlp, inputs, count);
  double total = softmax_cross_entropy(mlp->outputs[mlp->layer_count - 1], labels, count,
                                       nn_mlp_class_count(mlp));
  *loss_p = total / (double)count;
  return KEEL_OK;
}

keel_status nn_mlp_gradient(nn_mlp *mlp, const float *inputs, const uint8_t *labels, size_t count,
                            nn_reduction reduction, float *gradient, double *loss_p) {
  if (count > mlp->max_batch || !labels_valid(mlp, labels, count)) return KEEL_EINVAL;
  if (count == 0) {
    /* GEMM with an empty inner dimension is not something every BLAS handles alike. */
    memset(gradient, 0, mlp->parameter_count * sizeof(float));
    *loss_p = 0.0;
    return KEEL_OK;
  }
  size_t last = mlp->layer_count - 1, classes = mlp->sizes[last];
  forward(mlp, inputs, count);
  float *probabilities = mlp->outputs[last];
  double total = softmax_cross_entropy(probabilities, labels, count, classes);

  /* The loss gradient at the logits is (softmax - one-hot), scaled here once so that every
   * layer below inherits the reduction. */
  float scale = reduction == NN_MEAN ? 1.0f / (float)count : 1.0f;
  float *error = mlp->errors[0], *error_below = mlp->errors[1];
  for (size_t row = 0; row < count; row++) {
    for (size_t c = 0; c < classes; c++) {
      float target = c == labels[row] ? 1.0f : 0.0f;
      error[row * classes + c] = (probabilities[row * classes + c] - target) * scale;
    }
  }
  for (size_t l = last; l >= 1; l--) {
    size_t in = mlp->sizes[l - 1], out = mlp->sizes[l];
    const float *below = l == 1 ? inputs : mlp->outputs[l - 1];
    const float *weights = mlp->parameters + mlp->weight_offset[l];
    float *weight_gradient = gradient + mlp->weight_offset[l];
    float *bias_gradient = gradient + mlp->bias_offset[l];
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)in, (int)out, (int)count, 1.0f, below,
                (int)in, error, (int)out, 0.0f, weight_gradient, (int)out);
    memset(bias_gradient, 0, out * sizeof(float));
    for (size_t row = 0; row < count; row++) {
      for (size_t c = 0; c < out; c++) bias_gradient[c] += error[row * out + c];
    }
    if (l == 1) break;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)count, (int)in, (int)out, 1.0f, error,
                (int)out, weights, (int)out, 0.0f, error_below, (int)in);
    /* ReLU passes the error only where it passed the signal. */
    for (size_t i = 0; i < count * in; i++) {
      if (!(below[i] > 0.0f)) error_below[i] = 0.0f;
    }
    float *swap = error;
    error = error_below;
    error_below = swap;
  }
  *loss_p = total / (double)count;
  return KEEL_OK;
}

keel_status nn_mlp_predict(nn_mlp *mlp, const float *inputs, size_t count, uint8_t *classes) {
  if (count > mlp->max_batch) return KEEL_EINVAL;
  if (count == 0) return KEEL_OK;
  forward(mlp, inputs, count);
  size_t class_count = nn_mlp_class_count(mlp);
  const float *logits = mlp->outputs[mlp->layer_count - 1];
  for (size_t row = 0; row < count; row++) {
    const float *row_logits = logits + row * class_count;
    size_t best = 0;
    for (size_t c = 1; c < class_count; c++) {
      if (row_logits[c] > row_logits[best]) best = c;
    }
    classes[row] = (uint8_t)best;
  }
  return KEEL_OK;
}

keel_status nn_mlp_accuracy(nn_mlp *mlp, const nn_dataset *dataset, double *accuracy_p) {
  if (dataset->image_size != nn_mlp_input_size(mlp)) return KEEL_EINVAL;
  if (dataset->count == 0) {
    *accuracy_p = 0.0;
    return KEEL_OK;
  }
  size_t batch = mlp->max_batch;
  float *images = allocate_floats(batch * dataset->image_size);
  uint8_t *labels = malloc(batch * 2);
  if (images == NULL || labels == NULL) {
    free(images);
    free(labels);
    return KEEL_ENOMEM;
  }
  uint8_t *predicted = labels + batch;
  size_t correct = 0;
  for (size_t first = 0; first < dataset->count; first += batch) {
    size_t count = dataset->count - first < batch ? dataset->count - first : batch;
    nn_dataset_copy_range(dataset, first, count, images, labels);
    nn_mlp_predict(mlp, images, count, predicted);
    for (size_t i = 0; i < count; i++) correct += predicted[i] == labels[i];
  }
  free(images);
  free(labels);
  *accuracy_p = (double)correct / (double)dataset->count;
  return KEEL_OK;
}
