#!/usr/bin/env bash
# bench.sh LABEL SRC -- marconi run options: one timed run of `marconi run` with the package at SRC (an exported
# copy of one commit), appending "LABEL SRC user-s wall-s peak-KB md5(output)" to bench.log (the runs of this folder's
# README used /usr/bin/time and a scratch folder; TMP below)
label=$1; src=$2; shift 2
TMP=${TMP:-/tmp}
export PYTHONPATH=$src
/usr/bin/time -f "%U %e %M" -o "$TMP/t_$$.txt" marconi run --no-progress --format json "$@" > "$TMP/bout_$$.json" 2>/dev/null
echo "$label $src $(tail -1 "$TMP/t_$$.txt") $(md5sum < "$TMP/bout_$$.json" | cut -c1-8)" >> bench.log
rm -f "$TMP/t_$$.txt" "$TMP/bout_$$.json"
