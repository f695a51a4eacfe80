/*
 * layer.h - the layer rule, checked by the compiler.
 *
 * The library is built as one static library per folder, in dependency order (docs/
 * architecture.md §2):
 *
 *     base <- policy <- kernels <- offload <- runtime <- bench, tests
 *
 * Meson compiles each folder with -DFLEXDIAG_LAYER=FLEXDIAG_LAYER_<FOLDER>. Every internal header
 * includes this file and states the lowest layer allowed to see it, so an include that points up
 * (policy/ reaching into kernels/, say) stops the build with an #error naming both. Headers
 * private to one folder (a backend's op declarations, the tokenizer's internals) also require
 * that folder's FLEXDIAG_OWNER_<FOLDER> define. Code outside the library (the `flexdiag` CLI,
 * embedding programs) defines no layer and may include only include/flexdiag.h.
 *
 * Tests are white-box and may include any header.
 */
#ifndef FLEXDIAG_LAYER_H
#define FLEXDIAG_LAYER_H

#define FLEXDIAG_LAYER_BASE 1
#define FLEXDIAG_LAYER_POLICY 2
#define FLEXDIAG_LAYER_KERNELS 3
#define FLEXDIAG_LAYER_OFFLOAD 4
#define FLEXDIAG_LAYER_RUNTIME 5
#define FLEXDIAG_LAYER_BENCH 6
#define FLEXDIAG_LAYER_TESTS 7

#ifndef FLEXDIAG_LAYER
#error "internal flexdiag header outside the library: programs include only include/flexdiag.h (inside the tree, meson sets FLEXDIAG_LAYER per folder)"
#endif

#endif /* FLEXDIAG_LAYER_H */
