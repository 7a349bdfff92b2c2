/*
 * coll: the baseline for bench/coll, measuring an MPI library's
 * collectives the way bench/coll measures comm's (and the OSU
 * Micro-Benchmarks osu_allreduce, osu_bcast and osu_barrier measure
 * MPI's), with the same sizes, iterations and output:
 *
 *   allreduce  MPI_Allreduce of doubles with MPI_SUM, 8 B to MAX
 *   bcast      MPI_Bcast of bytes from rank 0, 1 B to MAX
 *   barrier    MPI_Barrier
 *
 * For each size every rank makes warm-up calls (200, or 10 above 8 KiB),
 * passes a barrier and times the calls that follow (1000, or 100 above
 * 8 KiB); rank 0 prints the average over the ranks of their time per
 * call, and the least and the most of a rank, in µs.
 *
 *   mpicc -O2 -o coll coll.c
 *   mpirun -n 4 ./coll allreduce|bcast|barrier [max-size]
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

int main(int argc, char **argv)
{
	MPI_Init(&argc, &argv);
	int rank, size;
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &size);
	const char *test = argc > 1 ? argv[1] : "allreduce";
	long max = argc > 2 ? atol(argv[2]) : 1 << 20;
	long min = 1;
	if (strcmp(test, "allreduce") == 0)
		min = 8;
	else if (strcmp(test, "barrier") == 0)
		min = max = 0;
	else if (strcmp(test, "bcast") != 0) {
		if (rank == 0)
			fprintf(stderr, "coll: test %s: allreduce, bcast or barrier\n", test);
		MPI_Abort(MPI_COMM_WORLD, 2);
	}
	char *buf = malloc(max > 0 ? max : 1);
	double *vec = malloc(max > 0 ? max : 8), *out = malloc(max > 0 ? max : 8);
	memset(buf, 0, max > 0 ? max : 1);
	if (rank == 0) {
		printf("# MPI %s, %d ranks\n# %-10s %12s %12s %12s %10s\n", test, size, "Size", "Avg(us)", "Min(us)", "Max(us)", "Iterations");
	}
	for (long n = min;; n *= 2) {
		int iters = n > LARGE ? 100 : 1000, warm = n > LARGE ? 10 : 200;
		for (long i = 0; i < n / 8; i++)
			vec[i] = rank + i;
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
