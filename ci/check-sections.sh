#!/usr/bin/env bash
# Every section citation in the tree names a section docs/semantics.md has: a `§N` (`§4b`, `§5.8.1`)
# in a source file, kernel or document must be one of its headings' numbers, and a kernel cites the
# project's sections, never the numbers of the upstream contract (`contract 4.3`). A citation of the
# contract itself is written `contract §N` and is not checked here (the contract is not in the tree).
set -euo pipefail
cd "$(dirname "$0")/.."

sections="$(grep -oE '^#{2,4} [0-9]+[a-z]?(\.[0-9]+)*' docs/semantics.md | awk '{print $2}' | sed 's/\.$//' | sort -u)"
status=0

# One awk over every citation (file:line:§N), the sections as its first input: no process per hit.
if ! { git ls-files -z -- '*.rs' '*.cl' '*.cu' '*.cuh' '*.wgsl' '*.md' '*.sh' \
  | xargs -0 grep -noP '(?<![Cc]ontract )§ ?[0-9]+[a-z]?(\.[0-9]+)*' || true; } \
  | awk -F: 'NR == FNR { known[$0] = 1; next }
      { number = $3; sub(/^§ ?/, "", number); sub(/\.$/, "", number)
        if (!(number in known)) { printf "%s:%s: cites §%s, which docs/semantics.md does not have\n", $1, $2, number; bad = 1 } }
      END { exit bad }' <(printf '%s\n' "$sections") - >&2; then
  status=1
fi

if git ls-files -z -- '*.cl' '*.cu' '*.cuh' '*.wgsl' | xargs -0 grep -nE '[Cc]ontract [0-9]' >&2; then
  echo "kernel comments above cite the contract's numbers: cite docs/semantics.md's (§N)" >&2
  status=1
fi

if [ "$status" = 0 ]; then
  echo "section citations: $(wc -l <<<"$sections") sections, every citation found"
fi
exit "$status"
