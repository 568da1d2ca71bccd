#!/bin/bash
# Which runtime commit after e63d613 ended the ResNet-18 servers' SIGSEGV? Bisect on the lent GPU with the harness
# that crashes them (e63d613's bench/gpu_issue12.py): a commit "crashes" when either of its two single-process
# starts (resnet18_1inst_nobatch, resnet18_1inst_batch) exits -11. Known ends (old_runtime_ab.sh): e63d613
# crashes, the newest does not. About 110 s of plan preparation, then ~80 s per step, 5 steps for the 31 runtime trees.
# usage: bash .carry/oldrepro/old_runtime_bisect.sh   (repository root; the folder from make_oldrepro.sh
#        carried; $OUT from the device tool: bisect.tgz lands there)
set -u
R=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd); W=/tmp/bisect; mkdir -p $W; export PYTHONFAULTHANDLER=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
tar -xzf $R/trees.tgz -C $R
mapfile -t T < $R/trees/order.txt
rm -rf /tmp/ngcx-shim
(cd $R && python3 bench/gpu_issue12.py --out $W/prep --work /tmp/i12 --seconds 0.5 \
   --skip shm,body,bs1,transport,small,mps > $W/prep.txt 2>&1)
echo "plans prepared by e63d613 in $SECONDS s"
crashes() {  # $1 = index into T; true when a start of that commit's runtime died with SIGSEGV
  local t=${T[$1]} t0=$SECONDS; mkdir -p $R/trees/$t/bench && cp $R/bench/gpu_issue12.py $R/trees/$t/bench/
  rm -rf /tmp/ngcx-shim /tmp/i12/logs
  (cd $R/trees/$t && timeout 250 python3 bench/gpu_issue12.py --out $W/$t --work /tmp/i12 --seconds 0.5 \
     --skip shm,body,bs1,transport,mps --only resnet18_1inst_nobatch,resnet18_1inst_batch --tag $t > $W/$t.txt 2>&1)
  mkdir -p $W/logs/$t; cp /tmp/i12/logs/*.log $W/logs/$t/ 2>/dev/null
  local died; died=$(grep -c 'server exited -11' $W/$t.txt)
  echo "$t ($((SECONDS - t0)) s): $(tail -1 $W/$t.txt | cut -c1-160) | SIGSEGV in $died of 2" | tee -a $W/steps.txt
  [ "$died" -gt 0 ] && return 0
  tail -1 $W/$t.txt | grep -q '"resnet18_1inst_nobatch": "ok", "resnet18_1inst_batch": "ok"' && return 1
  return 2                                      # neither crashed nor ran both phases: says nothing
}
lo=0; hi=$((${#T[@]} - 1))
while [ $((hi - lo)) -gt 1 ] && [ $SECONDS -lt 520 ]; do
  mid=$(((lo + hi) / 2)); crashes $mid; rc=$?
  if [ $rc = 0 ]; then lo=$mid; elif [ $rc = 1 ]; then hi=$mid
  else echo "${T[$mid]}: inconclusive, left out"; T=("${T[@]:0:$mid}" "${T[@]:$((mid + 1))}"); hi=$((hi - 1)); fi
done
echo "last crashing: ${T[$lo]}; first clean: ${T[$hi]}; adjacent: $([ $((hi - lo)) = 1 ] && echo yes || echo no)"
tar -czf $OUT/bisect.tgz -C $W .
