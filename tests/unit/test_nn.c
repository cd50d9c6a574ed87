/* Unit tests of the nn kit: the MLP's gradient against finite differences of a plain double
 * twin of its forward pass, bit-for-bit determinism, the optimizers' arithmetic, the data
 * sharding's coverage, the IDX loader on good and damaged files, and a real training run. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#include <cmocka.h>

#include "nn.h"
#include "test_support.h"

/* ---- helpers */

static void fill_uniform(keel_random *random, float *values, size_t count, double low,
                         double high) {
  for (size_t i = 0; i < count; i++) {
    values[i] = (float)(low + (high - low) * keel_random_unit(random));
  }
}

static nn_mlp *make_mlp(const size_t *sizes, size_t layer_count, size_t max_batch, uint64_t seed) {
  nn_mlp *mlp = NULL;
  assert_int_equal(nn_mlp_create(sizes, layer_count, max_batch, seed, &mlp), KEEL_OK);
  assert_non_null(mlp);
  return mlp;
}

/* The MLP's mean loss computed in double straight from the documented parameter layout: the
 * reference the float implementation is checked against. */
static double reference_loss(const size_t *sizes, size_t layer_count, const double *parameters,
                             const float *inputs, const uint8_t *labels, size_t count) {
  double total = 0.0;
  double activation[2][64];
  for (size_t row = 0; row < count; row++) {
    for (size_t i = 0; i < sizes[0]; i++) activation[0][i] = inputs[row * sizes[0] + i];
    size_t offset = 0, current = 0;
    for (size_t l = 1; l < layer_count; l++) {
      size_t in = sizes[l - 1], out = sizes[l];
      const double *weights = parameters + offset, *biases = weights + in * out;
      double *next = activation[1 - current];
      for (size_t j = 0; j < out; j++) {
        double sum = biases[j];
        for (size_t i = 0; i < in; i++) sum += activation[current][i] * weights[i * out + j];
        next[j] = (l + 1 < layer_count && sum < 0.0) ? 0.0 : sum;
      }
      offset += in * out + out;
      current = 1 - current;
    }
    size_t classes = sizes[layer_count - 1];
    double largest = activation[current][0], sum = 0.0;
    for (size_t c = 1; c < classes; c++) {
      if (activation[current][c] > largest) largest = activation[current][c];
    }
    for (size_t c = 0; c < classes; c++) sum += exp(activation[current][c] - largest);
    total += largest + log(sum) - activation[current][labels[row]];
  }
  return total / (double)count;
}

/* ---- MLP */

