#!/bin/bash
cd /work/wt/prototypes
for spec in "full|--set prototypes=null" "p10|" "p05|--set prototypes.share=0.05"; do
  name=${spec%%|*}; args=${spec#*|}
  rm -f /tmp/val/$name.duckdb
  echo "== $name start $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
  /usr/bin/time -f "$name wall %e s" uv run populace demo --scenario examples/prototypes-smollm2.yaml --db /tmp/val/$name.duckdb $args > /tmp/val/$name.log 2>&1
  echo "== $name end $(date -u +%T) rc=$? load $(cut -d' ' -f1-3 /proc/loadavg)"
  tail -3 /tmp/val/$name.log
done
