/*
 * cli.h - the flexdiag command-line tool: subcommand entry points and the one flag parser they
 * share, so every command reports bad flags the same way ("flexdiag score: --cfg: expected a
 * number, got 'x'"; "flexdiag generate: --top-p 2 is out of range: expected a number in (0, 1]")
 * and exits 2. Library errors are printed with cli_last_error() (the library's message, the
 * params fields it names turned into the flags that set them) and exit 2 when the library
 * refused a value (FLEXDIAG_ERR_INVALID_ARG), else 1.
 * Everything here is built on include/flexdiag.h alone (the tool links the shared library); the
 * bench tool (bench/) reuses the parser and the model and policy flags.
 */
#ifndef FLEXDIAG_CLI_H
#define FLEXDIAG_CLI_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "flexdiag.h"

/* ---- subcommands: argv[0] is the subcommand name; return the process exit code ---- */
int flexdiag_cmd_generate(int argc, char **argv);
int flexdiag_cmd_score(int argc, char **argv);
int flexdiag_cmd_decode(int argc, char **argv);
int flexdiag_cmd_serve(int argc, char **argv);

/* ---- flag parser ---- */

typedef enum cli_type {
    CLI_STR,   /* const char * */
    CLI_INT,   /* int64_t */
    CLI_F64,   /* double */
    CLI_FLAG,  /* int, set to 1, takes no value */
    CLI_SIZE,  /* uint64_t bytes: 24G, 512M, 4096 (K/M/G/T, powers of 1024) */
} cli_type;

/* A flag. CLI_INT and CLI_F64 flags may carry the range of values the command accepts
 * (CLI_INTS / CLI_NUMS in the initializer): the parser refuses a value outside it and --help
 * prints it, so the two cannot disagree. Rules that involve other flags or the model (N_att
 * <= L_dec) are the command's or the library's. */
typedef struct cli_opt {
    const char *name;   /* "--gpu-mem" */
    cli_type type;      /* value type */
    void *dst;          /* where the value goes */
    const char *help;   /* one line for --help */
    int ranged;         /* 1: the bounds below hold */
    int64_t lo, hi;     /* CLI_INT: accepted, inclusive */
    double flo, fhi;    /* CLI_F64: bounds; fhi inclusive */
    int lo_open;        /* CLI_F64: 1 when flo itself is refused */
    const char *note;   /* what to know about the range ("0 = off"), or NULL */
} cli_opt;

/* Designated tails of a cli_opt initializer (.name designated too, so entries without a range
 * may leave the range fields out): {.name = "--top-k", CLI_INT, &k, "help", CLI_INTS(0,
 * INT32_MAX, "0 = off")}. */
#define CLI_INTS(l, h, n) .ranged = 1, .lo = (l), .hi = (h), .note = (n)
#define CLI_NUMS(l, h, open, n) .ranged = 1, .flo = (l), .fhi = (h), .lo_open = (open), .note = (n)

/* Parse argv[1..] (argv[0] is the subcommand). Accepts "--x v" and "--x=v"; CLI_F64 values
 * must be finite, and ranged values inside their range. Returns 0 on success, 1 if --help or
 * --version was printed (exit 0), 2 after printing an error naming the flag. A name registered
 * twice in opts is a bug: it aborts. */
int cli_parse(const char *cmd, int argc, char **argv, const cli_opt *opts, int n_opts);
/* Print "flexdiag <cmd>: <library message>" (cli_last_error) for a failed status; return 2 for
 * FLEXDIAG_ERR_INVALID_ARG (the library refused a value the flags or the input gave it), 1 for
 * every other failure. */
int cli_fail(const char *cmd, flexdiag_status st);
/* The thread's last library message with each params field it names ("context_params.kv_pct")
 * written as the flag that sets it ("--kv"); valid until the next call on this thread. */