static void test_mlp_gradient_matches_finite_differences(void **state) {
  (void)state;
  const size_t sizes[] = {6, 5, 4, 3};
  const size_t layers = 4, count = 5;
  nn_mlp *mlp = make_mlp(sizes, layers, 8, 11);
  size_t parameter_count = nn_mlp_parameter_count(mlp);
  assert_int_equal(parameter_count, 6 * 5 + 5 + 5 * 4 + 4 + 4 * 3 + 3);
  assert_true(parameter_count <= 128);
  float *parameters = nn_mlp_parameters(mlp);
  keel_random random;
  keel_random_seed(&random, 5);
  /* Non-zero biases, so the bias gradients are exercised away from the initial point. */
  fill_uniform(&random, parameters, parameter_count, -0.5, 0.5);
  float inputs[5 * 6];
  fill_uniform(&random, inputs, 5 * 6, -1.0, 1.0);
  const uint8_t labels[5] = {0, 2, 1, 2, 0};

  float gradient[128], sum_gradient[128];
  double loss = 0.0, sum_loss = 0.0;
  assert_int_equal(nn_mlp_gradient(mlp, inputs, labels, count, NN_MEAN, gradient, &loss), KEEL_OK);
  assert_int_equal(nn_mlp_gradient(mlp, inputs, labels, count, NN_SUM, sum_gradient, &sum_loss),
                   KEEL_OK);
  assert_true(sum_loss == loss);

  double reference[128];
  for (size_t i = 0; i < parameter_count; i++) reference[i] = parameters[i];
  double exact = reference_loss(sizes, layers, reference, inputs, labels, count);
  assert_true(fabs(exact - loss) < 1e-5 * (1.0 + fabs(exact)));
  double forward_only = 0.0;
  assert_int_equal(nn_mlp_loss(mlp, inputs, labels, count, &forward_only), KEEL_OK);
  assert_true(forward_only == loss);

  /* Central differences in double are accurate to ~1e-10, so the tolerance is the float
   * rounding of the analytic gradient: ~1e-6 relative to the terms summed. */
  const double step = 1e-6;
  for (size_t i = 0; i < parameter_count; i++) {
    double saved = reference[i];
    reference[i] = saved + step;
    double above = reference_loss(sizes, layers, reference, inputs, labels, count);
    reference[i] = saved - step;
    double below = reference_loss(sizes, layers, reference, inputs, labels, count);
    reference[i] = saved;
    double numeric = (above - below) / (2.0 * step);
    if (fabs(numeric - gradient[i]) > 2e-5 + 1e-3 * fabs(numeric)) {
      fail_msg("parameter %zu: analytic %.8g, numeric %.8g", i, (double)gradient[i], numeric);
    }
    double summed = (double)sum_gradient[i] / (double)count;
    assert_true(fabs(summed - gradient[i]) <= 1e-6 + 1e-5 * fabs(summed));
  }

  /* The same check through the float forward pass itself: a larger step, because float loss
   * values carry only ~7 digits, and a tolerance to match. */
  const float float_step = 1e-2f;
  for (size_t i = 0; i < parameter_count; i++) {
    float saved = parameters[i];
    double above, below;
    parameters[i] = saved + float_step;
    assert_int_equal(nn_mlp_loss(mlp, inputs, labels, count, &above), KEEL_OK);
    parameters[i] = saved - float_step;
    assert_int_equal(nn_mlp_loss(mlp, inputs, labels, count, &below), KEEL_OK);
    parameters[i] = saved;
    double numeric = (above - below) / (2.0 * (double)float_step);
    assert_true(fabs(numeric - gradient[i]) < 2e-3 + 2e-2 * fabs(numeric));
  }
  nn_mlp_destroy(mlp);
}

static void test_mlp_arguments(void **state) {
  (void)state;
  nn_mlp *mlp = NULL;
  const size_t one[] = {4};
  const size_t zero_width[] = {4, 0, 2};
  const size_t sizes[] = {4, 3, 2};
  assert_int_equal(nn_mlp_create(one, 1, 4, 1, &mlp), KEEL_EINVAL);
  assert_int_equal(nn_mlp_create(zero_width, 3, 4, 1, &mlp), KEEL_EINVAL);
  assert_int_equal(nn_mlp_create(sizes, 3, 0, 1, &mlp), KEEL_EINVAL);
  assert_null(mlp);
  mlp = make_mlp(sizes, 3, 4, 1);
  assert_int_equal(nn_mlp_input_size(mlp), 4);
  assert_int_equal(nn_mlp_class_count(mlp), 2);
  assert_int_equal(nn_mlp_max_batch(mlp), 4);

  float inputs[5 * 4] = {0};
  uint8_t labels[5] = {0, 1, 0, 1, 0};
  float gradient[32];
  double loss = -1.0;
  assert_int_equal(nn_mlp_gradient(mlp, inputs, labels, 5, NN_MEAN, gradient, &loss), KEEL_EINVAL);
  labels[1] = 2;
  assert_int_equal(nn_mlp_gradient(mlp, inputs, labels, 2, NN_MEAN, gradient, &loss), KEEL_EINVAL);
  assert_true(loss == -1.0);
  /* An empty batch is a rank whose slice of a small global batch is empty. */
  for (size_t i = 0; i < 32; i++) gradient[i] = 1.0f;
  assert_int_equal(nn_mlp_gradient(mlp, inputs, labels, 0, NN_SUM, gradient, &loss), KEEL_OK);
  assert_true(loss == 0.0);
  for (size_t i = 0; i < nn_mlp_parameter_count(mlp); i++) assert_true(gradient[i] == 0.0f);
  uint8_t predicted[4];
  assert_int_equal(nn_mlp_predict(mlp, inputs, 5, predicted), KEEL_EINVAL);
  assert_int_equal(nn_mlp_predict(mlp, inputs, 4, predicted), KEEL_OK);
  nn_mlp_destroy(mlp);
  nn_mlp_destroy(NULL);
}

/* Trains a small model on synthetic data with one optimizer; returns the crc32c of its
 * parameters. */
