/* The loss and AUC of metrics.h. Sums run in double in sample order, so a figure is the
 * same for the same scores on every run. */
#include "metrics.h"

#include <math.h>
#include <stdlib.h>

double dlrm_logistic_loss(double logit, double label) {
  return log1p(exp(-fabs(logit))) + fmax(logit, 0.0) - logit * label;
}

double dlrm_base_log_loss(double click_rate) {
  if (!(click_rate > 0.0 && click_rate < 1.0)) return 0.0;
  return -(click_rate * log(click_rate) + (1.0 - click_rate) * log1p(-click_rate));
}

/* NaN (a diverged model) sorts below every number, so the order stays total. */
static int by_score(const void *left, const void *right) {
  double a = ((const dlrm_scored *)left)->score, b = ((const dlrm_scored *)right)->score;
  if (isnan(a) || isnan(b)) return (isnan(b) != 0) - (isnan(a) != 0);
  return (a > b) - (a < b);
}

double dlrm_auc(dlrm_scored *samples, size_t count) {
  qsort(samples, count, sizeof *samples, by_score);
  /* Walking up the scores, each click beats every non-click already passed and ties with
   * those of its own score. */
  double clicks = 0.0, wins = 0.0, passed_non_clicks = 0.0;
  size_t first = 0;
  while (first < count) {
    size_t end = first;
    double group_clicks = 0.0, group_non_clicks = 0.0;
    while (end < count && samples[end].score == samples[first].score) {
      if (samples[end].label > 0.5f) {
        group_clicks += 1.0;
      } else {
        group_non_clicks += 1.0;
      }
      end++;
    }
    wins += group_clicks * (passed_non_clicks + 0.5 * group_non_clicks);
    clicks += group_clicks;
    passed_non_clicks += group_non_clicks;
    first = end;
  }
  if (clicks == 0.0 || passed_non_clicks == 0.0) return NAN;
  return wins / (clicks * passed_non_clicks);
}
