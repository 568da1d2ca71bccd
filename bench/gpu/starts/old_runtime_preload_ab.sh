#!/bin/bash
# e63d613's harness and runtime (13 of 14 of its harness starts died with SIGSEGV, old_runtime_ab/ and
# old_runtime_rounds/), alternating invocations with segv_native.so preloaded (preN: the faulting thread's name and
# native stack after faulthandler's dump) and without (bareN). old_runtime_native.py's starts by the harness's
# Server class alone, with the preload and no prepare before each, did not crash (0 of 18, native/).
# usage: bash .carry/oldrepro/old_runtime_preload_ab.sh   (repository root; the folder from make_oldrepro.sh
#        carried; $OUT from the device tool: pab.tgz lands there)
set -u
R=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd); W=/tmp/pab; mkdir -p $W; export PYTHONFAULTHANDLER=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
gcc -O1 -g -shared -fPIC -o /tmp/segv_native.so $R/segv_native.c -ldl
T=$(python3 -c 'import importlib.util as u; print(u.find_spec("torch").submodule_search_locations[0])')
sed -n 300,375p $T/_inductor/cudagraph_trees.py > $W/torch_cudagraph_trees_tls.txt
one() {  # $1 tag, $2 the library to preload ("" for none)
  local t0=$SECONDS; rm -rf /tmp/ngcx-shim /tmp/i12/logs
  (cd $R && export LD_PRELOAD=$2 && timeout 250 python3 bench/gpu_issue12.py --out $W/$1 --work /tmp/i12 \
     --seconds 0.5 --skip shm,body,bs1,transport,mps --only resnet18_1inst_nobatch,resnet18_1inst_batch --tag $1 \
     > $W/$1.txt 2>&1)
  mkdir -p $W/logs/$1; cp /tmp/i12/logs/*.log $W/logs/$1/ 2>/dev/null
  echo "$1 ($((SECONDS - t0)) s): $(tail -1 $W/$1.txt | cut -c1-120) | $(grep -o 'server exited -\?[0-9]*' \
     $W/$1.txt | tr '\n' ' ')| native lines $(cat $W/logs/$1/*.log 2>/dev/null | grep -c '^native ')"
}
for tag in pre1 bare1 pre2 bare2 pre3 bare3; do
  [ $SECONDS -lt 430 ] || break
  one $tag "$([ "${tag#pre}" != "$tag" ] && echo /tmp/segv_native.so)"
done
grep -h -A24 "^native SIGSEGV" -r $W/logs | cut -c1-220 | head -60
tar -czf $OUT/pab.tgz -C $W .