const char *cli_last_error(void);
/* Print "flexdiag <cmd>: <message>" and a newline on stderr; returns rc (an exit code). */
__attribute__((format(printf, 3, 4))) int cli_errorf(const char *cmd, int rc, const char *fmt,
                                                     ...);
/* Print "flexdiag <cmd>: <message of the failed file operation>" (cli_io_error) and return 1. */
int cli_fail_io(const char *cmd);
/* mkdir -p; returns 0 on success. */
int cli_mkdirs(const char *path);
/* Whether output file path (of flag) can be written, checked before a command spends minutes
 * on what goes there: an existing file that is not a regular one (/dev/null, a pipe) grants
 * write access, and otherwise a file can be made in its folder (the writers replace the file
 * with a renamed temporary). 0, or 1 after "flexdiag <cmd>: <flag> <path>: <why> (nothing was run)". */
int cli_check_writable(const char *cmd, const char *flag, const char *path);
/* Parse a size like "24G"; returns 0 on success. */
int cli_parse_size(const char *s, uint64_t *out);
/* Monotonic seconds. */
double cli_now(void);
/* 64-bit FNV-1a of n token ids taken as little-endian int32 bytes (a fingerprint of a
 * generated image that does not depend on the host's byte order). */
uint64_t cli_fnv1a64_ids(const int32_t *ids, int64_t n);

/* ---- model and policy flags shared by generate, score, bench ---- */

typedef struct cli_model_opts {
    const char *model;  /* --model DIR (NULL: builtin) */
    const char *arch;   /* --arch NAME: a builtin shape (cli_arch_help) */
    int64_t seed;       /* --seed: random-weight seed */
    int random_weights; /* --random-weights (implied without --model) */
    int cpu;            /* --cpu: force the CPU engine */
    uint64_t gpu_mem;   /* --gpu-mem SIZE (0 = free memory less a margin) */
    int64_t threads;    /* --threads N (0 = all cores) */
    const char *weights;     /* --weights G,C,D: percent of layer weights on GPU, CPU, disk */
    const char *compress;    /* --compress-weights none|4bit: the CPU and disk parts packed */
    const char *compress_disk; /* --compress-disk none|zstd: the disk part as zstd chunks */
    uint64_t cpu_mem;        /* --cpu-mem SIZE: pinned host pool (0: what --weights needs) */
    uint64_t disk_mem;       /* --disk-mem SIZE: NVMe store (0: what --weights needs) */
    const char *offload_dir; /* --offload-dir DIR: folder of the store file */
    const char *kv;          /* --kv G,C,D: percent of the micro-batches' KV on GPU, CPU, disk */
    int cpu_attention;       /* --cpu-attention: the host attends the host-homed micro-batches */
    int64_t cpu_attn_share;  /* --cpu-attention-share PCT: of those, the percent it attends
                                (0: not given, all) */
    int device;              /* CUDA device when > 0 and not --cpu (an MPI rank's: its rank
                                among its host's ranks); 0 = the runtime's default, device 0 */
} cli_model_opts;

/* The policy flags as given; fill with CLI_POLICY_OPTS_INIT so "not given" is known. */
typedef struct cli_policy_opts {
    const char *policy; /* --policy NAME (NULL: dense) */
    double sparsity;    /* --sparsity S; NaN = not given */
    int64_t n_att;      /* --n-att N; 0 = not given (derive from --sparsity) */
    int64_t n_r;        /* --n-r N; 0 = not given (the default ring) */
    const char *calib;  /* --calib FILE: ssd / hack's calibration table (NULL: none) */
    double ssd_tau;     /* --ssd-tau T; NaN = not given (the default 0.5) */
} cli_policy_opts;

#define CLI_POLICY_OPTS_INIT {NULL, NAN, 0, 0, NULL, NAN}

#define CLI_MAX_THREADS 1024 /* the library's thread-pool limit (base/thread_pool.c) */
#define CLI_MAX_RING 32767   /* the library's largest Diagonal ring (policy/kv_policy.c) */

