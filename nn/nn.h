/* keel nn: a small deterministic neural-network kit for the examples: a multilayer
 * perceptron whose parameters and gradient are each one flat float array (the runtime
 * allreduces and checkpoints them as plain buffers), SGD/Adam on flat arrays, the MNIST IDX
 * loader and the step-indexed data sharding of data-parallel training. Uses OpenBLAS, zlib
 * and keel/core.h (status codes, keel_random, keel_crc32c) only; keel never depends on it. */
#ifndef KEEL_NN_H
#define KEEL_NN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "keel/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- multilayer perceptron: dense layers with ReLU between them, softmax cross-entropy on
 * the last. Parameter layout in the flat array, layer by layer (l = 1 .. layer_count-1):
 * weights as a row-major [sizes[l-1]][sizes[l]] matrix (input index major), then sizes[l]
 * biases. The gradient array has the same length and layout. */
#define NN_MAX_LAYERS 8

typedef struct nn_mlp nn_mlp;

/* How nn_mlp_gradient combines the per-sample gradients of a batch. NN_SUM is what
 * data-parallel training sends: ranks add their sums and divide once by the global count,
 * so the math does not depend on how the global batch is split. */
typedef enum nn_reduction {
  NN_MEAN = 0,
  NN_SUM = 1,
} nn_reduction;

/* Creates an MLP with layer_sizes[0] inputs, layer_sizes[layer_count-1] classes and the
 * sizes between as hidden widths (layer_count in 2 .. NN_MAX_LAYERS; no size 0). Weights are
 * He-uniform (U(-a, a), a = sqrt(6 / fan_in): the variance 2 / fan_in of He init, drawn with
 * no transcendental function so it is bit-identical everywhere) from keel_random seeded with
 * seed; biases are zero. Workspaces for batches of up to max_batch samples are allocated
 * here, so the training calls allocate nothing. Sets OpenBLAS to one thread (process-wide):
 * results are then deterministic and N workers do not oversubscribe the cores.
 * Returns KEEL_EINVAL on bad sizes, KEEL_ENOMEM; *mlp_p is set only on success, and the
 * caller ends it with nn_mlp_destroy. */
keel_status nn_mlp_create(const size_t *layer_sizes, size_t layer_count, size_t max_batch,
                          uint64_t seed, nn_mlp **mlp_p);
/* Frees the MLP and its parameters; NULL is allowed. */
void nn_mlp_destroy(nn_mlp *mlp);

/* The flat parameter array (owned by the MLP, nn_mlp_parameter_count floats). The caller may
 * read and write it (an optimizer step, a restored checkpoint) between calls. */
float *nn_mlp_parameters(nn_mlp *mlp);
size_t nn_mlp_parameter_count(const nn_mlp *mlp);
size_t nn_mlp_input_size(const nn_mlp *mlp);
size_t nn_mlp_class_count(const nn_mlp *mlp);
size_t nn_mlp_max_batch(const nn_mlp *mlp);

/* Forward and backward pass over count samples (inputs: count x input_size floats, row-major;
 * labels: count class indices). Writes into gradient (nn_mlp_parameter_count floats, not
 * aliasing the parameters) the mean (NN_MEAN) or the sum (NN_SUM) over the batch of the
 * per-sample gradients of the cross-entropy loss, and into *loss_p the mean loss (0 for an
 * empty batch, whose gradient is all zeros). Allocates nothing; deterministic for a given
 * count. KEEL_EINVAL if count > max_batch or a label is not a class, with nothing written. */
keel_status nn_mlp_gradient(nn_mlp *mlp, const float *inputs, const uint8_t *labels, size_t count,
                            nn_reduction reduction, float *gradient, double *loss_p);

/* Forward pass only: the mean cross-entropy loss of count samples (count <= max_batch),
 * for validation and gradient checks. KEEL_EINVAL as nn_mlp_gradient. */
keel_status nn_mlp_loss(nn_mlp *mlp, const float *inputs, const uint8_t *labels, size_t count,
                        double *loss_p);

