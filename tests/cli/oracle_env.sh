# oracle_env.sh: sourced by the CLI tests that compare cedar with the NumPy
# oracle (oracle_run, oracle_released, oracle_mtp): the interpreter check,
# the work folder and the helpers they share.
#   py      /usr/bin/python3 (the test exits 77, saying why, without it or
#           without numpy: Debian's python3-numpy is installed for it)
#   tmp     the work folder: $KEEP_VAR's folder when that variable names
#           one (kept), else a fresh one removed on exit
#   fail MSG; phase MSG (prints MSG with the seconds since sourcing)
# Usage: . tests/cli/oracle_env.sh ORACLE_RUN_KEEP   (the keep variable's name is required)
py=/usr/bin/python3
[ -x "$py" ] || { echo "skipped: $py not found"; exit 77; }
"$py" -c 'import numpy' 2>/dev/null || { echo "skipped: numpy is missing for $py"; exit 77; }
if [ -n "${!1:-}" ]; then
  tmp=${!1}
  mkdir -p "$tmp"
else
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
fi
fail() { echo "FAIL: $*" >&2; exit 1; }
t0=$SECONDS
phase() { echo "== $* ($((SECONDS - t0)) s)"; }
