#!/usr/bin/env bash
# Builds bench/ompi/pingpong.c with mpicc and runs it with Open MPI's
# mpirun, two ranks on this machine, over shared memory (the vader BTL,
# called sm from Open MPI 5) and over TCP on the loopback interface: the
# baseline for bench/osu (docs/benchmarks.md). Not part of CI; it needs
# Open MPI:
#
#	apt-get install openmpi-bin libopenmpi-dev
#	bench/ompi/run.sh                  # every test on both transports
#	bench/ompi/run.sh shm latency      # one of them: shm|tcp, latency|bw
#
# MAX_SIZE (default 4194304) is the largest message; BIND is mpirun's
# --bind-to (default core, mpirun's own default for two ranks; xrcrun does
# not pin ranks, BIND=none compares with that); MPIRUN_ARGS are added to
# mpirun's arguments.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
build="${BUILD_DIR:-$(mktemp -d)}"
mpicc -O2 -Wall -o "$build/pingpong" "$here/pingpong.c"

# The shared-memory BTL is vader in Open MPI 4 and sm in 5.
shm=vader
if ompi_info --parsable 2>/dev/null | grep -q '^mca:btl:sm:'; then
	shm=sm
fi
mpirun=(mpirun -n 2 --bind-to "${BIND:-core}" --oversubscribe)
[ "$(id -u)" -eq 0 ] && mpirun+=(--allow-run-as-root)
# ob1 is the PML that uses BTLs; without it, a build with UCX may pick
# UCX and ignore the BTL selection.
mpirun+=(--mca pml ob1)

transports=("${1:-shm}" )
tests=("${2:-latency}")
if [ $# -eq 0 ]; then
	transports=(shm tcp)
	tests=(latency bw)
fi
echo "# $(mpirun --version | head -1); $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
for tr in "${transports[@]}"; do
	case "$tr" in
	shm) btl=(--mca btl "self,$shm") ;;
	tcp) btl=(--mca btl self,tcp --mca btl_tcp_if_include lo) ;;
	*) echo "run.sh: transport $tr: shm or tcp" >&2; exit 2 ;;
	esac
	for t in "${tests[@]}"; do
		echo "# mpirun --bind-to ${BIND:-core} --mca ${btl[*]:1}; load: $(cut -d' ' -f1-3 /proc/loadavg)"
		"${mpirun[@]}" "${btl[@]}" ${MPIRUN_ARGS:-} "$build/pingpong" "$t" "${MAX_SIZE:-4194304}"
	done
done
