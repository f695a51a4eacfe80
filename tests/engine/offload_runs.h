/*
 * offload_runs.h - the weight-placement scenario shared by the CPU (tests/engine) and CUDA
 * (tests/gpu) tests: one prompt set generated (and one image scored) with every layer's weights
 * all on the device, then split over device, pinned host and disk by several --weights
 * placements; every placement must give the resident run's tokens and logits bit for bit (same
 * batch and micro-batch), with contexts run one after another, a run cancelled half way, and
 * two contexts on one split model.
 */
#ifndef FLEXDIAG_TEST_OFFLOAD_RUNS_H
#define FLEXDIAG_TEST_OFFLOAD_RUNS_H

#include <stdint.h>

/* Run the scenario on device (-1: the CPU engine) with builtin arch, the store in dir. cmocka
 * assertions fail the test on a mismatch. */
void to_run_placements(int device, const char *arch, int32_t batch, int32_t micro,
                       const char *dir);
/* Compressed weights (--compress-weights 4bit): placements with streamed weights against a
 * resident model of the same seed whose streamed matrix rows the plain C reference packed and
 * unpacked in place: the same tokens and logits bit for bit, and fewer bytes below the device
 * than the placement holds unpacked. */
void to_run_compressed(int device, const char *arch, int32_t batch, int32_t micro,
                       const char *dir);
/* Disk-homed weights compressed (runtime_params.compress_disk zstd): placements with a disk
 * part, one streaming 4-bit groups, give the raw disk tier's tokens and logits bit for bit
 * (and so the resident run's, without 4-bit), also after a cancelled run and in a second
 * context, with the same bytes per tier and over the link and fewer bytes read from disk. */
void to_run_zstd_disk(int device, const char *arch, int32_t batch, int32_t micro,
                      const char *dir);
/* A byte of a layer's first zstd chunk flipped in the store file: generation fails with
 * FLEXDIAG_ERR_CHECKSUM naming the file, the layer and the chunk's byte offset. */
void to_run_zstd_corrupt(int device, const char *arch, const char *dir);
/* KV homes: for every policy, the block's KV all on the device, then half the micro-batches and
 * all of them in pinned host memory, all on disk (the store in dir), one micro-batch in each
 * home (cancelled runs among them), and the KV on the host with the weights split: the same
 * tokens and logits as the all-device run, and the same KV bytes to the device from disk as
 * from the pinned home. quick: only all on the host and one micro-batch in each home. */
void to_run_kv_homes(int device, const char *arch, int32_t batch, int32_t micro,
                     const char *dir, int quick);

/* CPU attention (--kv with a CPU share, --cpu-attention) for the first n_kinds of dense, window
 * and streaming with
 * one, two and all-single-image micro-batches (a run cancelled half way among them), with
 * half the block on the device, with half on disk (the store in dir; the device attends
 * that half over the rows it streams), and all on the host with half of it attended there
 * (cpu_attention_pct 50; the device attends the other half over streamed rows): no KV of a
 * host-attended micro-batch moves to the device in the decode steps, and the image
 * of the all-device run scores within tol relative L2 of its logits (tol 0: the tokens and
 * logits bit for bit, the CPU backend's host attention being its own). batch even, >= 2. */
void to_run_cpu_attention(int device, const char *arch, int32_t batch, double tol,
                          int n_kinds, const char *dir);

#endif /* FLEXDIAG_TEST_OFFLOAD_RUNS_H */