static uint32_t train_synthetic(uint64_t seed, nn_optimizer_kind kind, float learning_rate) {
  const size_t sizes[] = {20, 16, 8, 4};
  nn_mlp *mlp = make_mlp(sizes, 4, 32, seed);
  size_t parameter_count = nn_mlp_parameter_count(mlp);
  nn_optimizer_config config = nn_optimizer_defaults(kind, learning_rate);
  nn_optimizer *optimizer = NULL;
  assert_int_equal(nn_optimizer_create(&config, parameter_count, &optimizer), KEEL_OK);
  float *gradient = calloc(parameter_count, sizeof(float));
  assert_non_null(gradient);
  float inputs[32 * 20];
  uint8_t labels[32];
  keel_random random;
  keel_random_seed(&random, 99);
  for (int step = 0; step < 25; step++) {
    fill_uniform(&random, inputs, 32 * 20, 0.0, 1.0);
    for (size_t i = 0; i < 32; i++) labels[i] = (uint8_t)keel_random_below(&random, 4);
    double loss;
    assert_int_equal(nn_mlp_gradient(mlp, inputs, labels, 32, NN_MEAN, gradient, &loss), KEEL_OK);
    nn_optimizer_step(optimizer, nn_mlp_parameters(mlp), gradient);
  }
  uint32_t crc = keel_crc32c(0, nn_mlp_parameters(mlp), parameter_count * sizeof(float));
  free(gradient);
  nn_optimizer_destroy(optimizer);
  nn_mlp_destroy(mlp);
  return crc;
}

static void test_training_is_deterministic(void **state) {
  (void)state;
  const size_t sizes[] = {20, 16, 4};
  nn_mlp *first = make_mlp(sizes, 3, 8, 7), *second = make_mlp(sizes, 3, 8, 7);
  size_t bytes = nn_mlp_parameter_count(first) * sizeof(float);
  assert_memory_equal(nn_mlp_parameters(first), nn_mlp_parameters(second), bytes);
  nn_mlp_destroy(second);
  second = make_mlp(sizes, 3, 8, 8);
  assert_memory_not_equal(nn_mlp_parameters(first), nn_mlp_parameters(second), bytes);
  nn_mlp_destroy(first);
  nn_mlp_destroy(second);

  assert_int_equal(train_synthetic(3, NN_OPTIMIZER_ADAM, 0.01f),
                   train_synthetic(3, NN_OPTIMIZER_ADAM, 0.01f));
  assert_int_equal(train_synthetic(3, NN_OPTIMIZER_SGD, 0.1f),
                   train_synthetic(3, NN_OPTIMIZER_SGD, 0.1f));
  assert_int_not_equal(train_synthetic(3, NN_OPTIMIZER_ADAM, 0.01f),
                       train_synthetic(4, NN_OPTIMIZER_ADAM, 0.01f));
}

/* ---- optimizers */

static void test_sgd_momentum_arithmetic(void **state) {
  (void)state;
  nn_optimizer_config config = nn_optimizer_defaults(NN_OPTIMIZER_SGD, 0.5f);
  nn_optimizer *optimizer = NULL;
  assert_int_equal(nn_optimizer_create(&config, 2, &optimizer), KEEL_OK);
  assert_int_equal(nn_optimizer_state_count(optimizer), 1);
  nn_state_buffer velocity = nn_optimizer_state(optimizer, 0);
  assert_string_equal(velocity.name, "optimizer.velocity");
  assert_int_equal(velocity.bytes, 2 * sizeof(float));
  float parameters[2] = {1.0f, -1.0f};
  const float gradient[2] = {1.0f, 2.0f};
  nn_optimizer_step(optimizer, parameters, gradient);
  /* v = g; p = p - 0.5 v */
  assert_true(parameters[0] == 0.5f && parameters[1] == -2.0f);
  nn_optimizer_step(optimizer, parameters, gradient);
  /* v = 0.9 v + g = 1.9, 3.8 */
  assert_true(fabsf(parameters[0] - (0.5f - 0.95f)) < 1e-6f);
  assert_true(fabsf(parameters[1] - (-2.0f - 1.9f)) < 1e-6f);
  assert_true(fabsf(((float *)velocity.data)[1] - 3.8f) < 1e-6f);
  assert_null(nn_optimizer_state(optimizer, 1).data);
  nn_optimizer_destroy(optimizer);
}

