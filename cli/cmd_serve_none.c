/*
 * cmd_serve_none.c - `flexdiag serve` in a build without libmicrohttpd: says so and how to get
 * it. Built instead of cmd_serve.c and the serve_*.c files when meson finds no libmicrohttpd (or
 * -Dserve=disabled).
 */
#include <stdio.h>

#include "cli/cli.h"

int flexdiag_cmd_serve(int argc, char **argv) {
    (void)argc, (void)argv;
    fprintf(stderr, "flexdiag serve: this flexdiag was built without libmicrohttpd, which the "
                    "HTTP server needs: apt-get install libmicrohttpd-dev, then meson setup "
                    "--reconfigure <build folder> -Dserve=enabled and rebuild\n");
    return 1;
}
