/* Measures of a click model shared by training and evaluation: the logistic loss of a logit,
 * the loss of always predicting the base rate, and the exact area under the ROC curve. */
#ifndef DLRM_METRICS_H
#define DLRM_METRICS_H

#include <stddef.h>

/* Binary cross-entropy of a logit against a 0/1 label, log(1 + e^-|x|) + max(x, 0) - x*y:
 * finite for every finite logit. */
double dlrm_logistic_loss(double logit, double label);

/* The mean loss of predicting click_rate for every sample of a set whose clicks are
 * click_rate of it: its entropy, the best any constant does there. 0 when the rate is 0 or 1. */
double dlrm_base_log_loss(double click_rate);

typedef struct dlrm_scored {
  double score;
  float label; /* 0 or 1 */
} dlrm_scored;

/* The probability that a random clicked sample scores above a random unclicked one, ties
 * counted half: the AUC, exactly (no binning). Sorts samples by score in place (O(n log n)),
 * allocates nothing. NaN when the set has no click or no non-click. */
double dlrm_auc(dlrm_scored *samples, size_t count);

#endif