static void test_adam_arithmetic(void **state) {
  (void)state;
  nn_optimizer_config config = nn_optimizer_defaults(NN_OPTIMIZER_ADAM, 0.1f);
  nn_optimizer *optimizer = NULL;
  assert_int_equal(nn_optimizer_create(&config, 3, &optimizer), KEEL_OK);
  assert_int_equal(nn_optimizer_state_count(optimizer), 3);
  assert_string_equal(nn_optimizer_state(optimizer, 0).name, "optimizer.m");
  assert_string_equal(nn_optimizer_state(optimizer, 1).name, "optimizer.v");
  nn_state_buffer step = nn_optimizer_state(optimizer, 2);
  assert_string_equal(step.name, "optimizer.step");
  assert_int_equal(step.bytes, sizeof(uint64_t));
  float parameters[3] = {0.0f, 0.0f, 0.0f};
  const float gradient[3] = {4.0f, -0.001f, 0.0f};
  /* With bias correction the first step moves each parameter by the learning rate against
   * the gradient's sign, whatever its size. */
  nn_optimizer_step(optimizer, parameters, gradient);
  assert_true(fabsf(parameters[0] + 0.1f) < 1e-5f);
  assert_true(fabsf(parameters[1] - 0.1f) < 1e-4f);
  assert_true(parameters[2] == 0.0f);
  assert_int_equal(*(uint64_t *)step.data, 1);
  nn_optimizer_step(optimizer, parameters, gradient);
  assert_true(fabsf(parameters[0] + 0.2f) < 1e-5f);
  assert_int_equal(*(uint64_t *)step.data, 2);

  assert_int_equal(nn_optimizer_set_learning_rate(optimizer, 0.0f), KEEL_EINVAL);
  assert_int_equal(nn_optimizer_set_learning_rate(optimizer, 0.05f), KEEL_OK);
  nn_optimizer_destroy(optimizer);

  nn_optimizer *bad = NULL;
  config.beta2 = 1.0f;
  assert_int_equal(nn_optimizer_create(&config, 3, &bad), KEEL_EINVAL);
  config = nn_optimizer_defaults(NN_OPTIMIZER_SGD, -1.0f);
  assert_int_equal(nn_optimizer_create(&config, 3, &bad), KEEL_EINVAL);
  assert_null(bad);
}

/* ---- sharding */

static void test_shard_split_covers_batch(void **state) {
  (void)state;
  const size_t batches[] = {0, 1, 3, 7, 64, 256, 1001};
  for (size_t b = 0; b < sizeof batches / sizeof batches[0]; b++) {
    for (int world = 1; world <= 5; world++) {
      size_t expected_offset = 0, smallest = SIZE_MAX, largest = 0;
      for (int rank = 0; rank < world; rank++) {
        size_t offset, count;
        assert_int_equal(nn_shard_split(batches[b], rank, world, &offset, &count), KEEL_OK);
        assert_int_equal(offset, expected_offset);
        expected_offset += count;
        smallest = count < smallest ? count : smallest;
        largest = count > largest ? count : largest;
      }
      assert_int_equal(expected_offset, batches[b]);
      assert_true(largest - smallest <= 1);
    }
  }
  size_t offset, count;
  assert_int_equal(nn_shard_split(8, 2, 2, &offset, &count), KEEL_EINVAL);
  assert_int_equal(nn_shard_split(8, -1, 2, &offset, &count), KEEL_EINVAL);
  assert_int_equal(nn_shard_split(8, 0, 0, &offset, &count), KEEL_EINVAL);
}

