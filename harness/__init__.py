"""The evaluation harness's internals (harness/README.md describes them); eval_harness.py is its API and command line.

  processes.py        the caller's side: zygotes and worker pools, the GPU timing gate, memory admission, run_job
  worker.py           inside a worker process: start-up, a candidate's five evaluation stages, compile and lint jobs
  compare.py          inside a worker: outputs against the reference's, inputs against their copies, fingerprints
  instrumentation.py  inside a worker: what is installed before a candidate's import and verified after every phase
  timing.py           inside a worker: the timing rule
  static_checks.py    the parent's parse-only rules on a candidate's source
  verdict.py          a verdict (KernelResult), the one typed object from the worker to the caller

Importing the package imports none of them.
"""