/* The --arch help line: the library's builtin shapes (flexdiag_builtin_arch), tiny-janus the
 * default; a static string. */
const char *cli_arch_help(void);

/* The model flags; seed_help says what --seed seeds in the command. */
#define CLI_MODEL_FLAGS_SEED(o, seed_help)                                                         \
    {.name = "--model", CLI_STR, &(o)->model,                                                      \
     "model folder (config.json + safetensors); default builtin"},                                 \
    {.name = "--arch", CLI_STR, &(o)->arch, cli_arch_help()},                                      \
    {.name = "--random-weights", CLI_FLAG, &(o)->random_weights,                                   \
     "seeded random weights (builtin shapes)"},                                                    \
    {.name = "--seed", CLI_INT, &(o)->seed, seed_help, CLI_INTS(0, INT64_MAX, NULL)},              \
    {.name = "--cpu", CLI_FLAG, &(o)->cpu, "use the CPU engine even if a GPU is present"},         \
    {.name = "--gpu-mem", CLI_SIZE, &(o)->gpu_mem, "GPU memory budget, e.g. 24G or 48G"},          \
    {.name = "--threads", CLI_INT, &(o)->threads, "CPU threads (default 0: all cores)",            \
     CLI_INTS(0, CLI_MAX_THREADS, "0 = all cores")},                                               \
    {.name = "--weights", CLI_STR, &(o)->weights,                                                  \
     "G,C,D: percent of every layer's weights on GPU, pinned CPU, disk (default 100,0,0)"},        \
    {.name = "--compress-weights", CLI_STR, &(o)->compress,                                        \
     "none (default) or 4bit: the weights --weights puts on CPU and disk kept in 4-bit groups "    \
     "of 64 (4.5 bits a value; lossy), moved packed and unpacked on the device"},                  \
    {.name = "--compress-disk", CLI_STR, &(o)->compress_disk,                                      \
     "none (default) or zstd: the weights --weights puts on disk stored as byte planes "          \
     "compressed with zstd, decompressed by --threads host threads as they are read (lossless)"}, \
    {.name = "--cpu-mem", CLI_SIZE, &(o)->cpu_mem,                                                 \
     "pinned host memory budget (default: what --weights needs)"},                                 \
    {.name = "--disk-mem", CLI_SIZE, &(o)->disk_mem,                                               \
     "disk budget of the offload store (default: what --weights and --kv need)"},                  \
    {.name = "--offload-dir", CLI_STR, &(o)->offload_dir,                                          \
     "folder for the offload store (a file created there and unlinked at once)"},                  \
    {.name = "--kv", CLI_STR, &(o)->kv,                                                            \
     "G,C,D: percent of the micro-batches whose KV cache lives on GPU, pinned CPU, disk "          \
     "(default 100,0,0; disk needs --offload-dir)"},                                               \
    {.name = "--cpu-attention", CLI_FLAG, &(o)->cpu_attention,                                     \
     "decode attention of the CPU-homed micro-batches on the CPU, over their KV in place "         \
     "(dense, window, streaming; needs --kv with a CPU share)"},                                   \
    {.name = "--cpu-attention-share", CLI_INT, &(o)->cpu_attn_share,                               \
     "PCT: with --cpu-attention, the percent of the CPU-homed micro-batches the CPU attends "      \
     "(default 100); the GPU attends the others over rows streamed from the same home",            \
     CLI_INTS(0, 100, "0 = not given: 100")}

#define CLI_MODEL_FLAGS(o) CLI_MODEL_FLAGS_SEED(o, "random-weight seed (default 1)")