static void test_sampler_covers_every_index_once(void **state) {
  (void)state;
  /* A dataset of 97 samples and batches that straddle epoch boundaries. */
  const size_t dataset_size = 97;
  const size_t batches[] = {1, 5, 32, 97, 150};
  nn_sampler *sampler = NULL, *fresh = NULL;
  assert_int_equal(nn_sampler_create(dataset_size, 42, &sampler), KEEL_OK);
  uint32_t whole[200], part[200];
  for (size_t b = 0; b < sizeof batches / sizeof batches[0]; b++) {
    size_t batch = batches[b];
    for (uint64_t step = 0; step < 9; step++) {
      size_t whole_count;
      assert_int_equal(nn_sampler_indices(sampler, step, 0, 1, batch, whole, 200, &whole_count),
                       KEEL_OK);
      assert_int_equal(whole_count, batch);
      for (int world = 1; world <= 5; world++) {
        /* The ranks' slices, laid end to end, are exactly the world-of-one batch. */
        size_t filled = 0;
        for (int rank = 0; rank < world; rank++) {
          size_t count;
          assert_int_equal(nn_sampler_indices(sampler, step, rank, world, batch, part + filled,
                                              200 - filled, &count),
                           KEEL_OK);
          filled += count;
        }
        assert_int_equal(filled, batch);
        assert_memory_equal(part, whole, batch * sizeof(uint32_t));
      }
      /* Within one epoch no index repeats; across a batch each epoch contributes distinct
       * ones; every position maps to the permutation of its own epoch. */
      unsigned seen[200] = {0};
      uint64_t first_position = step * batch;
      for (size_t i = 0; i < batch; i++) {
        assert_true(whole[i] < dataset_size);
        uint64_t epoch = (first_position + i) / dataset_size;
        assert_true(seen[whole[i]] != (unsigned)(epoch + 1));
        seen[whole[i]] = (unsigned)(epoch + 1);
      }
    }
  }
  /* One epoch in steps of 1 visits each sample exactly once. */
  unsigned visits[97] = {0};
  for (uint64_t step = 0; step < dataset_size; step++) {
    size_t count;
    assert_int_equal(nn_sampler_indices(sampler, step + 3 * dataset_size, 0, 1, 1, part, 1, &count),
                     KEEL_OK);
    visits[part[0]]++;
  }
  for (size_t i = 0; i < dataset_size; i++) assert_int_equal(visits[i], 1);

  /* The cache is invisible: a fresh sampler asked out of order agrees. */
  assert_int_equal(nn_sampler_create(dataset_size, 42, &fresh), KEEL_OK);
  for (int probe = 0; probe < 20; probe++) {
    uint64_t step = (uint64_t)((probe * 7919) % 31);
    size_t count_a, count_b;
    assert_int_equal(nn_sampler_indices(fresh, step, 1, 3, 64, part, 200, &count_a), KEEL_OK);
    assert_int_equal(nn_sampler_indices(sampler, step, 1, 3, 64, whole, 200, &count_b), KEEL_OK);
    assert_int_equal(count_a, count_b);
    assert_memory_equal(part, whole, count_a * sizeof(uint32_t));
  }
  nn_sampler_destroy(fresh);

  /* Another seed, another order. */
  assert_int_equal(nn_sampler_create(dataset_size, 43, &fresh), KEEL_OK);
  size_t count;
  assert_int_equal(nn_sampler_indices(fresh, 0, 0, 1, 97, part, 200, &count), KEEL_OK);
  assert_int_equal(nn_sampler_indices(sampler, 0, 0, 1, 97, whole, 200, &count), KEEL_OK);
  assert_memory_not_equal(part, whole, 97 * sizeof(uint32_t));
  nn_sampler_destroy(fresh);

  assert_int_equal(nn_sampler_indices(sampler, 0, 0, 1, 10, part, 9, &count), KEEL_ERANGE);
  assert_int_equal(nn_sampler_indices(sampler, UINT64_MAX / 2, 0, 1, 10, part, 10, &count),
                   KEEL_ERANGE);
  assert_int_equal(nn_sampler_indices(sampler, 0, 3, 3, 10, part, 10, &count), KEEL_EINVAL);
  nn_sampler_destroy(sampler);
  assert_int_equal(nn_sampler_create(0, 1, &sampler), KEEL_EINVAL);
}

/* ---- IDX loader */

typedef struct idx_files {
  char directory[256];
  char images[320];
  char labels[320];
} idx_files;

static void make_paths(idx_files *files, const char *images_name, const char *labels_name) {
  const char *directory = keel_test_tempdir("test_nn");
  assert_non_null(directory);
  snprintf(files->directory, sizeof files->directory, "%s", directory);
  snprintf(files->images, sizeof files->images, "%s/%s", directory, images_name);
  snprintf(files->labels, sizeof files->labels, "%s/%s", directory, labels_name);
}