/* Writes the predicted class (the first largest logit) of each of count samples
 * (count <= max_batch) into classes. */
keel_status nn_mlp_predict(nn_mlp *mlp, const float *inputs, size_t count, uint8_t *classes);

/* ---- optimizers on flat arrays. Their state is a few plain buffers (nn_optimizer_state) so
 * the runtime can register, send and checkpoint it like the parameters. Deterministic:
 * element-wise float arithmetic in a fixed order. */
typedef enum nn_optimizer_kind {
  NN_OPTIMIZER_SGD = 0,  /* with momentum: v = momentum * v + g; p -= learning_rate * v */
  NN_OPTIMIZER_ADAM = 1, /* Kingma and Ba, with bias correction (PyTorch's form) */
} nn_optimizer_kind;

typedef struct nn_optimizer_config {
  nn_optimizer_kind kind;
  float learning_rate;
  float momentum;              /* SGD */
  float beta1, beta2, epsilon; /* Adam */
} nn_optimizer_config;

/* The usual settings for kind: momentum 0.9; beta1 0.9, beta2 0.999, epsilon 1e-8. */
nn_optimizer_config nn_optimizer_defaults(nn_optimizer_kind kind, float learning_rate);

/* One buffer of optimizer state: a stable name for keel_state_register, and its memory,
 * owned by the optimizer. */
typedef struct nn_state_buffer {
  const char *name;
  void *data;
  size_t bytes;
} nn_state_buffer;

typedef struct nn_optimizer nn_optimizer;

/* Creates an optimizer for parameter_count parameters with zeroed state. KEEL_EINVAL on a
 * bad config (learning rate not positive and finite, momentum or betas outside [0, 1)),
 * KEEL_ENOMEM; the caller ends it with nn_optimizer_destroy. */
keel_status nn_optimizer_create(const nn_optimizer_config *config, size_t parameter_count,
                                nn_optimizer **optimizer_p);
/* Frees the optimizer and its state; NULL is allowed. */
void nn_optimizer_destroy(nn_optimizer *optimizer);
/* Applies one update to parameters with gradient (both parameter_count floats). */
void nn_optimizer_step(nn_optimizer *optimizer, float *parameters, const float *gradient);
/* Changes the learning rate from the next step on, for a schedule that is a function of
 * the step (so a recovered run follows it exactly); KEEL_EINVAL unless positive and finite. */
keel_status nn_optimizer_set_learning_rate(nn_optimizer *optimizer, float learning_rate);
/* Number of state buffers (SGD: "optimizer.velocity"; Adam: "optimizer.m", "optimizer.v",
 * "optimizer.step" a uint64_t) and each of them by index, in a fixed order. */
size_t nn_optimizer_state_count(const nn_optimizer *optimizer);
nn_state_buffer nn_optimizer_state(nn_optimizer *optimizer, size_t index);

/* ---- datasets in the IDX format of MNIST and Fashion-MNIST, gzip-compressed or not. */
#define NN_FASHION_MNIST_DIRECTORY "/usr/share/datasets/fashion-mnist"
#define NN_MNIST_CLASSES 10

/* Images stay bytes as in the file (a quarter of the memory of floats, which matters with
 * several workers on one machine); nn_dataset_gather turns them into floats in [0, 1]. */
typedef struct nn_dataset {
  uint8_t *pixels; /* count x image_size, row-major */
  uint8_t *labels; /* count, each < NN_MNIST_CLASSES */
  size_t count;
  size_t rows, columns, image_size;
} nn_dataset;

typedef enum nn_split {
  NN_TRAIN = 0,
  NN_TEST = 1,
} nn_split;

/* Reads an IDX image file (magic 0x00000803) and its label file (0x00000801) through zlib,
 * checking magic numbers, dimensions (bounded before anything is allocated), that the
 * counts agree, that every label is < NN_MNIST_CLASSES, and that each file ends exactly
 * where its header says (which also makes zlib verify the gzip checksum). On error, returns
 * KEEL_ENOTFOUND (a file is missing), KEEL_EIO, KEEL_ECORRUPT (truncated, malformed) or
 * KEEL_ENOMEM, writes a one-line explanation naming the file into message (capacity bytes;
 * may be NULL), and leaves *dataset untouched. On success the caller owns *dataset and frees
 * it with nn_dataset_free. Blocks on file I/O. */
