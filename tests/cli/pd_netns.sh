#!/usr/bin/env bash
# pd_netns.sh: prefill and decode on "two hosts": two network namespaces on
# this machine joined by a veth pair, Open MPI over TCP between them
# (runtime/comm/comm_mpi.c; docs/runtime.md, "Prefill and decode on different
# ranks").
#
#  1. namespaces cedar-p-PID and cedar-d-PID, a veth pair 10.231.X.1/24 <->
#     .2/24 (X from the PID), loopbacks up;
#  2. mpirun starts in P's namespace with --host P_IP,D_IP: rank 0 runs
#     there, rank 1 is launched into D's namespace by a launch agent
#     (plm_rsh_agent: `ip netns exec`), so the two ranks share no network
#     but the veth; the BTL is TCP only (no shared memory), the out-of-band
#     channel and the BTL are pinned to the veth's subnet;
#  3. the P/D run (tests/plans/pd-tiny-40.yaml, several chunks, an odd
#     prompt) reports "through StarPU-MPI" from rank 1 in D's namespace, its
#     --dump equals the one-process run of tiny-40 tensor for tensor, and the
#     veth carried at least the package's bytes (its byte counters);
#  4. the namespaces and the veth are removed on exit, pass or fail.
# Exits 77, saying why, where namespaces cannot be made (not root, no `ip`,
# no CAP_NET_ADMIN, a container without netns) or mpirun is missing.
# Run from the repository root: bash tests/cli/pd_netns.sh build/cedar (~20 s)
set -euo pipefail
cedar=${1:?usage: pd_netns.sh /path/to/cedar}
fail() { echo "FAIL: $*" >&2; exit 1; }
skip() { echo "skipped: $*"; exit 77; }
command -v mpirun > /dev/null || skip "mpirun is not installed (Debian: openmpi-bin)"
command -v ip > /dev/null || skip "no ip command (Debian: iproute2)"
[ "$(id -u)" = 0 ] || skip "network namespaces need root (this runs as uid $(id -u))"
py=/usr/bin/python3
[ -x "$py" ] || py=$(command -v python3)
id=$$
nsp=cedar-p-$id nsd=cedar-d-$id vp=cdp$id vd=cdd$id
net=10.231.$((id % 250)).
tmp=$(mktemp -d)
cleanup() {
  ip netns del "$nsp" 2> /dev/null || true
  ip netns del "$nsd" 2> /dev/null || true
  ip link del "$vp" 2> /dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT
ip netns add "$nsp" 2> "$tmp/e" || skip "cannot make a network namespace here: $(cat "$tmp/e")"
ip netns add "$nsd" 2> "$tmp/e" || skip "cannot make a second network namespace: $(cat "$tmp/e")"
ip link add "$vp" type veth peer name "$vd" 2> "$tmp/e" || skip "cannot make a veth pair: $(cat "$tmp/e")"
ip link set "$vp" netns "$nsp" && ip link set "$vd" netns "$nsd" || fail "moving the veth ends"
ip -n "$nsp" addr add "${net}1/24" dev "$vp"
ip -n "$nsd" addr add "${net}2/24" dev "$vd"
for n in "$nsp" "$nsd"; do ip -n "$n" link set lo up; done
ip -n "$nsp" link set "$vp" up
ip -n "$nsd" link set "$vd" up

# the launch agent: Open MPI's rsh launcher runs `agent HOST COMMAND...`
cat > "$tmp/agent.sh" << EOF
#!/bin/sh
host=\$1; shift
[ "\$host" = "${net}2" ] || { echo "agent: unknown host \$host" >&2; exit 1; }
exec ip netns exec $nsd sh -c "\$*"
EOF
chmod +x "$tmp/agent.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 HWLOC_COMPONENTS=${HWLOC_COMPONENTS:--pci}
. tests/cli/mpi_asan.sh; mpi_asan_env "$cedar" # Open MPI's own leaks suppressed under ASan
mpi_ns() {
  timeout -k 10 180 ip netns exec "$nsp" mpirun --host "${net}1,${net}2" -np 2 \
    --mca plm_rsh_agent "$tmp/agent.sh" --mca btl tcp,self --mca pml ob1 \
    --mca btl_tcp_if_include "${net}0/24" --mca oob_tcp_if_include "${net}0/24" \
    -x HWLOC_COMPONENTS "$@"
}
# where each rank runs: its namespace's address
mpi_ns sh -c 'echo "rank $OMPI_COMM_WORLD_RANK $(ip -o -4 addr show | grep -o "10\.231\.[0-9]*\.[0-9]*" | head -1)"' \
  > "$tmp/where" 2> "$tmp/where.err" || { cat "$tmp/where.err" >&2; fail "mpirun across the namespaces failed"; }
grep -qx "rank 0 ${net}1" "$tmp/where" && grep -qx "rank 1 ${net}2" "$tmp/where" ||
  { cat "$tmp/where"; fail "the ranks did not land in the two namespaces"; }

rx0=$(ip netns exec "$nsd" cat "/sys/class/net/$vd/statistics/rx_bytes")
toks=$(seq 0 52 | awk '{printf "%s%d", (NR > 1 ? "," : ""), ($1 * 37 + 11) % 97}')
args=(--tokens "$toks" --chunk 16 --max-new 3 --workers 1)
mpi_ns "$cedar" run --plan tests/plans/pd-tiny-40.yaml "${args[@]}" --dump "$tmp/pd.st" > "$tmp/pd.txt" 2> "$tmp/pd.err" ||
  { cat "$tmp/pd.err" >&2; fail "the P/D run across the namespaces failed"; }
rx1=$(ip netns exec "$nsd" cat "/sys/class/net/$vd/statistics/rx_bytes")
grep -q "^P/D: prefill on rank 0 cpu, decode on rank 1 cpu, through StarPU-MPI" "$tmp/pd.txt" ||
  { cat "$tmp/pd.txt"; fail "no P/D report through StarPU-MPI"; }
total=$(sed -n 's/^  moved [0-9]* messages:.*; total \([0-9]*\) B$/\1/p' "$tmp/pd.txt")
[ -n "$total" ] || { cat "$tmp/pd.txt"; fail "no total bytes in the report"; }
[ $((rx1 - rx0)) -ge "$total" ] || fail "the veth carried $((rx1 - rx0)) B into D's namespace, the package is $total B"
"$cedar" run --plan tests/oracle/plans/tiny-40.yaml "${args[@]}" --dump "$tmp/one.st" > /dev/null
"$py" - "$tmp/pd.st" "$tmp/one.st" << 'PY' || fail "P/D across the namespaces differs from one process"
import json, struct, sys
def load(p):
    b = open(p, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n]); h.pop("__metadata__", None)
    return {k: b[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]] for k, v in h.items()}
a, b = load(sys.argv[1]), load(sys.argv[2])
assert sorted(a) == sorted(b) and a, sorted(set(a) ^ set(b))
bad = [k for k in a if a[k] != b[k]]
assert not bad, "differ: %s" % bad[:8]
print("%d tensors equal" % len(a))
PY
echo "pd_netns: P in $nsp (${net}1), D in $nsd (${net}2), TCP over the veth: $((rx1 - rx0)) B into D's side" \
  "for a $total B package; bitwise equal to one process"