static void put_big_endian(uint8_t *bytes, uint32_t value) {
  bytes[0] = (uint8_t)(value >> 24);
  bytes[1] = (uint8_t)(value >> 16);
  bytes[2] = (uint8_t)(value >> 8);
  bytes[3] = (uint8_t)value;
}

/* Writes an IDX file: header words, then payload, gzip-compressed unless mode is "wbT". */
static void write_idx(const char *path, const char *mode, const uint32_t *words, size_t word_count,
                      const uint8_t *payload, size_t payload_bytes) {
  gzFile file = gzopen(path, mode);
  assert_non_null(file);
  for (size_t i = 0; i < word_count; i++) {
    uint8_t bytes[4];
    put_big_endian(bytes, words[i]);
    assert_int_equal(gzwrite(file, bytes, 4), 4);
  }
  if (payload_bytes > 0) {
    assert_int_equal(gzwrite(file, payload, (unsigned)payload_bytes), (int)payload_bytes);
  }
  assert_int_equal(gzclose(file), Z_OK);
}

enum { TEST_ITEMS = 7, TEST_ROWS = 3, TEST_COLUMNS = 4, TEST_PIXELS = TEST_ITEMS * 12 };

static void write_valid_pair(const idx_files *files, const char *mode) {
  uint8_t pixels[TEST_PIXELS], labels[TEST_ITEMS];
  for (size_t i = 0; i < TEST_PIXELS; i++) pixels[i] = (uint8_t)(i * 37 % 256);
  for (size_t i = 0; i < TEST_ITEMS; i++) labels[i] = (uint8_t)(i % 10);
  const uint32_t image_header[] = {0x803, TEST_ITEMS, TEST_ROWS, TEST_COLUMNS};
  const uint32_t label_header[] = {0x801, TEST_ITEMS};
  write_idx(files->images, mode, image_header, 4, pixels, sizeof pixels);
  write_idx(files->labels, mode, label_header, 2, labels, sizeof labels);
}

/* Loads a pair that must fail with expected; the message must contain needle. */
static void expect_load_error(const idx_files *files, keel_status expected, const char *needle) {
  nn_dataset dataset;
  memset(&dataset, 0xAB, sizeof dataset);
  nn_dataset before = dataset;
  char message[512] = "";
  keel_status status =
      nn_dataset_load_idx(files->images, files->labels, &dataset, message, sizeof message);
  if (status != expected) {
    fail_msg("expected %s, got %s: %s", keel_status_name(expected), keel_status_name(status),
             message);
  }
  assert_memory_equal(&dataset, &before, sizeof dataset);
  if (strstr(message, needle) == NULL) fail_msg("message \"%s\" lacks \"%s\"", message, needle);
}

static void test_loader_reads_valid_files(void **state) {
  (void)state;
  const char *modes[] = {"wb6", "wbT"}; /* gzip, and a plain uncompressed IDX file */
  for (size_t m = 0; m < 2; m++) {
    idx_files files;
    make_paths(&files, "images.gz", "labels.gz");
    write_valid_pair(&files, modes[m]);
    nn_dataset dataset;
    char message[256] = "";
    assert_int_equal(
        nn_dataset_load_idx(files.images, files.labels, &dataset, message, sizeof message),
        KEEL_OK);
    assert_int_equal(dataset.count, TEST_ITEMS);
    assert_int_equal(dataset.rows, TEST_ROWS);
    assert_int_equal(dataset.columns, TEST_COLUMNS);
    assert_int_equal(dataset.image_size, 12);
    for (size_t i = 0; i < TEST_PIXELS; i++) assert_int_equal(dataset.pixels[i], i * 37 % 256);
    for (size_t i = 0; i < TEST_ITEMS; i++) assert_int_equal(dataset.labels[i], i % 10);

    const uint32_t indices[2] = {5, 0};
    float images[2 * 12];
    uint8_t labels[2];
    nn_dataset_gather(&dataset, indices, 2, images, labels);
    assert_int_equal(labels[0], 5);
    assert_int_equal(labels[1], 0);
    for (size_t i = 0; i < 12; i++) {
      assert_true(images[i] >= 0.0f && images[i] <= 1.0f);
      assert_true(fabsf(images[i] - (float)((5 * 12 + i) * 37 % 256) / 255.0f) < 1e-6f);
      assert_true(fabsf(images[12 + i] - (float)(i * 37 % 256) / 255.0f) < 1e-6f);
    }
    nn_dataset_copy_range(&dataset, 5, 1, images, labels);
    assert_int_equal(labels[0], 5);
    nn_dataset_free(&dataset);
    assert_null(dataset.pixels);
    nn_dataset_free(&dataset);
  }
}

