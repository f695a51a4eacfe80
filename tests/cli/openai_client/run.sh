#!/bin/sh
# run.sh - the meson test test_openai_client: test_openai_client.mjs under node, or exit 77
# (skip) where there is no node or one older than 18, the oldest the pinned openai package
# runs on (README's set-up command (1) installs nodejs and npm; Debian 12 has 18).
command -v node >/dev/null 2>&1 || { echo "skip: no node on PATH"; exit 77; }
node -e 'process.exit(+process.versions.node.split(".")[0] < 18 ? 1 : 0)' ||
    { echo "skip: node $(node --version) is older than 18"; exit 77; }
exec node "$(dirname "$0")/test_openai_client.mjs"
