/* `keel report --svg FILE` (report_svg.c): the job's timeline, which report.c fills with every
 * event it reads from the events file, and its drawing as one standalone SVG file. */
#ifndef KEEL_REPORT_SVG_H
#define KEEL_REPORT_SVG_H

#include <stddef.h>
#include <stdint.h>

#include "tool.h"

typedef struct keel__timeline keel__timeline;

/* NULL when out of memory. */
keel__timeline *keel__timeline_create(void);
void keel__timeline_free(keel__timeline *timeline);
/* One event of the file: name is its "event", t_ns its time (both present). */
void keel__timeline_event(keel__timeline *timeline, const char *name, const struct json_t *event,
                          int64_t t_ns);
/* Draws the timeline into path, noting the skipped_lines of the file under it. Returns 0, or
 * says why on stderr and returns KEEL__EXIT_USAGE (the events have no job_start: there is no
 * time axis to draw on) or KEEL__EXIT_FAILURE (path cannot be written). */
int keel__timeline_svg_write(const keel__timeline *timeline, const char *path,
                             size_t skipped_lines);

#endif
