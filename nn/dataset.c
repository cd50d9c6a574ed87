/* The IDX loader of (Fashion-)MNIST through zlib. Every header field is checked and bounded
 * before anything is allocated, and a short, long or damaged file is an error with a message
 * naming it, never a crash or a partly filled dataset. */
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "nn.h"

#define IDX_LABELS_MAGIC 0x00000801u /* unsigned bytes, one dimension */
#define IDX_IMAGES_MAGIC 0x00000803u /* unsigned bytes, three dimensions */
/* Far above MNIST's 60000 x 28 x 28, far below what would exhaust a machine. */
#define IDX_MAX_ITEMS ((uint32_t)1 << 24)
#define IDX_MAX_SIDE 4096u
#define IDX_MAX_BYTES ((size_t)1 << 31)
/* gzread takes an unsigned length and returns an int. */
#define GZ_READ_CHUNK ((size_t)1 << 30)

static void set_message(char *message, size_t capacity, const char *format, ...)
    __attribute__((format(printf, 3, 4)));

static void set_message(char *message, size_t capacity, const char *format, ...) {
  if (message == NULL || capacity == 0) return;
  va_list arguments;
  va_start(arguments, format);
  vsnprintf(message, capacity, format, arguments);
  va_end(arguments);
}

/* Reads up to length bytes; *read_p says how many came before the end of the data. A zlib
 * or system error (a damaged stream, a bad gzip checksum) is KEEL_ECORRUPT or KEEL_EIO. */
static keel_status read_bytes(gzFile file, const char *path, void *data, size_t length,
                              size_t *read_p, char *message, size_t capacity) {
  size_t done = 0;
  while (done < length) {
    size_t want = length - done < GZ_READ_CHUNK ? length - done : GZ_READ_CHUNK;
    int got = gzread(file, (uint8_t *)data + done, (unsigned)want);
    if (got < 0) {
      int error_number;
      const char *text = gzerror(file, &error_number);
      if (error_number == Z_ERRNO) {
        set_message(message, capacity, "%s: read failed: %s", path, strerror(errno));
        return KEEL_EIO;
      }
      set_message(message, capacity, "%s: corrupt gzip data: %s", path, text);
      return KEEL_ECORRUPT;
    }
    if (got == 0) break;
    done += (size_t)got;
  }
  *read_p = done;
  return KEEL_OK;
}

static keel_status read_exact(gzFile file, const char *path, void *data, size_t length,
                              const char *what, char *message, size_t capacity) {
  size_t got = 0;
  keel_status status = read_bytes(file, path, data, length, &got, message, capacity);
  if (status != KEEL_OK) return status;
  if (got < length) {
    set_message(message, capacity, "%s: truncated: %zu of the %zu bytes of %s", path, got, length,
                what);
    return KEEL_ECORRUPT;
  }
  return KEEL_OK;
}

static uint32_t big_endian_32(const uint8_t *bytes) {
  return (uint32_t)bytes[0] << 24 | (uint32_t)bytes[1] << 16 | (uint32_t)bytes[2] << 8 |
         (uint32_t)bytes[3];
}

/* One IDX file of unsigned bytes with the expected magic. The header's dimensions go into
 * dimensions (dimension_count of them) and the payload into a new *payload_p. */
static keel_status read_idx(const char *path, uint32_t expected_magic, size_t dimension_count,
                            uint32_t *dimensions, uint8_t **payload_p, char *message,
                            size_t capacity) {
  errno = 0;
  gzFile file = gzopen(path, "rb");
  if (file == NULL) {
    int error_number = errno;
    if (error_number == ENOENT) {
      set_message(message, capacity, "%s: no such file", path);
      return KEEL_ENOTFOUND;
    }
    set_message(message, capacity, "%s: cannot open: %s", path,
                error_number ? strerror(error_number) : "out of memory");
    return error_number ? keel_status_from_errno(error_number) : KEEL_ENOMEM;
  }
  gzbuffer(file, 1 << 17);

  /* The magic first, so a file of the wrong kind is named as such, not as a short header. */
  uint8_t header[4 * 4];
  uint8_t *payload = NULL;
  keel_status status = read_exact(file, path, header, 4, "the magic number", message, capacity);
  if (status != KEEL_OK) goto fail_close_file;
  uint32_t magic = big_endian_32(header);
  if (magic != expected_magic) {
    set_message(message, capacity,
                "%s: bad magic number 0x%08x (expected 0x%08x): not an IDX %s file", path, magic,
                expected_magic, expected_magic == IDX_IMAGES_MAGIC ? "image" : "label");
    status = KEEL_ECORRUPT;
    goto fail_close_file;
  }
  status = read_exact(file, path, header + 4, 4 * dimension_count, "the header", message, capacity);
  if (status != KEEL_OK) goto fail_close_file;
  size_t payload_bytes = 1;
  for (size_t d = 0; d < dimension_count; d++) {
    dimensions[d] = big_endian_32(header + 4 * (d + 1));
    uint32_t limit = d == 0 ? IDX_MAX_ITEMS : IDX_MAX_SIDE;
    if (dimensions[d] == 0 || dimensions[d] > limit) {
      set_message(message, capacity, "%s: dimension %zu is %u (expected 1 .. %u)", path, d,
                  dimensions[d], limit);
      status = KEEL_ECORRUPT;
      goto fail_close_file;
    }
    payload_bytes *= dimensions[d];
  }
  if (payload_bytes > IDX_MAX_BYTES) {
    set_message(message, capacity, "%s: %zu bytes of data is more than this loader accepts", path,
                payload_bytes);
    status = KEEL_ECORRUPT;
    goto fail_close_file;
  }
  payload = malloc(payload_bytes);
  if (payload == NULL) {
    set_message(message, capacity, "%s: out of memory for %zu bytes", path, payload_bytes);
    status = KEEL_ENOMEM;
    goto fail_close_file;
  }
  status = read_exact(file, path, payload, payload_bytes, "the data", message, capacity);
  if (status != KEEL_OK) goto fail_free_payload;
  /* Reading past the end also makes zlib check the gzip trailer's checksum and length. */
  uint8_t extra;
  size_t extra_count = 0;
  status = read_bytes(file, path, &extra, 1, &extra_count, message, capacity);
  if (status != KEEL_OK) goto fail_free_payload;
  if (extra_count != 0) {
    set_message(message, capacity, "%s: data continues past the %zu bytes the header announces",
                path, payload_bytes);
    status = KEEL_ECORRUPT;
    goto fail_free_payload;
  }
  gzclose(file);
  *payload_p = payload;
  return KEEL_OK;

fail_free_payload:
  free(payload);
fail_close_file:
  gzclose(file);
  return status;
}

