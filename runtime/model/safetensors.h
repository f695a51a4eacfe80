/*
 * safetensors.h - validated reader for safetensors checkpoints: one file, a folder, or a sharded
 * model.safetensors.index.json. Every header is checked (docs/formats.md §2.5) before anything is
 * sized from it; tensor data is read with pread (never a live mmap, so a file truncated during a
 * run gives FLEXDIAG_ERR_IO instead of SIGBUS) and converted to the dtype the caller asks for.
 */
#ifndef FLEXDIAG_SAFETENSORS_H
#define FLEXDIAG_SAFETENSORS_H

#include "base/layer.h"
#if FLEXDIAG_LAYER < FLEXDIAG_LAYER_RUNTIME
#error "runtime/model/safetensors.h: a lower layer may not use runtime/ (base <- policy <- kernels <- offload <- runtime; docs/architecture.md)"
#endif

#include <stddef.h>
#include <stdint.h>

#include "flexdiag.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum flexdiag_dtype {
    FLEXDIAG_DTYPE_BF16 = 0,
    FLEXDIAG_DTYPE_F16 = 1,
    FLEXDIAG_DTYPE_F32 = 2,
    FLEXDIAG_DTYPE_I32 = 3,
    FLEXDIAG_DTYPE_I64 = 4,
} flexdiag_dtype;

#define FLEXDIAG_ST_MAX_DIMS 8
#define FLEXDIAG_ST_MAX_ENTRIES 1000000 /* tensors per header or index (docs/formats.md §2.5) */
#define FLEXDIAG_ST_NAME_MSG 200        /* characters of a tensor name quoted in messages */

typedef struct flexdiag_st_tensor {
    const char *name;                     /* canonical-or-original name as stored in the file */
    flexdiag_dtype dtype;                 /* stored dtype */
    int32_t ndim;                         /* 0..FLEXDIAG_ST_MAX_DIMS */
    int64_t shape[FLEXDIAG_ST_MAX_DIMS];  /* elements per dim */
    int64_t numel;                        /* product of shape (1 for rank 0) */
    uint64_t offset;                      /* absolute byte offset of the data in its file */
    uint64_t nbytes;                      /* numel × dtype size */
    int32_t file;                         /* index into the reader's file list */
} flexdiag_st_tensor;

typedef struct flexdiag_safetensors flexdiag_safetensors;

/* Open path: a .safetensors file, a .index.json, or a folder holding model.safetensors.index.json
 * or model.safetensors. Validates every header; errors name the file (and tensor) and reason. */
flexdiag_status flexdiag__st_open(const char *path, flexdiag_safetensors **out);
void flexdiag__st_close(flexdiag_safetensors *st);
/* Number of tensors and the i-th (sorted by name). */
int64_t flexdiag__st_count(const flexdiag_safetensors *st);
const flexdiag_st_tensor *flexdiag__st_at(const flexdiag_safetensors *st, int64_t i);
/* Tensor by exact name, or NULL. */
const flexdiag_st_tensor *flexdiag__st_find(const flexdiag_safetensors *st, const char *name);
/* Path of file i. */
const char *flexdiag__st_file_path(const flexdiag_safetensors *st, int32_t file);
/* Read t's data into dst (numel elements), converting BF16/F16/F32 to bf16 (F32 rounded to
 * nearest even). Other dtypes: FLEXDIAG_ERR_UNSUPPORTED naming the tensor. */
flexdiag_status flexdiag__st_read_bf16(const flexdiag_safetensors *st, const flexdiag_st_tensor *t,
                                       uint16_t *dst);
/* Read t's data into dst converted to fp32. */
flexdiag_status flexdiag__st_read_f32(const flexdiag_safetensors *st, const flexdiag_st_tensor *t,
                                      float *dst);
/* Size in bytes of one element of dtype. */
int flexdiag__dtype_size(flexdiag_dtype dt);
/* "BF16", "F16", ... */
const char *flexdiag__dtype_name(flexdiag_dtype dt);

/* ---- stored-only dtypes ---- */

/* Standard safetensors dtypes that flexdiag knows the element size of but does not convert. A
 * tensor stored as one of them has this value in flexdiag_st_tensor.dtype (outside the
 * flexdiag_dtype enumerators, so switches over the readable dtypes stay exhaustive): the file
 * opens and is fully validated, flexdiag__st_read_bf16/_f32 return FLEXDIAG_ERR_UNSUPPORTED
 * naming the tensor, flexdiag__st_read_raw copies the bytes, and the writer accepts them. */
#define FLEXDIAG_DTYPE_F64 ((flexdiag_dtype)16)
#define FLEXDIAG_DTYPE_BOOL ((flexdiag_dtype)17)
#define FLEXDIAG_DTYPE_U8 ((flexdiag_dtype)18)
#define FLEXDIAG_DTYPE_I8 ((flexdiag_dtype)19)
#define FLEXDIAG_DTYPE_I16 ((flexdiag_dtype)20)
#define FLEXDIAG_DTYPE_U16 ((flexdiag_dtype)21)
#define FLEXDIAG_DTYPE_U32 ((flexdiag_dtype)22)
#define FLEXDIAG_DTYPE_U64 ((flexdiag_dtype)23)
#define FLEXDIAG_DTYPE_F8_E4M3 ((flexdiag_dtype)24)
#define FLEXDIAG_DTYPE_F8_E5M2 ((flexdiag_dtype)25)
#define FLEXDIAG_DTYPE_F8_E8M0 ((flexdiag_dtype)26)
#define FLEXDIAG_DTYPE_C64 ((flexdiag_dtype)27)

/* Copy t's bytes as stored (little-endian, t->nbytes bytes) into dst, whatever the dtype. */
flexdiag_status flexdiag__st_read_raw(const flexdiag_safetensors *st, const flexdiag_st_tensor *t,
                                      void *dst);
/* The dtype whose safetensors name is str (e.g. "BF16"), or -1 when flexdiag does not know it. */
int flexdiag__dtype_parse(const char *str);

#ifdef __cplusplus
}
#endif

#endif /* FLEXDIAG_SAFETENSORS_H */
