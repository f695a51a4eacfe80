#!/bin/sh
# old_headers.sh REFERENCE OLD... [--known-break OLD...] - programs built against older
# flexdiag.h headers (tests/abi/old_header.c) run against this library and draw the images the
# reference (the same program built against include/flexdiag.h) draws.
# Each old program runs twice: as written (the library's _init() functions fill its structs)
# and with FLEXDIAG_ABI_OWN_SIZE=1 (struct_size = its own sizeof: the library's side of the
# struct_size rule alone). Programs after --known-break (built against API 11 or older) exit 3
# as written: the _init() symbols of programs built before API 14 write API 13's structs, and
# flexdiag_context_params_init's is longer than theirs (docs/abi.md §6); any other failure, or a
# clean run of theirs, fails this test.
ref=$1
shift
fail() { echo "FAIL $*" >&2; exit 1; }

want=$("$ref") || fail "reference $ref"
echo "reference: $want"
broken=0
for prog in "$@"; do
    if [ "$prog" = --known-break ]; then
        broken=1
        continue
    fi
    got=$(FLEXDIAG_ABI_OWN_SIZE=1 "$prog") || fail "$prog with its own struct sizes"
    [ "$got" = "$want" ] || fail "$prog with its own struct sizes: $got, reference $want"
    echo "$prog, own struct sizes: $got"
    got=$("$prog")
    rc=$?
    if [ "$rc" -eq 3 ] && [ "$broken" -eq 1 ]; then
        echo "$prog as written: the known break (exit 3)"
    elif [ "$rc" -eq 0 ] && [ "$broken" -eq 0 ]; then
        [ "$got" = "$want" ] || fail "$prog as written: $got, reference $want"
        echo "$prog as written: $got"
    else
        fail "$prog as written: exit $rc"
    fi
done