keel_status nn_dataset_load_idx(const char *images_path, const char *labels_path,
                                nn_dataset *dataset, char *message, size_t capacity);
/* Loads the train or test split of (Fashion-)MNIST from directory (NULL:
 * NN_FASHION_MNIST_DIRECTORY) under the standard file names (train-images-idx3-ubyte.gz,
 * t10k-labels-idx1-ubyte.gz, ...). A missing file's message names the Debian package
 * dataset-fashion-mnist. Otherwise as nn_dataset_load_idx. */
keel_status nn_dataset_load_mnist(const char *directory, nn_split split, nn_dataset *dataset,
                                  char *message, size_t capacity);
/* Frees what a load allocated and zeroes *dataset; a zeroed dataset is allowed. */
void nn_dataset_free(nn_dataset *dataset);
/* Copies samples indices[0 .. count) into images (count x image_size floats, pixel / 255)
 * and labels (count bytes). Every index must be < dataset->count. Allocates nothing. */
void nn_dataset_gather(const nn_dataset *dataset, const uint32_t *indices, size_t count,
                       float *images, uint8_t *labels);
/* Same for the contiguous samples first .. first + count - 1. */
void nn_dataset_copy_range(const nn_dataset *dataset, size_t first, size_t count, float *images,
                           uint8_t *labels);

/* Fraction of the dataset the MLP classifies right, in batches of its max_batch (allocates
 * one batch of floats for the call; KEEL_ENOMEM). KEEL_EINVAL if the image size is not the
 * MLP's input size. An empty dataset has accuracy 0. */
keel_status nn_mlp_accuracy(nn_mlp *mlp, const nn_dataset *dataset, double *accuracy_p);

/* ---- deterministic data sharding for data-parallel training. Epoch e visits the dataset
 * in a permutation that is a function of (seed, e); the epochs' permutations laid end to
 * end form one stream, and step s uses positions [s * B, (s + 1) * B) of it (B the global
 * batch). Rank r of a world of w takes a contiguous slice of those B positions. So which
 * samples a step uses depends on the step alone, every sample of the global batch is used
 * whatever the world size, and a world that shrinks mid-run keeps the same data order. */

/* The slice of a global batch that rank takes: *count_p samples from *offset_p. The first
 * global_batch % world ranks take one more than the others, so the slices cover the batch
 * exactly. KEEL_EINVAL unless 0 <= rank < world. */
keel_status nn_shard_split(size_t global_batch, int rank, int world, size_t *offset_p,
                           size_t *count_p);

typedef struct nn_sampler nn_sampler;

/* Creates the sampler of a dataset of dataset_size samples (1 .. UINT32_MAX) for seed.
 * KEEL_EINVAL, KEEL_ENOMEM; the caller ends it with nn_sampler_destroy. */
keel_status nn_sampler_create(size_t dataset_size, uint64_t seed, nn_sampler **sampler_p);
/* Frees the sampler; NULL is allowed. */
void nn_sampler_destroy(nn_sampler *sampler);
/* Writes the dataset indices rank takes at step (see above) into indices (capacity entries)
 * and their number into *count_p. The result is a function of (seed, dataset size, step,
 * rank, world, global_batch) only: the sampler caches the last two epochs' permutations,
 * which changes nothing but the speed. KEEL_EINVAL on a bad rank or world, KEEL_ERANGE if
 * capacity is too small or the position overflows; allocates nothing. */
keel_status nn_sampler_indices(nn_sampler *sampler, uint64_t step, int rank, int world,
                               size_t global_batch, uint32_t *indices, size_t capacity,
                               size_t *count_p);

#ifdef __cplusplus
}
#endif
#endif
