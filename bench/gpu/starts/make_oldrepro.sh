#!/bin/bash
# Builds the folder the old-runtime SIGSEGV runs carry to the lent GPU (issue 24 item 4).
# usage: bash bench/gpu/starts/make_oldrepro.sh [DIR]      (from the repository root; DIR: .carry/oldrepro)
# DIR gets e63d613's runtime/ and bench/ (bench/gpu_issue12.py: the harness whose ResNet-18 servers died with
# SIGSEGV), trees.tgz (trees/NN_SHA/runtime: e63d613's runtime and that of every later commit touching runtime/,
# oldest first, listed in trees/order.txt) and the device scripts. .carry/ is ignored by git: pass the
# folder as the device run's carry.
set -euo pipefail
dir=${1:-.carry/oldrepro}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
rm -rf "$dir" && mkdir -p "$dir/trees"
git archive e63d613 runtime bench | tar -x -C "$dir"
i=0
for sha in e63d613 $(git log --reverse --format=%h e63d613..HEAD -- runtime/); do
  name=$(printf "%02d_%s" $i "$sha")
  mkdir -p "$dir/trees/$name" && git archive "$sha" runtime | tar -x -C "$dir/trees/$name"
  echo "$name" >> "$dir/trees/order.txt"; i=$((i + 1))
done
tar -czf "$dir/trees.tgz" -C "$dir" trees && rm -rf "$dir/trees"
cp "$here/old_runtime_ab.sh" "$here/old_runtime_bisect.sh" "$here/old_runtime_native.py" "$here/old_runtime_preload_ab.sh" "$here/old_runtime_arms.sh" "$here/segv_native.c" "$dir/"
echo "$dir: $(du -sh "$dir" | cut -f1), $i runtime trees; newest: $(git log -1 --format=%h -- runtime/)"
