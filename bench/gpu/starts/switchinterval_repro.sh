mkdir -p /tmp/swi && echo 'import sys; sys.setswitchinterval(0.0005)' > /tmp/swi/sitecustomize.py
export PYTHONPATH=/tmp/swi OMP_NUM_THREADS=4
python3 -c "import sys, torch; print('switchinterval', sys.getswitchinterval(), 'torch', torch.__version__)"; nvidia-smi -L
end=$((SECONDS+570)); i=1; only=""
while [ $((end-SECONDS)) -gt 110 ]; do
  timeout $((end-SECONDS-10)) python3 bench/gpu/serving.py --out $OUT --work /tmp/i24 --seconds 2 --skip shm,body,bs1,transport $only --tag swi$i 2>&1 | tail -2
  mkdir -p $OUT/logs/$i; cp /tmp/i24/logs/*.log $OUT/logs/$i/ 2>/dev/null; rm -f /tmp/i24/logs/*.log
  i=$((i+1)); only="--only resnet18_4mps_nobatch,resnet18_1inst_batch,resnet18_4inst_batch"
done
echo "crashes:"; grep -l -E "Fatal Python error|Segmentation fault|exited -11|exited with -11" -r $OUT; echo "server logs: $(find $OUT/logs -name '*.log' | wc -l)"