static void test_loader_rejects_bad_files(void **state) {
  (void)state;
  idx_files files;
  uint8_t pixels[TEST_PIXELS] = {0}, labels[TEST_ITEMS] = {0};
  const uint32_t label_header[] = {0x801, TEST_ITEMS};

  /* Bad magic: a label file where images are expected. */
  make_paths(&files, "images.gz", "labels.gz");
  write_valid_pair(&files, "wb6");
  write_idx(files.images, "wb6", label_header, 2, labels, sizeof labels);
  expect_load_error(&files, KEEL_ECORRUPT, "magic");

  /* Data shorter than the header announces. */
  const uint32_t image_header[] = {0x803, TEST_ITEMS, TEST_ROWS, TEST_COLUMNS};
  write_idx(files.images, "wb6", image_header, 4, pixels, sizeof pixels - 5);
  expect_load_error(&files, KEEL_ECORRUPT, "truncated");
  /* Only part of the header. */
  write_idx(files.images, "wb6", image_header, 2, NULL, 0);
  expect_load_error(&files, KEEL_ECORRUPT, "header");
  /* Data longer than the header announces. */
  uint8_t longer[TEST_PIXELS + 3] = {0};
  write_idx(files.images, "wb6", image_header, 4, longer, sizeof longer);
  expect_load_error(&files, KEEL_ECORRUPT, "past");
  /* Dimensions that would need terabytes, or zero: refused before allocating. */
  const uint32_t huge_header[] = {0x803, 0xFFFFFFFFu, 28, 28};
  write_idx(files.images, "wb6", huge_header, 4, pixels, sizeof pixels);
  expect_load_error(&files, KEEL_ECORRUPT, "dimension 0");
  const uint32_t zero_header[] = {0x803, TEST_ITEMS, 0, TEST_COLUMNS};
  write_idx(files.images, "wb6", zero_header, 4, pixels, sizeof pixels);
  expect_load_error(&files, KEEL_ECORRUPT, "dimension 1");

  /* Label count that disagrees with the image count, and a label that is not a class. */
  write_valid_pair(&files, "wb6");
  const uint32_t fewer_labels[] = {0x801, TEST_ITEMS - 1};
  write_idx(files.labels, "wb6", fewer_labels, 2, labels, TEST_ITEMS - 1);
  expect_load_error(&files, KEEL_ECORRUPT, "labels");
  labels[3] = 10;
  write_idx(files.labels, "wb6", label_header, 2, labels, sizeof labels);
  expect_load_error(&files, KEEL_ECORRUPT, "not a class");

  /* A gzip file cut short, and one with a damaged byte in its compressed data. */
  write_valid_pair(&files, "wb6");
  size_t length = 0;
  char *bytes = keel_test_read_file(files.images, &length);
  assert_non_null(bytes);
  assert_int_equal(truncate(files.images, (off_t)(length / 2)), 0);
  expect_load_error(&files, KEEL_ECORRUPT, files.images);
  bytes[length / 2] ^= 0x55;
  FILE *file = fopen(files.images, "wb");
  assert_non_null(file);
  assert_int_equal(fwrite(bytes, 1, length, file), length);
  fclose(file);
  free(bytes);
  expect_load_error(&files, KEEL_ECORRUPT, files.images);

  /* Missing files name the Debian package. */
  nn_dataset dataset;
  char message[512] = "";
  char missing[300];
  snprintf(missing, sizeof missing, "%s/nothing-here", files.directory);
  assert_int_equal(nn_dataset_load_mnist(missing, NN_TRAIN, &dataset, message, sizeof message),
                   KEEL_ENOTFOUND);
  assert_non_null(strstr(message, "dataset-fashion-mnist"));
  assert_non_null(strstr(message, "train-images-idx3-ubyte.gz"));
  /* A NULL message is allowed. */
  assert_int_equal(nn_dataset_load_mnist(missing, NN_TEST, &dataset, NULL, 0), KEEL_ENOTFOUND);
}

/* ---- training on the real data set */

