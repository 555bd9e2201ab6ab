#!/usr/bin/env bash
# oracle_self.sh: self-checks of the independent NumPy oracle (tests/oracle/).
#
# Runs tests/oracle/test_oracle_self.py with Debian's python3 (the one that
# sees python3-numpy). Exit 77 (skipped) when that python or numpy is
# missing. The cedar binary, when given, is used only to cross-check the
# oracle's plan reader against `cedar plan show --json`.
#
# Run: bash tests/cli/oracle_self.sh [build/cedar]   (from the repo root; ctest
# runs it as cli_oracle_self).
set -u
py=/usr/bin/python3
[ -x "$py" ] || { echo "skipped: $py not found"; exit 77; }
"$py" -c 'import numpy' 2>/dev/null || { echo "skipped: numpy is missing for $py"; exit 77; }
here=$(cd "$(dirname "$0")/../.." && pwd)
if [ $# -ge 1 ] && [ -x "$1" ]; then export CEDAR_BIN="$1"; fi
# The smaller form (CEDAR_TEST_SMALL=1, the ASan build: tests/CMakeLists.txt)
# runs the one check that executes cedar (the plan reader against `cedar
# plan show`); the rest is the oracle's own Python, which the plain build's
# run of this test covers.
if [ "${CEDAR_TEST_SMALL:-0}" = 1 ]; then
  exec "$py" "$here/tests/oracle/test_oracle_self.py" -k plan_agrees_with_cedar_plan_show
fi
exec "$py" "$here/tests/oracle/test_oracle_self.py"
