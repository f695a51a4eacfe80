/*
 * calib_table.h - a calibration table for the engine tests of ssd and hack (test_calib.c,
 * test_continuous.c): the collector kind run on a model through the engine (dense attention,
 * two CFG images of the full decode length), exported, stamped with the model's config hash and
 * written to a file, as `flexdiag-bench calibrate` does.
 */
#ifndef FLEXDIAG_TEST_CALIB_TABLE_H
#define FLEXDIAG_TEST_CALIB_TABLE_H

#include "flexdiag.h"

/* The table of model m written to dir/name; returns the path (malloc'ed). Fails the test on
 * any error. */
char *ct_calib_file(flexdiag_model *m, const char *dir, const char *name);

#endif /* FLEXDIAG_TEST_CALIB_TABLE_H */
