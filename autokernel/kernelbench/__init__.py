"""KernelBench mode: judge ModelNew solutions against KernelBench problems by KernelBench's
protocol with its known holes closed (evaluate), score a run with fast_p and geometric-mean
speedups and export it in KernelBench's layout (score), and search for solutions (run).

Importing the package does nothing; torch is imported only by the functions that need it.
"""