keel_status nn_dataset_load_idx(const char *images_path, const char *labels_path,
                                nn_dataset *dataset, char *message, size_t capacity) {
  uint32_t image_dimensions[3], label_dimensions[1];
  uint8_t *pixels = NULL, *labels = NULL;
  keel_status status =
      read_idx(images_path, IDX_IMAGES_MAGIC, 3, image_dimensions, &pixels, message, capacity);
  if (status != KEEL_OK) return status;
  status = read_idx(labels_path, IDX_LABELS_MAGIC, 1, label_dimensions, &labels, message, capacity);
  if (status != KEEL_OK) goto fail_free_pixels;
  if (label_dimensions[0] != image_dimensions[0]) {
    set_message(message, capacity, "%s has %u labels but %s has %u images", labels_path,
                label_dimensions[0], images_path, image_dimensions[0]);
    status = KEEL_ECORRUPT;
    goto fail_free_labels;
  }
  for (uint32_t i = 0; i < label_dimensions[0]; i++) {
    if (labels[i] >= NN_MNIST_CLASSES) {
      set_message(message, capacity, "%s: label %u of item %u is not a class (0 .. %d)",
                  labels_path, labels[i], i, NN_MNIST_CLASSES - 1);
      status = KEEL_ECORRUPT;
      goto fail_free_labels;
    }
  }
  dataset->pixels = pixels;
  dataset->labels = labels;
  dataset->count = image_dimensions[0];
  dataset->rows = image_dimensions[1];
  dataset->columns = image_dimensions[2];
  dataset->image_size = (size_t)image_dimensions[1] * image_dimensions[2];
  return KEEL_OK;

fail_free_labels:
  free(labels);
fail_free_pixels:
  free(pixels);
  return status;
}

keel_status nn_dataset_load_mnist(const char *directory, nn_split split, nn_dataset *dataset,
                                  char *message, size_t capacity) {
  if (directory == NULL) directory = NN_FASHION_MNIST_DIRECTORY;
  const char *prefix = split == NN_TRAIN ? "train" : "t10k";
  char images_path[PATH_MAX], labels_path[PATH_MAX];
  int images_length =
      snprintf(images_path, sizeof images_path, "%s/%s-images-idx3-ubyte.gz", directory, prefix);
  int labels_length =
      snprintf(labels_path, sizeof labels_path, "%s/%s-labels-idx1-ubyte.gz", directory, prefix);
  if (images_length < 0 || (size_t)images_length >= sizeof images_path || labels_length < 0 ||
      (size_t)labels_length >= sizeof labels_path) {
    set_message(message, capacity, "data directory path is too long");
    return KEEL_EINVAL;
  }
  keel_status status = nn_dataset_load_idx(images_path, labels_path, dataset, message, capacity);
  if (status == KEEL_ENOTFOUND && message != NULL && capacity > 0) {
    /* Append the remedy to the loader's message rather than replacing which file it named. */
    size_t used = strlen(message);
    set_message(message + used, capacity - used,
                " (install the Debian package dataset-fashion-mnist, or point --data-dir at a "
                "folder with the MNIST .gz files)");
  }
  return status;
}

void nn_dataset_free(nn_dataset *dataset) {
  free(dataset->pixels);
  free(dataset->labels);
  memset(dataset, 0, sizeof *dataset);
}

static void convert_image(const uint8_t *pixels, size_t size, float *image) {
  for (size_t i = 0; i < size; i++) image[i] = (float)pixels[i] * (1.0f / 255.0f);
}

void nn_dataset_gather(const nn_dataset *dataset, const uint32_t *indices, size_t count,
                       float *images, uint8_t *labels) {
  size_t size = dataset->image_size;
  for (size_t i = 0; i < count; i++) {
    convert_image(dataset->pixels + (size_t)indices[i] * size, size, images + i * size);
    labels[i] = dataset->labels[indices[i]];
  }
}

void nn_dataset_copy_range(const nn_dataset *dataset, size_t first, size_t count, float *images,
                           uint8_t *labels) {
  size_t size = dataset->image_size;
  convert_image(dataset->pixels + first * size, count * size, images);
  memcpy(labels, dataset->labels + first, count);
}
