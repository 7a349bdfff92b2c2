#!/usr/bin/env bash
# Measures xrc (bench/osu over comm, two ranks on one node: shared memory)
# and Open MPI (bench/ompi/pingpong.c over vader and over TCP on loopback)
# in one session, REPS times each, interleaved, and prints the median of
# every configuration at a few sizes, with the load average seen before
# each run. docs/benchmarks.md shows its output. Needs Go and Open MPI
# (apt-get install openmpi-bin libopenmpi-dev); not part of CI.
#
#	bench/compare.sh [REPS [OUTDIR]]       # default 5 repetitions, a temporary OUTDIR
#
# OUTDIR keeps every run's table (NAME-TEST-REP.txt) and loads.txt.
# SIZES overrides the sizes of the summary.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
reps="${1:-5}"
out="${2:-$(mktemp -d)}"
mkdir -p "$out"
sizes="${SIZES:-8 4096 65536 1048576 4194304}"
go build -o "$out/xrcrun" "$root/cmd/xrcrun"
go build -o "$out/osu" "$root/bench/osu"
export BUILD_DIR="$out"

run() { # NAME TEST REP command...
	local name=$1 test=$2 rep=$3
	shift 3
	echo "$name $test $rep $(cut -d' ' -f1-3 /proc/loadavg)" >>"$out/loads.txt"
	"$@" >"$out/$name-$test-$rep.txt"
}
: >"$out/loads.txt"
for rep in $(seq "$reps"); do
	for test in latency bw; do
		run xrc-shm "$test" "$rep" "$out/xrcrun" -n 2 "$out/osu" -test "$test"
		run ompi-vader "$test" "$rep" "$root/bench/ompi/run.sh" shm "$test"
		run ompi-tcp "$test" "$rep" "$root/bench/ompi/run.sh" tcp "$test"
	done
done

echo "# $reps runs each; $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); results in $out"
echo "# 1-minute load average before the runs: min $(awk '{print $4}' "$out/loads.txt" | sort -n | head -1), median $(awk '{print $4}' "$out/loads.txt" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'), max $(awk '{print $4}' "$out/loads.txt" | sort -n | tail -1)"
for test in latency bw; do
	unit="one-way latency, us"
	[ "$test" = bw ] && unit="bandwidth, MB/s"
	printf '\n# %s (median of %s runs)\n%-10s' "$unit" "$reps" "size"
	for name in xrc-shm ompi-vader ompi-tcp; do printf '%14s' "$name"; done
	echo
	for size in $sizes; do
		printf '%-10s' "$size"
		for name in xrc-shm ompi-vader ompi-tcp; do
			cat "$out/$name-$test-"*.txt | awk -v s="$size" '!/^#/ && $1 == s {print $2}' | sort -n |
				awk '{a[NR]=$1} END {if (NR == 0) printf "%14s", "-"; else if (NR % 2) printf "%14.2f", a[(NR+1)/2]; else printf "%14.2f", (a[NR/2]+a[NR/2+1])/2}'
		done
		echo
	done
done
