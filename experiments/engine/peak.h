/* The machine's fp32 multiply-add peak (peak.c), the roofline of `specmoe bench layer`. */
#ifndef SPECMOE_EXPERIMENTS_ENGINE_PEAK_H
#define SPECMOE_EXPERIMENTS_ENGINE_PEAK_H

/* The peak in GFLOP/s, measured: the rate of one thread, of `threads` threads, and the bound
 * max(all, threads x one) that no fp32 computation on this machine beats; *isa names the vector
 * instructions used. */
double exp_fma_peak(int threads, double *one_thread, double *all_threads, const char **isa);

#endif
