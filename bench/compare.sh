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

# busy prints how busy the CPUs were (percent, all CPUs) over the second
# before a run: what other processes take from the benchmark.
busy() {
	local a b
	read -r -a a < <(head -1 /proc/stat)
	sleep 1
	read -r -a b < <(head -1 /proc/stat)
	local total=0 idle=$((b[4] + b[5] - a[4] - a[5])) i
	for i in 1 2 3 4 5 6 7 8; do total=$((total + b[i] - a[i])); done
	echo $((100 * (total - idle) / (total > 0 ? total : 1)))
}

run() { # NAME TEST REP command...
	local name=$1 test=$2 rep=$3
	shift 3
	echo "$name $test $rep $(cut -d' ' -f1 /proc/loadavg) $(busy)" >>"$out/loads.txt"
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
stats() { # column of loads.txt
	awk -v c="$1" '{print $c}' "$out/loads.txt" | sort -n | awk '{a[NR]=$1} END {printf "min %s, median %s, max %s", a[1], a[int((NR+1)/2)], a[NR]}'
}
echo "# 1-minute load average before the runs (the benchmarks' own two polling ranks count in it): $(stats 4)"
echo "# CPU busy in the second before each run, percent of both CPUs: $(stats 5)"
for test in latency bw; do
	unit="one-way latency, us"
	[ "$test" = bw ] && unit="bandwidth, MB/s"
	best=min
	[ "$test" = bw ] && best=max
	printf '\n# %s: median of %s runs (best)\n%-10s' "$unit" "$reps" "size"
	for name in xrc-shm ompi-vader ompi-tcp; do printf '%22s' "$name"; done
	echo
	for size in $sizes; do
		printf '%-10s' "$size"
		for name in xrc-shm ompi-vader ompi-tcp; do
			cat "$out/$name-$test-"*.txt | awk -v s="$size" '!/^#/ && $1 == s {print $2}' | sort -g |
				awk -v best="$best" '{a[NR]=$1} END {
					if (NR == 0) { printf "%22s", "-"; exit }
					m = NR % 2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2
					printf "%22s", sprintf("%.2f (%.2f)", m, best == "min" ? a[1] : a[NR])
				}'
		done
		echo
	done
done
