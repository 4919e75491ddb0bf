#!/usr/bin/env bash
# Packs what bench/gpu/stage-ssh.sh needs into N parts of equal size, for a GPU machine reached by copying
# folders of limited size: the SGLang overlay (its build script's parts), tunectl's wheels (bench/gpu/pack.sh),
# this checkout (tracked and untracked files), and `patch`, `sshd`, `ssh-keygen` with their libraries (the GPU
# image may lack them; glibc comes from the host).
# Usage: bench/gpu/bundle.sh OVERLAY_DIR WHEELS_DIR OUTDIR N [EXTRA_WHEELS_DIR]   -> OUTDIR/part-1..N/bundle.partI
# (EXTRA_WHEELS_DIR: e.g. sgl-deep-gemm==0.1.5.post1, which SGLang 0.5.17 pins, for the GLM-5-shaped model)
# On the GPU machine: cat the parts | tar x -C B; tar xzf B/tree.tgz -C TREE; cd TREE; bench/gpu/stage-ssh.sh B
set -euo pipefail
overlay=${1:?}; wheels=${2:?}; out=${3:?}; n=${4:?}; extra=${5:-}
here=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
cat "$overlay"/part-*/site.tgz.part* > "$work/site.tgz"
cp -r "$overlay/part-1/tiny-llama" "$work/"; cp -r "$wheels" "$work/whl"; mkdir -p "$work/extra"
[ -z "$extra" ] || cp "$extra"/*.whl "$work/extra/"
(cd "$here" && git ls-files -co --exclude-standard -z | tar czf "$work/tree.tgz" --null -T -)
mkdir -p "$work/tools/bin" "$work/tools/lib"
for t in patch sshd ssh-keygen; do cp "$(command -v "$t" || echo /usr/sbin/$t)" "$work/tools/bin/"; done
ldd "$work"/tools/bin/* | awk '/=> \//{print $3}' | sort -u | grep -Ev '/lib(c|m|resolv|pthread|dl|rt)\.so' \
  | xargs -I{} cp -L {} "$work/tools/lib/"
tar -C "$work" -cf "$work/bundle.tar" site.tgz tiny-llama whl tree.tgz tools extra
size=$(stat -c %s "$work/bundle.tar"); per=$(( (size + n - 1) / n ))
split -b "$per" -d -a 1 "$work/bundle.tar" "$work/bundle.part"
rm -rf "$out"; i=1
for p in "$work"/bundle.part*; do mkdir -p "$out/part-$i"; mv "$p" "$out/part-$i/"; i=$((i+1)); done
du -sh "$out"/part-*