#define CLI_POLICY_FLAGS(o)                                                                        \
    {.name = "--policy", CLI_STR, &(o)->policy,                                                    \
     "dense|window|streaming|h2o|tova|alisa|diagonal|diagonal-sink4|line-ar|ssd|hack (default "  \
     "dense; ssd and hack need --calib)"},                                                         \
    {.name = "--sparsity", CLI_F64, &(o)->sparsity,                                                \
     "S: N_att = round((1-S) L_dec); or give --n-att (a sparse policy needs one)",                 \
     CLI_NUMS(0, 1, 0, NULL)},                                                                     \
    {.name = "--n-att", CLI_INT, &(o)->n_att, "attended decode tokens per step, at most L_dec",    \
     CLI_INTS(0, INT32_MAX, "0 = not given: from --sparsity")},                                    \
    {.name = "--n-r", CLI_INT, &(o)->n_r,                                                          \
     "Diagonal ring size, at least N_att (default max(round(L_dec/2), N_att))",                    \
     CLI_INTS(0, CLI_MAX_RING, "0 = not given: the default ring")},                                \
    {.name = "--calib", CLI_STR, &(o)->calib,                                                      \
     "FILE: the model's calibration table for ssd and hack (flexdiag-bench calibrate)"},           \
    {.name = "--ssd-tau", CLI_F64, &(o)->ssd_tau,                                                  \
     "T: ssd types a KV head spatial iff its calibrated local mass lambda(N_att) >= T "            \
     "(default 0.5; 0: every head spatial)", CLI_NUMS(0, 1e9, 0, NULL)}

/* Checks of the model flags the parser cannot make (--weights, --kv, --compress-weights,
 * --compress-disk, and
 * --cpu-attention-share only with --cpu-attention); prints the error and returns 2. */
int cli_check_model(const char *cmd, const cli_model_opts *o);
/* --compress-weights as flexdiag_model_params.compress_weights (0 or 4); 2 after a message. */
int cli_compress_bits(const char *cmd, const cli_model_opts *o, uint32_t *bits);
/* --compress-disk as flexdiag_runtime_params.compress_disk (0 none, 1 zstd); 2 after a
 * message. */
int cli_compress_disk(const char *cmd, const cli_model_opts *o, uint32_t *codec);
/* --kv into pct (100,0,0 when not given); prints the error and returns 2 when malformed. */
int cli_kv_pct(const char *cmd, const cli_model_opts *o, uint32_t pct[3]);
/* The KV flags (--kv, checked when the model was opened, and --cpu-attention) into cp. */
void cli_kv_homes(const char *cmd, const cli_model_opts *o, flexdiag_context_params *cp);
/* Create runtime and model from the flags (checked first); prints the error and returns 2 for
 * a bad flag, 1 for a runtime failure. */
int cli_open_model(const char *cmd, const cli_model_opts *o, flexdiag_runtime **rt,
                   flexdiag_model **m);
/* Policy params from the flags: the name and that --n-att and --sparsity are not both given;
 * a --sparsity not given becomes NaN, which the library refuses for a sparse policy without
 * --n-att ("needs a budget"). Every other rule is the
 * library's one validation (docs/policies.md §0.6), run at context creation (or by the bench
 * tool before it), whose INVALID_ARG cli_fail turns into exit 2. Prints the error and returns 2
 * on bad flags. */
int cli_policy_params(const char *cmd, const cli_policy_opts *o, flexdiag_policy_params *out);
/* --calib and --ssd-tau into cp: policy_calib, and ssd_tau as the library reads it (not given:
 * 0, the default; T > 0: T; T = 0: -1, which the library takes as tau 0). */
void cli_policy_calib(const cli_policy_opts *o, flexdiag_context_params *cp);

/* --batch N|auto (bench, generate): N, or with "auto" the largest number of images whose
 * context (cp, max_images ignored) fits the model's memory budget. Prints the error naming the
 * flag (a bad value, bad context params, auto without a budget, nothing fits) and returns -1. */
int32_t cli_batch(const char *cmd, const char *value, flexdiag_model *m,
                  const flexdiag_context_params *cp);

#endif /* FLEXDIAG_CLI_H */
