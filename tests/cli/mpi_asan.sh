# mpi_asan.sh: sourced by the CLI tests that run cedar under mpirun. Under
# `make asan` (a cedar linked with libasan), Open MPI's own never-freed
# allocations (and one StarPU-MPI race) are suppressed (tests/lsan-openmpi.supp; its components stay
# loaded and stacks are unwound in full, so their frames have names to
# match), and cedar's leaks are still reported.
# Usage: . tests/cli/mpi_asan.sh; mpi_asan_env "$cedar"   (from the repository root)
mpi_asan_env() {
  ldd "$1" 2>/dev/null | grep libasan > /dev/null || return 0
  export OMPI_MCA_mca_base_component_disable_dlclose=1
  export LSAN_OPTIONS="suppressions=$PWD/tests/lsan-openmpi.supp:print_suppressions=0${LSAN_OPTIONS:+:$LSAN_OPTIONS}"
  export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}fast_unwind_on_malloc=0" # whole stacks: Open MPI lacks frame pointers
}
