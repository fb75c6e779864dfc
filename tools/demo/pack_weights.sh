#!/usr/bin/env bash
# Pack the demo model's large files into the committed archive: DIR/weights.tar.xz + DIR/SHA256SUMS.
# Usage: tools/demo/pack_weights.sh [DIR]   (default models/dsv4-demo; run after copying a new export there)
# The archive is reproducible (fixed order, owner, mode and mtime; same xz version gives the same bytes).
# scripts/unpack-demo.sh restores and verifies the files.
set -euo pipefail
DIR=${1:-models/dsv4-demo}
FILES=(model-00001-of-00003.safetensors model-00002-of-00003.safetensors model-00003-of-00003.safetensors
       tokenizer.json)
cd "$DIR"
for f in "${FILES[@]}"; do [ -f "$f" ] || { echo "pack_weights: $DIR/$f is missing" >&2; exit 1; }; done
sha256sum "${FILES[@]}" > SHA256SUMS
tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 --mode=u=rw,go=r -cf - "${FILES[@]}" \
  | xz -9e -T2 > weights.tar.xz.tmp
mv weights.tar.xz.tmp weights.tar.xz
echo "pack_weights: wrote $DIR/weights.tar.xz ($(stat -c %s weights.tar.xz) bytes) and $DIR/SHA256SUMS" >&2
