#!/bin/bash
# Which part of the preload ended the SIGSEGV? e63d613's harness and runtime (bare: 2 of 4 phases died in
# old_runtime_preload_ab.sh, 13 of 14 before), in turn with each arm named, one harness invocation (prepare, then
# the two single-process ResNet-18 phases) per arm and round:
#   bare     as it was
#   handler  segv_native.so preloaded (0 of 6 phases died in old_runtime_preload_ab.sh)
#   unwind   a preload that only runs backtrace() at load (glibc's unwinder and libgcc_s set up at start)
#   empty    an empty preload (only the link map and address layout change)
#   park     no preload; the runtime's load thread parks on an Event after loading instead of exiting
#            (tests whether the load thread's exit, with its thread-local state, is where it dies)
# usage: bash .carry/oldrepro/old_runtime_arms.sh ARM [ARM ...]   (repository root; the folder from
#        make_oldrepro.sh carried; $OUT from the device tool: arms.tgz lands there; ~150 s for the first
#        invocation, ~80 s for each after it, none started after ARMS_UNTIL s, default 430)
set -u
UNTIL=${ARMS_UNTIL:-430}
R=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd); W=/tmp/arms; mkdir -p $W; export PYTHONFAULTHANDLER=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
gcc -O1 -g -shared -fPIC -o /tmp/handler.so $R/segv_native.c -ldl
gcc -O1 -g -shared -fPIC -DNO_HANDLER -o /tmp/unwind.so $R/segv_native.c -ldl
gcc -O1 -g -shared -fPIC -DNO_CONSTRUCTOR -o /tmp/empty.so $R/segv_native.c -ldl
mkdir -p $R/park/bench && cp -r $R/runtime $R/park/ && cp $R/bench/gpu_issue12.py $R/park/bench/
python3 - "$R/park/runtime/serve.py" <<'PY'
import sys
from pathlib import Path
p = Path(sys.argv[1])
old = '    threading.Thread(target=load, name="ngcx-load", daemon=True).start()\n'
new = ('    def load_and_park() -> None:\n        load()\n        threading.Event().wait()\n\n'
       '    threading.Thread(target=load_and_park, name="ngcx-load", daemon=True).start()\n')
text = p.read_text()
assert text.count(old) == 1, "e63d613's start_loading line not found"
p.write_text(text.replace(old, new))
PY
one() {  # $1 tag, $2 arm
  local t0=$SECONDS tree=$R pre=""; rm -rf /tmp/ngcx-shim /tmp/i12/logs
  case $2 in handler|unwind|empty) pre=/tmp/$2.so ;; park) tree=$R/park ;; esac
  (cd $tree && export LD_PRELOAD=$pre && timeout 250 python3 bench/gpu_issue12.py --out $W/$1 --work /tmp/i12 \
     --seconds 0.5 --skip shm,body,bs1,transport,mps --only resnet18_1inst_nobatch,resnet18_1inst_batch --tag $1 \
     > $W/$1.txt 2>&1)
  mkdir -p $W/logs/$1; cp /tmp/i12/logs/*.log $W/logs/$1/ 2>/dev/null
  echo "$1 ($((SECONDS - t0)) s): $(tail -1 $W/$1.txt | cut -c1-120) | $(grep -o 'server exited -\?[0-9]*' \
     $W/$1.txt | tr '\n' ' ')| native lines $(cat $W/logs/$1/*.log 2>/dev/null | grep -c '^native ')"
}
round=1
while [ $SECONDS -lt $UNTIL ]; do
  for arm in "$@"; do
    [ $SECONDS -lt $UNTIL ] || break
    one ${arm}$round $arm
  done
  round=$((round + 1))
done
grep -h -A24 "^native SIGSEGV" -r $W/logs | cut -c1-220 | head -60
tar -czf $OUT/arms.tgz -C $W .
