#!/bin/bash
# A/B on the lent GPU: e63d613's bench/gpu_issue12.py (the harness whose ResNet-18 servers died with SIGSEGV)
# driving e63d613's runtime (oldN) and the newest runtime (newN), interleaved, on the same plans.
# usage: bash .carry/oldrepro/old_runtime_ab.sh   (repository root; the folder from make_oldrepro.sh carried;
#        $OUT from the device tool: ab.tgz lands there)
set -u
R=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd); W=/tmp/ab; mkdir -p $W; export PYTHONFAULTHANDLER=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
tar -xzf $R/trees.tgz -C $R
NEW=$R/trees/$(tail -1 $R/trees/order.txt)
mkdir -p $NEW/bench && cp $R/bench/gpu_issue12.py $NEW/bench/
one() {  # $1 tag, $2 repo folder (its runtime/ is the one served; the script links it as ngcx_runtime)
  local t0=$SECONDS; rm -rf /tmp/ngcx-shim /tmp/i12/logs
  (cd $2 && timeout 250 python3 bench/gpu_issue12.py --out $W/$1 --work /tmp/i12 --seconds 0.5 \
     --skip shm,body,bs1,transport,mps --only resnet18_1inst_nobatch,resnet18_1inst_batch --tag $1 > $W/$1.txt 2>&1)
  mkdir -p $W/logs/$1; cp /tmp/i12/logs/*.log $W/logs/$1/ 2>/dev/null
  echo "$1 ($((SECONDS - t0)) s): $(tail -1 $W/$1.txt | cut -c1-200) | $(grep -o 'server exited -\?[0-9]*' $W/$1.txt | tr '\n' ' ')"
}
i=1
while [ $SECONDS -lt 290 ]; do
  one old$i $R
  [ $SECONDS -lt 330 ] && one new$i $NEW
  i=$((i + 1))
done
grep -l "Fatal Python error" -r $W/logs | sed 's/^/fatal: /'
tar -czf $OUT/ab.tgz -C $W .
