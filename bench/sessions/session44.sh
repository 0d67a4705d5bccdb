#!/usr/bin/env bash
# Session 44 (repo root on the device). First: bench/restore_cost.py's pairs-kernel check and the
# three cached streams in one step against three prefilled (session 43's open question). Then the
# garbage collector: one full pass with and without the heap frozen at build (bench/gc_pause.py),
# and the legs of the first packet at 512 streams ramped with gc_freeze on (the default in
# `code2wav bench` since this session) and off, one process each (`quick`: the check alone).
source bench/device_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$log"
stamp "restore_cost.py: the pairs kernel alone; three cached streams in one step against three prefilled"
timeout 150 python3 bench/restore_cost.py bfloat16 300 2>&1 | tee -a "$log"
[ "${1:-}" = quick ] && { pack_out; exit 0; }
stamp "gc_pause.py: one full collector pass, heap frozen at build or not"
timeout 60 python3 bench/gc_pause.py --device cuda --streams 512 2>&1 | grep '^{' | tee -a "$log"
legs512 freeze_1 230
legs512 nofreeze_1 110 --set gc_freeze=false
pack_out