static double seconds_since(const struct timespec *start) {
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  return (double)(now.tv_sec - start->tv_sec) + (double)(now.tv_nsec - start->tv_nsec) * 1e-9;
}

/* The recipe of examples/fashion_mnist (its defaults), in one process: hidden 128, Adam at
 * 0.005 decayed linearly to 0, global batch 256, 500 steps (2.1 epochs). */
static void test_fashion_mnist_reaches_85_percent(void **state) {
  (void)state;
  struct timespec start;
  clock_gettime(CLOCK_MONOTONIC, &start);
  nn_dataset train, test;
  char message[512] = "";
  keel_status status = nn_dataset_load_mnist(NULL, NN_TRAIN, &train, message, sizeof message);
  if (status == KEEL_ENOTFOUND) {
    print_message("skipped: %s\n", message);
    skip();
  }
  if (status != KEEL_OK) fail_msg("%s", message);
  status = nn_dataset_load_mnist(NULL, NN_TEST, &test, message, sizeof message);
  if (status != KEEL_OK) fail_msg("%s", message);

  const size_t sizes[] = {784, 128, 10};
  const size_t global_batch = 256;
  const uint64_t steps = 500, seed = 1;
  const float learning_rate = 0.005f;
  nn_mlp *mlp = make_mlp(sizes, 3, global_batch, seed);
  size_t parameter_count = nn_mlp_parameter_count(mlp);
  nn_optimizer_config config = nn_optimizer_defaults(NN_OPTIMIZER_ADAM, learning_rate);
  nn_optimizer *optimizer = NULL;
  nn_sampler *sampler = NULL;
  assert_int_equal(nn_optimizer_create(&config, parameter_count, &optimizer), KEEL_OK);
  assert_int_equal(nn_sampler_create(train.count, seed, &sampler), KEEL_OK);
  float *gradient = malloc(parameter_count * sizeof(float));
  float *images = malloc(global_batch * 784 * sizeof(float));
  uint8_t *labels = malloc(global_batch);
  uint32_t *indices = malloc(global_batch * sizeof(uint32_t));
  assert_true(gradient && images && labels && indices);
  double loss = 0.0;
  for (uint64_t step = 0; step < steps; step++) {
    size_t count;
    assert_int_equal(
        nn_sampler_indices(sampler, step, 0, 1, global_batch, indices, global_batch, &count),
        KEEL_OK);
    nn_dataset_gather(&train, indices, count, images, labels);
    assert_int_equal(nn_mlp_gradient(mlp, images, labels, count, NN_SUM, gradient, &loss), KEEL_OK);
    for (size_t i = 0; i < parameter_count; i++) gradient[i] /= (float)count;
    float scale = (float)(1.0 - (double)step / (double)steps);
    assert_int_equal(nn_optimizer_set_learning_rate(optimizer, learning_rate * scale), KEEL_OK);
    nn_optimizer_step(optimizer, nn_mlp_parameters(mlp), gradient);
  }
  double accuracy = 0.0;
  assert_int_equal(nn_mlp_accuracy(mlp, &test, &accuracy), KEEL_OK);
  double elapsed = seconds_since(&start);
  print_message("fashion-mnist: test accuracy %.4f, last loss %.3f, %.2f s (load, train, eval)\n",
                accuracy, loss, elapsed);
  assert_true(accuracy >= 0.85);
  assert_true(elapsed < 60.0);
  free(indices);
  free(labels);
  free(images);
  free(gradient);
  nn_sampler_destroy(sampler);
  nn_optimizer_destroy(optimizer);
  nn_mlp_destroy(mlp);
  nn_dataset_free(&test);
  nn_dataset_free(&train);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_mlp_gradient_matches_finite_differences),
      cmocka_unit_test(test_mlp_arguments),
      cmocka_unit_test(test_training_is_deterministic),
      cmocka_unit_test(test_sgd_momentum_arithmetic),
      cmocka_unit_test(test_adam_arithmetic),
      cmocka_unit_test(test_shard_split_covers_batch),
      cmocka_unit_test(test_sampler_covers_every_index_once),
      cmocka_unit_test(test_loader_reads_valid_files),
      cmocka_unit_test(test_loader_rejects_bad_files),
      cmocka_unit_test(test_fashion_mnist_reaches_85_percent),
  };
  return keel_test_finish(cmocka_run_group_tests(tests, NULL, NULL));
}
