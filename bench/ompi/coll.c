/*
 * coll: the baseline for bench/coll, measuring an MPI library's
 * collectives the way bench/coll measures comm's (and the OSU
 * Micro-Benchmarks osu_allreduce, osu_bcast and osu_barrier measure
 * MPI's), with the same sizes, iterations and output:
 *
 *   allreduce  MPI_Allreduce of doubles with MPI_SUM, 8 B to MAX
 *   bcast      MPI_Bcast of bytes from rank 0, 1 B to MAX
 *   barrier    MPI_Barrier
 *   iallreduce MPI_Iallreduce and MPI_Wait, with and without computing
 *              between them, as osu_iallreduce (bench/coll says how)
 *
 * For each size every rank makes warm-up calls (200, or 10 above 8 KiB),
 * passes a barrier and times the calls that follow (1000, or 100 above
 * 8 KiB); rank 0 prints the average over the ranks of their time per
 * call, and the least and the most of a rank, in µs.
 *
 *   mpicc -O2 -o coll coll.c
 *   mpirun -n 4 ./coll allreduce|bcast|barrier|iallreduce [max-size]
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LARGE 8192

static void call(const char *test, char *buf, double *vec, double *out, long n)
{
	if (strcmp(test, "allreduce") == 0)
		MPI_Allreduce(vec, out, n / 8, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
	else if (strcmp(test, "bcast") == 0)
		MPI_Bcast(buf, n, MPI_CHAR, 0, MPI_COMM_WORLD);
	else
		MPI_Barrier(MPI_COMM_WORLD);
}

/* timed runs iters Iallreduces, computing (spinning) for spin seconds
 * between the start and the wait, and returns the time per call in µs;
 * *computed gets the time computed per call. */
static double timed(double *vec, double *out, long n, int iters, double spin, double *computed)
{
	double busy = 0;
	MPI_Barrier(MPI_COMM_WORLD);
	double start = MPI_Wtime();
	for (int k = 0; k < iters; k++) {
		MPI_Request r;
		MPI_Iallreduce(vec, out, n / 8, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD, &r);
		if (spin > 0) {
			double s = MPI_Wtime();
			while (MPI_Wtime() - s < spin)
				;
			busy += MPI_Wtime() - s;
		}
		MPI_Wait(&r, MPI_STATUS_IGNORE);
	}
	if (computed)
		*computed = busy * 1e6 / iters;
	return (MPI_Wtime() - start) * 1e6 / iters;
}

/* overlap prints the row of iallreduce for n bytes at rank 0. */
static void overlap(double *vec, double *out, long n, int iters, int warm, int rank, int size)
{
	timed(vec, out, n, warm, 0, NULL);
	double pure = timed(vec, out, n, iters, 0, NULL), longest, computed;
	MPI_Allreduce(&pure, &longest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
	double overall = timed(vec, out, n, iters, longest / 1e6, &computed);
	double mine[3] = {overall, computed, pure}, sums[3];
	MPI_Allreduce(mine, sums, 3, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
	overall = sums[0] / size, computed = sums[1] / size, pure = sums[2] / size;
	double hidden = 100 - 100 * (overall - computed) / pure;
	hidden = hidden < 0 ? 0 : hidden > 100 ? 100 : hidden;
	if (rank == 0)
		printf("  %-10ld %12.2f %12.2f %14.2f %10.2f\n", n, overall, computed, pure, hidden);
}

int main(int argc, char **argv)
{
	MPI_Init(&argc, &argv);
	int rank, size;
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &size);
	const char *test = argc > 1 ? argv[1] : "allreduce";
	long max = argc > 2 ? atol(argv[2]) : 1 << 20;
	long min = 1;
	int iallreduce = strcmp(test, "iallreduce") == 0;
	if (strcmp(test, "allreduce") == 0 || iallreduce)
		min = 8;
	else if (strcmp(test, "barrier") == 0)
		min = max = 0;
	else if (strcmp(test, "bcast") != 0) {
		if (rank == 0)
			fprintf(stderr, "coll: test %s: allreduce, bcast, barrier or iallreduce\n", test);
		MPI_Abort(MPI_COMM_WORLD, 2);
	}
	char *buf = malloc(max > 0 ? max : 1);
	double *vec = malloc(max > 0 ? max : 8), *out = malloc(max > 0 ? max : 8);
	memset(buf, 0, max > 0 ? max : 1);
	if (rank == 0) {
		printf("# MPI %s, %d ranks\n", test, size);
		if (iallreduce)
			printf("# %-10s %12s %12s %14s %10s\n", "Size", "Overall(us)", "Compute(us)", "Pure Comm.(us)", "Overlap(%)");
		else
			printf("# %-10s %12s %12s %12s %10s\n", "Size", "Avg(us)", "Min(us)", "Max(us)", "Iterations");
	}
	for (long n = min;; n *= 2) {
		int iters = n > LARGE ? 100 : 1000, warm = n > LARGE ? 10 : 200;
		for (long i = 0; i < n / 8; i++)
			vec[i] = rank + i;
		if (iallreduce) {
			overlap(vec, out, n, iters, warm, rank, size);
			if (n * 2 > max)
				break;
			continue;
		}
		for (int k = 0; k < warm; k++)
			call(test, buf, vec, out, n);
		MPI_Barrier(MPI_COMM_WORLD);
		double start = MPI_Wtime();
		for (int k = 0; k < iters; k++)
			call(test, buf, vec, out, n);
		double t = (MPI_Wtime() - start) * 1e6 / iters;
		double sum, least, most;
		MPI_Reduce(&t, &sum, 1, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);
		MPI_Reduce(&t, &least, 1, MPI_DOUBLE, MPI_MIN, 0, MPI_COMM_WORLD);
		MPI_Reduce(&t, &most, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
		if (rank == 0) {
			char label[32];
			snprintf(label, sizeof label, "%ld", n);
			printf("  %-10s %12.2f %12.2f %12.2f %10d\n", n == 0 ? "-" : label, sum / size, least, most, iters);
		}
		if (n == 0 || n * 2 > max)
			break;
	}
	free(buf);
	free(vec);
	free(out);
	MPI_Finalize();
	return 0;
}
